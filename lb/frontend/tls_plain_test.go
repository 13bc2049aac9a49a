package frontend_test

import (
	"testing"

	"golang.org/x/net/http2"
)

// TestTLSPortRefusesH2C: HTTP/2's cleartext preface sent to the TLS port
// is plain HTTP on the HTTPS port like any other request: answered 400
// and closed, never served unencrypted.
func TestTLSPortRefusesH2C(t *testing.T) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			c := dial(t, serveWith(t, name, newApp().handler(), ts.options()))
			c.send(t, http2.ClientPreface)
			resp, b := c.response(t)
			expect(t, resp, b, 400, "The plain HTTP request was sent to HTTPS port\n")
		})
	}
}

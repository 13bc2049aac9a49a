package lb_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"testing"
	"time"

	"pdlb/lb/config"
)

// TestTicketKeysRotate: on the API listener and the admin listener alike,
// a session resumes with a fresh ticket, and not with one whose key
// rotated out (tls.ticket_rotation; a key serves three rotations).
func TestTicketKeysRotate(t *testing.T) {
	const every = 400 * time.Millisecond
	ca, _, gw := tlsGateway(t, testFleet(t, "m", 1, 1000), func(c *config.Config) {
		c.TLS.Admin = true
		c.TLS.TicketRotation = every
	})
	for _, l := range []struct{ name, addr, path string }{{"api", gw.Addr(), "/v1/models"}, {"admin", gw.AdminAddr(), "/metrics"}} {
		t.Run(l.name, func(t *testing.T) {
			cfg := &tls.Config{RootCAs: ca.Pool, ServerName: "localhost", NextProtos: []string{"http/1.1"},
				ClientSessionCache: tls.NewLRUClientSessionCache(1)}
			// resumed makes a request on a new connection, which takes
			// the ticket that comes with it into the cache.
			resumed := func() bool {
				t.Helper()
				c, err := tls.Dial("tcp", l.addr, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.WriteString(c, "GET "+l.path+" HTTP/1.1\r\nHost: localhost\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return c.ConnectionState().DidResume
			}
			resumed()
			if !resumed() {
				t.Fatal("a ticket just issued did not resume")
			}
			time.Sleep(6 * every)
			if resumed() {
				t.Fatalf("a ticket issued %v ago resumed, with keys rotating every %v", 6*every, every)
			}
		})
	}
}

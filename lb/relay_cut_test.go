package lb_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"pdlb/lb/config"
)

// TestStreamCutMidEvent: a pod whose stream has no length and is not
// chunked ends it by closing its connection, and one that closes midway
// through an event broke: the client gets the whole events, then an error
// event, never the half event nor a clean end, and the request counts as
// failed, on both front ends and both of gnet's relays.
func TestStreamCutMidEvent(t *testing.T) {
	cut := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		io.WriteString(c, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n"+`data: {"choi`)
	})
	// A stray blank line after the last event cuts nothing.
	whole := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		io.WriteString(c, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\ndata: [DONE]\n\n\n")
	})
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Model: "m", Address: cut}, {Model: "whole", Address: whole}}, func(c *config.Config) { c.Frontend = frontend })
		resp, b := postVia(t, via, s, "/v1/chat/completions", `{"model":"whole","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if resp.StatusCode != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("whole stream relayed badly: %d %q", resp.StatusCode, b)
		}
		resp, b = postVia(t, via, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if resp.StatusCode != 200 || !strings.HasPrefix(b, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n") || strings.Contains(b, `{"choi`+"\n") {
			t.Fatalf("cut stream relayed badly: %d %q", resp.StatusCode, b)
		}
		if !strings.Contains(b, `data: {"error"`) {
			t.Errorf("a stream cut mid-event ended without an error event: %q", b)
		}
		if n := metricValue(t, s, `pdlb_requests_total{model="m",code="200"}`); n != 0 {
			t.Errorf("a stream cut mid-event counted as %v successes", n)
		}
		waitIdle(t, s)
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

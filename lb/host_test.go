package lb_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"pdlb/lb/config"
)

// TestPodHost: every attempt names its pod in the Host header, on either
// front end, a retry on another pod included (on gnet the first attempt
// goes from the event loop, the retry from a worker through the pod's
// client).
func TestPodHost(t *testing.T) {
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			// The first request to either pod is answered 503, which
			// upstream.retry.on sends to the other; every other answer
			// says which Host the pod got and which address it has.
			var answered atomic.Int32
			serve := func(c net.Conn, r *http.Request) {
				if answered.Add(1) == 1 {
					io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
					return
				}
				got := r.Host + " " + c.LocalAddr().String()
				io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(got), got))
			}
			pods := []config.Pod{{Name: "a", Model: "m", Address: fakePod(t, serve)}, {Name: "b", Model: "m", Address: fakePod(t, serve)}}
			s := testGateway(t, pods, func(c *config.Config) {
				c.Frontend = frontend
				c.Upstream.Retry.On = append(c.Upstream.Retry.On, config.RetryOn503)
			})
			for i := range 3 {
				resp, b := post(t, s, "/v1/chat/completions", chatBody)
				host, addr, _ := strings.Cut(b, " ")
				if resp.StatusCode != 200 || host != addr {
					t.Fatalf("request %d: %d, the pod got Host %q at %q", i, resp.StatusCode, host, addr)
				}
			}
			if n := answered.Load(); n != 4 {
				t.Fatalf("the pods answered %d requests, want 4 (one retried)", n)
			}
		})
	}
}

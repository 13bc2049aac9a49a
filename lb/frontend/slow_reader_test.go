package frontend_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"pdlb/lb/frontend"
)

// TestSlowSteadyReader: a client that reads a large answer slowly but
// without stopping gets all of it, though it takes several IdleTimeouts:
// the timeout is for a client that makes no progress.
func TestSlowSteadyReader(t *testing.T) {
	for _, name := range frontEnds {
		for _, onLoop := range []bool{false, true} {
			if onLoop && name != frontend.NameGNet {
				continue
			}
			t.Run(name+map[bool]string{true: "/loop"}[onLoop], func(t *testing.T) {
				a := newApp()
				a.onLoop = onLoop
				addr := serveWith(t, name, a.handler(), frontend.Options{MaxBodyBytes: testMaxBody, IdleTimeout: time.Second})
				c := dial(t, addr)
				_ = c.tcp.SetReadBuffer(64 << 10)
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				const n = 8 << 20
				c.send(t, "GET /big?n="+strconv.Itoa(n)+" HTTP/1.1\r\nHost: x\r\n\r\n")
				resp, err := http.ReadResponse(c.br, nil)
				if err != nil {
					t.Fatal(err)
				}
				start, got := time.Now(), 0
				buf := make([]byte, 128<<10)
				for got < n {
					k, err := io.ReadFull(resp.Body, buf[:min(len(buf), n-got)])
					if got += k; err != nil {
						t.Fatalf("after %v, %d of %d bytes: %v", time.Since(start).Round(time.Millisecond), got, n, err)
					}
					time.Sleep(40 * time.Millisecond)
				}
			})
		}
	}
}

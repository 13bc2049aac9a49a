package frontend_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/lb/frontend"
)

// BenchmarkRequestDuringHandshakes times requests on one kept TLS
// connection to the gnet front end while other clients run full
// handshakes in a loop (handshakes>0), against none: handshakes run on
// goroutines of their own, so the kept connection's requests wait only
// for a core, not for a loop busy with public-key work.
func BenchmarkRequestDuringHandshakes(b *testing.B) {
	ts := newTLSSetup(b)
	addr := serveWith(b, frontend.NameGNet, newApp().handler(), ts.options())
	for _, n := range []int{0, 4} {
		b.Run(map[int]string{0: "handshakes=0", 4: "handshakes=4"}[n], func(b *testing.B) {
			b.ReportAllocs()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var done atomic.Int64
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ts.ca.Pool, ServerName: "localhost", ClientSessionCache: nil})
						if err == nil {
							done.Add(1)
							c.Close()
						}
					}
				}()
			}
			c, err := tls.Dial("tcp", addr, ts.clientConfig("http/1.1"))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			req := []byte(post("/echo", "x"))
			start := time.Now()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(done.Load())/time.Since(start).Seconds(), "handshakes/s")
		})
	}
}

package frontend_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"pdlb/lb/frontend"
)

// TestHTTP2Shutdown: a shutdown sends an h2 client GOAWAY, lets its open
// stream run to its end, and then returns.
func TestHTTP2Shutdown(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			a := newApp()
			s, err := frontend.Start(name, "127.0.0.1:0", a.handler(), frontend.Options{MaxBodyBytes: testMaxBody})
			if err != nil {
				t.Fatal(err)
			}
			fr := rawH2(t, s.Addr(), nil)
			h2Get(fr, 1, "/sse?n=2&gated=1")
			data := func(end bool) func(http2.Frame) bool {
				return func(f http2.Frame) bool {
					d, ok := f.(*http2.DataFrame)
					return ok && d.StreamID == 1 && (!end || d.StreamEnded())
				}
			}
			a.step <- struct{}{}
			h2Until(t, fr, "the first event", data(false))

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- s.ShutdownWithContext(ctx)
			}()
			h2Until(t, fr, "GOAWAY", func(f http2.Frame) bool {
				ga, ok := f.(*http2.GoAwayFrame)
				if ok && (ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1) {
					t.Fatalf("GOAWAY %v, last stream %d; want NO_ERROR, 1", ga.ErrCode, ga.LastStreamID)
				}
				return ok
			})
			select {
			case err := <-done:
				t.Fatalf("shutdown returned with a stream open: %v", err)
			default:
			}
			a.step <- struct{}{}
			h2Until(t, fr, "the stream's end", data(true))
			if err := <-done; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		})
	}
}

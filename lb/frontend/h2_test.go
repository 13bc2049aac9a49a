package frontend_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

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
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/sse?n=2&gated=1"}, {Name: ":authority", Value: "x"}} {
				_ = enc.WriteField(f)
			}
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: true})
			// until reads frames until want says stop.
			until := func(what string, want func(http2.Frame) bool) {
				t.Helper()
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						t.Fatalf("waiting for %s: %v", what, err)
					}
					if want(f) {
						return
					}
				}
			}
			data := func(end bool) func(http2.Frame) bool {
				return func(f http2.Frame) bool {
					d, ok := f.(*http2.DataFrame)
					return ok && d.StreamID == 1 && (!end || d.StreamEnded())
				}
			}
			a.step <- struct{}{}
			until("the first event", data(false))

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- s.ShutdownWithContext(ctx)
			}()
			until("GOAWAY", func(f http2.Frame) bool {
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
			until("the stream's end", data(true))
			if err := <-done; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		})
	}
}

package frontend_test

import (
	"testing"

	"golang.org/x/net/http2"

	"pdlb/lb/frontend"
)

// TestHTTP2StreamCapCountsOpen: a client that keeps max_concurrent_streams
// streams open, opening the next as soon as one ended, is never refused:
// a stream whose request and answer both ended is closed (RFC 9113 5.1.2),
// even before its handler let go of it.
func TestHTTP2StreamCapCountsOpen(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			o := frontend.Options{MaxBodyBytes: testMaxBody, HTTP2: frontend.HTTP2{MaxConcurrentStreams: 1}}
			fr := rawH2(t, serveWith(t, name, newApp().handler(), o), nil)
			for i := range 3000 {
				id := uint32(2*i + 1)
				h2Get(fr, id, "/big?n=1")
				if got := h2Outcome(fr, id); got != "status 200" {
					t.Fatalf("stream %d: %s", id, got)
				}
				h2Until(t, fr, "the answer's end", func(f http2.Frame) bool {
					d, ok := f.(*http2.DataFrame)
					return ok && d.StreamID == id && d.StreamEnded()
				})
			}
		})
	}
}

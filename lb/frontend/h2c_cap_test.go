package frontend_test

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"pdlb/lb/frontend"
	"pdlb/lb/limits"
)

// TestH2CKeepsItsPlace: an h2c connection the gnet loop hands to the
// HTTP/2 server keeps its place under the per-address cap, and gives it
// back when it closes; a client at its cap is served over h2c as over
// HTTP/1.1. (Taking the place again on the HTTP/2 server's goroutine
// raced the loop's giving it back.)
func TestH2CKeepsItsPlace(t *testing.T) {
	conns := limits.NewConns(limits.ConnLimits{MaxConnsPerIP: 1})
	addr := serveWith(t, frontend.NameGNet, newApp().handler(), frontend.Options{MaxBodyBytes: testMaxBody, Conns: conns})
	for i := range 200 {
		fr, c := rawH2Conn(t, addr, nil)
		h2Get(fr, 1, "/big?n=1")
		h2Until(t, fr, fmt.Sprintf("connection %d's answer", i), func(f http2.Frame) bool {
			if ga, ok := f.(*http2.GoAwayFrame); ok {
				t.Fatalf("connection %d: GOAWAY %v", i, ga.ErrCode)
			}
			d, ok := f.(*http2.DataFrame)
			return ok && d.StreamEnded()
		})
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		_ = c.Close()
		deadline := time.Now().Add(5 * time.Second)
		for conns.Open() > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := conns.Open(); n != 0 {
			t.Fatalf("connection %d closed, %d still counted open", i, n)
		}
	}
}

package gateway

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"pdlb/lb/upstream"

	"github.com/valyala/fasthttp"
)

// TestNotSent: what may go to another pod is what the pod never received.
func TestNotSent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{fasthttp.ErrDialTimeout, true},
		{fmt.Errorf("pod p: %w", fasthttp.ErrNoFreeConns), true},
		{fasthttp.ErrConnectionClosed, false},
		{fasthttp.ErrTimeout, false},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, false},
	} {
		if got := upstream.NotSent(tc.err); got != tc.want {
			t.Errorf("upstream.NotSent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestIsHopByHop(t *testing.T) {
	for _, h := range hopByHop {
		for _, k := range []string{string(h), strings.ToLower(string(h)), strings.ToUpper(string(h))} {
			if !isHopByHop([]byte(k)) {
				t.Errorf("%q is hop-by-hop", k)
			}
		}
	}
	for _, k := range []string{"", "X", "Content-Type", "Connections", "Authorization", "X-Request-Id", "Proxy-Authorization-X"} {
		if isHopByHop([]byte(k)) {
			t.Errorf("%q is not hop-by-hop", k)
		}
	}
}

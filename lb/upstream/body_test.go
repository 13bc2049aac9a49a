package upstream

import (
	"errors"
	"fmt"
	"net"
	"testing"

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
		if got := NotSent(tc.err); got != tc.want {
			t.Errorf("NotSent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

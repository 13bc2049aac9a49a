package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/internal/racebuild"
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

// TestReadBodyWholeKeepsBuffers: a whole answer read from its stream
// allocates no buffer once fasthttp's body pool has sized itself (it
// counts 42,000 releases, then drops a buffer over the size it counted):
// the one allocation left is io.LimitReader's.
func TestReadBodyWholeKeepsBuffers(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	body := bytes.Repeat([]byte("x"), 1024)
	r := bytes.NewReader(body)
	read := func() {
		resp := fasthttp.AcquireResponse()
		r.Reset(body)
		resp.SetBodyStream(r, len(body))
		if err := readBodyWhole(resp, 1<<20); err != nil || !bytes.Equal(resp.Body(), body) {
			t.Fatalf("read %d bytes: %v", len(resp.Body()), err)
		}
		fasthttp.ReleaseResponse(resp)
	}
	for range 50_000 {
		read()
	}
	if n := testing.AllocsPerRun(1000, read); n > 1 {
		t.Errorf("%.1f allocations a read, want 1 at most", n)
	}
}

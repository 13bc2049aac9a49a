package rawio

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// ring is a Ring for t, or a skip where the kernel has none.
func ring(t *testing.T, entries int) *Ring {
	t.Helper()
	r, err := NewRing(entries)
	if errors.Is(err, ErrRingUnsupported) {
		t.Skipf("no io_uring here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestRingBatch: one Submit carries sends on several sockets and then the
// receives of what they sent, each result in the order queued.
func TestRingBatch(t *testing.T) {
	r := ring(t, 8)
	const n = 5
	var a, b [n]int
	for i := range n {
		a[i], b[i] = pair(t)
	}
	for i := range n {
		r.Send(a[i], bytes.Repeat([]byte{byte('a' + i)}, 100+i))
	}
	if r.Len() != n {
		t.Fatalf("Len %d, want %d", r.Len(), n)
	}
	for i, res := range r.Submit() {
		if res.Err != nil || res.N != 100+i {
			t.Fatalf("send %d: %+v, want %d bytes", i, res, 100+i)
		}
	}
	bufs := make([][]byte, n)
	for i := range n {
		bufs[i] = make([]byte, 1024)
		r.Recv(b[i], bufs[i])
	}
	for i, res := range r.Submit() {
		if res.Err != nil || res.N != 100+i || !bytes.Equal(bufs[i][:res.N], bytes.Repeat([]byte{byte('a' + i)}, 100+i)) {
			t.Fatalf("recv %d: %+v, %q", i, res, bufs[i][:max(res.N, 0)])
		}
	}
	if r.Len() != 0 {
		t.Fatalf("Len %d after Submit", r.Len())
	}
}

// TestRingNoWait: a receive with nothing there and a send to a full
// socket complete at once with EAGAIN, as recvfrom and sendto do; once
// the peer shut its side, a receive past what came reads 0.
func TestRingNoWait(t *testing.T) {
	r := ring(t, 4)
	a, b := pair(t)
	p := make([]byte, 64)
	r.Recv(b, p)
	if res := r.Submit(); res[0].Err != syscall.EAGAIN {
		t.Fatalf("receive with nothing there: %+v, want EAGAIN", res[0])
	}
	big := make([]byte, 1<<20)
	for {
		r.Send(a, big)
		res := r.Submit()[0]
		if res.Err == syscall.EAGAIN {
			break
		}
		if res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	if err := syscall.Shutdown(a, syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	for {
		r.Recv(b, big)
		res := r.Submit()[0]
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		if res.N == 0 {
			break
		}
	}
}

// TestRingProbe: the kernel's probe says which ops it runs; one it does
// not is ErrRingUnsupported.
func TestRingProbe(t *testing.T) {
	r := ring(t, 2)
	if err := r.probe(opSend, opRecv); err != nil {
		t.Fatal(err)
	}
	if err := r.probe(opSend, 255); !errors.Is(err, ErrRingUnsupported) {
		t.Fatalf("probe of op 255: %v, want ErrRingUnsupported", err)
	}
}

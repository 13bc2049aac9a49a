package rawio

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"pdlb/internal/racebuild"
)

// pair returns the two ends of a non-blocking stream socket pair, closed
// when tb ends.
func pair(tb testing.TB) (a, b int) {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = unix.Close(fds[0]); _ = unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// TestSendRecv: what Send and Sendv send, Recv gets in order, and Sendv's
// scratch keeps no buffer; a full socket takes part, then says EAGAIN;
// empty buffers send nothing; a closed peer reads as 0 bytes and a send
// to it fails with EPIPE.
func TestSendRecv(t *testing.T) {
	a, b := pair(t)
	var vec []unix.Iovec
	if n, err := Sendv(a, [][]byte{[]byte("he"), nil, []byte("llo")}, &vec); n != 5 || err != nil {
		t.Fatalf("Sendv: %d, %v", n, err)
	}
	for _, e := range vec {
		if e.Base != nil {
			t.Fatal("Sendv's scratch holds a buffer after the call")
		}
	}
	if n, err := Send(a, []byte(" world")); n != 6 || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	p := make([]byte, 64)
	if n, err := Recv(b, p); string(p[:n]) != "hello world" || err != nil {
		t.Fatalf("Recv: %q, %v", p[:n], err)
	}
	if _, err := Recv(b, p); err != syscall.EAGAIN {
		t.Fatalf("Recv with nothing there: %v, want EAGAIN", err)
	}
	if n, err := Send(a, nil); n != 0 || err != nil {
		t.Fatalf("Send of nothing: %d, %v", n, err)
	}
	if n, err := Sendv(a, [][]byte{nil, {}}, &vec); n != 0 || err != nil {
		t.Fatalf("Sendv of nothing: %d, %v", n, err)
	}

	big := bytes.Repeat([]byte("x"), 8<<20)
	n, err := Send(a, big)
	if err != nil || n == 0 || n == len(big) {
		t.Fatalf("Send of 8 MiB: %d, %v: want part of it", n, err)
	}
	if _, err := Send(a, big); err != syscall.EAGAIN {
		t.Fatalf("Send to a full socket: %v, want EAGAIN", err)
	}
	if _, err := Sendv(a, [][]byte{big}, &vec); err != syscall.EAGAIN {
		t.Fatalf("Sendv to a full socket: %v, want EAGAIN", err)
	}

	c, d := pair(t)
	_ = unix.Close(d)
	if n, err := Recv(c, p); n != 0 || err != nil {
		t.Fatalf("Recv after the peer closed: %d, %v, want 0, nil", n, err)
	}
	if _, err := Send(c, []byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Send after the peer closed: %v, want EPIPE (and no SIGPIPE)", err)
	}
}

// TestNoAllocs: a send or a receive allocates nothing, errors included.
func TestNoAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	a, b := pair(t)
	var vec []unix.Iovec
	iov, p := [][]byte{[]byte("head"), []byte("body")}, make([]byte, 64)
	if n := testing.AllocsPerRun(100, func() {
		_, _ = Sendv(a, iov, &vec)
		_, _ = Send(a, iov[0])
		_, _ = Recv(b, p)
		_, _ = Recv(b, p)
		_, _ = Recv(b, p) // EAGAIN
	}); n != 0 {
		t.Errorf("%.1f allocations, want 0", n)
	}
}

// BenchmarkSend: an answer's head and body (200 + 1,024 bytes) to a
// socket, with the writev that gnet's Writev makes against Sendv, and
// its read with the read(2) that gnet makes against Recv. The peer is
// drained every 16 sends, the same reads for both.
func BenchmarkSend(b *testing.B) {
	head, body := bytes.Repeat([]byte("h"), 200), bytes.Repeat([]byte("b"), 1024)
	iov := [][]byte{head, body}
	for _, name := range []string{"writev", "Sendv"} {
		b.Run(name, func(b *testing.B) {
			w, r := pair(b)
			var vec []unix.Iovec
			drain := make([]byte, 64<<10)
			n := 0
			for b.Loop() {
				var err error
				if name == "writev" {
					_, err = unix.Writev(w, iov)
				} else {
					_, err = Sendv(w, iov, &vec)
				}
				if err != nil {
					b.Fatal(err)
				}
				if n++; n%16 == 0 {
					for {
						if k, _ := unix.Read(r, drain); k <= 0 {
							break
						}
					}
				}
			}
		})
	}
}

// BenchmarkRecv: 1,224-byte reads with read(2), as syscall.Read and
// gnet make them, against Recv. The socket is refilled every 16 reads,
// off the clock.
func BenchmarkRecv(b *testing.B) {
	msg := bytes.Repeat([]byte("a"), 1224*16)
	for _, name := range []string{"read", "Recv"} {
		b.Run(name, func(b *testing.B) {
			w, r := pair(b)
			p := make([]byte, 1224)
			n := 0
			for b.Loop() {
				if n%16 == 0 {
					b.StopTimer()
					if _, err := unix.Write(w, msg); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				n++
				var err error
				if name == "read" {
					_, err = syscall.Read(r, p)
				} else {
					_, err = Recv(r, p)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

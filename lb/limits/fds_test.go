package limits

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFDReserve(t *testing.T) {
	for _, c := range []struct{ limit, want int }{{0, 16}, {128, 16}, {1024, 64}, {20000, 256}, {1 << 20, 256}} {
		if got := FDReserve(c.limit); got != c.want {
			t.Errorf("FDReserve(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
	f := FDsFor(1024, nil)
	if !f.Accept(959) || f.Accept(960) || f.Accept(1023) {
		t.Fatal("accept line not at limit-64")
	}
	var none *FDs
	if !none.Accept(1 << 20) {
		t.Fatal("a nil guard refused")
	}
}

// TestFDsOpenEstimate: connections closed low in the table leave holes,
// so a socket's number can be far below how many descriptors are in use;
// with an estimate of those (SetOpen) the guard goes by the larger.
func TestFDsOpenEstimate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f := FDsFor(1024, nil)
	open := 900
	f.SetOpen(func() int { return open })
	if !f.Accept(10) || f.Accept(1000) {
		t.Fatal("under the line by both the number and the estimate: refused")
	}
	open = 960
	if f.Accept(10) {
		t.Fatal("a low socket number accepted with the table at the line by the estimate")
	}
	if _, err := f.Dial(ln.Addr().String(), time.Second); err != nil {
		t.Fatalf("a dial under the dial line (992): %v", err)
	}
	open = 991 // with the dial itself counted twice, over it
	if _, err := f.Dial(ln.Addr().String(), time.Second); !errors.Is(err, ErrOutOfFDs) {
		t.Fatalf("a dial over the line by the estimate: %v", err)
	}
	f.SetOpen(nil)
	if !f.Accept(10) {
		t.Fatal("the estimate taken back, a low socket refused")
	}
}

// A dial over the line never connects: the pod sees nothing, and the
// error says so in a dial error.
func TestFDsDialRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	var logged bytes.Buffer
	full := FDsFor(0, slogTo(&logged))
	_, err = full.Dial(ln.Addr().String(), time.Second)
	var op *net.OpError
	if !errors.Is(err, ErrOutOfFDs) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("dial over the line: %v, want ErrOutOfFDs in a dial error", err)
	}
	_, _ = full.Dial(ln.Addr().String(), time.Second)
	if full.refused.Load() != 2 || full.shed.Load() != 0 {
		t.Fatalf("refused %d shed %d, want 2 and 0", full.refused.Load(), full.shed.Load())
	}
	if n := strings.Count(logged.String(), "open-files limit"); n != 1 {
		t.Fatalf("%d warnings for two refusals within a minute, want 1:\n%s", n, logged.String())
	}
	select {
	case <-accepted:
		t.Fatal("the refused dial connected")
	case <-time.After(50 * time.Millisecond):
	}
	room := FDsFor(1<<20, nil)
	c, err := room.Dial(ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-accepted
}

func TestOutOfFDs(t *testing.T) {
	emfile := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	if err := OutOfFDs(emfile); !errors.Is(err, ErrOutOfFDs) || !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("EMFILE became %v", err)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	if err := OutOfFDs(refused); err != refused {
		t.Fatalf("a refused connection became %v", err)
	}
	if OutOfFDs(nil) != nil || NoFDs(nil) || NoFDs(refused) || !NoFDs(emfile) || !NoFDs(OutOfFDs(emfile)) {
		t.Fatal("NoFDs or OutOfFDs wrong on nil, a refused connection or EMFILE")
	}
}

// On fasthttp's listener, a connection over the line is reset at once and
// Accept goes on to the next, returning none of them.
func TestFDsWrap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := FDsFor(0, nil)
	wrapped := f.Wrap(ln)
	returned := make(chan error, 1)
	go func() {
		c, err := wrapped.Accept()
		if err == nil {
			c.Close()
		}
		returned <- err
	}()
	for i := 0; i < 2; i++ {
		// The reset may come before connect returns, or at the first read.
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("shed connection %d: %v, want a reset", i, err)
		}
	}
	if f.shed.Load() != 2 {
		t.Fatalf("shed %d, want 2", f.shed.Load())
	}
	wrapped.Close()
	if err := <-returned; err == nil {
		t.Fatal("Accept returned a connection over the line")
	}
	if FDsFor(0, nil).Wrap(ln) == ln || (*FDs)(nil).Wrap(ln) != ln {
		t.Fatal("Wrap: a guard must wrap, nil must not")
	}
}

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// An accept the kernel refused for want of descriptors is counted under
// at="listen" and warned of, once a minute; a nil guard takes it too.
func TestFDsAcceptFailed(t *testing.T) {
	var log strings.Builder
	f := FDsFor(1024, slogTo(&log))
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	f.AcceptFailed(emfile)
	// fasthttp's listener: Wrap tells the guard of a failed accept.
	if _, err := f.Wrap(failingListener{emfile}).Accept(); err != emfile {
		t.Fatalf("Accept returned %v, want the listener's error", err)
	}
	if _, err := f.Wrap(failingListener{net.ErrClosed}).Accept(); err != net.ErrClosed {
		t.Fatalf("Accept returned %v, want the listener's error", err)
	}
	(*FDs)(nil).AcceptFailed(emfile)
	var out strings.Builder
	f.WritePrometheus(&out)
	if !strings.Contains(out.String(), MetricFDRefused+`{at="listen"} 2`) {
		t.Fatalf("want 2 accepts counted at listen in:\n%s", out.String())
	}
	if n := strings.Count(log.String(), "accept failed"); n != 1 || !strings.Contains(log.String(), "too many open files") {
		t.Fatalf("want one warning naming the error, got %d:\n%s", n, log.String())
	}
}

// failingListener's Accept fails with err.
type failingListener struct{ err error }

func (l failingListener) Accept() (net.Conn, error) { return nil, l.err }
func (failingListener) Close() error                { return nil }
func (failingListener) Addr() net.Addr              { return &net.TCPAddr{} }

package limits

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func TestClientOf(t *testing.T) {
	f := func(addr net.Addr, want string) {
		t.Helper()
		got := clientOf(addr)
		if (want == "" && got.IsValid()) || (want != "" && got.String() != want) {
			t.Fatalf("clientOf(%v) = %v, want %q", addr, got, want)
		}
	}
	f(&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5}, "10.1.2.3")
	f(&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5}, "10.1.2.3")
	f(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 5}, "2001:db8:1:2::")
	f(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::1"), Port: 5}, "2001:db8:1:2::")
	f(&net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 9}, "192.0.2.1")
	f(&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "")
	f(nil, "")
}

func TestConnsAcquire(t *testing.T) {
	cs := NewConns(ConnLimits{MaxConnsPerIP: 2})
	a := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 1}
	b := &net.TCPAddr{IP: net.ParseIP("10.0.0.2"), Port: 1}
	a6 := &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}
	a6same64 := &net.TCPAddr{IP: net.ParseIP("2001:db8::2"), Port: 1}
	unix := &net.UnixAddr{Name: "/s", Net: "unix"}
	f := func(addr net.Addr, acquire, want bool) {
		t.Helper()
		if !acquire {
			cs.Release(addr)
			return
		}
		if got := cs.Acquire(addr); got != want {
			t.Fatalf("Acquire(%v) = %v", addr, got)
		}
	}
	f(a, true, true)
	f(a, true, true)
	f(a, true, false)
	f(b, true, true)
	f(a, false, false)
	f(a, true, true)
	f(a6, true, true)
	f(a6same64, true, true)
	f(a6, true, false)
	for range 5 {
		f(unix, true, true) // not an IP: never capped
	}
	if cs.Open() != 10 || cs.Refused() != 2 {
		t.Fatalf("open %d refused %d", cs.Open(), cs.Refused())
	}
	for _, addr := range []net.Addr{a, a, b, a6, a6same64, unix, unix, unix, unix, unix} {
		cs.Release(addr)
	}
	if cs.Open() != 0 || len(cs.perIP) != 0 {
		t.Fatalf("open %d, addresses %v", cs.Open(), cs.perIP)
	}
}

// serve wraps a loopback listener and accepts into a channel until it is
// closed.
func serve(t *testing.T, l ConnLimits) (*Conns, net.Listener, chan net.Conn) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cs := NewConns(l)
	ln := cs.Wrap(raw, nil)
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for c := range accepted {
			c.Close()
		}
	})
	return cs, ln, accepted
}

func dial(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestWrapCapsPerIP: beyond the cap a connection is reset at once, and
// closing one frees its place.
func TestWrapCapsPerIP(t *testing.T) {
	cs, ln, accepted := serve(t, ConnLimits{MaxConnsPerIP: 2})
	dial(t, ln)
	first := <-accepted
	dial(t, ln)
	<-accepted
	// The refused connection is reset by the server: the reset may even
	// beat the dialer's check of the handshake, else the first read ends
	// with it (or EOF) rather than blocking.
	if over, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		defer over.Close()
		over.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := over.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read on a refused connection: %v", err)
		}
	}
	if cs.Refused() != 1 || cs.Open() != 2 {
		t.Fatalf("refused %d open %d", cs.Refused(), cs.Open())
	}
	first.Close()
	first.Close() // counted once
	dial(t, ln)
	<-accepted
	if cs.Open() != 2 {
		t.Fatalf("open %d after a close and a new connection", cs.Open())
	}
}

// TestWrapIdle: a read that sees no byte for IdleTimeout fails with a
// timeout, a caller's earlier deadline wins, and a later one does not
// extend the idle limit.
func TestWrapIdle(t *testing.T) {
	const idle = 50 * time.Millisecond
	_, ln, accepted := serve(t, ConnLimits{IdleTimeout: idle})
	client := dial(t, ln)
	server := <-accepted

	// A byte in time resets the idle clock.
	go client.Write([]byte("x"))
	if _, err := server.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// Silence: the read times out although the caller set no deadline.
	if err := server.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("idle read: %v", err)
	}
	// A caller's deadline in the past applies at once.
	server.SetReadDeadline(time.Unix(1, 0))
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the caller's deadline: %v", err)
	}
	// A caller's deadline far away does not lift the idle limit.
	server.SetDeadline(time.Now().Add(time.Hour))
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("idle read under a far deadline: %v", err)
	}
	// Writes to a client that does not read stall and time out too.
	server.SetWriteDeadline(time.Time{})
	buf := make([]byte, 1<<20)
	var err error
	for err == nil {
		_, err = server.Write(buf)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled write: %v", err)
	}
}

// TestWrapNoIdle: with no idle limit the caller's deadlines are the only
// ones.
func TestWrapNoIdle(t *testing.T) {
	_, ln, accepted := serve(t, ConnLimits{})
	client := dial(t, ln)
	server := <-accepted
	server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the caller's deadline: %v", err)
	}
	server.SetReadDeadline(time.Time{})
	go client.Write([]byte("hi"))
	if _, err := io.ReadFull(server, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
}

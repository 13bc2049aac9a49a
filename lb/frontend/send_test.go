package frontend

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// sockConn is a gnet.Conn on one end of a real socket pair: what sendv
// or send leaves to gnet's Writev and Write lands in rest, as gnet would
// buffer it, and out stands for gnet's outbound buffer.
type sockConn struct {
	gnet.Conn
	fd   int
	out  int
	rest []byte
}

func (c *sockConn) Fd() int               { return c.fd }
func (c *sockConn) OutboundBuffered() int { return c.out }
func (c *sockConn) Write(b []byte) (int, error) {
	c.rest = append(c.rest, b...)
	return len(b), nil
}
func (c *sockConn) Writev(bs [][]byte) (int, error) {
	n := 0
	for _, b := range bs {
		c.rest = append(c.rest, b...)
		n += len(b)
	}
	return n, nil
}

// socketPair returns a non-blocking stream socket's fd wrapped as a
// sockConn and its peer as a file, both closed when t ends.
func socketPair(t *testing.T) (*sockConn, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := os.NewFile(uintptr(fds[1]), "peer")
	t.Cleanup(func() { _ = unix.Close(fds[0]); _ = peer.Close() })
	return &sockConn{fd: fds[0]}, peer
}

// TestSendvRest: what the socket takes goes out first, the rest to
// gnet's Writev in order, from within a buffer as well as at a boundary;
// with bytes already in gnet's buffer, everything goes there, so nothing
// overtakes them; a failed send hands gnet everything, to meet the error
// and close the connection.
func TestSendvRest(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than a socket takes
	iov := func() [][]byte { return [][]byte{[]byte("head "), big, nil, []byte(" tail")} }
	want := bytes.Join(iov(), nil)

	t.Run("partial", func(t *testing.T) {
		c, peer := socketPair(t)
		var vec []unix.Iovec
		if err := sendv(c, iov(), &vec); err != nil {
			t.Fatal(err)
		}
		sent := len(want) - len(c.rest)
		if sent == 0 || len(c.rest) == 0 {
			t.Fatalf("sent %d, left %d of %d bytes: want both", sent, len(c.rest), len(want))
		}
		got := make([]byte, sent)
		if _, err := io.ReadFull(peer, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(got, c.rest...), want) {
			t.Fatal("the bytes sent and the rest are not the whole in order")
		}
	})
	t.Run("send", func(t *testing.T) {
		c, peer := socketPair(t)
		if err := send(c, want); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want)-len(c.rest))
		if _, err := io.ReadFull(peer, got); err != nil {
			t.Fatal(err)
		}
		if len(c.rest) == 0 || !bytes.Equal(append(got, c.rest...), want) {
			t.Fatalf("sent %d, left %d: want a part each, whole in order", len(got), len(c.rest))
		}
	})
	t.Run("buffered", func(t *testing.T) {
		c, _ := socketPair(t)
		c.out = 1
		var vec []unix.Iovec
		if err := sendv(c, iov(), &vec); err != nil {
			t.Fatal(err)
		}
		if err := send(c, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(c.rest, append(want, 'x')) {
			t.Fatalf("%d bytes to gnet's buffer, want all %d", len(c.rest), len(want)+1)
		}
	})
	t.Run("failed", func(t *testing.T) {
		c, peer := socketPair(t)
		_ = peer.Close()
		var vec []unix.Iovec
		if err := sendv(c, [][]byte{[]byte("a"), []byte("b")}, &vec); err != nil {
			t.Fatal(err)
		}
		if err := send(c, []byte("c")); err != nil {
			t.Fatal(err)
		}
		if string(c.rest) != "abc" {
			t.Fatalf("gnet got %q, want every byte after the failed sends", c.rest)
		}
	})
}

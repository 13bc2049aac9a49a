package upstream

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"pdlb/internal/racebuild"
)

// dialPod opens a pod connection to a listener whose first connection
// serve has (nil: none is taken), and closes both when the test ends.
func dialPod(t *testing.T, serve func(pod net.Conn)) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if serve != nil {
		go func() {
			pod, err := ln.Accept()
			if err != nil {
				return
			}
			defer pod.Close()
			serve(pod)
		}()
	}
	c, err := Dialer(nil)(ln.Addr().String(), time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readLine reads c up to and with a newline.
func readLine(t *testing.T, c net.Conn) string {
	t.Helper()
	var sb strings.Builder
	b := make([]byte, 64<<10)
	for !strings.HasSuffix(sb.String(), "\n") {
		n, err := c.Read(b)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", sb.Len(), err)
		}
		sb.Write(b[:n])
	}
	return sb.String()
}

// TestUpstreamConnHoldsLastWrite: a plain connection holds a request's
// last write back until its answer is read, and that read sends it
// before it waits: a read made as a plain one would come before any
// answer could, a system call that only says EAGAIN. The bytes go out
// in the order written, whole when the socket takes only part of them
// at once, or at once when they are more than maxHeld.
func TestUpstreamConnHoldsLastWrite(t *testing.T) {
	t.Run("in order", func(t *testing.T) {
		_, c := dialEchoPod(t, "")
		// "a" goes out as "b\n" comes, which the read sends.
		if _, err := io.WriteString(c, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "b\n"); err != nil {
			t.Fatal(err)
		}
		if got := readLine(t, c); got != "1:ab\n" {
			t.Fatalf("got %q, want 1:ab", got)
		}
		if c.(*Conn).held != nil {
			t.Fatal("bytes still held after the answer was read")
		}
	})

	t.Run("not sent before the read", func(t *testing.T) {
		early := make(chan error, 1)
		c := dialPod(t, func(pod net.Conn) {
			_ = pod.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			_, err := pod.Read(make([]byte, 8))
			early <- err
			_ = pod.SetReadDeadline(time.Time{})
			line, _ := bufio.NewReader(pod).ReadString('\n')
			io.WriteString(pod, "got "+line)
		})
		if _, err := io.WriteString(c, "a\n"); err != nil {
			t.Fatal(err)
		}
		if err := <-early; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the pod's read before the answer's read: %v; want the bytes held", err)
		}
		if got := readLine(t, c); got != "got a\n" {
			t.Fatalf("got %q", got)
		}
	})

	t.Run("more than the socket takes at once", func(t *testing.T) {
		c := dialPod(t, func(pod net.Conn) {
			// Reads only after a while, each line answered with its
			// length.
			time.Sleep(50 * time.Millisecond)
			br := bufio.NewReader(pod)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				io.WriteString(pod, strconv.Itoa(len(line))+"\n")
			}
		})
		// The socket's buffers filled first, so the held bytes' write
		// finds no room.
		filled, fill := 0, []byte(strings.Repeat("x", 64<<10))
		_ = c.(*Conn).cur.Load().raw.Write(func(fd uintptr) bool {
			for {
				n, err := syscall.Write(int(fd), fill)
				if err != nil {
					return true
				}
				filled += n
			}
		})
		if _, err := io.WriteString(c, "a\n"); err != nil {
			t.Fatal(err)
		}
		if got, want := readLine(t, c), strconv.Itoa(filled+2)+"\n"; got != want {
			t.Fatalf("the pod got %q bytes, want %q", got, want)
		}
		// More than maxHeld go out at once.
		line := strings.Repeat("y", maxHeld) + "\n"
		if _, err := io.WriteString(c, line); err != nil {
			t.Fatal(err)
		}
		if got, want := readLine(t, c), strconv.Itoa(len(line))+"\n"; got != want {
			t.Fatalf("the pod got %q bytes, want %q", got, want)
		}
	})

	t.Run("pod closed after the request", func(t *testing.T) {
		c := dialPod(t, func(pod net.Conn) { bufio.NewReader(pod).ReadString('\n') })
		io.WriteString(c, "a\n")
		// io.EOF itself, as net returns it: fasthttp tells a pod's close
		// by it.
		if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("read: %d bytes, %v; want io.EOF", n, err)
		}
	})

	t.Run("deadline while waiting", func(t *testing.T) {
		c := dialPod(t, nil)
		io.WriteString(c, "a\n")
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := c.Read(make([]byte, 8))
		var oe *net.OpError
		if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("read: %d bytes, %v; want a read's timeout", n, err)
		}
	})

	t.Run("closed while waiting", func(t *testing.T) {
		c := dialPod(t, nil)
		io.WriteString(c, "a\n")
		time.AfterFunc(50*time.Millisecond, func() { c.Close() })
		if n, err := c.Read(make([]byte, 8)); n != 0 || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read: %d bytes, %v; want net.ErrClosed", n, err)
		}
	})

	t.Run("pod reset the connection", func(t *testing.T) {
		p, c := dialEchoPod(t, "")
		pod := <-p.conns
		if got := exchangeLine(t, c, "a"); got != "1:a" {
			t.Fatalf("got %q", got)
		}
		// An abortive close: the pod's RST, not a FIN.
		_ = pod.(*net.TCPConn).SetLinger(0)
		pod.Close()
		time.Sleep(50 * time.Millisecond)
		uc := c.(*Conn)
		uc.sendsAgain = true // unlooked-at, as a watched call's
		if _, err := io.WriteString(c, "b\n"); err != nil {
			t.Fatalf("write: %v; want it held", err)
		}
		n, err := c.Read(make([]byte, 8))
		if n != 0 || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) || !uc.Stale() {
			t.Fatalf("read: %d bytes, %v, stale %v; want the reset, stale", n, err, uc.Stale())
		}
	})
}

// TestUpstreamConnHeldAllocs: an exchange that holds its last write back
// allocates nothing.
func TestUpstreamConnHeldAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	c := dialPod(t, func(pod net.Conn) {
		// An echo that allocates nothing per line, unlike echoPod.
		b := make([]byte, 64)
		for {
			n, err := pod.Read(b)
			if err != nil {
				return
			}
			pod.Write(b[:n])
		}
	})
	line, b := []byte("a\n"), make([]byte, 64)
	exchange := func() {
		if _, err := c.Write(line); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(b); err != nil || string(b[:n]) != "a\n" {
			t.Fatalf("read %q, %v", b[:n], err)
		}
	}
	exchange()
	if n := testing.AllocsPerRun(100, exchange); n != 0 {
		t.Fatalf("%v allocations per exchange", n)
	}
}

package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/racebuild"
)

// echoPod accepts connections and answers each line it reads with
// "<n>:<line>", n counting its connections from 1; first, if set, is what
// it sends on its first connection right after the first answer, unasked.
type echoPod struct {
	ln    net.Listener
	conns chan net.Conn
}

func startEchoPod(t *testing.T, first string) *echoPod {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &echoPod{ln: ln, conns: make(chan net.Conn, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns <- c
			go func(n int) {
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, strconv.Itoa(n)+":"+line)
					if n == 1 && i == 0 && first != "" {
						io.WriteString(c, first)
					}
				}
			}(n)
		}
	}()
	return p
}

// dialEchoPod starts an echoPod and opens a pod connection to it.
func dialEchoPod(t *testing.T, first string) (*echoPod, net.Conn) {
	t.Helper()
	p := startEchoPod(t, first)
	c, err := Dialer(nil)(p.ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

// exchangeLine writes line on c and reads the answer.
func exchangeLine(t *testing.T, c net.Conn, line string) string {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	b := make([]byte, 64)
	n, err := c.Read(b)
	if err != nil {
		t.Fatalf("read after %q: %v", line, err)
	}
	return strings.TrimSpace(string(b[:n]))
}

// TestUpstreamConnRedials: a kept connection the pod closed, or on which
// it sent what no request asked for, is dialed anew before the next
// request goes out, so the request reaches the pod; one the pod keeps is
// used as it is; a pod that is gone refuses the new dial with an error the
// gateway retries elsewhere (NotSent).
func TestUpstreamConnRedials(t *testing.T) {
	t.Run("kept", func(t *testing.T) {
		_, c := dialEchoPod(t, "")
		for _, want := range []string{"1:a", "1:b", "1:c"} {
			if got := exchangeLine(t, c, want[2:]); got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		}
	})

	t.Run("pod closed it", func(t *testing.T) {
		p, c := dialEchoPod(t, "")
		if got := exchangeLine(t, c, "a"); got != "1:a" {
			t.Fatalf("got %q", got)
		}
		(<-p.conns).Close()
		time.Sleep(50 * time.Millisecond) // the pod's FIN arrives
		if got := exchangeLine(t, c, "b"); got != "2:b" {
			t.Fatalf("after the pod closed the connection: got %q, want 2:b (on a new connection)", got)
		}
		if got := exchangeLine(t, c, "c"); got != "2:c" {
			t.Fatalf("got %q, want 2:c (the new connection kept)", got)
		}
	})

	t.Run("pod sent bytes unasked", func(t *testing.T) {
		_, c := dialEchoPod(t, "HTTP/1.1 408 Request Timeout\r\n\r\n")
		b := make([]byte, 64)
		io.WriteString(c, "a\n")
		time.Sleep(50 * time.Millisecond) // the answer and the extra bytes
		n, err := c.Read(b[:4])
		if err != nil || string(b[:n]) != "1:a\n" {
			t.Fatalf("read %q, %v", b[:n], err)
		}
		if got := exchangeLine(t, c, "b"); got != "2:b" {
			t.Fatalf("got %q, want 2:b (on a new connection)", got)
		}
	})

	t.Run("pod gone", func(t *testing.T) {
		p, c := dialEchoPod(t, "")
		if got := exchangeLine(t, c, "a"); got != "1:a" {
			t.Fatalf("got %q", got)
		}
		p.ln.Close()
		(<-p.conns).Close()
		time.Sleep(50 * time.Millisecond)
		_, err := io.WriteString(c, "b\n")
		if err == nil || !NotSent(err) {
			t.Fatalf("write to a pod that is gone: %v; want a dial error the gateway retries elsewhere", err)
		}
		// fasthttp makes ErrTimeout of an error that is a timeout itself;
		// a dial that timed out must stay a dial.
		if _, ok := err.(interface{ Timeout() bool }); ok {
			t.Fatalf("the redial's error %T says Timeout() itself", err)
		}
	})
}

// TestUpstreamConnPeekAllocs: the look at a kept connection before each
// request allocates nothing.
func TestUpstreamConnPeekAllocs(t *testing.T) {
	_, c := dialEchoPod(t, "")
	uc := c.(*Conn)
	if n := testing.AllocsPerRun(100, func() {
		if uc.cur.Load().peerDone() {
			t.Fatal("a connection the pod keeps looks closed")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per peek", n)
	}
}

// TestReadBodyWholeAllocs: a whole answer read off its stream goes into a
// buffer an earlier answer left, so the body costs no allocation of its
// own; the one left is the limit's reader. It counts after 50,000 answers,
// more than a pool that sizes itself by what was put back counts first.
func TestReadBodyWholeAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	body := bytes.Repeat([]byte("x"), 1000)
	var r bytes.Reader
	read := func() {
		r.Reset(body)
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		resp.SetBodyStream(&r, len(body))
		if err := readBodyWhole(resp, 1<<20); err != nil || len(resp.Body()) != len(body) {
			t.Fatalf("read %d bytes, %v; want %d", len(resp.Body()), err, len(body))
		}
	}
	for range 50_000 {
		read()
	}
	if n := testing.AllocsPerRun(100, read); n > 1 {
		t.Fatalf("%v allocations per body, want at most 1", n)
	}
}

// TestDeadlineSlack: a deadline is set a 64th of its distance late, the
// ones that follow within that are not set again, and an earlier one or
// none is.
func TestDeadlineSlack(t *testing.T) {
	var by atomic.Int64
	var sets []time.Time
	set := func(d time.Time) error { sets = append(sets, d); return nil }
	at := time.Now().Add(64 * time.Second)
	if err := setDeadline(&by, at, set); err != nil || len(sets) != 1 {
		t.Fatalf("first deadline: %v, %d sets", err, len(sets))
	}
	if late := sets[0].Sub(at); late < 900*time.Millisecond || late > time.Second {
		t.Fatalf("set %v late, want about a 64th of 64 s", late)
	}
	for _, d := range []time.Duration{time.Millisecond, 500 * time.Millisecond} {
		if _ = setDeadline(&by, at.Add(d), set); len(sets) != 1 {
			t.Fatalf("a deadline %v later was set again", d)
		}
	}
	for i, d := range []time.Time{at.Add(-time.Second), at.Add(2 * time.Second), {}} {
		if _ = setDeadline(&by, d, set); len(sets) != i+2 || !sets[i+1].IsZero() != !d.IsZero() {
			t.Fatalf("deadline %v not set: %v", d, sets)
		}
	}
	if _ = setDeadline(&by, time.Time{}, set); len(sets) != 4 {
		t.Fatalf("no deadline, twice: set again")
	}
}

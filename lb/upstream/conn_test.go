package upstream

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// echoPod accepts connections and answers each line it reads with
// "<n>:<line>", n counting its connections from 1; first, if set, is what
// it sends on its first connection after the first answer, unasked.
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
					answer := strconv.Itoa(n) + ":" + line
					if n == 1 && i == 0 {
						// In the answer's write: the bytes are in the
						// socket once the answer was read, before the
						// next request's peek.
						answer += first
					}
					io.WriteString(c, answer)
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
	c, err := Dialer(nil)(p.ln.Addr().String(), time.Second, nil)
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

// TestUpstreamConnSkipsPeek: a request its caller sends again should the
// connection prove stale (sendsAgain, as a watched call's) goes out on a
// kept connection unlooked-at while its pod answered within peekAfter: a
// close there fails it as Stale; once the answer is older, the
// connection is looked at and dialed anew as any other.
func TestUpstreamConnSkipsPeek(t *testing.T) {
	p, c := dialEchoPod(t, "")
	uc := c.(*Conn)
	if got := exchangeLine(t, c, "a"); got != "1:a" {
		t.Fatalf("got %q", got)
	}
	(<-p.conns).Close()
	time.Sleep(50 * time.Millisecond) // the pod's FIN arrives
	uc.sendsAgain = true
	if _, err := io.WriteString(c, "b\n"); err != nil {
		t.Fatalf("write: %v; want it sent on the kept socket, unlooked-at", err)
	}
	if n, err := c.Read(make([]byte, 8)); n != 0 || !closedByPeer(err) || !uc.Stale() {
		t.Fatalf("read: %d bytes, %v, stale %v; want the pod's close, stale", n, err, uc.Stale())
	}

	p, c = dialEchoPod(t, "")
	uc = c.(*Conn)
	if got := exchangeLine(t, c, "a"); got != "1:a" {
		t.Fatalf("got %q", got)
	}
	(<-p.conns).Close()
	time.Sleep(50 * time.Millisecond)
	uc.answeredAt -= int64(peekAfter)
	uc.sendsAgain = true
	if got := exchangeLine(t, c, "b"); got != "2:b" {
		t.Fatalf("an answer peekAfter old: got %q, want 2:b (looked at, on a new connection)", got)
	}
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

// TestDeadlineSlack: a deadline is set a 64th of its distance late, the
// ones that follow within that are not set again, and an earlier one or
// none is.
func TestDeadlineSlack(t *testing.T) {
	var d deadline
	var sets []time.Time
	set := func(at time.Time) error { sets = append(sets, at); return nil }
	at := time.Now().Add(64 * time.Second)
	if err := d.set(at, set); err != nil || len(sets) != 1 {
		t.Fatalf("first deadline: %v, %d sets", err, len(sets))
	}
	if late := sets[0].Sub(at); late < 900*time.Millisecond || late > time.Second {
		t.Fatalf("set %v late, want about a 64th of 64 s", late)
	}
	for _, later := range []time.Duration{time.Millisecond, 500 * time.Millisecond} {
		if _ = d.set(at.Add(later), set); len(sets) != 1 {
			t.Fatalf("a deadline %v later was set again", later)
		}
	}
	for i, next := range []time.Time{at.Add(-time.Second), at.Add(2 * time.Second), {}, time.Unix(0, 0), {}} {
		if _ = d.set(next, set); len(sets) != i+2 || sets[i+1].IsZero() != next.IsZero() {
			t.Fatalf("deadline %v not set: %v", next, sets)
		}
	}
	if _ = d.set(time.Time{}, set); len(sets) != 6 {
		t.Fatalf("no deadline, twice: set again")
	}
}

// TestDeadlineTightenedMeanwhile: a deadline tightened by another
// goroutine while one is being set (a PD call's, under its relay's) is
// what the socket and the record end with, together, so the relay's next
// deadline is set.
func TestDeadlineTightenedMeanwhile(t *testing.T) {
	var d deadline
	var mu sync.Mutex
	var socket time.Time
	set := func(at time.Time) error { mu.Lock(); socket = at; mu.Unlock(); return nil }
	now := time.Now()
	loose, tight := now.Add(20*time.Second), now.Add(2*time.Second)
	inSet, release, tightened, loosened := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		_ = d.set(loose, func(at time.Time) error { _ = set(at); close(inSet); <-release; return nil })
		close(loosened)
	}()
	<-inSet
	go func() { _ = d.set(tight, set); close(tightened) }()
	select {
	case <-tightened: // it got in between the setting and the recording
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-tightened
	<-loosened
	want := time.Now().Add(20 * time.Second)
	_ = d.set(want, set)
	mu.Lock()
	defer mu.Unlock()
	if socket.Before(want) {
		t.Fatalf("asked for a deadline %v away; the socket's fires %v away", time.Until(want).Round(time.Millisecond), time.Until(socket).Round(time.Millisecond))
	}
}

// stepWall is t as time.Now() reads after the system's wall clock was
// stepped by secs (NTP's makestep, a VM resumed): its monotonic reading
// as it was, its wall reading moved. It relies on time.Time's layout
// (wall bits, ext, loc); ok is false when that is not what it finds.
func stepWall(t time.Time, secs int64) (_ time.Time, ok bool) {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	if unsafe.Sizeof(t) != unsafe.Sizeof(layout{}) {
		return t, false
	}
	p := (*layout)(unsafe.Pointer(&t))
	if p.wall&(1<<63) == 0 { // no monotonic reading
		return t, false
	}
	p.wall += uint64(secs << 30) // seconds are bits 30 to 62
	return t, true
}

// TestDeadlineWallStep: after the wall clock is stepped back a second, a
// deadline 3 s away is set, not taken for the 2 s one already there: the
// record counts on the runtime's clock, not the wall's.
func TestDeadlineWallStep(t *testing.T) {
	var d deadline
	var sets []time.Time
	set := func(at time.Time) error { sets = append(sets, at); return nil }
	now := time.Now()
	_ = d.set(now.Add(2*time.Second), set)
	stepped, ok := stepWall(now.Add(3*time.Second), -1)
	if !ok {
		t.Skip("time.Time's layout is not the one this test steps")
	}
	if _ = d.set(stepped, set); len(sets) != 2 {
		t.Fatalf("a deadline a second later than the one set, asked for after the wall clock stepped back a second, was not set")
	}
}

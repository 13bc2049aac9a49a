package frontend

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"pdlb/internal/spares"
	"pdlb/internal/testwait"
	"pdlb/lb/upstream"
)

// loopAnswer answers a request served on the loop with its pod's answer,
// or 504 and the exchange's error.
type loopAnswer struct {
	ctx  *fasthttp.RequestCtx
	resp *fasthttp.Response
}

func (a *loopAnswer) Answered(err error) {
	if err != nil {
		a.ctx.SetStatusCode(fasthttp.StatusGatewayTimeout)
		a.ctx.SetBodyString(err.Error())
		return
	}
	a.ctx.SetStatusCode(a.resp.StatusCode())
	a.ctx.SetBody(a.resp.Body())
}

// sendingGNet starts a gnet front end that serves each request with an
// exchange on its loop with pod: a request to path, by u (its Addr pod's),
// streamed if stream; answer wraps the request's loopAnswer as the
// exchange's Done (nil: the loopAnswer).
func sendingGNet(t *testing.T, o Options, pod, path string, u Upstream, stream bool, answer func(*loopAnswer) Done) *GNet {
	t.Helper()
	u.Addr = pod
	h := Handler{OnLoop: true, Error: func(*fasthttp.RequestCtx, error) {}, Serve: func(ctx *fasthttp.RequestCtx) {
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		req.SetRequestURI("http://" + pod + path)
		a := &loopAnswer{ctx: ctx, resp: new(fasthttp.Response)}
		var done Done = a
		if answer != nil {
			done = answer(a)
		}
		if err := LoopOf(ctx).Send(u, stream, (*FastRequest)(req), a.resp, done); err != nil {
			done.Answered(err)
		}
	}}
	return startGNet(t, h, o)
}

// startGNet starts a gnet front end serving h, shut down when t ends.
func startGNet(t *testing.T, h Handler, o Options) *GNet {
	t.Helper()
	s, err := StartGNet("127.0.0.1:0", h, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.ShutdownWithContext(ctx)
	})
	return s
}

// TestSweptConnectionIsNotReused: a connection the sweep closed for a
// timeout, whose answer then came before the close ran (the loop's task
// queue backed up under load), must not carry the next exchange: that
// exchange would end at once with the timeout of the one before it.
func TestSweptConnectionIsNotReused(t *testing.T) {
	gotA, answerA := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/a" {
			close(gotA)
			<-answerA
		}
		io.WriteString(w, r.URL.Path[1:]+"!")
	}))
	t.Cleanup(srv.Close)
	pod := srv.Listener.Addr().String()

	var onA atomic.Pointer[loopState]
	h := Handler{OnLoop: true, Error: func(*fasthttp.RequestCtx, error) {}, Serve: func(ctx *fasthttp.RequestCtx) {
		l := LoopOf(ctx)
		if string(ctx.Path()) == "/a" {
			onA.Store(l.gc.ls)
		}
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		req.SetRequestURI("http://" + pod + string(ctx.Path()))
		a := &loopAnswer{ctx: ctx, resp: new(fasthttp.Response)}
		u := Upstream{Addr: pod, DialTimeout: time.Second, Timeout: time.Minute, Keepalive: time.Minute, MaxConns: 8}
		if err := l.Send(u, false, (*FastRequest)(req), a.resp, a); err != nil {
			a.Answered(err)
		}
	}}
	s := startGNet(t, h, Options{})

	c := dialGNet(t, s)
	// /b, pipelined, is parsed once /a's answer is written, and goes out
	// on the connection /a's answer left idle.
	io.WriteString(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
	<-gotA
	ls := onA.Load()
	noop := func() {}
	_ = ls.el.Execute(func() {
		// A backlog that leaves the sweep's close for a later turn of
		// the loop than the pod's answer.
		for range 2 * 1024 {
			_ = ls.el.Execute(noop)
		}
		for _, uc := range ls.conns {
			uc.deadline = 0
		}
		ls.sweepConns()
		close(answerA)
		time.Sleep(100 * time.Millisecond) // the answer reaches the socket
	})
	br := bufio.NewReader(c)
	for _, want := range []string{"a!", "b!"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != want {
			t.Fatalf("want 200 %q, got %d %q", want, resp.StatusCode, strings.TrimSpace(string(b)))
		}
	}
}

// TestParseAllocatesNothing: reading a pod's whole answer on a loop
// allocates nothing, with the head scanned raw (as the gateway asks) or
// by fasthttp.
func TestParseAllocatesNothing(t *testing.T) {
	s := &GNet{o: Options{}.withDefaults()}
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	for _, head := range []*upstream.AnswerHead{nil, {}} {
		uc := &upConn{ls: &loopState{s: s}, resp: new(fasthttp.Response), head: head}
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := uc.parse(answer, false); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("raw head %v: %.1f allocations per answer, want 0", head != nil, allocs)
		}
	}
}

// TestIdleFromTheLastWrite: the idle sweep closes a connection whose
// client took nothing of its answer since the answer was written (by the
// loop, or by a worker whose last write was taken), and keeps one whose
// client took some.
func TestIdleFromTheLastWrite(t *testing.T) {
	for _, onLoop := range []bool{true, false} {
		for _, take := range []bool{false, true} {
			name := map[bool]string{true: "loop", false: "worker"}[onLoop] + map[bool]string{true: "/took"}[take]
			t.Run(name, func(t *testing.T) {
				h := Handler{OnLoop: onLoop, Error: func(*fasthttp.RequestCtx, error) {}, Serve: func(ctx *fasthttp.RequestCtx) {
					ctx.SetBody(make([]byte, 48<<10))
				}}
				s := startGNet(t, h, Options{IdleTimeout: time.Hour})
				// Small socket buffers both sides: part of the answer
				// waits in the loop's queue, less than a worker's
				// write leaves queued before it returns (maxOutbound).
				d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
					return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
				}}
				c, err := d.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				gc := onlyConn(t, s)
				onLoopOf(t, gc, func() { _ = unix.SetsockoptInt(gc.c.Fd(), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096) })
				io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				// Written: the answer waits in the loop's queue, and the
				// worker (if any) is done with it.
				var queued int64
				testwait.For(t, "the answer queued", func() bool {
					onLoopOf(t, gc, func() { queued = int64(gc.c.OutboundBuffered()) })
					return queued > 0 && !gc.busy.Load() && gc.pending.Load() == queued
				})
				if take {
					if _, err := io.ReadFull(c, make([]byte, 16<<10)); err != nil {
						t.Fatal(err)
					}
					testwait.For(t, "the loop to send more", func() bool {
						onLoopOf(t, gc, func() { queued = int64(gc.c.OutboundBuffered()) })
						return queued < gc.pending.Load()
					})
				}
				onLoopOf(t, gc, gc.checkIdleOnLoop)
				loopTurns(t, gc.c.EventLoop(), 1) // the close it queued
				var closed bool
				onLoopOf(t, gc, func() { closed = gc.closed })
				if closed == take {
					t.Errorf("client took some since the write: %v; closed: %v", take, closed)
				}
			})
		}
	}
}

// onlyConn waits for s's one client connection.
func onlyConn(t *testing.T, s *GNet) *gconn {
	t.Helper()
	var gc *gconn
	testwait.For(t, "the connection", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			gc = c
		}
		return gc != nil
	})
	return gc
}

// onLoopOf runs fn on gc's loop and waits for it.
func onLoopOf(t *testing.T, gc *gconn, fn func()) {
	t.Helper()
	ran := make(chan struct{})
	if err := gc.c.EventLoop().Execute(func() { fn(); close(ran) }); err != nil {
		t.Fatal(err)
	}
	<-ran
}

// taskFunc is a Task.
type taskFunc func()

func (f taskFunc) Run() { f() }

// TestFailedConnEndsWhatItHolds: once a write on the connection failed,
// the requests still queued are dropped, but a task the handler detached
// and a stream it started on the loop still run to their end, with their
// client gone (ClientGone, so a task's pod call is cut at once) and
// nothing written: each holds what its request took (an in-flight slot,
// a pod's charge), which only its end gives back.
func TestFailedConnEndsWhatItHolds(t *testing.T) {
	s := startOK(t, Options{})
	c := dialGNet(t, s)
	gc := onlyConn(t, s)
	gc.failed = true
	ran, gone, streamed := false, false, make(chan error, 1)
	stream := acquireCtx()
	SetBodyStreamWriter(stream, func(w *StreamWriter) {
		_, err := w.Write([]byte("data: {}\n\n"))
		if err == nil {
			err = w.Flush()
		}
		streamed <- err
	})
	detached := acquireCtx()
	detached.Init2(gc, ctxLogger, false)
	task := func() {
		ran = true
		select {
		case <-ClientGone(detached):
			gone = true
		default:
		}
	}
	gc.queue = []queued{{ctx: acquireCtx()}, {ctx: detached, task: taskFunc(task)}, {ctx: acquireCtx()}, {ctx: stream, served: true}}
	gc.ls.serving.Add(int64(len(gc.queue)))
	gc.busy.Store(true)
	gc.work() // a plain request served would write its answer
	if !ran || !gone {
		t.Errorf("the detached task ran %v, and found its client gone %v", ran, gone)
	}
	select {
	case err := <-streamed:
		if err == nil {
			t.Error("the stream's write to a failed connection did not fail")
		}
	default:
		t.Error("the started stream's writer did not run")
	}
	if n := gc.s.serving(); n != 0 {
		t.Errorf("%d requests still counted as served", n)
	}
	var closed bool
	onLoopOf(t, gc, func() { closed = gc.closed })
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || closed {
		t.Errorf("read %d bytes (%v), closed %v: a failed connection takes no more", n, err, closed)
	}
}

// TestFirstByteFromTheSend: an exchange's deadlines run from its Send, not
// from the loops' coarse clock, which before the first exchange moves once
// a second. A Send late in that second got a first-byte deadline most of
// a second early, and its pod, answering well within it, was given up.
func TestFirstByteFromTheSend(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(500 * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	pod := srv.Listener.Addr().String()
	u := Upstream{DialTimeout: time.Second, Timeout: time.Minute, Keepalive: time.Minute, MaxConns: 8, FirstByte: 900 * time.Millisecond}
	s := sendingGNet(t, Options{}, pod, "/", u, false, nil)
	// The clock 0.8 s behind: its next tick is 0.2 s away, before the
	// pod's answer and long before the deadline.
	for s.o.clock()-s.now.Load() < int64(800*time.Millisecond) {
		time.Sleep(2 * time.Millisecond)
	}
	resp, err := http.Get("http://" + s.Addr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("a pod answering in 0.5 s with a first-byte deadline of 0.9 s: %d %q", resp.StatusCode, b)
	}
}

// TestStreamHeadIsNotItsFirstByte: engines send a stream's head before
// its prefill, so a stream whose head came at once and whose first event
// does not come by FirstByte ends with fasthttp.ErrTimeout, as one
// with no byte at all: nothing of it reached the client yet.
func TestStreamHeadIsNotItsFirstByte(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a prefill that hangs, until the gateway gives up
	}))
	t.Cleanup(srv.Close)
	pod := srv.Listener.Addr().String()
	errs := make(chan error, 1)
	u := Upstream{DialTimeout: time.Second, Timeout: time.Minute, FirstByte: 100 * time.Millisecond, Keepalive: time.Minute, MaxConns: 8}
	s := sendingGNet(t, Options{}, pod, "/v1/completions", u, true, func(a *loopAnswer) Done { return &streamAnswer{a, errs} })
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + s.Addr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-errs; err != fasthttp.ErrTimeout {
		t.Fatalf("the exchange ended with %v (status %d), want fasthttp.ErrTimeout at its first-byte deadline", err, resp.StatusCode)
	}
}

// streamAnswer is a loopAnswer that reports the exchange's end on errs.
type streamAnswer struct {
	*loopAnswer
	errs chan<- error
}

func (a *streamAnswer) Answered(err error) {
	a.errs <- err
	a.loopAnswer.Answered(err)
}

// relayAnswer relays a streamed answer on the loop, each next byte of the
// pod's due within idle.
type relayAnswer struct {
	*loopAnswer
	idle time.Duration
}

func (a *relayAnswer) Answered(err error) {
	if err != nil {
		a.loopAnswer.Answered(err)
		return
	}
	a.ctx.SetContentType("text/event-stream")
	LoopOf(a.ctx).Relay(a.idle, passSink{})
}

// passSink relays the pod's body as it comes.
type passSink struct{}

func (passSink) Body(w *StreamWriter, p []byte) error {
	_, err := w.Write(p)
	return err
}

func (passSink) End(*StreamWriter, error) {}

// TestRelayNotCutEarly: a stream relayed on the loop waits its whole idle
// time for the pod's next bytes, counted from the last ones. They were
// stamped off the loops' coarse clock, which lags by up to a tick (1 s
// before the first exchange sets a shorter sweep period): a pod whose
// next event came well within the idle time had its stream cut.
func TestRelayNotCutEarly(t *testing.T) {
	rest, err := relayOfTwo(t, Options{}, 500*time.Millisecond, func(s *GNet) {
		// The clock as the loops see it just before a tick.
		s.now.Store(s.o.clock() - int64(900*time.Millisecond))
	}, func(s *GNet) { tickNow(t, s) })
	if err != nil || !strings.Contains(rest, "data: 2") {
		t.Fatalf("the stream after a sweep right after its first event (idle time 0.5 s): %q, %v; want its next event", rest, err)
	}
}

// relayOfTwo relays, on a loop of a GNet of options o whose relays wait
// idle for the pod's next bytes, a pod's stream of two events: the second
// comes once between ran, after the first reached the client; before
// runs once the GNet is up. It returns what came after the first event.
func relayOfTwo(t *testing.T, o Options, idle time.Duration, before, between func(*GNet)) (string, error) {
	t.Helper()
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-next
		io.WriteString(w, "data: 2\n\n")
	}))
	t.Cleanup(srv.Close)
	// Run first: Close waits for the handler.
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(next) }) })
	u := Upstream{DialTimeout: time.Second, Timeout: time.Minute, Keepalive: time.Minute, MaxConns: 8}
	s := sendingGNet(t, o, srv.Listener.Addr().String(), "/", u, true, func(a *loopAnswer) Done { return &relayAnswer{a, idle} })
	before(s)
	c := dialGNet(t, s)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if ev, err := br.ReadString('\n'); ev != "data: 1\n" {
		t.Fatalf("the first event: %q, %v", ev, err)
	}
	between(s)
	release.Do(func() { close(next) })
	rest, err := io.ReadAll(br)
	return string(rest), err
}

// TestKeptPodConnectionReused: a connection to a pod is kept for the next
// exchange for its whole Upstream.Keepalive, counted from the end of the
// answer before it. That was stamped off the loops' coarse clock, which
// lags by up to a tick (1 s): an exchange right after another found its
// connection looking past Keepalive, and dialed a new one.
func TestKeptPodConnectionReused(t *testing.T) {
	var dials atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	u := Upstream{DialTimeout: time.Second, Timeout: time.Minute, Keepalive: 500 * time.Millisecond, MaxConns: 8}
	s := sendingGNet(t, Options{}, srv.Listener.Addr().String(), "/", u, false, nil)
	// The clock as the loops see it just before a tick.
	s.now.Store(s.o.clock() - int64(900*time.Millisecond))
	c := dialGNet(t, s)
	br := bufio.NewReader(c)
	for i := range 2 {
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("exchange %d: %d %q", i+1, resp.StatusCode, b)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("two exchanges one after the other, Keepalive 0.5 s: %d connections to the pod; want the first one kept", n)
	}
}

// TestLoopKeepsContexts: a context the loop gave back is the next one it
// takes, reset, with no body buffer over maxLoopCtxBody; past
// spares.Max kept, the loop gives them to the pool.
func TestLoopKeepsContexts(t *testing.T) {
	ls := &loopState{}
	ctx := ls.takeCtx()
	ctx.Init2(nil, ctxLogger, false) // as serveOnLoop does: buffers kept
	ctx.Request.SetBody(make([]byte, 1<<10))
	ctx.Response.SetBody(make([]byte, maxLoopCtxBody+1))
	ctx.SetUserValue("k", 1)
	ls.giveCtx(ctx)
	if got := ls.takeCtx(); got != ctx {
		t.Fatal("the loop took another context than the one it was given back")
	}
	if len(ctx.Request.Body()) != 0 || ctx.UserValue("k") != nil {
		t.Error("a context the loop kept was not reset")
	}
	if cap(ctx.Request.Body()) == 0 {
		t.Error("a 1 KB request body's buffer was not kept")
	}
	if cap(ctx.Response.Body()) != 0 {
		t.Errorf("a %d-byte response body's buffer was kept", maxLoopCtxBody+1)
	}
	for range spares.Max + 1 {
		ls.giveCtx(acquireCtx())
	}
	if ls.ctxs.Len() != spares.Max {
		t.Errorf("the loop keeps %d contexts, want at most %d", ls.ctxs.Len(), spares.Max)
	}
}

// TestLoopSpares: what a loop's request gave back is what its next one
// takes, the last first; past spares.Max the loop keeps no more.
func TestLoopSpares(t *testing.T) {
	l := &Loop{gc: &gconn{ls: &loopState{}}}
	if v := l.TakeSpare(); v != nil {
		t.Fatalf("a new loop had a spare: %v", v)
	}
	a, b := new(int), new(int)
	l.GiveSpare(a)
	l.GiveSpare(b)
	if l.TakeSpare() != b || l.TakeSpare() != a || l.TakeSpare() != nil {
		t.Error("the loop did not give its spares back last first, then none")
	}
	for i := range spares.Max + 1 {
		if kept := l.GiveSpare(i); kept != (i < spares.Max) {
			t.Fatalf("spare %d: kept %v with spares.Max %d", i, kept, spares.Max)
		}
	}
}

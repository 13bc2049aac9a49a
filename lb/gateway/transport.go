package gateway

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/mono"
	"pdlb/lb/frontend"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// transport carries a plain attempt to its pod and the answer back: the
// event loop's own upstream connection (loopTransport), or a call through
// the pod's client on a goroutine that may block (workerTransport). The
// request's stages (stages.go) are the same on both.
type transport interface {
	// send sends x's request to x.pod; x.answered gets the outcome,
	// before send returns or, on the loop, once the pod answered
	// (Answered).
	send(x *completion)
	// renders reports whether send renders x's request itself when x.up
	// is nil (appendUpstream).
	renders() bool
	// relay streams the answer's body events to the client, then
	// finishes x.
	relay(x *completion, pod *pool.Pod, resp *fasthttp.Response)
	// block reports whether x may wait here (an admission deferral, a
	// retry's backoff); if not, it moves x to a worker (Run), which goes
	// on from x.stage.
	block(x *completion) bool
}

// loopTransport serves x on the gnet event loop it arrived on.
type loopTransport struct{ l *frontend.Loop }

func (t loopTransport) send(x *completion) {
	g, u := x.g, &x.g.cfg.Upstream
	to := frontend.Upstream{Addr: x.pod.Config.Address, DialTimeout: u.ConnectTimeout, Timeout: g.answerTimeout(x),
		Keepalive: u.KeepaliveTimeout, MaxConns: u.MaxConnsPerPod, MaxBody: u.MaxResponseBytes, FirstByte: x.within, Down: &x.pod.DownAt, Head: &x.head}
	var req frontend.Request = x
	if x.up != nil {
		req = (*frontend.FastRequest)(x.up)
	}
	if err := t.l.Send(to, x.req.Stream, req, x.resp, x); err != nil {
		x.answered(err)
	}
}

func (loopTransport) renders() bool { return true }

func (t loopTransport) relay(x *completion, _ *pool.Pod, _ *fasthttp.Response) {
	t.l.Relay(x.g.cfg.Upstream.StreamIdleTimeout, x)
}

func (t loopTransport) block(x *completion) bool {
	t.l.Detach(x)
	return false
}

// workerTransport serves x on a goroutine of its own (fasthttp's handler,
// or a worker x was detached to).
type workerTransport struct{}

func (workerTransport) send(x *completion) {
	// A stream is relayed as it comes; a whole answer is read whole.
	x.resp.StreamBody = x.req.Stream
	now := time.Now()
	// A stream's first body bytes are due with its head (within), and
	// its relay begins with them. A hedged attempt's are due by the
	// response timeout, unless giveUp cuts it at within (x.hedge).
	deadline := now.Add(x.g.answerTimeout(x))
	headBy, hedge := now.Add(x.within), upstream.Cut(nil)
	if x.hedged {
		x.hedge.x, x.hedge.fired = x, false
		headBy, hedge = deadline, &x.hedge
	}
	n, err := x.g.callPod(clientCut(x.ctx), x.pod, x.up, x.resp, &x.head, now, headBy, deadline, x.wait[:], hedge)
	if err == upstream.ErrCut && hedge != nil && x.hedge.fired {
		err = fasthttp.ErrTimeout // no byte by the first-byte deadline
	}
	x.primed = n
	x.answered(err)
}

// callPod is upstream.DoCut of up on pod (head: DoCut's), sent at now,
// cut by cut and hedge, when the shutdown's grace is over and when
// health checks find the pod dead, as the loops give such an exchange up
// (AbortRelays, frontend.Upstream.Down); those end it with
// frontend.ErrAborted and upstream.ErrPodDown.
func (g *Gateway) callPod(cut upstream.Cut, pod *pool.Pod, up *fasthttp.Request, resp *fasthttp.Response, head *upstream.AnswerHead, now, headBy, deadline time.Time, first []byte, hedge upstream.Cut) (int, error) {
	n, err := upstream.DoCut(pod.Client, up, resp, head, headBy, deadline, first, cut, pod.Down(), abortCut{g}, hedge)
	if err == upstream.ErrCut {
		switch {
		case g.aborting.Load():
			err = frontend.ErrAborted
		case pod.DownAt.Load() > mono.Of(now):
			err = upstream.ErrPodDown
		}
	}
	return n, err
}

func (workerTransport) renders() bool { return false }

func (workerTransport) relay(x *completion, pod *pool.Pod, resp *fasthttp.Response) {
	g, m := x.g, x.m
	// Taken now: the writer must not touch ctx (the late watch's timer
	// reads fasthttp's ctx only while the writer runs).
	client := clientCut(x.ctx)
	frontend.SetBodyStreamWriter(x.ctx, func(w *frontend.StreamWriter) {
		// Deferred, so that a relay that panics (the front end cuts the
		// stream and logs it) still gives back its charges and in-flight
		// counts.
		code := fasthttp.StatusInternalServerError
		defer func() { g.finish(x, m, pod, resp, code) }()
		code = g.relay(w, resp, x, pod, client)
	})
}

func (workerTransport) block(*completion) bool { return true }

// clientCut is what cuts a worker's call to the pod, or its relay, when
// ctx's client leaves: the front end's own ClientCut, else (fasthttp's
// HTTP/1) a lateWatch.
func clientCut(ctx *fasthttp.RequestCtx) upstream.Cut {
	if cut := frontend.ClientCut(ctx); cut != nil {
		return cut
	}
	return &lateWatch{ctx: ctx}
}

// lateWatch cuts a call or a stream's relay on fasthttp once its client
// leaves. fasthttp reads nothing while a handler or a stream's writer
// runs, and the wait may be long: a whole answer is the pod's whole
// generation, and a stream waits for its first event through the
// prefill, its head sent at once (as the engines send it); a write to a
// client that closed its side succeeds all the same. So a watch of the
// client's connection (frontend.WatchClient) sees it leave; it starts
// only once the wait has taken clientWatchAfter, so that the many short
// answers pay a timer, not the watch's goroutine and deadline changes.
type lateWatch struct {
	ctx *fasthttp.RequestCtx
	// mu orders the timer's start of the watch with Unwatch: none starts
	// after it, when fasthttp may be reading the connection again.
	mu      sync.Mutex
	timer   *time.Timer
	stop    chan struct{}
	stopped bool
}

// clientWatchAfter is how long a call or relay waits before its client's
// connection is watched.
const clientWatchAfter = 250 * time.Millisecond

func (w *lateWatch) Watch(c upstream.Cutter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stop = make(chan struct{})
	w.timer = time.AfterFunc(clientWatchAfter, func() {
		w.mu.Lock()
		var gone <-chan struct{}
		if !w.stopped {
			gone = frontend.WatchClient(w.ctx)
		}
		w.mu.Unlock()
		if gone == nil {
			return
		}
		select {
		case <-gone:
			// Both may be ready, and select picks either: once Unwatch
			// ran, the call's state (c's) may be released already.
			w.mu.Lock()
			if !w.stopped {
				c.Cut()
			}
			w.mu.Unlock()
		case <-w.stop:
		}
	})
}

func (w *lateWatch) Unwatch(upstream.Cutter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
	close(w.stop)
}

package gateway

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/ledger"
)

// Headers the gateway sets itself.
const (
	headerPod       = "x-pdlb-pod"
	headerRequestID = "X-Request-Id"
)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), and are never forwarded in either direction.
var hopByHop = [][]byte{
	[]byte("Connection"), []byte("Keep-Alive"), []byte("Proxy-Connection"),
	[]byte("Proxy-Authenticate"), []byte("Proxy-Authorization"), []byte("Te"),
	[]byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
	[]byte("Host"), []byte("Content-Length"),
	// The front end answered the client's 100-continue; the pod gets the
	// whole body at once (as nginx and Envoy send it).
	[]byte("Expect"),
}

// hopByHopByLen is hopByHop by name length: every header of every request
// and answer is looked up, and compared with the names of its own length
// it meets one or two instead of twelve.
var hopByHopByLen = func() (t [len("Proxy-Authorization") + 1][][]byte) {
	for _, h := range hopByHop {
		t[len(h)] = append(t[len(h)], h)
	}
	return t
}()

func isHopByHop(k []byte) bool {
	if len(k) >= len(hopByHopByLen) {
		return false
	}
	for _, h := range hopByHopByLen[len(k)] {
		if bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

var (
	pdlbPrefix    = []byte("x-pdlb-")
	authorization = []byte(fasthttp.HeaderAuthorization)
	forwardedFor  = []byte(fasthttp.HeaderXForwardedFor)
	server        = []byte(fasthttp.HeaderServer)
)

// serveCompletion is the request path of /v1/chat/completions and
// /v1/completions.
func (g *Gateway) serveCompletion(ctx *fasthttp.RequestCtx, kind openai.Kind) {
	x := acquireExchange()
	key, d := g.keys.Lookup(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if !d.OK() {
		g.fail(ctx, x, nil, refused(d))
		return
	}
	if err := x.req.Parse(kind, ctx.PostBody()); err != nil {
		var e *openai.Error
		if !errors.As(err, &e) {
			panic("BUG: gateway: openai.Request.Parse returned " + err.Error())
		}
		g.fail(ctx, x, nil, answer(e))
		return
	}
	if d = key.Admit(x.start, x.req.PromptTokens()); !d.OK() {
		g.fail(ctx, x, nil, refused(d))
		return
	}
	x.key = key
	m := g.pool.Load().Model(x.req.Model)
	if m == nil {
		g.fail(ctx, x, nil, answer(openai.ModelNotFound(x.req.Model)))
		return
	}
	var e *openai.Error
	if x.class, e = classOf(ctx.Request.Header.Peek(headerPriority)); e != nil {
		g.fail(ctx, x, m, answer(e))
		return
	}
	if n := g.inFlight.Add(1); g.cfg.MaxInFlight > 0 && n > int64(g.cfg.MaxInFlight) {
		g.inFlight.Add(-1)
		g.fail(ctx, x, m, &failure{
			e:          openai.Overloaded("the gateway has " + strconv.Itoa(g.cfg.MaxInFlight) + " requests in flight, its max_in_flight"),
			retryAfter: 1,
		})
		return
	}
	x.ticket = ledger.Ticket{ID: g.nextID.Add(1)}
	x.g, x.ctx, x.m = g, ctx, m
	if !g.resolve(ctx, x, m) {
		return
	}
	if l := frontend.LoopOf(ctx); l != nil && (x.cascade != nil || (x.req.Stream && !l.CanRelay())) {
		// A PD exchange blocks, and a stream that is the connection's last
		// answer is written by a worker: they go on one.
		l.Detach(x)
		return
	}
	g.proxy(ctx, x, m)
}

// Run is the rest of x's request on a worker (frontend.Task): what
// serveCompletion would have done next, or, after the loop had admission
// defer it or a pod refuse its dial, the wait or the retries.
func (x *exchange) Run() {
	if x.up == nil {
		x.g.proxy(x.ctx, x, x.m)
		return
	}
	up, resp := x.up, x.resp
	x.up, x.resp = nil, nil
	x.g.forward(x.ctx, x, x.m, up, resp)
}

// proxy sends x to a pod of m and answers with what it says, on the event
// loop when ctx is served there.
func (g *Gateway) proxy(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model) {
	if x.cascade != nil {
		g.servePD(ctx, x, m, x.cascade)
		return
	}
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	g.buildUpstream(ctx, up)
	if l := frontend.LoopOf(ctx); l != nil {
		g.sendOnLoop(l, ctx, x, m, up, resp)
		return
	}
	g.forward(ctx, x, m, up, resp)
}

// forward sends up on this goroutine and answers.
func (g *Gateway) forward(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, up *fasthttp.Request, resp *fasthttp.Response) {
	pod, f := g.send(m, x, up, resp, sessionOf(ctx))
	if f != nil {
		g.unsent(ctx, x, m, up, resp, f)
		return
	}
	fasthttp.ReleaseRequest(up)
	g.respond(ctx, x, m, pod, resp)
}

// unsent answers a request no pod answered with f, and lets go of its
// upstream request and response.
func (g *Gateway) unsent(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, up *fasthttp.Request, resp *fasthttp.Response, f *failure) {
	fasthttp.ReleaseRequest(up)
	fasthttp.ReleaseResponse(resp)
	g.inFlight.Add(-1)
	g.fail(ctx, x, m, f)
}

// sendOnLoop places x on a pod of m, admits it, and hands up to the loop's
// connection to the pod; ExchangeDone continues. A request admission
// defers waits on a worker.
func (g *Gateway) sendOnLoop(l *frontend.Loop, ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, up *fasthttp.Request, resp *fasthttp.Response) {
	pod := g.pick(m, x, sessionOf(ctx))
	if pod == nil {
		g.unsent(ctx, x, m, up, resp, answer(openai.NoHealthyPod(x.req.Model)))
		return
	}
	if g.admit != nil {
		since := g.clock()
		ttft, tpot := predict(x, pod, pod)
		wait, f := g.admitNow(x, since, ttft, tpot)
		if f != nil {
			g.unsent(ctx, x, m, up, resp, f)
			return
		}
		if wait {
			// send waits, then places it anew.
			x.deferred, x.deferral = true, admitWait{since, ttft, tpot}
			x.up, x.resp = up, resp
			l.Detach(x)
			return
		}
	}
	g.attempt(m, x, pod, up)
	u := g.cfg.Upstream
	x.up, x.resp, x.pod = up, resp, pod
	to := frontend.Upstream{Addr: pod.Config.Address, DialTimeout: u.ConnectTimeout, Timeout: g.responseTimeout(x.req.Stream),
		Keepalive: u.KeepaliveTimeout, MaxConns: u.MaxConnsPerPod, MaxBody: u.MaxResponseBytes}
	if err := l.Exchange(to, x.req.Stream, up, resp, x); err != nil {
		x.ExchangeDone(err)
	}
}

// ExchangeDone, on the loop, answers with the pod's response, or moves to
// a worker for the retries a refused dial allows.
func (x *exchange) ExchangeDone(err error) {
	g, ctx, m, pod := x.g, x.ctx, x.m, x.pod
	gone := errors.Is(err, frontend.ErrClientGone)
	if err == nil || gone {
		// Sent for good; x.resp stays: a stream relayed on the loop
		// finishes with it.
		fasthttp.ReleaseRequest(x.up)
		x.up = nil
	}
	switch {
	case err == nil:
		g.respond(ctx, x, m, pod, x.resp)
		return
	case gone:
		// The pod's connection closed with the client's, which tells the
		// pod to stop; not its failure. A prefill cut short times nothing.
		x.idleStart = false
		g.finish(x, m, pod, x.resp, statusClientClosed)
		return
	}
	if f := g.attemptFailed(x, pod, err); !g.tryAgain(x, f) {
		g.unsent(ctx, x, m, x.up, x.resp, f)
		return
	}
	x.refused = err
	frontend.LoopOf(ctx).Detach(x)
}

// respond relays pod's response, whose headers are in, to the client and
// finishes the request.
func (g *Gateway) respond(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, pod *pool.Pod, resp *fasthttp.Response) {
	// Headers are in: from here on the pod owes the client this response.
	status := resp.StatusCode()
	switch {
	case isFault(status):
		g.podFailed(pod)
	case status < 500:
		pod.ReportSuccess()
	}
	ctx.SetStatusCode(status)
	resp.Header.VisitAll(func(k, v []byte) {
		// The engine's Server (uvicorn under vLLM and SGLang) stays
		// behind, as nginx and Envoy keep their upstreams' to
		// themselves: x-pdlb-pod names the pod that answered.
		if !isHopByHop(k) && !(len(k) == len(server) && bytes.EqualFold(k, server)) {
			ctx.Response.Header.AddBytesKV(k, v)
		}
	})
	ctx.Response.Header.Set(headerPod, pod.Config.Name)
	ctx.Response.Header.SetBytesV(headerRequestID, ctx.Request.Header.Peek(headerRequestID))

	if x.req.Stream && status == fasthttp.StatusOK {
		g.keepLogHead(ctx, x)
		// x.times is zero: releaseExchange clears it.
		x.mm = g.metrics.model(m)
		if l := frontend.LoopOf(ctx); l != nil {
			l.Relay(g.cfg.Upstream.StreamIdleTimeout, x)
			return
		}
		frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
			// Deferred, so that a relay that panics (the front end cuts
			// the stream and logs it) still gives back its charges and
			// in-flight counts.
			code := fasthttp.StatusInternalServerError
			defer func() { g.finish(x, m, pod, resp, code) }()
			code = g.relay(w, resp, x, pod)
		})
		return
	}
	// A whole response: read it all before answering, so a pod that breaks
	// midway still gets the client a clean 502 instead of a truncated body.
	// The client read it already unless the request asked for a stream (an
	// error answer to a stream, or a PD decode leg).
	var err error
	if resp.IsBodyStream() {
		buf := relayBufs.Get().(*[relayBufferBytes]byte)
		err = readWhole(ctx.Response.BodyWriter(), resp.BodyStream(), g.cfg.Upstream.MaxResponseBytes, buf[:])
		relayBufs.Put(buf)
	} else {
		ctx.Response.SetBody(resp.Body())
	}
	if err != nil {
		closeStream(resp, err)
		ctx.Response.ResetBody()
		g.podFailed(pod)
		f := g.streamFailure(x, err)
		writeFailure(ctx, f)
		x.failure, status = f.e, f.e.Status
	} else if status == fasthttp.StatusOK {
		// Its usage is the output the API key's token bucket and
		// pdlb_completion_tokens_total are charged.
		x.counted.ObserveBody(ctx.Response.Body())
	}
	g.finish(x, m, pod, resp, status)
}

// send places x on a pod of m, admits it, forwards up and returns once the
// response headers arrived. A request not sent (notSent: the pod refused
// the connection, or every connection to it was busy) moves to another
// pod, at most Retries times; any other failure is final, since the pod
// may have started work.
func (g *Gateway) send(m *pool.Model, x *exchange, up *fasthttp.Request, resp *fasthttp.Response, session string) (*pool.Pod, *failure) {
	// Attempts made on the event loop count (see ExchangeDone), and the
	// backoff after one of them is waited here.
	var last *failure
	if x.refused != nil {
		last = g.podFailure(nil, x.refused, g.responseTimeout(x.req.Stream))
	}
	for attempt := len(x.tried); attempt <= g.cfg.Upstream.Retries; attempt++ {
		if attempt > 0 {
			// Back off a little, with jitter, so a fleet-wide hiccup is
			// not met by every request retrying in lockstep.
			time.Sleep(time.Duration(rand.Int64N(int64(retryBackoff) << (attempt - 1))))
			if x.clientLeft() {
				return nil, errClientLeft
			}
		}
		pod := g.pick(m, x, session)
		if pod == nil {
			break
		}
		if attempt == 0 && g.admit != nil {
			predictOn := func() (float64, float64) { return predict(x, pod, pod) }
			replace := func() {
				if p := g.pick(m, x, session); p != nil {
					pod = p
				}
			}
			var f *failure
			if x.deferred {
				// Deferred on the event loop: the wait is what is left.
				x.deferred = false
				f = g.awaitAdmission(x, x.deferral, predictOn, replace)
			} else {
				f = g.admission(x, predictOn, replace)
			}
			if f != nil {
				return nil, f
			}
		}
		g.attempt(m, x, pod, up)
		// A stream is relayed as it comes; a whole answer is read whole.
		resp.StreamBody = x.req.Stream
		err := doWatched(frontend.ClientGone(x.ctx), pod.Client, up, resp, time.Now().Add(g.responseTimeout(x.req.Stream)))
		if err == nil {
			return pod, nil
		}
		if err == errClientLeft {
			g.unplace(x, pod)
			return nil, errClientLeft
		}
		last = g.attemptFailed(x, pod, err)
		if !g.tryAgain(x, last) {
			break
		}
	}
	if last == nil {
		return nil, answer(openai.NoHealthyPod(x.req.Model))
	}
	return nil, last
}

// attempt records that up goes to pod and charges pod with it.
func (g *Gateway) attempt(m *pool.Model, x *exchange, pod *pool.Pod, up *fasthttp.Request) {
	x.tried = append(x.tried, pod.ID)
	up.SetHost(pod.Config.Address)
	g.place(m, x, pod)
}

// notSentLogEvery spaces the lines of requests moved to another pod.
const notSentLogEvery = time.Second

// attemptFailed takes back pod's charge for an attempt that failed with
// err, counts it against the pod, and returns the failure.
func (g *Gateway) attemptFailed(x *exchange, pod *pool.Pod, err error) *failure {
	g.unplace(x, pod)
	g.callFailed(pod, err)
	return g.podFailure(pod, err, g.responseTimeout(x.req.Stream))
}

// tryAgain decides whether x goes to another pod after f: f allows it
// (mayRetry) and retries are left.
func (g *Gateway) tryAgain(x *exchange, f *failure) bool {
	if !f.mayRetry() || len(x.tried) > g.cfg.Upstream.Retries {
		return false
	}
	if held, ok := g.notSentLog.allow(g.ledger.Now(), notSentLogEvery); ok {
		g.log.Warn("request not sent to pod; trying another", "pod", f.pod.Config.Name, "err", f.e.Message, "suppressed", held)
	}
	return true
}

// retryBackoff is the longest first wait before a retry (it doubles per
// attempt); a retry goes to another pod, so it need not wait long.
const retryBackoff = 5 * time.Millisecond

// sessionOf returns the request's session key, "" when it has none. Only
// requests that carry one pay for the string.
func sessionOf(ctx *fasthttp.RequestCtx) string {
	v := ctx.Request.Header.Peek(headerSession)
	if len(v) == 0 {
		v = ctx.Request.Header.Peek(headerSessionAIBrix)
	}
	return string(v)
}

// buildUpstream copies the client's request into up: the body byte for
// byte, the headers less hop-by-hop ones and any x-pdlb-* a client made up,
// an X-Request-Id, generated when the client sent none, and the client's
// address appended to X-Forwarded-For (upstream.x_forwarded_for).
func (g *Gateway) buildUpstream(ctx *fasthttp.RequestCtx, up *fasthttp.Request) {
	authorize, forward := g.keys.Enabled(), g.cfg.Upstream.XForwardedFor
	up.Header.DisableNormalizing()
	up.Header.SetMethod(fasthttp.MethodPost)
	up.SetRequestURIBytes(ctx.Path())
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		if isHopByHop(k) || (len(k) >= len(pdlbPrefix) && bytes.EqualFold(k[:len(pdlbPrefix)], pdlbPrefix)) {
			return
		}
		// A client's key is the gateway's business, not the pods'.
		if authorize && bytes.EqualFold(k, authorization) {
			return
		}
		// Set whole below, the client's chain with its address added.
		if forward && bytes.EqualFold(k, forwardedFor) {
			return
		}
		up.Header.AddBytesKV(k, v)
	})
	if forward {
		var buf [128]byte
		up.Header.SetBytesV(fasthttp.HeaderXForwardedFor, appendForwardedFor(buf[:0], ctx))
	}
	if len(ctx.Request.Header.Peek(headerRequestID)) == 0 {
		var id [32]byte
		ctx.Request.Header.SetBytesV(headerRequestID, appendRequestID(id[:0], ctx.ID(), ctx.ConnTime()))
		up.Header.SetBytesV(headerRequestID, ctx.Request.Header.Peek(headerRequestID))
	}
	// The body is the client's own buffer, valid until the handler returns;
	// the upstream request is written before that.
	up.SetBodyRaw(ctx.PostBody())
}

// appendForwardedFor appends the X-Forwarded-For the pods get: the
// client's own, its several fields joined as one (RFC 9110 section 5.3),
// then the client's address.
func appendForwardedFor(b []byte, ctx *fasthttp.RequestCtx) []byte {
	for _, v := range ctx.Request.Header.PeekAll(fasthttp.HeaderXForwardedFor) {
		if len(v) > 0 {
			b = append(append(b, v...), ", "...)
		}
	}
	if a, ok := clientAddr(ctx); ok {
		return a.Addr().AppendTo(b)
	}
	return append(b, "unknown"...)
}

// clientAddr is the address ctx's client connected from, IPv4 as such.
func clientAddr(ctx *fasthttp.RequestCtx) (netip.AddrPort, bool) {
	a, ok := ctx.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := a.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// appendRequestID renders a request id unique per process run: the
// connection's start time and the request's sequence number on it.
func appendRequestID(dst []byte, seq uint64, connTime time.Time) []byte {
	dst = strconv.AppendInt(dst, connTime.UnixNano(), 36)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, seq, 36)
}

// relay copies the SSE stream of resp to the client event by event as it
// arrives and returns the status to count: 200, 499 when the client went
// away, or the error status of a stream that broke (the client still saw
// 200, then an error event).
//
// Only whole events are written, so a stream that breaks midway never leaves
// half an event in front of the error event. Nothing is decoded, and token
// counting scans the bytes in place.
//
// A stream spends nearly all its life waiting for the pod's next event, and
// thousands wait at once, so it waits holding no buffer: it reads one byte
// into the exchange, and only when that byte begins an event does it take a
// pooled relay buffer for the rest of what arrived, which goes back once
// the events in it are written. The writer's buffer, likewise, is held only
// from an event's Write to the Flush.
func (g *Gateway) relay(w *frontend.StreamWriter, resp *fasthttp.Response, x *exchange, pod *pool.Pod) int {
	conn := connOf(resp)
	stream := resp.BodyStream()
	idle := g.cfg.Upstream.StreamIdleTimeout
	t := &x.times
	for {
		if conn != nil {
			_ = conn.SetReadDeadline(g.readDeadline(x, idle, t.started))
		}
		n, err := g.readUpstream(stream, x.wait[:])
		if n > 0 {
			t.started = true
			werr := g.pass(w, x.wait[:n], x, pod)
			// The byte began an event, or continued one, that needs more:
			// block for it with a buffer. Had it ended one, the event
			// goes out first, and the relay waits bufferless again.
			if werr == nil && err == nil && len(x.events.Pending()) > 0 {
				buf := relayBufs.Get().(*[relayBufferBytes]byte)
				if n, err = g.readUpstream(stream, buf[:]); n > 0 {
					werr = g.pass(w, buf[:n], x, pod)
				}
				relayBufs.Put(buf)
			}
			if werr == nil {
				werr = w.Flush()
			}
			if werr != nil {
				closeStream(resp, werr)
				return statusClientClosed
			}
			if err == nil {
				err = x.events.Err()
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			closeStream(resp, err)
			return g.relayBroke(w, x, err)
		}
	}
	g.relayDone(x, pod)
	return fasthttp.StatusOK
}

// relayBroke ends a stream that broke with err with an error event and
// returns the status to count.
func (g *Gateway) relayBroke(w *frontend.StreamWriter, x *exchange, err error) int {
	e := g.streamFailure(x, err).e
	x.failure = e
	buf := relayBufs.Get().(*[relayBufferBytes]byte)
	_, _ = w.Write(openai.AppendErrorEvent(buf[:0], e))
	relayBufs.Put(buf)
	_ = w.Flush()
	return e.Status
}

// relayDone learns from a stream that ran to its end: its TPOT.
func (g *Gateway) relayDone(x *exchange, pod *pool.Pod) {
	t := &x.times
	if n := x.counted.Tokens(); n > 1 {
		tpot := t.last.Sub(t.first).Seconds() / float64(n-1)
		x.mm.tpot.Update(tpot)
		// The pod's step time at its batch teaches its TPOT line, which
		// admission predicts from.
		batch, _ := decodeBatch(pod)
		pod.DecodeLine().Observe(max(batch, 1), tpot)
		if g.admit != nil {
			g.admit.Observe(x.class, t.first.Sub(x.start).Seconds(), tpot)
		}
	}
}

// Body relays the pod's next bytes of a stream on the event loop
// (frontend.Sink).
func (x *exchange) Body(w *frontend.StreamWriter, p []byte) error {
	g := x.g
	if g.aborting.Load() {
		return errShuttingDown
	}
	x.times.started = true
	if err := g.pass(w, p, x, x.pod); err != nil {
		return err
	}
	return x.events.Err()
}

// End ends a stream relayed on the event loop (frontend.Sink).
func (x *exchange) End(w *frontend.StreamWriter, err error) {
	g := x.g
	code := fasthttp.StatusOK
	switch {
	case err == nil:
		g.relayDone(x, x.pod)
	case errors.Is(err, frontend.ErrClientGone):
		code = statusClientClosed
	default:
		code = g.relayBroke(w, x, err)
	}
	g.finish(x, x.m, x.pod, x.resp, code)
}

// relayBufferBytes is the most one upstream read relays at once. Engines
// send an event of a few hundred bytes at a time, and an event larger than
// the buffer is reassembled by the SSE splitter.
const relayBufferBytes = 8 << 10

var relayBufs = sync.Pool{New: func() any { return new([relayBufferBytes]byte) }}

// tokenTimes is what a relay learns of its stream's timing: whether any
// byte arrived, and when the first and the latest token events did.
type tokenTimes struct {
	started     bool
	first, last time.Time
}

// readUpstream reads the pod's next bytes into b. Once Shutdown's grace is
// over it ends the stream instead, dropping what it read, rather than let
// the stream run on or cut it mid-event.
func (g *Gateway) readUpstream(stream io.Reader, b []byte) (int, error) {
	n, err := stream.Read(b)
	if g.aborting.Load() {
		return 0, errShuttingDown
	}
	return n, err
}

// pass feeds the pod's bytes b to the stream's SSE splitter and writes every
// event they complete, unchanged, counting tokens on the way. It returns the
// client's write error.
func (g *Gateway) pass(w *frontend.StreamWriter, b []byte, x *exchange, pod *pool.Pod) error {
	t := &x.times
	x.events.Feed(b)
	for {
		ev, ok := x.events.Next()
		if !ok {
			return nil
		}
		before := x.counted.Tokens()
		x.counted.Observe(ev)
		if x.counted.Tokens() > before {
			t.last = time.Now()
			if t.first.IsZero() {
				t.first = t.last
				g.prefillDone(x, pod, t.first)
				x.mm.ttft.Update(t.first.Sub(x.start).Seconds())
			}
		}
		if _, err := w.Write(ev); err != nil {
			return err
		}
	}
}

// clientLeft reports whether x's client has closed its connection, as far
// as its front end can tell (frontend.ClientGone).
func (x *exchange) clientLeft() bool {
	select {
	case <-frontend.ClientGone(x.ctx):
		return true
	default:
		return false
	}
}

// finish ends a request that reached a pod.
func (g *Gateway) finish(x *exchange, m *pool.Model, pod *pool.Pod, resp *fasthttp.Response, status int) {
	g.logCompletion(x.ctx, x, pod, status, x.failure)
	g.endPD(x, pod, status)
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	g.prefillDone(x, pod, time.Now())
	g.ledger.Finish(x.ticket)
	pod.Release()
	g.inFlight.Add(-1)
	mm := g.metrics.model(m)
	mm.e2e.Update(time.Since(x.start).Seconds())
	mm.completionTokens.Add(x.counted.Tokens())
	g.metrics.countRequest(m, status)
	releaseExchange(x)
}

// refused is the failure for a request its API key does not allow now.
func refused(d limits.Decision) *failure {
	return &failure{e: d.Error(), retryAfter: d.RetryAfterSeconds()}
}

// fail answers a request that never reached a pod.
func (g *Gateway) fail(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, f *failure) {
	g.ledger.Finish(x.ticket)
	writeFailure(ctx, f)
	g.logCompletion(ctx, x, nil, f.e.Status, f.e)
	g.metrics.countRequest(m, f.e.Status)
	if f.e.Status == fasthttp.StatusTooManyRequests {
		g.metrics.shed.Update(time.Since(x.start).Seconds())
	}
	releaseExchange(x)
}

// callFailed counts a call to p that failed with err against p, unless
// the gateway's own limits refused it: every connection to p busy, or no
// file descriptor to open one.
func (g *Gateway) callFailed(p *pool.Pod, err error) {
	if !errors.Is(err, fasthttp.ErrNoFreeConns) && !errors.Is(err, limits.ErrOutOfFDs) {
		g.podFailed(p)
	}
}

// podFailed counts a failure against p and ejects it when due, unless
// health.max_ejected_percent of its model's pods are ejected already.
func (g *Gateway) podFailed(p *pool.Pod) {
	h := g.cfg.Health
	if !p.ReportFailure(h.EjectAfterFailures) {
		return
	}
	// One decision at a time, so that two pods failing together cannot
	// both take the model's last ejection.
	g.ejectMu.Lock()
	defer g.ejectMu.Unlock()
	now := g.ledger.Now()
	if p.Ejected(now) {
		return
	}
	if m := g.pool.Load().Model([]byte(p.Config.Model)); m != nil && !m.MayEject(now, h.MaxEjectedPercent) {
		p.KeepIn()
		// When a whole model fails this comes with every few failures:
		// one line per ejection time says it, the metric counts it.
		if held, ok := g.keptLog.allow(now, h.EjectionTime); ok {
			g.log.Warn("pod failing but kept in: health.max_ejected_percent of its model's pods are ejected (pdlb_pod_ejections_kept_total counts these)",
				"pod", p.Config.Name, "model", p.Config.Model, "max_ejected_percent", h.MaxEjectedPercent, "suppressed", held)
		}
		return
	}
	p.Eject(now, h.EjectionTime)
	g.log.Warn("pod ejected after consecutive failures", "pod", p.Config.Name, "for", h.EjectionTime)
}

// readWhole copies a whole answer's streamed body to dst, at most limit
// bytes (upstream.max_response_bytes): past it, fasthttp.ErrBodyTooLarge,
// as the pods' clients say it of the bodies they read whole.
func readWhole(dst io.Writer, src io.Reader, limit int, buf []byte) error {
	n, err := io.CopyBuffer(dst, io.LimitReader(src, int64(limit)+1), buf)
	if err == nil && n > int64(limit) {
		return fasthttp.ErrBodyTooLarge
	}
	return err
}

// closeStream abandons a response body: the connection is closed rather
// than reused, which also tells the pod to stop generating.
func closeStream(resp *fasthttp.Response, err error) {
	if s, ok := resp.BodyStream().(fasthttp.ReadCloserWithError); ok {
		_ = s.CloseWithError(err)
	}
}

// responseTimeout bounds the wait for a pod's answer: a stream's headers,
// or a whole answer.
func (g *Gateway) responseTimeout(stream bool) time.Duration {
	if stream {
		return g.cfg.Upstream.ResponseTimeout
	}
	return g.cfg.Upstream.WholeResponseTimeout
}

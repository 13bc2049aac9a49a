package gateway

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/ledger"
)

// serveCompletion is the request path of /v1/chat/completions and
// /v1/completions.
func (g *Gateway) serveCompletion(ctx *fasthttp.RequestCtx, kind openai.Kind) {
	x := acquireCompletion()
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
func (x *completion) Run() {
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
func (g *Gateway) proxy(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model) {
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
func (g *Gateway) forward(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, up *fasthttp.Request, resp *fasthttp.Response) {
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
func (g *Gateway) unsent(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, up *fasthttp.Request, resp *fasthttp.Response, f *failure) {
	fasthttp.ReleaseRequest(up)
	fasthttp.ReleaseResponse(resp)
	g.inFlight.Add(-1)
	g.fail(ctx, x, m, f)
}

// sendOnLoop places x on a pod of m, admits it, and hands up to the loop's
// connection to the pod; Answered continues. A request admission
// defers waits on a worker.
func (g *Gateway) sendOnLoop(l *frontend.Loop, ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, up *fasthttp.Request, resp *fasthttp.Response) {
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
	if err := l.Send(to, x.req.Stream, up, resp, x); err != nil {
		x.Answered(err)
	}
}

// Answered, on the loop, answers with the pod's response, or moves to
// a worker for the retries a refused dial allows.
func (x *completion) Answered(err error) {
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

// send places x on a pod of m, admits it, forwards up and returns once the
// response headers arrived. A request not sent (notSent: the pod refused
// the connection, or every connection to it was busy) moves to another
// pod, at most Retries times; any other failure is final, since the pod
// may have started work.
func (g *Gateway) send(m *pool.Model, x *completion, up *fasthttp.Request, resp *fasthttp.Response, session string) (*pool.Pod, *failure) {
	// Attempts made on the event loop count (see Answered), and the
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
func (g *Gateway) attempt(m *pool.Model, x *completion, pod *pool.Pod, up *fasthttp.Request) {
	x.tried = append(x.tried, pod.ID)
	up.SetHost(pod.Config.Address)
	g.place(m, x, pod)
}

// notSentLogEvery spaces the lines of requests moved to another pod.
const notSentLogEvery = time.Second

// attemptFailed takes back pod's charge for an attempt that failed with
// err, counts it against the pod, and returns the failure.
func (g *Gateway) attemptFailed(x *completion, pod *pool.Pod, err error) *failure {
	g.unplace(x, pod)
	g.callFailed(pod, err)
	return g.podFailure(pod, err, g.responseTimeout(x.req.Stream))
}

// tryAgain decides whether x goes to another pod after f: f allows it
// (mayRetry) and retries are left.
func (g *Gateway) tryAgain(x *completion, f *failure) bool {
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

// finish ends a request that reached a pod.
func (g *Gateway) finish(x *completion, m *pool.Model, pod *pool.Pod, resp *fasthttp.Response, status int) {
	g.logCompletion(x.ctx, x, pod, status, x.failure)
	g.endPD(x, pod, status)
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	g.prefillDone(x, pod, time.Now())
	g.ledger.Finish(x.ticket)
	pod.Release()
	g.inFlight.Add(-1)
	stats := g.metrics.model(m)
	stats.e2e.Update(time.Since(x.start).Seconds())
	stats.completionTokens.Add(x.counted.Tokens())
	g.metrics.countRequest(m, status)
	releaseCompletion(x)
}

// refused is the failure for a request its API key does not allow now.
func refused(d limits.Decision) *failure {
	return &failure{e: d.Error(), retryAfter: d.RetryAfterSeconds()}
}

// fail answers a request that never reached a pod.
func (g *Gateway) fail(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, f *failure) {
	g.ledger.Finish(x.ticket)
	writeFailure(ctx, f)
	g.logCompletion(ctx, x, nil, f.e.Status, f.e)
	g.metrics.countRequest(m, f.e.Status)
	if f.e.Status == fasthttp.StatusTooManyRequests {
		g.metrics.shed.Update(time.Since(x.start).Seconds())
	}
	releaseCompletion(x)
}

// responseTimeout bounds the wait for a pod's answer: a stream's headers,
// or a whole answer.
func (g *Gateway) responseTimeout(stream bool) time.Duration {
	if stream {
		return g.cfg.Upstream.ResponseTimeout
	}
	return g.cfg.Upstream.WholeResponseTimeout
}

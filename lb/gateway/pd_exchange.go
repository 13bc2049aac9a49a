package gateway

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/protocols"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/ledger"
)

// The exchange of a PD pair, driven through the engine's
// engines.Protocol:
//
//   - sequential (vLLM, TensorRT-LLM context_first): the prefill leg, whole
//     and non-streaming; then the decode leg built from its answer, relayed
//     to the client. A context answer that is already final (TRT) is the
//     client's answer.
//   - concurrent (SGLang, TensorRT-LLM generation_first): both legs at
//     once, each in its own goroutine; the request waits for whichever
//     settles the matter first. A failed prefill leg aborts the decode leg
//     at once (SGLang: POST /abort_request; otherwise its connection is
//     closed as soon as it is known) and answers the client with
//     x-error-pd-prefill.
//
// Cleanup of KV a prefill leg left behind, by engine: a decode leg that
// cannot go to its pod goes to another decode pod of the model (same
// roleset first) with the same body, which takes the KV. Where none is
// left, vLLM and TensorRT-LLM context_first prefill pods hold the KV until
// their own timeout (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by
// default): neither has a call to drop it, and the prefill leg's
// connection has already ended. An SGLang or generation_first prefill leg
// still waiting for the pickup is ended by its PrefillRequestTimeout.

const (
	abortTimeout = 2 * time.Second
	// prefillGrace is how long a concurrent decode leg's error answer
	// waits for the prefill leg's outcome.
	prefillGrace = 250 * time.Millisecond
)

// runPair carries out a PDPair decision.
func (g *Gateway) runPair(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model) *failure {
	p := x.pd
	pre := p.pre
	p.proto = protocols.For(pre.Engine, engines.PDOptions{TRTMachineID: p.opts.TRTMachineID, TRTScheduleStyle: p.opts.TRTScheduleStyle})
	g.place(m, x, pre)
	if m.UsesCache && len(x.keys) > 0 {
		// The decode pod will hold the prompt's KV too.
		m.Prefix.Insert(p.dec.Slot, x.keys)
	}
	// The prefill leg's request carries the client's headers and the
	// request id buildUpstream settles on.
	up := fasthttp.AcquireRequest()
	g.buildUpstream(ctx, up)
	up.SetHost(pre.Config.Address)
	p.ex = engines.Exchange{
		RequestID:     string(ctx.Request.Header.Peek(headerRequestID)),
		Chat:          x.req.Kind == openai.KindChat,
		PrefillHost:   hostOf(pre.Config.Address),
		BootstrapPort: pre.Config.BootstrapPort,
	}
	p.proto.Begin(&p.ex)
	if path := p.proto.PrefillInfoPath(); path != "" {
		info, err := protocols.PrefillInfo(pre.Client, pre.Config.Address, path)
		if err != nil {
			fasthttp.ReleaseRequest(up)
			// Nothing of the request went out: another pair may take it.
			return g.dropPair(x, pre, &failure{e: openai.UpstreamError("prefill pod " + pre.Config.Name + " " + path + ": " + err.Error()),
				pdHeader: headerPrefillError, pod: pre})
		}
		p.ex.PrefillInfo = info
	}
	var err error
	p.preBody, err = p.proto.PrefillBody(p.preBody[:0], ctx.PostBody(), &p.ex)
	if err == nil && p.proto.Concurrent() {
		// Otherwise the decode body waits for the prefill answer.
		p.decBody, err = p.proto.DecodeBody(p.decBody[:0], ctx.PostBody(), nil, &p.ex)
	}
	if err != nil {
		fasthttp.ReleaseRequest(up)
		return g.dropPair(x, pre, &failure{e: openai.UpstreamError(err.Error()), pdHeader: headerPrefillError})
	}
	p.active = true
	p.legsStart = time.Now()
	if p.proto.Concurrent() {
		return g.runConcurrent(ctx, x, m, up)
	}
	return g.runSequential(ctx, x, m, up)
}

// dropPair undoes a pair whose legs were not both sent: the prefill pod's
// placement (when the prefill leg never went out) and the decode pod's
// pending pick.
func (g *Gateway) dropPair(x *exchange, pre *pool.Pod, f *failure) *failure {
	p := x.pd
	if pre != nil {
		g.unplace(x, pre)
		if f.mayRetry() {
			x.tried = append(x.tried, pre.ID)
		}
	}
	p.ticket.Done()
	p.active = false
	if p.link != nil {
		p.link.release()
		p.link = nil
	}
	return f
}

// runSequential: the prefill leg, then the decode leg with its answer.
func (g *Gateway) runSequential(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, up *fasthttp.Request) *failure {
	p := x.pd
	pre := p.pre
	up.SetBodyRaw(p.preBody)
	resp := fasthttp.AcquireResponse()
	err := doWatched(frontend.ClientGone(ctx), pre.Client, up, resp, time.Now().Add(p.opts.PrefillRequestTimeout))
	fasthttp.ReleaseRequest(up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		p.preResp = append(p.preResp[:0], resp.Body()...)
	}
	p.prefillEnd = time.Now()
	if err == errClientLeft {
		// The prefill was cut short: it times nothing.
		x.idleStart = false
	} else {
		p.metrics.prefill.Update(p.prefillEnd.Sub(p.legsStart).Seconds())
	}
	g.prefillDone(x, pre, p.prefillEnd)
	f := prefillFailure(g, pre, status, p.preResp, err, p.opts.PrefillRequestTimeout)
	if f == nil && p.proto.PrefillAnswers(p.preResp) {
		// The context pod finished at its first token: its answer is the
		// client's, and the decode pod gets nothing.
		p.ticket.Done()
		p.active = false
		g.answerFromPrefill(ctx, x, m, pre, resp)
		return nil
	}
	fasthttp.ReleaseResponse(resp)
	pre.Release()
	if f == nil && x.clientLeft() {
		// No decode leg for a client that left during the prefill; the
		// prefill pod drops its KV where the protocol can say so.
		g.abortLeg(p.proto, &p.ex, pre)
		f = errClientLeft
	}
	if f == nil {
		if p.decBody, err = p.proto.DecodeBody(p.decBody[:0], ctx.PostBody(), p.preResp, &p.ex); err != nil {
			f = &failure{e: openai.UpstreamError(err.Error()), pdHeader: headerPrefillError}
		}
	}
	if f != nil {
		if f.mayRetry() {
			x.tried = append(x.tried, pre.ID)
		}
		return g.dropPair(x, nil, f)
	}
	return g.sequentialDecode(ctx, x, m)
}

// prefillFailure classifies a finished prefill leg: nil for a 200 answer,
// else the client's error (retryable when it was not sent: notSent).
func prefillFailure(g *Gateway, pre *pool.Pod, status int, body []byte, err error, timeout time.Duration) *failure {
	switch {
	case err == errClientLeft:
		return errClientLeft
	case err != nil:
		g.callFailed(pre, err)
		f := g.podFailure(pre, err, timeout)
		f.pdHeader = headerPrefillError
		return f
	case status != fasthttp.StatusOK:
		if isFault(status) {
			g.podFailed(pre)
		}
		return &failure{e: prefillAnswered(status, body), pdHeader: headerPrefillError, pod: pre, sent: true}
	}
	pre.ReportSuccess()
	return nil
}

// sequentialDecode sends the decode leg after a prefill leg that answered,
// moving it to another decode pod while pods refuse the connection, and
// relays the answer.
func (g *Gateway) sequentialDecode(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model) *failure {
	p := x.pd
	for {
		dec := p.dec
		up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		g.buildUpstream(ctx, up)
		up.SetHost(dec.Config.Address)
		up.SetBodyRaw(p.decBody)
		dec.Acquire()
		// Streamed even for a whole answer: the watchdog times its reads.
		resp.StreamBody = true
		err := doWatched(frontend.ClientGone(ctx), dec.Client, up, resp, g.decodeHeadersBy(x))
		fasthttp.ReleaseRequest(up)
		if err == nil {
			p.ticket.Done()
			p.metrics.kvTransfer.Update(time.Since(p.prefillEnd).Seconds())
			g.respondPD(ctx, x, m, resp)
			return nil
		}
		fasthttp.ReleaseResponse(resp)
		dec.Release()
		if err == errClientLeft {
			return g.dropPair(x, nil, errClientLeft)
		}
		g.callFailed(dec, err)
		x.tried = append(x.tried, dec.ID)
		if notSent(err) && g.moveDecode(m, x) {
			continue
		}
		return g.dropPair(x, nil, g.decodeFailure(x, err))
	}
}

// decodeHeadersBy is the deadline of the decode leg's response headers
// (and, without a stream, its whole body): the watchdog's first-response
// bound for a stream, its response bound without one, else the upstream's
// (responseTimeout).
func (g *Gateway) decodeHeadersBy(x *exchange) time.Time {
	p := x.pd
	limit := g.watchdogLimit(x)
	p.watched = limit > 0
	if !p.watched {
		return time.Now().Add(g.responseTimeout(x.req.Stream))
	}
	return p.firstBy(limit)
}

// watchdogLimit is how long after the prefill's success x's decode leg
// may take to answer: its first chunk for a stream, its whole answer
// otherwise (0: no bound).
func (g *Gateway) watchdogLimit(x *exchange) time.Duration {
	if x.req.Stream {
		return x.pd.opts.DecodeFirstResponseTimeout
	}
	return x.pd.opts.DecodeResponseTimeout
}

// decodeFailure is the client's error for a decode leg that got no
// response headers: the watchdog's 504 when its deadline passed.
func (g *Gateway) decodeFailure(x *exchange, err error) *failure {
	if x.pd.watched && pool.IsTimeout(err) {
		return g.decodeWatchdog(x, err)
	}
	f := g.podFailure(x.pd.dec, err, g.responseTimeout(x.req.Stream))
	f.pdHeader = headerDecodeError
	return f
}

// moveDecode switches the pair's decode leg to another available decode
// pod, its own roleset's first, after the leg could not be sent to the
// chosen one (notSent): the new pod takes the KV the prefill leg left.
// False when there is none.
func (g *Gateway) moveDecode(m *pool.Model, x *exchange) bool {
	p := x.pd
	now := g.ledger.Now()
	var next *pool.Pod
	for _, d := range m.Decode {
		if !d.Available(now) || tried(x.tried, d.ID) {
			continue
		}
		if next == nil || (d.Roleset == p.pre.Roleset && next.Roleset != p.pre.Roleset) {
			next = d
		}
	}
	if next == nil {
		return false
	}
	p.ticket.Done()
	p.dec = next
	g.ledger.LockSelection()
	g.ledger.Charge(&x.ticket, p.pre.ID, next.ID, &p.prompt, g.ledger.Now())
	p.ticket = next.Pending().Pick()
	g.ledger.UnlockSelection()
	// The prefill leg is over: only the decode charge stays.
	g.ledger.PrefillDone(x.ticket)
	return true
}

// respondPD relays the decode leg's answer with the pair's headers.
func (g *Gateway) respondPD(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, resp *fasthttp.Response) {
	p := x.pd
	if c := connOf(resp); c != nil && !x.req.Stream && p.opts.DecodeResponseTimeout > 0 {
		// The whole body is due within the watchdog's bound of the
		// prefill's success, which a concurrent prefill leg may have
		// reported only after the headers' deadline was set.
		p.watched = true
		_ = c.SetReadDeadline(p.firstBy(p.opts.DecodeResponseTimeout))
	}
	ctx.Response.Header.Set(headerPrefillPod, p.pre.Config.Name)
	ctx.Response.Header.Set(headerDecodePod, p.dec.Config.Name)
	g.respond(ctx, x, m, p.dec, resp)
}

// runConcurrent sends both legs at once and waits for the one that
// settles the request: the decode leg's headers (its answer), or a failed
// prefill leg, or the watchdog.
func (g *Gateway) runConcurrent(ctx *fasthttp.RequestCtx, x *exchange, m *pool.Model, up *fasthttp.Request) *failure {
	p := x.pd
	l := acquireLink()
	p.link = l
	// The prefill leg's goroutine takes the prefill pod off the request:
	// the relay must not account for it again.
	x.firstSeen = true
	// Each leg owns a copy of its body: the request may go back to its
	// pool while a leg still runs.
	up.SetBody(p.preBody)
	l.refs.Add(1)
	go g.concurrentPrefill(l, concurrentPrefill{
		pre: p.pre, dec: p.dec, up: up, timeout: p.opts.PrefillRequestTimeout, uncached: x.uncached, ticket: x.ticket,
		proto: p.proto, ex: p.ex, metrics: p.metrics, limit: g.watchdogLimit(x), start: p.legsStart,
		gone: frontend.ClientGone(ctx),
	})
	resp := g.sendConcurrentDecode(ctx, x, l)
	var watchdog <-chan time.Time
	preDone := l.preDone
	for {
		select {
		case f := <-preDone:
			preDone = nil
			if f != nil {
				g.abandonDecode(l, p.dec, resp)
				if f.mayRetry() {
					x.tried = append(x.tried, p.pre.ID)
				}
				return g.dropPair(x, nil, f)
			}
			if limit := g.watchdogLimit(x); limit > 0 {
				t := time.NewTimer(time.Until(p.firstBy(limit)))
				defer t.Stop()
				watchdog = t.C
			}
		case err := <-l.decDone:
			if err == nil && resp.StatusCode() != fasthttp.StatusOK && preDone != nil {
				// A decode leg whose KV never came fails too: when the
				// prefill leg fails within moments, it names the cause.
				select {
				case f := <-preDone:
					preDone = nil
					if f != nil {
						closeStream(resp, errAbandoned)
						fasthttp.ReleaseResponse(resp)
						p.dec.Release()
						if f.mayRetry() {
							x.tried = append(x.tried, p.pre.ID)
						}
						return g.dropPair(x, nil, f)
					}
				case <-time.After(prefillGrace):
				}
			}
			if err == nil {
				p.ticket.Done()
				l.setDecConn(connOf(resp))
				if l.preErr.Load() != nil {
					// The prefill leg failed before the connection was
					// known: cut it now, the relay reports the failure.
					l.withDecConn(func(c *upstreamConn) { _ = c.Close() })
				}
				g.respondPD(ctx, x, m, resp)
				return nil
			}
			fasthttp.ReleaseResponse(resp)
			p.dec.Release()
			g.callFailed(p.dec, err)
			x.tried = append(x.tried, p.dec.ID)
			if notSent(err) && g.moveDecode(m, x) {
				resp = g.sendConcurrentDecode(ctx, x, l)
				continue
			}
			// The prefill leg waits for a pickup that will not come.
			g.abortLeg(p.proto, &p.ex, p.pre)
			return g.dropPair(x, nil, g.decodeFailure(x, err))
		case <-watchdog:
			g.abandonDecode(l, p.dec, resp)
			p.watched = true
			return g.dropPair(x, nil, g.decodeFailure(x, fasthttp.ErrTimeout))
		case <-frontend.ClientGone(ctx):
			// Both pods drop the request where the protocol can say so.
			g.abandonDecode(l, p.dec, resp)
			g.abortLeg(p.proto, &p.ex, p.pre)
			g.abortDecode(p.proto, &p.ex, p.dec)
			return g.dropPair(x, nil, errClientLeft)
		}
	}
}

// sendConcurrentDecode starts the decode leg on the pair's decode pod in
// its own goroutine and returns the response it fills.
func (g *Gateway) sendConcurrentDecode(ctx *fasthttp.RequestCtx, x *exchange, l *pdLink) *fasthttp.Response {
	p := x.pd
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	g.buildUpstream(ctx, up)
	up.SetHost(p.dec.Config.Address)
	up.SetBody(p.decBody)
	// Streamed even for a whole answer: the watchdog times its reads.
	resp.StreamBody = true
	p.dec.Acquire()
	l.decState.Store(decPending)
	l.refs.Add(1)
	l.cut = make(chan struct{})
	go l.decode(l.cut, p.dec, up, resp, g.decodeHeadersBy(x))
	return resp
}

// abandonDecode gives up a concurrent decode leg the request no longer
// waits for: its goroutine cleans up when it returns, or, if it already
// delivered, the caller's goroutine does here.
func (g *Gateway) abandonDecode(l *pdLink, dec *pool.Pod, resp *fasthttp.Response) {
	if l.decState.CompareAndSwap(decPending, decAbandoned) {
		close(l.cut)
		return
	}
	if err := <-l.decDone; err == nil {
		closeStream(resp, errAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	dec.Release()
}

// errAbandoned closes a decode leg nobody reads.
var errAbandoned = errors.New("gateway: pd decode leg abandoned")

// concurrentPrefill is what a concurrent prefill leg's goroutine needs;
// it touches nothing of the request itself.
type concurrentPrefill struct {
	pre, dec *pool.Pod
	up       *fasthttp.Request
	timeout  time.Duration
	uncached int64
	ticket   ledger.Ticket // a copy, valid since the first Charge
	proto    engines.Protocol
	ex       engines.Exchange
	metrics  *pdMetrics
	limit    time.Duration
	start    time.Time
	gone     <-chan struct{} // the client's, for doWatched
}

// concurrentPrefill runs the prefill leg of a concurrent exchange and
// reports it on l.preDone: nil for success, else the client's error, after
// aborting the decode leg.
func (g *Gateway) concurrentPrefill(l *pdLink, c concurrentPrefill) {
	defer l.release()
	resp := fasthttp.AcquireResponse()
	err := doWatched(c.gone, c.pre.Client, c.up, resp, time.Now().Add(c.timeout))
	fasthttp.ReleaseRequest(c.up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		l.buf = append(l.buf[:0], resp.Body()...)
	}
	fasthttp.ReleaseResponse(resp)
	end := time.Now()
	c.metrics.prefill.Update(end.Sub(c.start).Seconds())
	c.pre.AddQueuedPrefill(-c.uncached)
	c.pre.Release()
	g.ledger.PrefillDone(c.ticket)
	f := prefillFailure(g, c.pre, status, l.buf, err, c.timeout)
	if f == nil {
		l.prefillEnd.Store(end.UnixNano())
		if c.limit > 0 {
			// Tighten the deadline of a decode answer that is already being
			// relayed (a race with the relay's own setting only leaves the
			// looser bound).
			l.withDecConn(func(conn *upstreamConn) {
				if !l.started.Load() {
					_ = conn.SetReadDeadline(end.Add(c.limit))
				}
			})
		}
	} else {
		l.preErr.Store(f)
		g.abortLeg(c.proto, &c.ex, c.dec)
		l.withDecConn(func(conn *upstreamConn) { _ = conn.Close() })
	}
	l.preDone <- f
}

// abortLeg tells pod to drop the exchange's request where the protocol has
// a call for it (SGLang's /abort_request), in the background.
func (g *Gateway) abortLeg(proto engines.Protocol, ex *engines.Exchange, pod *pool.Pod) {
	path, body := proto.Abort(nil, ex)
	if path == "" {
		return // closing the connection is the abort
	}
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(path)
		req.SetHost(pod.Config.Address)
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		// What the pod answers changes nothing.
		_ = pod.Client.DoTimeout(req, resp, abortTimeout)
	}()
}

// abortDecode is abortLeg on the decode pod.
func (g *Gateway) abortDecode(proto engines.Protocol, ex *engines.Exchange, dec *pool.Pod) {
	g.abortLeg(proto, ex, dec)
}

// Hand-over states of a concurrent decode leg's response.
const (
	decPending int32 = iota
	decDelivered
	decAbandoned
)

// pdLink is what a concurrent exchange's legs share with the request while
// they run beside it: the request's own state may return to its pool
// before a leg ends, so the legs touch only this. It is reference counted;
// the last holder returns it to its pool.
type pdLink struct {
	refs atomic.Int32
	// prefillEnd is when the prefill leg succeeded (unix nanoseconds, 0
	// before); preErr its failure, for the relay's error event.
	prefillEnd atomic.Int64
	preErr     atomic.Pointer[failure]
	// started: the decode stream's first chunk arrived.
	started atomic.Bool
	// decState hands the decode leg's response over; decDone carries its
	// outcome, preDone the prefill leg's (nil: success).
	decState atomic.Int32
	decDone  chan error
	preDone  chan *failure
	// cut gives up the decode leg in flight (abandonDecode closes it):
	// its connection is closed, which is how a decode pod that waits for
	// KV that will not come learns to stop.
	cut chan struct{}
	// mu guards decConn, the decode leg's connection while the request
	// relays it: a failed prefill leg closes it, and it must not outlive
	// the request (the client pool reuses connections).
	mu      sync.Mutex
	decConn *upstreamConn
	// buf holds the prefill leg's answer.
	buf []byte
}

var linkPool = sync.Pool{New: func() any {
	return &pdLink{decDone: make(chan error, 1), preDone: make(chan *failure, 1)}
}}

// acquireLink returns a link held once, by the request.
func acquireLink() *pdLink {
	l := linkPool.Get().(*pdLink)
	l.refs.Store(1)
	return l
}

func (l *pdLink) release() {
	if l.refs.Add(-1) != 0 {
		return
	}
	l.prefillEnd.Store(0)
	l.preErr.Store(nil)
	l.started.Store(false)
	l.decConn = nil
	select {
	case <-l.preDone:
	default:
	}
	select {
	case <-l.decDone:
	default:
	}
	linkPool.Put(l)
}

func (l *pdLink) setDecConn(c *upstreamConn) {
	l.mu.Lock()
	l.decConn = c
	l.mu.Unlock()
}

func (l *pdLink) withDecConn(f func(*upstreamConn)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.decConn != nil {
		f(l.decConn)
	}
}

// decode runs a concurrent decode leg until its response headers and
// delivers them, or cleans up after a request that left.
func (l *pdLink) decode(cut <-chan struct{}, dec *pool.Pod, up *fasthttp.Request, resp *fasthttp.Response, by time.Time) {
	defer l.release()
	err := doWatched(cut, dec.Client, up, resp, by)
	fasthttp.ReleaseRequest(up)
	if l.decState.CompareAndSwap(decPending, decDelivered) {
		l.decDone <- err
		return
	}
	if err == nil {
		closeStream(resp, errAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	dec.Release()
}

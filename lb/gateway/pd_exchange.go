package gateway

import (
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/protocols"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
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

// prefillGrace is how long a concurrent decode leg's error answer waits
// for the prefill leg's outcome.
const prefillGrace = 250 * time.Millisecond

// runPair carries out a PDPair decision.
func (g *Gateway) runPair(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model) *failure {
	p := x.pd
	pre := p.pre
	p.proto = protocols.For(pre.Engine, p.opts.PDOptions)
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
		PrefillHost:   pd.HostOf(pre.Config.Address),
		BootstrapPort: pre.Config.BootstrapPort,
	}
	p.proto.Begin(&p.ex)
	if path := p.proto.PrefillInfoPath(); path != "" {
		info, err := protocols.PrefillInfo(pre.Client, pre.Config.Address, path)
		if err != nil {
			fasthttp.ReleaseRequest(up)
			// Nothing of the request went out: another pair may take it.
			return g.dropPair(x, pre, &failure{e: openai.UpstreamError("prefill pod " + pre.Config.Name + " " + path + ": " + err.Error()),
				pdHeader: pd.HeaderPrefillError, pod: pre})
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
		return g.dropPair(x, pre, &failure{e: openai.UpstreamError(err.Error()), pdHeader: pd.HeaderPrefillError})
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
func (g *Gateway) dropPair(x *completion, pre *pool.Pod, f *failure) *failure {
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
		p.link.Release()
		p.link = nil
	}
	return f
}

// runSequential: the prefill leg, then the decode leg with its answer.
func (g *Gateway) runSequential(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, up *fasthttp.Request) *failure {
	p := x.pd
	pre := p.pre
	up.SetBodyRaw(p.preBody)
	resp := fasthttp.AcquireResponse()
	err := upstream.Do(frontend.ClientGone(ctx), pre.Client, up, resp, time.Now().Add(p.opts.PrefillRequestTimeout))
	fasthttp.ReleaseRequest(up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		p.preResp = append(p.preResp[:0], resp.Body()...)
	}
	p.prefillEnd = time.Now()
	if err == upstream.ErrCut {
		// The prefill was cut short: it times nothing.
		x.idleStart = false
	} else {
		p.metrics.Prefill.Update(p.prefillEnd.Sub(p.legsStart).Seconds())
	}
	g.prefillDone(x, pre, p.prefillEnd)
	f := g.prefillFailure(pre, status, p.preResp, err, p.opts.PrefillRequestTimeout)
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
		pd.Abort(p.proto, &p.ex, pre)
		f = errClientLeft
	}
	if f == nil {
		if p.decBody, err = p.proto.DecodeBody(p.decBody[:0], ctx.PostBody(), p.preResp, &p.ex); err != nil {
			f = &failure{e: openai.UpstreamError(err.Error()), pdHeader: pd.HeaderPrefillError}
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
// else the client's error (retryable when it was not sent: upstream.NotSent).
func (g *Gateway) prefillFailure(pre *pool.Pod, status int, body []byte, err error, timeout time.Duration) *failure {
	switch {
	case err == upstream.ErrCut:
		return errClientLeft
	case err != nil:
		g.callFailed(pre, err)
		f := g.podFailure(pre, err, timeout)
		f.pdHeader = pd.HeaderPrefillError
		return f
	case status != fasthttp.StatusOK:
		if isFault(status) {
			g.podFailed(pre)
		}
		return &failure{e: prefillAnswered(status, body), pdHeader: pd.HeaderPrefillError, pod: pre, sent: true}
	}
	pre.ReportSuccess()
	return nil
}

// sequentialDecode sends the decode leg after a prefill leg that answered,
// moving it to another decode pod while pods refuse the connection, and
// relays the answer.
func (g *Gateway) sequentialDecode(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model) *failure {
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
		err := upstream.Do(frontend.ClientGone(ctx), dec.Client, up, resp, g.decodeHeadersBy(x))
		fasthttp.ReleaseRequest(up)
		if err == nil {
			p.ticket.Done()
			p.metrics.KVTransfer.Update(time.Since(p.prefillEnd).Seconds())
			g.respondPD(ctx, x, m, resp)
			return nil
		}
		fasthttp.ReleaseResponse(resp)
		dec.Release()
		if err == upstream.ErrCut {
			return g.dropPair(x, nil, errClientLeft)
		}
		g.callFailed(dec, err)
		x.tried = append(x.tried, dec.ID)
		if g.tryAgain(x, g.podFailure(dec, err, g.responseTimeout(x.req.Stream))) && g.moveDecode(m, x) {
			continue
		}
		return g.dropPair(x, nil, g.decodeFailure(x, err))
	}
}

// decodeHeadersBy is the deadline of the decode leg's response headers
// (and, without a stream, its whole body): the watchdog's first-response
// bound for a stream, its response bound without one, else the upstream's
// (responseTimeout).
func (g *Gateway) decodeHeadersBy(x *completion) time.Time {
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
func (g *Gateway) watchdogLimit(x *completion) time.Duration {
	if x.req.Stream {
		return x.pd.opts.DecodeFirstResponseTimeout
	}
	return x.pd.opts.DecodeResponseTimeout
}

// decodeFailure is the client's error for a decode leg that got no
// response headers: the watchdog's 504 when its deadline passed.
func (g *Gateway) decodeFailure(x *completion, err error) *failure {
	if x.pd.watched && pool.IsTimeout(err) {
		return g.decodeWatchdog(x, err)
	}
	f := g.podFailure(x.pd.dec, err, g.responseTimeout(x.req.Stream))
	f.pdHeader = pd.HeaderDecodeError
	return f
}

// moveDecode switches the pair's decode leg to another available decode
// pod, its own roleset's first, after the leg could not be sent to the
// chosen one (tryAgain allowed it): the new pod takes the KV the prefill
// leg left.
// False when there is none.
func (g *Gateway) moveDecode(m *pool.Model, x *completion) bool {
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
	// The move is an attempt: tryAgain's budget bounds it.
	x.attempts++
	return true
}

// respondPD relays the decode leg's answer with the pair's headers.
func (g *Gateway) respondPD(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, resp *fasthttp.Response) {
	p := x.pd
	if c := upstream.ConnOf(resp); c != nil && !x.req.Stream && p.opts.DecodeResponseTimeout > 0 {
		// The whole body is due within the watchdog's bound of the
		// prefill's success, which a concurrent prefill leg may have
		// reported only after the headers' deadline was set.
		p.watched = true
		_ = c.SetReadDeadline(p.firstBy(p.opts.DecodeResponseTimeout))
	}
	ctx.Response.Header.Set(pd.HeaderPrefillPod, p.pre.Config.Name)
	ctx.Response.Header.Set(pd.HeaderDecodePod, p.dec.Config.Name)
	g.respond(ctx, x, m, p.dec, resp)
}

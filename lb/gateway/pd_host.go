package gateway

import (
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// A PD pair's exchange (pd.Call.RunPair) runs on what the request path
// lends it: the request (a *completion is its pd.Host) and the gateway
// (pdFleet, which the legs' goroutines may call after the request ended).

// pdFleet is the gateway as a pd.Fleet.
type pdFleet struct{ g *Gateway }

func (f pdFleet) Send(cut, drop <-chan struct{}, pod *pool.Pod, up *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, first []byte) (int, error) {
	return f.g.callPod(upstream.ChansCut(cut, drop), pod, up, resp, nil, time.Now(), deadline, deadline, first, nil)
}
func (f pdFleet) CallFailed(pod *pool.Pod, err error) { f.g.callFailed(pod, err, true) }
func (f pdFleet) PodFailed(pod *pool.Pod)             { f.g.podFailed(pod) }
func (f pdFleet) PodFailure(pod *pool.Pod, err error, within time.Duration) *failure {
	return f.g.podFailure(pod, err, within)
}
func (f pdFleet) ReleasePrefill(t ledger.Ticket)            { f.g.ledger.PrefillDone(t) }
func (f pdFleet) ResponseTimeout(stream bool) time.Duration { return f.g.responseTimeout(stream) }

func (x *completion) Upstream(pod *pool.Pod) *fasthttp.Request {
	up := fasthttp.AcquireRequest()
	x.g.buildUpstream(x.ctx, up, x.reqID, pod)
	up.SetHost(pod.Config.Address)
	// An SGLang pair's prefill rank goes in the exchange (PrefillRank).
	if !sglangPairLeg(x, pod) {
		if pin := x.g.pinFor(x, pod); pin.pinned {
			setRank(up, pin)
		}
	}
	x.tr.leg(up, pod, pod == x.pd.Pre, x.attempts)
	return up
}

func (x *completion) RequestID() string {
	return string(x.reqID)
}

func (x *completion) PrefillRank(pre *pool.Pod) (rank, ranks int) {
	if !sglangPairLeg(x, pre) {
		return 0, 0
	}
	pin := x.g.pinFor(x, pre)
	if !pin.pinned {
		return 0, 0
	}
	return int(pin.rank), pre.Config.DataParallelSize
}

func (x *completion) PlacePair(pre, dec *pool.Pod) bool {
	// The pair is decided whole (pd) among available pods: its prefill
	// pod is counted as picked, and takes a half-open pod's probe; a
	// panic pick goes beside the probe (panic.go).
	if !x.g.place(x.m, x, pre, !x.panicked) {
		return false
	}
	x.placeDecode(dec)
	return true
}

// placeDecode records that dec takes x's decode leg: the adapter it uses,
// and the prompt's blocks it will hold (the prefill's KV) in the index.
func (x *completion) placeDecode(dec *pool.Pod) {
	if x.adapter != nil {
		dec.UseAdapter(x.adapter, &x.m.LoRA)
	}
	if x.usesCache(x.m) {
		x.m.Prefix.InsertChains(dec.PrefixID, x.keys, x.chains)
	}
}

func (x *completion) Unplace(pre *pool.Pod) { x.g.unplace(x, pre) }

func (x *completion) PrefillDone(pre *pool.Pod, at time.Time, cut, ok bool) {
	if !ok {
		// Not the pod's prefill speed: a failure may come at once.
		x.idleStart = false
	}
	x.g.prefillDone(x, pre, at)
	x.tr.prefillDone(at, cut)
}

func (x *completion) HandOver() (int64, ledger.Ticket) {
	x.firstSeen = true
	return x.uncached, x.ticket
}

// Respond relays the decode pod's answer, whose head is in, its relay
// beginning with first: a retry of the pair retries no more
// (retryAnswered), as on one pod.
func (x *completion) Respond(pod *pool.Pod, resp *fasthttp.Response, first []byte) {
	x.primed = copy(x.wait[:], first)
	x.tr.decodeHead(x.pd.PrefillEnd())
	x.g.retryAnswered(x)
	x.g.respond(x.ctx, x, x.m, pod, resp)
}

func (x *completion) Tried(pod *pool.Pod) { x.tried = append(x.tried, pod.ID) }

// MoveDecode switches the pair's decode leg to another available decode
// pod, its own roleset's first, after the leg could not be sent to the
// chosen one (f), if tryAgain allows it: the new pod takes the KV the
// prefill leg left. With none available, it is a panic pick among the
// decode pods not tried, whatever their state (panicRetry), as a retry's
// would be: the retry of the whole pair would run the prefill again.
// False when there is none, before tryAgain counts a retry: the pair's
// own failure then decides the retry.
func (x *completion) MoveDecode(f *failure) bool {
	g := x.g
	next, pick := x.nextDecode(x.availableUntried)
	panicked := false
	if next == nil && g.mayPanic(x) {
		next, pick = x.nextDecode(func(d *pool.Pod, _ int64) bool { return panicRetry(x, d.ID, d.Left()) })
		panicked = next != nil
	}
	// tryAgain, which logs, runs outside the selection lock.
	if next == nil || !g.tryAgain(x, f) {
		pick.Done()
		return false
	}
	if panicked {
		g.metrics.model(x.m).panics.Inc()
	}
	g.retried(x)
	x.switchDecode(next, pick)
	// The move is an attempt: tryAgain's budget bounds it.
	x.attempts++
	return true
}

// TakeDecode counts the decode leg in flight on its pod as it goes out.
// The pod was available at the decision, but a pair's prefill may outlast
// that: a pod ejected or taken out by its checks since, or half-open with
// its one probe out (pairs decided before its ejection each hold a leg
// for it), gets the leg only when no other decode pod is available; else
// the leg moves to one, spending no retry (nothing was sent).
func (x *completion) TakeDecode() {
	for {
		dec := x.pd.Dec
		if dec.Available(x.g.ledger.Now()) && dec.AcquireProbe(x.sequences()) {
			return
		}
		next, pick := x.nextDecode(x.availableUntried)
		if next == nil {
			dec.Acquire(x.sequences())
			return
		}
		x.switchDecode(next, pick)
	}
}

// nextDecode is the decode pod the pair's leg may move to among those
// may keeps (at now, the ledger's clock), its prefill pod's roleset's
// first, serving the request's adapter, with its pending pick taken; nil
// when there is none. Chosen and counted pending under the selection
// lock, as a decision is (pool.Pod.AvailablePD).
func (x *completion) nextDecode(may func(d *pool.Pod, now int64) bool) (*pool.Pod, route.PendingTicket) {
	g, p := x.g, x.pd
	g.ledger.LockSelection()
	defer g.ledger.UnlockSelection()
	now := g.ledger.Now()
	var next *pool.Pod
	for _, d := range x.m.Decode {
		if !may(d, now) || (x.adapter != nil && !d.Has(x.adapter)) {
			continue
		}
		if next == nil || (d.Roleset == p.Pre.Roleset && next.Roleset != p.Pre.Roleset) {
			next = d
		}
	}
	if next == nil {
		return nil, route.PendingTicket{}
	}
	return next, next.Pending().Pick()
}

// availableUntried keeps a decode pod available at now that x has not
// tried.
func (x *completion) availableUntried(d *pool.Pod, now int64) bool {
	return d.AvailablePD(now) && !tried(x.tried, d.ID)
}

// switchDecode moves the pair's decode leg to next, whose pending pick is
// pick.
func (x *completion) switchDecode(next *pool.Pod, pick route.PendingTicket) {
	g, p := x.g, x.pd
	p.Ticket.Done()
	p.Dec, p.Ticket = next, pick
	x.placeDecode(next)
	g.ledger.LockSelection()
	// Only the decode charge moves: a concurrent prefill leg may still
	// run, and ends its active charge itself.
	g.ledger.MoveDecode(x.ticket, next.ID, g.ledger.Now())
	g.ledger.UnlockSelection()
}

// includeUsage says whether the stream of x ends with a usage chunk as
// engine k would send it: stream_options without include_usage takes the
// engine's default.
func (x *completion) includeUsage(k engines.Kind) bool {
	r := x.req
	if r.HasStreamOptions && !r.HasIncludeUsage {
		return k.IncludeUsageDefault()
	}
	return r.IncludeUsage
}

// AnswerFromPrefill answers x with the prefill leg's answer (a
// TensorRT-LLM context response that finished at its first token), as
// is; a streaming client gets it as the stream it asked for.
func (x *completion) AnswerFromPrefill(pre *pool.Pod, resp *fasthttp.Response, body []byte) {
	x.g.retryAnswered(x)
	ctx := x.ctx
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.Set(headerPod, pre.Config.Name)
	ctx.Response.Header.Set(pd.HeaderPrefillPod, pre.Config.Name)
	ctx.Response.Header.SetBytesV(headerRequestID, x.reqID)
	addFields(ctx, x.rateHead)
	status := fasthttp.StatusOK
	if !x.req.Stream {
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	} else if sse, err := pd.AppendAnswerSSE(nil, body, x.req.Kind == openai.KindChat, x.includeUsage(pre.Engine)); err != nil {
		e := openai.UpstreamError("the context pod's final answer does not parse: " + err.Error())
		writeFailure(ctx, answer(e))
		x.failure, status = e, e.Status
	} else {
		ctx.SetContentType("text/event-stream; charset=utf-8")
		ctx.SetBody(sse)
	}
	if status == fasthttp.StatusOK {
		// Its usage is the output charged, as respond's for a whole
		// answer: the context response is one whatever the client asked.
		x.counted.ObserveBody(body)
	}
	x.g.finish(x, x.m, pre, resp, status)
}

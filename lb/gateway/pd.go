package gateway

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// Prefill/decode disaggregation on the request path. A model's profiles
// resolve each request's strategy; "pd" runs route.PDRouter.Decide over
// every pod of the model, and the decision is carried out here:
//
//	PDCombined  the whole request to a combined pod (fallback, overflow)
//	PDLocal     the whole request to the decode pod, which prefills itself
//	PDPair      the engine's exchange (pd_exchange.go): a prefill leg and a
//	            decode leg whose response the client gets
//
// A pod that refused the connection, or that the gateway's connection cap
// kept the request from, received nothing, so the request is decided again
// without it, at most Upstream.Retries times, as on the combined path.

// pdCall is one request's PD state, pooled apart from the exchange: a
// request the PD cascade does not route never takes one, and a stream holds
// its exchange for its whole life (about a kilobyte less each). Only the
// request's own goroutine touches it; what the legs running beside it
// share lives in a pd.Link.
type pdCall struct {
	opts    route.PDOptions
	metrics *pd.Metrics
	proto   engines.Protocol
	ex      engines.Exchange
	scratch route.PDScratch
	cands   []route.PDCandidate
	pods    []*pool.Pod
	prompt  ledger.Prompt
	// decision is the cascade's latest, for the request's stages.
	decision route.PDDecision
	// pre and dec are the pair of a PDPair decision (dec alone for
	// PDLocal); ticket is dec's pending-decode pick.
	pre, dec *pool.Pod
	ticket   route.PendingTicket
	// active: a PDPair exchange is under way, so the decode watchdog
	// applies and end has work to do.
	active bool
	// watched: the deadline of the decode leg's current read is the
	// watchdog's, so a timeout is the watchdog firing.
	watched bool
	// prefillEnd is when the prefill leg answered (sequential protocols;
	// concurrent ones publish it in link).
	prefillEnd time.Time
	legsStart  time.Time
	link       *pd.Link[failure]
	// ctx is the client's request, for the watchdog's header on a
	// non-streaming answer.
	ctx                       *fasthttp.RequestCtx
	preBody, decBody, preResp []byte
}

var pdCallPool = sync.Pool{New: func() any { return new(pdCall) }}

// release readies p for the next request and puts it back in the pool.
func (p *pdCall) release() {
	p.ticket.Done()
	if p.link != nil {
		p.link.Release()
	}
	clear(p.pods)
	p.proto, p.ex, p.link, p.ctx, p.pre, p.dec, p.metrics = nil, engines.Exchange{}, nil, nil, nil, nil, nil
	p.active, p.watched, p.prompt = false, false, ledger.Prompt{}
	p.cands, p.pods = p.cands[:0], p.pods[:0]
	pdCallPool.Put(p)
}

// pickPD routes x with its cascade, taking a pdCall on its first pick.
func (g *Gateway) pickPD(x *completion) error {
	if x.pd == nil {
		x.pd = pdCallPool.Get().(*pdCall)
		x.pd.opts, x.pd.ctx, x.pd.metrics = x.cascade.Options(), x.ctx, g.metrics.model(x.m).pd
	}
	// Each attempt places the prompt anew.
	x.firstSeen = false
	var err error
	x.pd.decision, err = g.decidePD(x.m, x, x.cascade, sessionOf(x.ctx))
	return err
}

// placedPD is the prefill and decode pods x's PD decision puts it on, as
// admission predicts them.
func placedPD(x *completion) (pre, dec *pool.Pod) {
	p := x.pd
	switch d := p.decision; d.Kind {
	case route.PDLocal:
		return p.dec, p.dec
	case route.PDCombined:
		return p.pods[d.Combined], p.pods[d.Combined]
	}
	return p.pre, p.dec
}

// attemptPD carries x's PD decision out: nil once the client is answered.
func (g *Gateway) attemptPD(x *completion) *failure {
	p := x.pd
	switch d := p.decision; d.Kind {
	case route.PDPair:
		return g.runPair(x.ctx, x, x.m)
	case route.PDLocal:
		return g.runWhole(x.ctx, x, x.m, p.dec)
	default:
		return g.runWhole(x.ctx, x, x.m, p.pods[d.Combined])
	}
}

// decidePD runs the cascade over every pod of m not yet tried, under the
// ledger's selection lock, and charges the decision: the prefill and
// decode pods' ledgers and the decode pod's pending count, before any I/O,
// so the next decision sees them.
func (g *Gateway) decidePD(m *pool.Model, x *completion, r *route.PDRouter, session string) (route.PDDecision, error) {
	p := x.pd
	p.ticket.Done()
	g.lookup(m, x)
	x.routeReq = route.Request{PromptTokens: x.req.PromptTokens(), Keys: x.keys, BlockSize: m.BlockSize, Rand: rand.Uint64()}
	g.ledger.LockSelection()
	defer g.ledger.UnlockSelection()
	// One reading of the gateway's clock (its ledger's) for the breakers,
	// the ledger and the decision's duration.
	now := g.ledger.Now()
	p.cands, p.pods = p.cands[:0], p.pods[:0]
	for _, pod := range m.Pods {
		c := route.PDCandidate{
			Role:      pod.Role,
			Roleset:   max(pod.Roleset, 0),
			BucketMin: pod.Config.BucketMin,
			BucketMax: pod.Config.BucketMax,
			Down:      !pod.Available(now) || tried(x.tried, pod.ID),
		}
		g.candidate(&c.Candidate, m, x, pod)
		if s := pod.Scraped(); s != nil {
			c.GenTokensPerSec = s.TokensPerSec
		}
		if pod.Role == route.RoleDecode {
			c.Pending, c.DrainRate, c.Line = pod.Pending(), pod.DrainRate(), pod.DecodeLine()
			c.DecodeTokens, c.DecodeAgeSec = g.ledger.Decode(pod.ID, now)
		}
		p.cands = append(p.cands, c)
		p.pods = append(p.pods, pod)
	}
	d, err := r.Decide(&x.routeReq, p.cands, &p.scratch)
	if err != nil {
		return d, err
	}
	preID, decID := int32(-1), int32(-1)
	p.pre, p.dec = nil, nil
	switch d.Kind {
	case route.PDPair:
		p.pre, p.dec = p.pods[d.Prefill], p.pods[d.Decode]
		x.chosen = p.cands[d.Prefill].Candidate
		preID, decID = p.pre.ID, p.dec.ID
	case route.PDLocal:
		// The decode pod prefills the few tokens it lacks: both charges
		// are its own.
		p.dec = p.pods[d.Decode]
		x.chosen = p.cands[d.Decode].Candidate
		preID, decID = p.dec.ID, p.dec.ID
	default:
		x.chosen = p.cands[d.Combined].Candidate
		preID = p.pods[d.Combined].ID
	}
	p.prompt = promptOf(m, x, session)
	g.ledger.Charge(&x.ticket, preID, decID, &p.prompt, now)
	if p.dec != nil {
		p.ticket = p.dec.Pending().Pick()
	}
	if pl := r.Planner(); pl != nil {
		pl.Record(x.routeReq.PromptTokens)
	}
	p.metrics.Decided(d, time.Duration(g.ledger.Now()-now))
	return d, nil
}

// runWhole sends the client's request unchanged to pod (a combined pod, or
// the decode pod of a PDLocal decision) and relays its answer.
func (g *Gateway) runWhole(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, pod *pool.Pod) *failure {
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	g.buildUpstream(ctx, up)
	up.SetHost(pod.Config.Address)
	g.place(m, x, pod)
	resp.StreamBody = x.req.Stream
	err := upstream.Do(frontend.ClientGone(ctx), pod.Client, up, resp, time.Now().Add(g.responseTimeout(x.req.Stream)))
	fasthttp.ReleaseRequest(up)
	x.pd.ticket.Done()
	if err == upstream.ErrCut {
		fasthttp.ReleaseResponse(resp)
		g.unplace(x, pod)
		return errClientLeft
	}
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		g.unplace(x, pod)
		g.callFailed(pod, err)
		x.tried = append(x.tried, pod.ID)
		return g.podFailure(pod, err, g.responseTimeout(x.req.Stream))
	}
	if pod.Role == route.RoleDecode {
		ctx.Response.Header.Set(pd.HeaderDecodePod, pod.Config.Name)
	}
	g.respond(ctx, x, m, pod, resp)
	return nil
}

// readDeadline is the deadline of the relay's next read from a PD
// stream: idleBy, the upstream idle timeout's, unless the decode leg of a
// pair is relayed; then the watchdog's (AIBrix's): the first chunk within
// DecodeFirstResponseTimeout of the prefill's success, then at most
// DecodeStreamIdleTimeout between chunks. A watchdog timeout that is 0
// (off) leaves the upstream's.
func (p *pdCall) readDeadline(idleBy time.Time, started bool) time.Time {
	if !p.active {
		return idleBy
	}
	if p.link != nil && started {
		p.link.Started.Store(true)
	}
	switch {
	case started && p.opts.DecodeStreamIdleTimeout > 0:
		p.watched = true
		return time.Now().Add(p.opts.DecodeStreamIdleTimeout)
	case !started && p.opts.DecodeFirstResponseTimeout > 0:
		p.watched = true
		return p.firstBy(p.opts.DecodeFirstResponseTimeout)
	}
	p.watched = false
	return idleBy
}

// firstBy is when the decode leg's first answer is due: within limit of
// the prefill's success. While a concurrent prefill leg is still running,
// the bound is its own timeout plus limit; the prefill leg tightens it
// when it succeeds (concurrentPrefill).
func (p *pdCall) firstBy(limit time.Duration) time.Time {
	if p.link != nil {
		if end := p.link.PrefillEnd.Load(); end != 0 {
			return time.Unix(0, end).Add(limit)
		}
		return p.legsStart.Add(p.opts.PrefillRequestTimeout + limit)
	}
	return p.prefillEnd.Add(limit)
}

// streamFailure is the client's failure for a failed read of a pod's
// answer whose headers are in: the prefill leg's when its failure cut the
// decode leg, the decode watchdog's when its deadline passed, else the
// pod's (podFailure).
func (g *Gateway) streamFailure(x *completion, err error) *failure {
	// A stream's reads wait at most the idle timeout; a whole answer's,
	// what is left of its bound.
	within := g.cfg.Upstream.StreamIdleTimeout
	if !x.req.Stream {
		within = g.cfg.Upstream.WholeResponseTimeout
	}
	if p := x.pd; p != nil && p.active {
		if l := p.link; l != nil {
			if f := l.PreErr.Load(); f != nil {
				if x.req.Stream {
					return answer(f.e) // past the headers: no x-error-pd-*
				}
				return f
			}
		}
		if p.watched && pool.IsTimeout(err) {
			f := g.decodeWatchdog(x, err)
			if x.req.Stream {
				f.pdHeader = ""
			}
			return f
		}
	}
	f := g.podFailure(nil, err, within)
	f.sent = true // the headers came: the pod has the request
	return f
}

// decodeWatchdog counts a request the watchdog failed, tells the decode
// pod to drop it and returns the client's 504. The caller closes the
// decode connection, which is the abort of engines without an abort call.
func (g *Gateway) decodeWatchdog(x *completion, err error) *failure {
	p := x.pd
	p.metrics.Watchdog.Inc()
	pd.Abort(p.proto, &p.ex, p.dec)
	return &failure{
		e: &openai.Error{Status: fasthttp.StatusGatewayTimeout, Type: openai.TypeServer,
			Message: "The decode pod stopped answering (decode watchdog); the request was aborted on " + p.dec.Config.Name + "."},
		pdHeader: pd.HeaderDecodeError, pod: p.dec, sent: !upstream.NotSent(err),
	}
}

// end ends a PD exchange whose decode leg answered, before its response
// is released; finish calls it.
func (p *pdCall) end(pod *pool.Pod, status int) {
	if p.link != nil {
		// Before the connection goes back to the client pool, where a
		// late prefill failure must not find it.
		p.link.SetDecConn(nil)
	}
	if !p.active {
		return
	}
	p.active = false
	if status == fasthttp.StatusOK && pod == p.dec {
		pod.DecodeFinished()
	}
}

// prefillAnswered is the client's error for a prefill leg the pod
// answered with status: the pod's own words, cut.
func prefillAnswered(status int, body []byte) *openai.Error {
	typ := openai.TypeServer
	if status < 500 {
		typ = openai.TypeInvalidRequest
	}
	const limit = 512
	if len(body) > limit {
		body = body[:limit]
	}
	return &openai.Error{Status: status, Type: typ, Message: "The prefill pod answered " + strconv.Itoa(status) + ": " + string(body)}
}

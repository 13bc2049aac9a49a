package gateway

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"pdlb/lb/fail"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// Prefill/decode disaggregation on the request path. A model's profiles
// resolve each request's strategy; "pd" runs route.PDRouter.Decide over
// every pod of the model, and the decision is carried out here:
//
//	PDCombined  the whole request to a combined pod (fallback, overflow),
//	            a plain attempt (stages.go)
//	PDLocal     the whole request to the decode pod, which prefills
//	            itself, a plain attempt too
//	PDPair      the engine's exchange (lb/pd, Call.RunPair): a prefill leg
//	            and a decode leg whose response the client gets
//
// A pod that refused the connection, or that the gateway's connection cap
// kept the request from, received nothing, so the request is decided again
// without it, at most Upstream.Retries times, as on the combined path.

// pickPD routes x with its cascade, taking a pd.Call on its first pick.
func (g *Gateway) pickPD(x *completion) error {
	if x.pd == nil {
		x.pd = pd.AcquireCall(x, pdFleet{g}, x.ctx, x.cascade.Options(), g.metrics.model(x.m).pd, x.req.Stream, x.req.Kind == openai.KindChat, x.req.Batch(), x.sequences())
	}
	// Each attempt places the prompt anew, and among available pods: a
	// panic pick of another model's, before a fallback, is not this one.
	x.firstSeen, x.panicked = false, false
	var err error
	x.pd.Decision, err = g.decidePD(x.m, x, x.cascade, sessionOf(x))
	// A pair's exchange runs in lb/pd (attemptStage); the whole request
	// to one pod (PDLocal, PDCombined) is a plain attempt on it.
	x.pod = nil
	if err == nil && x.pd.Decision.Kind != route.PDPair {
		x.pod, _ = placedPD(x)
	}
	return err
}

// exchangeCarries says whether the model's prefill/decode exchange
// carries x: a completion batch only where its engine's exchange does
// (engines.Kind.ExchangesBatch), several choices (n) on none. Each engine
// runs a prompt's n samples as requests of their own while its exchange
// hands one request's KV over: SGLang runs them all under the prompt's
// one bootstrap room, whatever rooms the request names, and their
// transfers collide; vLLM's prefill answer carries one child request's
// kv_transfer_params (vllm-project/vllm pull request 38900, open, would
// add the others'); TensorRT-LLM's disaggregated server passes on the
// first choice's disaggregated_params only. One it does not carry goes
// whole.
func exchangeCarries(x *completion) bool {
	return (x.req.Batch() == 1 || x.m.Profiles.Engine.ExchangesBatch()) && x.req.Choices == 1
}

// choicesRefused is the 400 for several choices (n) on a model none of
// whose pods can serve them: its exchange cannot, its decode pods refuse
// a request that did not go through it, and it has no combined pod. Nil
// when the model can serve x.
func choicesRefused(x *completion) *openai.Error {
	if n := x.req.Choices; n > 1 && len(x.m.Combined) == 0 && x.m.Profiles.DecodeNeedsExchange() {
		return openai.InvalidValue("n", fmt.Sprintf("is %d, which model %q cannot serve: its prefill/decode exchange runs one choice of a prompt, its decode pods refuse a request that did not go through it, and it has no combined pod; send one request per choice", n, x.m.Name))
	}
	return nil
}

// placedPD is the prefill and decode pods x's PD decision puts it on, as
// admission predicts them.
func placedPD(x *completion) (pre, dec *pool.Pod) {
	p := x.pd
	switch d := p.Decision; d.Kind {
	case route.PDLocal:
		return p.Dec, p.Dec
	case route.PDCombined:
		return p.Pods[d.Combined], p.Pods[d.Combined]
	}
	return p.Pre, p.Dec
}

// decidePD runs the cascade over every pod of m not yet tried, under the
// ledger's selection lock, and charges the decision: the prefill and
// decode pods' ledgers and the decode pod's pending count, before any I/O,
// so the next decision sees them. It decides again when the pods it chose
// must load x's adapter and another pick began a load since (loadAdapter).
func (g *Gateway) decidePD(m *pool.Model, x *completion, r *route.PDRouter, session string) (route.PDDecision, error) {
	p := x.pd
	p.Ticket.Done()
	g.lookup(m, x)
	x.routeReq = route.Request{PromptTokens: x.req.PromptTokens(), Keys: x.keys, BlockSize: m.BlockSize, Rand: rand.Uint64(),
		Whole: !exchangeCarries(x)}
	g.ledger.LockSelection()
	defer g.ledger.UnlockSelection()
	// One reading of the gateway's clock (its ledger's) for the breakers,
	// the ledger and the decision's duration.
	now := g.ledger.Now()
	var d route.PDDecision
	var preID, decID int32
	for {
		g.pdCandidates(m, x, now)
		var seen uint64
		if x.adapter != nil {
			seen = m.LoadsBegun()
			x.tiers = m.FillAdapterPD(p.Cands, p.Pods, x.adapter, x.tiers)
		}
		var err error
		if d, err = r.Decide(&x.routeReq, p.Cands, &p.Scratch); err != nil {
			if !x.panicked && errors.Is(err, route.ErrNoPDPair) && g.mayPanic(x) {
				// Once more among the pods the checks pass (panic.go).
				x.panicked = true
				continue
			}
			return d, err
		}
		preID, decID = -1, -1
		p.Pre, p.Dec = nil, nil
		switch d.Kind {
		case route.PDPair:
			p.Pre, p.Dec = p.Pods[d.Prefill], p.Pods[d.Decode]
			x.chosen = p.Cands[d.Prefill].Candidate
			preID, decID = p.Pre.ID, p.Dec.ID
		case route.PDLocal:
			// The decode pod prefills the few tokens it lacks: both
			// charges are its own.
			p.Dec = p.Pods[d.Decode]
			x.chosen = p.Cands[d.Decode].Candidate
			preID, decID = p.Dec.ID, p.Dec.ID
		default:
			x.chosen = p.Cands[d.Combined].Candidate
			preID = p.Pods[d.Combined].ID
		}
		p.Decision = d
		if pre, dec := placedPD(x); g.loadAdapter(m, x, pre, dec, seen) {
			break
		}
	}
	p.Prompt = promptOf(m, x, session)
	g.ledger.Charge(&x.ticket, preID, decID, &p.Prompt, now)
	if p.Dec != nil {
		p.Ticket = p.Dec.Pending().Pick()
	}
	if x.panicked {
		g.metrics.model(m).panics.Inc()
	}
	p.Metrics.Decided(d, time.Duration(g.ledger.Now()-now))
	if pl := r.Planner(); p.Routed(d.Kind) && pl != nil {
		// The prompts of requests, as the planner counts them: one
		// decided anew is one prompt.
		pl.Record(x.routeReq.PromptTokens)
	}
	return d, nil
}

// pdCandidates fills x's PD call with a candidate for each pod of m at
// now, down where unavailable or tried, or on a panic pick (x.panicked)
// where it may not take it (panicPod). The caller holds the ledger's
// selection lock.
func (g *Gateway) pdCandidates(m *pool.Model, x *completion, now int64) {
	p := x.pd
	p.Cands, p.Pods = p.Cands[:0], p.Pods[:0]
	for _, pod := range m.Pods {
		var down bool
		if x.panicked {
			down = !panicPod(x, pod.ID, pod.Healthy(), pod.Left())
		} else {
			down = !pod.AvailablePD(now) || tried(x.tried, pod.ID)
		}
		c := route.PDCandidate{
			Role:      pod.Role,
			Roleset:   max(pod.Roleset, 0),
			BucketMin: pod.Config.BucketMin,
			BucketMax: pod.Config.BucketMax,
			Down:      down,
		}
		g.candidate(&c.Candidate, m, x, pod)
		if s := pod.Scraped(); s != nil {
			c.GenTokensPerSec = s.TokensPerSec
		}
		if pod.Role == route.RoleDecode {
			c.Pending, c.DrainRate, c.Line = pod.Pending(), pod.DrainRate(), pod.DecodeLine()
			c.DecodeTokens, c.DecodeAgeSec = g.ledger.Decode(pod.ID, now)
		}
		p.Cands = append(p.Cands, c)
		p.Pods = append(p.Pods, pod)
	}
}

// streamFailure is the client's failure for a failed read of a pod's
// answer whose headers are in: the PD exchange's when it knows the cause
// (pd.Call.StreamFailure), else the pod's (podFailure).
func (g *Gateway) streamFailure(x *completion, err error) *failure {
	if x.pd != nil {
		if f := x.pd.StreamFailure(err); f != nil {
			return f
		}
	}
	// A stream's reads wait at most the idle timeout; a whole answer's,
	// what is left of its bound.
	within := g.cfg.Upstream.StreamIdleTimeout
	if !x.req.Stream {
		within = g.cfg.Upstream.WholeResponseTimeout
	}
	f := g.podFailure(nil, err, within)
	f.Reason = fail.Began // the headers came: the pod has the request
	return f
}

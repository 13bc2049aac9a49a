package pd

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/fail"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/ledger"
)

// Host is the request's side of a pair's exchange: its placement, its
// tried pods and retry budget, and its answer. Only the request's own
// goroutine calls it.
type Host interface {
	// Upstream is the client's request readied for pod (headers, the
	// request id, the host); the caller releases it.
	Upstream(pod *pool.Pod) *fasthttp.Request
	// RequestID is the request id Upstream settled on.
	RequestID() string
	// PrefillRank is the data-parallel rank of pre, of ranks, to prefill
	// the prompt on through the exchange (engines.Exchange.PrefillRank),
	// counted as pinned; ranks 0 when there is none.
	PrefillRank(pre *pool.Pod) (rank, ranks int)
	// PlacePair commits the request to the prefill pod pre; the prefix
	// index learns that dec will hold the prompt's KV too. False,
	// committing nothing, when pre is half-open and another request took
	// its one probe since the decision.
	PlacePair(pre, dec *pool.Pod) bool
	// Unplace undoes PlacePair's placement on pre, whose leg never went
	// out.
	Unplace(pre *pool.Pod)
	// PrefillDone: a sequential prefill leg on pre ended at at; cut, the
	// client cut it short; ok, it succeeded: a leg that failed or was cut
	// times nothing.
	PrefillDone(pre *pool.Pod, at time.Time, cut, ok bool)
	// HandOver gives the prefill pod's accounting to a concurrent prefill
	// leg, which ends it itself: the uncached tokens queued on the pod and
	// a copy of the request's ledger ticket.
	HandOver() (uncached int64, t ledger.Ticket)
	// Respond relays the decode pod's answer, whose head is in, and of a
	// stream its first body bytes, first, read already.
	Respond(pod *pool.Pod, resp *fasthttp.Response, first []byte)
	// AnswerFromPrefill answers with the prefill pod's final answer body
	// (resp's, copied), and finishes the request.
	AnswerFromPrefill(pre *pool.Pod, resp *fasthttp.Response, body []byte)
	// Tried rules pod out for the request's next picks.
	Tried(pod *pool.Pod)
	// TakeDecode counts a sequential decode leg in flight on Dec as it
	// goes out, first moving it to another available decode pod (Dec
	// then) when Dec has turned unavailable since the decision (ejected,
	// down, or half-open with its one probe out) and one is.
	TakeDecode()
	// MoveDecode moves the decode leg, which failed with f, to another
	// decode pod (Call.Dec), charging it; false when none is left or the
	// request may not retry (its retries, the retry budget), which it
	// asks only when a pod is left.
	MoveDecode(f *fail.Failure) bool
}

// Fleet is the gateway's side: the pods' connections and health, and the
// ledger. The legs' goroutines call it too, after the request may have
// ended.
type Fleet interface {
	// Send sends a leg, up, to pod and reads its answer into resp: its
	// head when resp.StreamBody is set, else all of it, by deadline, and
	// with first a 200 stream's first body bytes into it (n) by then too;
	// closing cut or drop (either may be nil) gives it up (upstream.DoCut
	// with upstream.ChansCut).
	Send(cut, drop <-chan struct{}, pod *pool.Pod, up *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, first []byte) (n int, err error)
	// CallFailed counts a call to pod that failed with err; PodFailed an
	// answer of pod's that is its fault.
	CallFailed(pod *pool.Pod, err error)
	PodFailed(pod *pool.Pod)
	// PodFailure is the client's failure for a call to pod that ended in
	// err; within is the bound that passed, should err be a timeout.
	PodFailure(pod *pool.Pod, err error, within time.Duration) *fail.Failure
	// ReleasePrefill releases the active (prefill) part of t's ledger
	// charge.
	ReleasePrefill(t ledger.Ticket)
	// ResponseTimeout bounds a pod's answer (stream: its headers).
	ResponseTimeout(stream bool) time.Duration
}

// Call is one request's PD state, pooled apart from the request: a
// request the PD cascade does not route never takes one. Only the
// request's own goroutine touches it; what the legs running beside it
// share lives in a Link.
type Call struct {
	// The gateway's decision, which it fills (Decide's inputs and
	// outcome): the cascade's options, the candidates and their pods, the
	// prompt as charged, the decision.
	Opts     route.PDOptions
	Metrics  *Metrics
	Scratch  route.PDScratch
	Cands    []route.PDCandidate
	Pods     []*pool.Pod
	Prompt   ledger.Prompt
	Decision route.PDDecision
	// Pre and Dec are the pair of a PDPair decision (Dec alone for
	// PDLocal); Ticket is Dec's pending-decode pick.
	Pre, Dec *pool.Pod
	Ticket   route.PendingTicket
	// routed: the request is counted in Metrics.Kinds (Routed).
	routed bool

	host   Host
	fleet  Fleet
	ctx    *fasthttp.RequestCtx
	stream bool
	chat   bool
	batch  int
	seqs   int // n for each prompt, which its legs count on their pods
	proto  engines.Protocol
	ex     engines.Exchange
	// gone is closed when the client leaves (frontend.WatchClient), from
	// the legs' start on.
	gone <-chan struct{}
	// active: a pair's exchange is under way, so the decode watchdog
	// applies and End has work to do.
	active bool
	// watched: the deadline of the decode leg's current read is the
	// watchdog's, so a timeout is the watchdog firing.
	watched bool
	// prefillEnd is when the prefill leg answered (sequential protocols;
	// concurrent ones publish it in link).
	prefillEnd time.Time
	legsStart  time.Time
	// first holds a sequential decode leg's first body bytes (firstN).
	first                     [1]byte
	firstN                    int
	link                      *Link
	preBody, decBody, preResp []byte
}

var callPool = sync.Pool{New: func() any { return new(Call) }}

// AcquireCall returns a Call for the client's request ctx, routed with
// opts; stream, chat, batch (its prompts) and seqs (its sequences: n for
// each prompt) are the request's.
func AcquireCall(h Host, f Fleet, ctx *fasthttp.RequestCtx, opts route.PDOptions, m *Metrics, stream, chat bool, batch, seqs int) *Call {
	c := callPool.Get().(*Call)
	c.host, c.fleet, c.ctx, c.Opts, c.Metrics, c.stream, c.chat, c.batch, c.seqs = h, f, ctx, opts, m, stream, chat, batch, seqs
	return c
}

// Release readies c for the next request and puts it back in the pool.
func (c *Call) Release() {
	c.Ticket.Done()
	if c.link != nil {
		c.link.Release()
	}
	clear(c.Pods)
	c.host, c.fleet, c.ctx, c.gone, c.proto, c.ex, c.link, c.Pre, c.Dec, c.Metrics = nil, nil, nil, nil, nil, engines.Exchange{}, nil, nil, nil, nil
	c.active, c.watched, c.routed, c.Prompt = false, false, false, ledger.Prompt{}
	c.Cands, c.Pods = c.Cands[:0], c.Pods[:0]
	callPool.Put(c)
}

// Routed counts c's request as routed by a decision of kind k, once:
// true the first time, false when it is decided anew (a retry, another
// request took the half-open prefill pod's probe, an admission deferral
// moved it to a worker), which the request's series (pdlb_pd_routed_total,
// the planner's arrivals) must not count again.
func (c *Call) Routed(k route.PDKind) bool {
	if c.routed {
		return false
	}
	c.routed = true
	c.Metrics.Kinds[k].Inc()
	return true
}

// ReadDeadline is the deadline of the relay's next read from a PD
// stream: idleBy, the upstream idle timeout's, unless the decode leg of a
// pair is relayed; then the watchdog's (AIBrix's): the first chunk within
// DecodeFirstResponseTimeout of the prefill's success, then at most
// DecodeStreamIdleTimeout between chunks. A watchdog timeout that is 0
// (off) leaves the upstream's.
func (c *Call) ReadDeadline(idleBy time.Time, started bool) time.Time {
	if !c.active {
		return idleBy
	}
	if c.link != nil && started {
		c.link.Started.Store(true)
	}
	switch {
	case started && c.Opts.DecodeStreamIdleTimeout > 0:
		c.watched = true
		return time.Now().Add(c.Opts.DecodeStreamIdleTimeout)
	case !started && c.Opts.DecodeFirstResponseTimeout > 0:
		c.watched = true
		return c.firstBy(c.Opts.DecodeFirstResponseTimeout)
	}
	c.watched = false
	return idleBy
}

// firstBy is when the decode leg's first answer is due: within limit of
// the prefill's success. While a concurrent prefill leg is still running,
// the bound is its own timeout plus limit; the prefill leg tightens it
// when it succeeds (concurrentPrefill).
func (c *Call) firstBy(limit time.Duration) time.Time {
	if c.link != nil {
		if end := c.link.PrefillEnd.Load(); end != 0 {
			return time.Unix(0, end).Add(limit)
		}
		return c.legsStart.Add(c.Opts.PrefillRequestTimeout + limit)
	}
	return c.prefillEnd.Add(limit)
}

// PrefillEnd is when the pair's prefill leg answered, zero while
// unknown.
func (c *Call) PrefillEnd() time.Time {
	if c.link != nil {
		if end := c.link.PrefillEnd.Load(); end != 0 {
			return time.Unix(0, end)
		}
		return time.Time{}
	}
	return c.prefillEnd
}

// FirstToken times the KV handoff of a sequential pair's stream, whose
// first token came at at: from the prefill leg's answer. Only the first
// token shows it: a decode pod sends a stream's headers before it pulls
// the KV (vLLM's OpenAI server), and a whole answer after the decode.
func (c *Call) FirstToken(at time.Time) {
	if c.active && c.link == nil {
		c.Metrics.KVTransfer.Update(at.Sub(c.prefillEnd).Seconds())
	}
}

// StreamFailure is the client's failure for a failed read of the decode
// leg's answer, whose headers are in, when the exchange knows its cause:
// the prefill leg's when its failure cut the decode leg, the decode
// watchdog's when its deadline passed. Nil otherwise: the pod's failure.
func (c *Call) StreamFailure(err error) *fail.Failure {
	if !c.active {
		return nil
	}
	if f := c.PrefillCut(); f != nil {
		if c.stream {
			return &fail.Failure{E: f.E} // past the headers: no x-error-pd-*
		}
		return f
	}
	if c.watched && pool.IsTimeout(err) {
		f := c.watchdog(err)
		if c.stream {
			f.PDHeader = ""
		}
		return f
	}
	return nil
}

// PrefillCut is the failure of the concurrent prefill leg, which cuts
// the decode leg's answer (Link.prefill), nil while it has none: a read
// of that answer that failed then is not the decode pod's failure.
func (c *Call) PrefillCut() *fail.Failure {
	if c.link == nil {
		return nil
	}
	return c.link.PreErr.Load()
}

// watchdog counts a request the watchdog failed, tells the decode pod to
// drop it and returns the client's 504. The caller closes the decode
// connection, which is the abort of engines without an abort call.
func (c *Call) watchdog(err error) *fail.Failure {
	c.Metrics.Watchdog.Inc()
	Abort(c.proto, &c.ex, c.Dec)
	return &fail.Failure{
		E: &openai.Error{Status: fasthttp.StatusGatewayTimeout, Type: openai.TypeServer,
			Message: "The decode pod stopped answering (decode watchdog); the request was aborted on " + c.Dec.Config.Name + "."},
		// Not retried (Reason Began): the decode pod may be pulling the
		// prefill's KV, which another decode pod cannot count on.
		PDHeader: HeaderDecodeError, Pod: c.Dec,
	}
}

// End ends a request whose answer (pod's, with status) was relayed,
// before its response is released; the request's finish calls it.
func (c *Call) End(pod *pool.Pod, status int) {
	if c.link != nil {
		// Before the connection goes back to the client pool, where a
		// late prefill failure must not find it.
		c.link.SetDecConn(nil)
		if status != fasthttp.StatusOK {
			// A decode answer that failed after its head (a broken
			// stream, an error event, a client that left) takes no KV.
			c.abandonPrefill()
		}
	}
	// A PDLocal request finishes on its decode pod too: its drain rate
	// counts every request that its running ones count.
	decoded := c.active || c.Decision.Kind == route.PDLocal
	c.active = false
	if decoded && status == fasthttp.StatusOK && pod == c.Dec {
		pod.DecodeFinished()
	}
}

// clientLeft reports whether the client has closed its connection, as
// far as its front end can tell.
func (c *Call) clientLeft() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

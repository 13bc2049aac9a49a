// Package admit predicts how soon a pod will serve a request and decides,
// from that prediction and the request's priority class, whether to admit
// it now, defer it, or reject it at once with a 429.
//
// Predictions are plain numbers in seconds; the package knows nothing of
// pods or candidates, so lb/route's policies (which rank pods by the same
// prediction) and the gateway and bench/cluster (which fill the inputs from
// live or simulated pods) all share one formula.
package admit

import (
	"math"
	"sync"
	"sync/atomic"
)

// Defaults of the predictors: the starting points the learners hold until
// they have observed a pod. Prefill speed is the global-scheduling study's
// 20,000 tokens/s; the decode line is engines/sim's (10 ms a step plus 0.2 ms
// per sequence).
const (
	DefaultPrefillTokensPerSec = 20000
	DefaultSpeedAlpha          = 0.2
	DefaultDecodeBaseSec       = 0.010
	DefaultDecodePerSeqSec     = 0.0002
	DefaultDecodeMaxBatch      = 64
	DefaultDecodeForget        = 0.99
)

// TTFT is the predicted time to first token on a prefill or combined pod, in
// seconds: the work already queued on it, then this request's uncached
// tokens, both at the pod's prefill speed, then the KV handoff to the decode
// pod (0 on a combined pod). This is the global-scheduling study's "queueing
// + computing the part that missed". A speed of zero or less means "unknown"
// and uses DefaultPrefillTokensPerSec.
func TTFT(queuedTokens, uncachedTokens, tokensPerSec, transferSec float64) float64 {
	if !(tokensPerSec > 0) {
		tokensPerSec = DefaultPrefillTokensPerSec
	}
	return (queuedTokens+uncachedTokens)/tokensPerSec + transferSec
}

// PrefillSpeed learns one pod's prefill speed on uncached tokens (tokens/s)
// as an exponentially weighted moving average of observed speeds. The zero
// value is not usable; start from NewPrefillSpeed, or Init one held in a
// larger struct. Observe and TokensPerSec are safe for concurrent use and
// never block: the average is one atomic word updated by compare-and-swap.
type PrefillSpeed struct {
	alpha float64
	bits  atomic.Uint64 // math.Float64bits of the average
}

// NewPrefillSpeed returns a learner that starts at initial tokens/s (the
// configured or default speed) and moves a fraction alpha (0 ≤ alpha ≤ 1;
// DefaultSpeedAlpha; 0 never moves) of the way to each observation.
func NewPrefillSpeed(initial, alpha float64) *PrefillSpeed {
	s := new(PrefillSpeed)
	s.Init(initial, alpha)
	return s
}

// Init sets s up as NewPrefillSpeed would, before s is shared.
func (s *PrefillSpeed) Init(initial, alpha float64) {
	s.alpha = alpha
	s.bits.Store(math.Float64bits(initial))
}

// Observe records that a prefill of uncached tokens took sec seconds.
// Observations without work or time are ignored: a full cache hit says
// nothing about compute speed.
func (s *PrefillSpeed) Observe(uncached int, sec float64) {
	if uncached <= 0 || !(sec > 0) {
		return
	}
	sample := float64(uncached) / sec
	for {
		old := s.bits.Load()
		v := math.Float64frombits(old)
		if s.bits.CompareAndSwap(old, math.Float64bits(v+s.alpha*(sample-v))) {
			return
		}
	}
}

// TokensPerSec returns the learned speed.
func (s *PrefillSpeed) TokensPerSec() float64 { return math.Float64frombits(s.bits.Load()) }

// DecodeLine learns one decode pod's step time as a line in its batch size,
// stepSec = base + perSeq × batch (engines/sim's model, and the shape real
// engines show until they run out of compute), by weighted least squares
// over observed (batch, step time) pairs. Older observations fade by the
// forget factor per observation, so the line follows a pod whose speed
// drifts. The prior (base, perSeq) counts as two observations at batch 1 and
// maxBatch, so the line is defined before any observation; a run of
// observations at one batch size (which cannot fix a slope) moves only the
// level and keeps the last slope.
//
// Observe takes a mutex (observations come from scrapes or step reports,
// not per request); TPOT reads two atomic words and never blocks.
type DecodeLine struct {
	mu                   sync.Mutex
	forget               float64
	n, sx, sy, sxx, sxy  float64 // weighted sums of 1, x, y, x², xy
	baseBits, perSeqBits atomic.Uint64
}

// NewDecodeLine returns a learner seeded with the configured line: a step
// of base seconds plus perSeq seconds per sequence, trusted as much as two
// observations at batch 1 and maxBatch. forget in (0, 1] weighs each older
// observation down per new one (DefaultDecodeForget keeps an effective
// memory of about 100 observations).
func NewDecodeLine(base, perSeq float64, maxBatch int, forget float64) *DecodeLine {
	d := &DecodeLine{forget: forget}
	for _, x := range [2]float64{1, float64(maxBatch)} {
		d.add(x, base+perSeq*x)
	}
	d.perSeqBits.Store(math.Float64bits(perSeq))
	d.publish()
	return d
}

func (d *DecodeLine) add(x, y float64) {
	d.n++
	d.sx += x
	d.sy += y
	d.sxx += x * x
	d.sxy += x * y
}

// Observe records that one decode step over batch sequences took stepSec.
func (d *DecodeLine) Observe(batch int, stepSec float64) {
	if batch < 1 || !(stepSec > 0) {
		return
	}
	d.mu.Lock()
	d.n, d.sx, d.sy, d.sxx, d.sxy = d.n*d.forget, d.sx*d.forget, d.sy*d.forget, d.sxx*d.forget, d.sxy*d.forget
	d.add(float64(batch), stepSec)
	d.publish()
	d.mu.Unlock()
}

// publish solves the normal equations and stores the line; the caller holds
// mu or owns d. When the observations span too little of the batch axis to
// fix a slope, the slope is kept and only the level moves.
func (d *DecodeLine) publish() {
	det := d.n*d.sxx - d.sx*d.sx
	if det <= 1e-9*d.n*d.sxx {
		perSeq := math.Float64frombits(d.perSeqBits.Load())
		d.baseBits.Store(math.Float64bits((d.sy - perSeq*d.sx) / d.n))
		return
	}
	perSeq := (d.n*d.sxy - d.sx*d.sy) / det
	d.perSeqBits.Store(math.Float64bits(perSeq))
	d.baseBits.Store(math.Float64bits((d.sy - perSeq*d.sx) / d.n))
}

// Line returns the learned base (seconds) and per-sequence slope (seconds).
func (d *DecodeLine) Line() (base, perSeq float64) {
	return math.Float64frombits(d.baseBits.Load()), math.Float64frombits(d.perSeqBits.Load())
}

// TPOT is the predicted time per output token of a request that joins a
// decode pod now running batch sequences with a fraction kvUsage of its KV
// blocks in use: one step at batch+1. A pod with no free KV (kvUsage ≥ 1)
// would queue or preempt the request, so its TPOT is +Inf.
func (d *DecodeLine) TPOT(batch int, kvUsage float64) float64 {
	if kvUsage >= 1 {
		return math.Inf(1)
	}
	base, perSeq := d.Line()
	return base + perSeq*float64(batch+1)
}

// Path is what a prediction reads of where a request would run: the
// prefill (or combined) pod's queue and speed, the KV handoff to a decode
// pod, and the decode pod's batch. A term the caller cannot tell is left
// zero and counts nothing.
type Path struct {
	// QueuedTokens is the uncached work already queued on the prefill pod
	// and UncachedTokens this prompt's (tokens); PrefillTokensPerSec is the
	// pod's speed (0 or less: DefaultPrefillTokensPerSec).
	QueuedTokens, UncachedTokens, PrefillTokensPerSec float64
	// TransferSec is the KV handoff from the prefill pod to the decode pod
	// (0 when one pod does both).
	TransferSec float64
	// SlotWaitSec is how long the request then waits on the decode pod for
	// a batch slot (SlotWait).
	SlotWaitSec float64
	// FirstTokenOnDecode says the client's first token is the decode pod's
	// first step for the request, as with a disaggregated pair whose decode
	// pod streams the answer: TTFT then adds one step at the joined batch.
	FirstTokenOnDecode bool
	// Batch is the decode pod's running sequences, KVUsage the fraction of
	// its KV blocks in use, Line its learned step line.
	Batch   int
	KVUsage float64
	Line    *DecodeLine
	// Sequences is the request's own that join the batch: n for each of
	// its prompts, as engines run every choice as a sequence of its own
	// (0 counts as 1).
	Sequences int
}

// Predict is the request's predicted time to first token and time per
// output token on p, in seconds: TTFT's prefill queue, uncached compute
// and KV transfer, then the wait for a decode slot (and the first decode
// step when FirstTokenOnDecode); TPOT is the decode pod's step with the
// request's sequences added (DecodeLine.TPOT, one fewer than them added
// to Batch). The gateway and bench/cluster both call it, so admission in
// the simulator is admission in the gateway.
func Predict(p Path) (ttft, tpot float64) {
	tpot = p.Line.TPOT(p.Batch+max(p.Sequences, 1)-1, p.KVUsage)
	ttft = TTFT(p.QueuedTokens, p.UncachedTokens, p.PrefillTokensPerSec, p.TransferSec) + p.SlotWaitSec
	if p.FirstTokenOnDecode {
		ttft += tpot
	}
	return ttft, tpot
}

// SlotWait predicts how long a request routed to a decode pod now waits for
// a batch slot, as the pod's scheduler, which knows its sequences' remaining
// tokens, would: the ahead requests queued before it (beyond the free
// slots; 0 or less: a slot is free) take the slots that free first, a
// running sequence freeing its slot after its remaining tokens at
// fullStepSec, the step time of a full batch of maxBatch. remaining holds
// the running sequences' remaining tokens in ascending order. A queue
// deeper than the running batch is charged queuedTokens, the output tokens
// of the queued requests, at a full batch's throughput on top (an
// overestimate: rejecting early beats a late miss).
func SlotWait(ahead int, remaining []int, fullStepSec float64, maxBatch, queuedTokens int) float64 {
	switch {
	case ahead < 0:
		return 0
	case ahead < len(remaining):
		return float64(remaining[ahead]) * fullStepSec
	}
	last := 0
	if len(remaining) > 0 {
		last = remaining[len(remaining)-1]
	}
	return (float64(last) + float64(queuedTokens)/float64(maxBatch)) * fullStepSec
}

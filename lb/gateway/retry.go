package gateway

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/config"
	"pdlb/lb/fail"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/promtext"
)

// Retries of attempts that got nothing back (upstream.retry_on), within
// Envoy's retry budget (upstream.retry_budget), and the first-byte
// deadline that gives up on a hung pod (upstream.first_byte).

// retryReasons are the reasons an attempt may be retried for, each with
// its retry_on name and its series.
var retryReasons = []struct {
	reason fail.Reason
	on     string
}{
	{fail.Refused, config.RetryOnRefused},
	{fail.Reset, config.RetryOnReset},
	{fail.Timeout, config.RetryOnTimeout},
	{fail.Hung, config.RetryOnTimeout}, // a hedge is a timeout drawn early
	{fail.Down, config.RetryOnTimeout}, // so is a pod the health checks found dead
	{fail.Unavailable, config.RetryOn503},
}

// retryMetrics count the retries by reason and those the budget refused;
// inFlight is the requests retrying now (the budget's count).
type retryMetrics struct {
	byReason  map[fail.Reason]*metrics.Counter
	exhausted *metrics.Counter
	inFlight  atomic.Int64
	// answered counts retries whose pod's answer began (awaitRetry).
	answered atomic.Int64
}

// retryMetricsDoc documents the retry series on the admin /metrics page.
var retryMetricsDoc = promtext.Doc{
	"pdlb_upstream_retries_total":                {Help: "Attempts that got no byte of a pod's answer and went to another pod (or back to one found healthy again), by reason (refused, reset, timeout, hung: past the first-byte deadline, down: health checks found the pod dead, 503)."},
	"pdlb_upstream_retry_budget_exhausted_total": {Help: "Retries not made because upstream.retry_budget's share of the requests in flight were retrying already."},
	"pdlb_upstream_retries_in_flight":            {Help: "Requests in flight that have been retried (upstream.retry_budget counts these)."},
}

func newRetryMetrics(set *metrics.Set) *retryMetrics {
	m := &retryMetrics{byReason: make(map[fail.Reason]*metrics.Counter, len(retryReasons)),
		exhausted: set.NewCounter("pdlb_upstream_retry_budget_exhausted_total")}
	for _, r := range retryReasons {
		m.byReason[r.reason] = set.NewCounter(fmt.Sprintf(`pdlb_upstream_retries_total{reason=%q}`, r.reason))
	}
	set.NewGauge("pdlb_upstream_retries_in_flight", func() float64 { return float64(m.inFlight.Load()) })
	return m
}

// retryOn reports whether upstream.retry_on lists reason.
func (g *Gateway) retryOn(reason fail.Reason) bool {
	for _, r := range retryReasons {
		if r.reason == reason {
			return g.cfg.Upstream.Retry.RetriesOn(r.on)
		}
	}
	return false
}

// takeRetry takes a place in the retry budget for x, which keeps it until
// the head of a pod's answer comes (answered) or it leaves (leave): false
// when the requests retrying are already upstream.retry_budget's share of
// those in flight, unless force. The budget guards a failing fleet
// against doubled load; a pod found dead or gone moves its requests at
// once, bounded by what it held, while the other pods answer their checks.
func (g *Gateway) takeRetry(x *completion, force bool) bool {
	if x.retrying {
		return true
	}
	m := g.metrics.retry
	if m.inFlight.Add(1) > g.retryLimit() && !force {
		m.inFlight.Add(-1)
		return false
	}
	x.retrying = true
	return true
}

// retryLimit is how many requests may be retrying now: retry_budget's
// share of the requests in flight, or its min_retries.
func (g *Gateway) retryLimit() int64 {
	b := &g.cfg.Upstream.Retry.Budget
	return max(int64(b.MinRetries), int64(b.Percent/100*float64(g.inFlight.Load())))
}

// retryAnswered gives x's place in the retry budget back as its pod's
// answer begins: a retry that worked.
func (g *Gateway) retryAnswered(x *completion) {
	if x.retrying {
		g.metrics.retry.answered.Add(1)
		g.leaveRetry(x)
	}
}

// leaveRetry gives x's place in the retry budget back.
func (g *Gateway) leaveRetry(x *completion) {
	if x.retrying {
		x.retrying = false
		g.metrics.retry.inFlight.Add(-1)
	}
}

// firstByteWithin is how long x's attempt on dec (prefilled on pre) may
// wait for the first byte of its answer: upstream.first_byte's k × the
// predicted time to it, plus its floor, when that is shorter than the
// response timeout and the attempt could be retried (hedged); else the
// response timeout. A stream's first byte is its first event's, with its
// first token (engines send its head at once, before the prefill); a
// whole answer comes after its last token, which needs its output budget
// (max_tokens, or a completion's engine default) to predict: that many
// steps of the pod's batch with each choice (n) of each prompt of the
// request in it, a sequence of its own, in rounds of at most
// plan.decode_max_batch sequences (the rest wait).
func (g *Gateway) firstByteWithin(x *completion, pre, dec *pool.Pod) (within time.Duration, hedged bool) {
	fb, limit := g.cfg.Upstream.Retry.FirstByte, g.answerTimeout(x)
	budget := x.req.OutputBudget()
	if fb.Factor <= 0 || (!x.req.Stream && budget <= 0) || !g.mayHedge(x) {
		return limit, false
	}
	ttft, tpot := g.predict(x, pre, dec)
	at := ttft
	if !x.req.Stream {
		// tpot is the step with a round of the request's sequences.
		full := g.cfg.Plan.DecodeMaxBatch
		at += float64(budget*((x.sequences()+full-1)/full)) * tpot
	}
	d := fb.Factor*at*float64(time.Second) + float64(fb.Floor)
	if math.IsNaN(d) || d >= float64(limit) {
		return limit, false
	}
	return time.Duration(d), true
}

// giveUp decides, as x's first-byte deadline passes with no byte of the
// answer, whether the attempt is given up for a retry: mayHedge still
// says so, and x takes a place in the retry budget now, which its retry
// keeps. Else x waits on for the pod's answer, its best chance, as it
// would without the deadline: up to the response timeout. Only x's
// transport calls it, while x awaits its attempt's outcome.
func (g *Gateway) giveUp(x *completion) bool {
	if g.mayHedge(x) && g.takeRetry(x, false) {
		return true
	}
	x.within, x.hedged = g.answerTimeout(x), false
	return false
}

// GiveUp is giveUp on the event loop (frontend.Hedger).
func (x *completion) GiveUp() bool { return x.g.giveUp(x) }

// hedgeCut gives a worker's call up at x's first-byte deadline when
// giveUp says so then; fired says it did.
type hedgeCut struct {
	x *completion
	// mu orders the timer's giveUp with Unwatch: none runs after the
	// call returned, when x's goroutine reads x again.
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	fired   bool
}

func (h *hedgeCut) Watch(c upstream.Cutter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = false
	h.timer = time.AfterFunc(h.x.within, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.stopped && h.x.g.giveUp(h.x) {
			h.fired = true
			c.Cut()
		}
	})
}

func (h *hedgeCut) Unwatch(upstream.Cutter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.timer.Stop()
}

// mayHedge says a hung attempt of x could go on elsewhere: retry_on lists
// timeouts, x has attempts left (as mayRetry counts them) and a place in
// the retry budget (held, or free now), and its model a pod available now
// that could answer it and that it has not tried (a combined pod, or a
// decode pod, alone or in a pair) or, off the PD path, may go back to (a
// combined pod in x.back: panic.go), or a fallback model to go to, and it
// names no stored response: bound to its pod (x.home), or seeking it
// (seekStored), where the pods without it answer 404 at once, so a slow
// one is the one holding it. Else giving up at the first-byte deadline
// only turns an answer on its way into a 504 (or a 404), or sends it to a
// pod the checks found down (a panic pick), which fails it.
func (g *Gateway) mayHedge(x *completion) bool {
	if x.attempts-x.downMoves > g.cfg.Upstream.Retries || !g.retryOn(fail.Hung) || storedIDOf(x.ctx, x) != nil {
		return false
	}
	if !x.retrying && g.metrics.retry.inFlight.Load() >= g.retryLimit() {
		// The budget would refuse the retry: the pod's answer is the
		// request's best chance, as it would be without a deadline.
		return false
	}
	now := g.ledger.Now()
	untried := false
	for _, p := range x.m.Combined {
		switch {
		case !tried(x.tried, p.ID):
			if p.Available(now) {
				return true
			}
			untried = true
		case x.cascade == nil && tried(x.back, p.ID) && p.Available(now):
			// A PD retry decides among the pods not tried.
			return true
		}
	}
	// A combined retry reaches a fallback model only once no pod of its
	// own is left untried: a pod found down takes it first (a panic pick).
	if len(x.fallbacks) > 0 && (x.cascade != nil || !untried) {
		return true
	}
	// A PD retry takes only a decode pod that is available and serves
	// the request's adapter (as MoveDecode picks one).
	for _, d := range x.m.Decode {
		if !tried(x.tried, d.ID) && d.AvailablePD(now) && (x.adapter == nil || d.Has(x.adapter)) {
			return true
		}
	}
	return false
}

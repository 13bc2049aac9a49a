package plan

import (
	"math"
	"time"
)

// Counts are one model's cumulative counters as a live gateway keeps them,
// read at the end of a window. They only grow; a reading below the last
// one means they restarted.
type Counts struct {
	// Requests counts the model's requests answered, whatever the answer
	// (a rejected request is demand the fleet did not serve).
	Requests float64
	// PromptTokens counts the prompt tokens placed on pods, CachedTokens
	// the part of them the chosen pods held in their prefix caches.
	PromptTokens, CachedTokens float64
	// OutputTokens counts the tokens the model's pods generated.
	OutputTokens float64
}

// Observer turns successive readings of Counts into the demand of the
// window between them. The zero value is ready; it is not safe for
// concurrent use (the planning loop owns it).
type Observer struct {
	last   Counts
	lastAt time.Time
	primed bool
}

// Observe reads c at now and returns the demand since the previous reading,
// with the per-instance capacities given (tokens/s; see Demand):
//
//	rate = Δrequests / Δt
//	isl  = Δprompt tokens / Δrequests      osl = Δoutput tokens / Δrequests
//	hit  = Δcached tokens / Δprompt tokens
//
// It reports false, and only sets the baseline, on the first reading, when
// no time passed, and when a counter went backwards. A window without
// requests has rate 0 and lengths 0.
func (o *Observer) Observe(now time.Time, c Counts, prefillCap, decodeCap float64) (Demand, bool) {
	prev, prevAt, primed := o.last, o.lastAt, o.primed
	o.last, o.lastAt, o.primed = c, now, true
	dt := now.Sub(prevAt).Seconds()
	dReq, dPrompt, dCached, dOut := c.Requests-prev.Requests, c.PromptTokens-prev.PromptTokens,
		c.CachedTokens-prev.CachedTokens, c.OutputTokens-prev.OutputTokens
	if !primed || !(dt > 0) || dReq < 0 || dPrompt < 0 || dCached < 0 || dOut < 0 {
		return Demand{}, false
	}
	d := Demand{Rate: dReq / dt, PrefillCap: prefillCap, DecodeCap: decodeCap}
	if dReq > 0 {
		d.PromptTokens, d.OutputTokens = dPrompt/dReq, dOut/dReq
	}
	if dPrompt > 0 {
		// Predictions of what a pod holds can exceed what it was sent
		// only through rounding; keep the rate a fraction.
		d.HitRate = math.Min(dCached/dPrompt, 1)
	}
	return d, true
}

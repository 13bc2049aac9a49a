package plan

import (
	"math"
	"time"
)

// Counts are one model's cumulative counters as a live gateway keeps them,
// read at the end of a window. They only grow; a reading below the last
// one means they restarted.
type Counts struct {
	// Requests counts the model's requests as they arrive (a live gateway
	// counts its routing decisions): demand, whether or not the pool keeps
	// up with it, which requests counted as they finish would hide.
	Requests float64
	// Finished counts the requests that ended with an answer, whose output
	// is complete.
	Finished float64
	// PromptTokens counts the prompt tokens placed on pods, CachedTokens
	// the part of them the chosen pods held in their prefix caches.
	PromptTokens, CachedTokens float64
	// OutputTokens counts the tokens the model's pods generated.
	OutputTokens float64
}

// Add returns c with every counter of d added.
func (c Counts) Add(d Counts) Counts {
	return Counts{c.Requests + d.Requests, c.Finished + d.Finished, c.PromptTokens + d.PromptTokens,
		c.CachedTokens + d.CachedTokens, c.OutputTokens + d.OutputTokens}
}

// Sub returns what each counter of c counts beyond d's.
func (c Counts) Sub(d Counts) Counts {
	return Counts{c.Requests - d.Requests, c.Finished - d.Finished, c.PromptTokens - d.PromptTokens,
		c.CachedTokens - d.CachedTokens, c.OutputTokens - d.OutputTokens}
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
//	isl  = Δprompt tokens / Δrequests      osl = Δoutput tokens / Δfinished
//	hit  = Δcached tokens / Δprompt tokens
//
// The output length is per finished request, not per arrival: a decode
// pool that falls behind generates fewer tokens than arrive, and dividing
// by arrivals would hide the shortfall the planner is there to see. It
// reports false, and only sets the baseline, on the first reading, when no
// time passed, and when a counter went backwards. A window without
// requests has rate 0; lengths without requests to divide by are 0.
func (o *Observer) Observe(now time.Time, c Counts, prefillCap, decodeCap float64) (Demand, bool) {
	prev, prevAt, primed := o.last, o.lastAt, o.primed
	o.last, o.lastAt, o.primed = c, now, true
	dt := now.Sub(prevAt).Seconds()
	dc := c.Sub(prev)
	dReq, dFin, dPrompt, dCached, dOut := dc.Requests, dc.Finished, dc.PromptTokens, dc.CachedTokens, dc.OutputTokens
	if !primed || !(dt > 0) || min(dReq, dFin, dPrompt, dCached, dOut) < 0 {
		return Demand{}, false
	}
	d := Demand{Rate: dReq / dt, PrefillCap: prefillCap, DecodeCap: decodeCap}
	if dReq > 0 {
		d.PromptTokens = dPrompt / dReq
	}
	if dFin > 0 {
		d.OutputTokens = dOut / dFin
	}
	if dPrompt > 0 {
		// Predictions of what a pod holds can exceed what it was sent
		// only through rounding; keep the rate a fraction.
		d.HitRate = math.Min(dCached/dPrompt, 1)
	}
	return d, true
}

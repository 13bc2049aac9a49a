package route

import "math"

// matchPct is the percentage of the prompt c holds in its prefix cache, 0
// below minPct (an incidental match on a shared system prompt should not
// attract the traffic).
func matchPct(req *Request, c *Candidate, minPct float64) float64 {
	if req.PromptTokens <= 0 {
		return 0
	}
	pct := 100 * float64(min(c.CachedTokens, req.PromptTokens)) / float64(req.PromptTokens)
	if pct < minPct {
		return 0
	}
	return pct
}

// PrefixCache is AIBrix's prefix_cache scorer:
//
//	score = (100 − match%) × 0.1 + in_flight / max_in_flight
//
// so the cache term (0..10) dominates the load term (0..1): load only breaks
// near-ties in cache. Pods whose in-flight count is more than StdDevFactor
// standard deviations above the mean are skipped (scored +Inf) so one hot
// pod cannot keep attracting its cached sessions without bound.
type PrefixCache struct{ Opts Options }

// Score implements Scorer.
func (p PrefixCache) Score(req *Request, cands []Candidate, out []float64) {
	maxReqs := 0
	for i := range cands {
		maxReqs = max(maxReqs, cands[i].InFlight)
	}
	limit := inFlightLimit(cands, p.Opts.StdDevFactor)
	for i := range cands {
		c := &cands[i]
		load := 0.0
		if maxReqs > 0 {
			load = float64(c.InFlight) / float64(maxReqs)
		}
		out[i] = (100-matchPct(req, c, p.Opts.MinMatchPct))*0.1 + load
		if float64(c.InFlight) > limit {
			out[i] = math.Inf(1)
		}
	}
}

// inFlightLimit is the in-flight count above which a pod is more than
// factor standard deviations above the mean of cands: AIBrix's skip of
// overloaded prefill pods, shared by prefix_cache and the PD cascade.
func inFlightLimit(cands []Candidate, factor float64) float64 {
	mean := 0.0
	for i := range cands {
		mean += float64(cands[i].InFlight)
	}
	mean /= float64(len(cands))
	variance := 0.0
	for i := range cands {
		d := float64(cands[i].InFlight) - mean
		variance += d * d
	}
	return mean + factor*math.Sqrt(variance/float64(len(cands)))
}

// CacheAware is the cache-aware policy of SGLang's router: while the load
// is balanced, send the request to the pod with the longest prefix match if
// it covers more than CacheThreshold of the prompt, else to the pod holding
// the fewest indexed blocks (most room to cache this prompt); once the
// in-flight spread is imbalanced by both thresholds, send it to the least
// loaded pod. Ties are broken at random, so equal pods share the traffic.
type CacheAware struct{ Opts Options }

// Pick implements Policy.
func (p CacheAware) Pick(req *Request, cands []Candidate, scratch []float64) int {
	if len(cands) == 0 {
		return -1
	}
	out := scratch[:len(cands)]
	lo, hi := math.MaxInt, 0
	best := 0
	for i := range cands {
		lo = min(lo, cands[i].InFlight)
		hi = max(hi, cands[i].InFlight)
		best = max(best, cands[i].CachedTokens)
	}
	imbalanced := float64(hi-lo) > p.Opts.BalanceAbsThreshold && float64(hi) > p.Opts.BalanceRelThreshold*float64(lo)
	byCache := req.PromptTokens > 0 && float64(best) > p.Opts.CacheThreshold*float64(req.PromptTokens)
	// The minimum is found while scoring, not in a second pass.
	var m argmin
	for i := range cands {
		c := &cands[i]
		switch {
		case imbalanced:
			out[i] = float64(c.InFlight)
		case byCache:
			// Longest match first; among equal matches the less loaded.
			out[i] = -float64(c.CachedTokens) + float64(c.InFlight)/float64(hi+1)
		default:
			out[i] = float64(c.IndexedBlocks) + float64(c.InFlight)/float64(hi+1)
		}
		m.add(i, out[i])
	}
	return m.pick(out, req.Rand)
}

var (
	_ Scorer = PrefixCache{}
	_ Policy = CacheAware{}
)

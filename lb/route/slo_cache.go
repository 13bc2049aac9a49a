package route

import "pdlb/lb/admit"

// DefaultPolicy is the policy the gateway and `pdlb sim --policy default`
// use: the best of the registry in bench/cluster's the global-scheduling
// study sweep.
const DefaultPolicy = "slo_cache"

// DefaultSLOCacheMissWeight is slo_cache's miss weight. Tuned with
// bench/cluster on the global-scheduling study's chat over seeds 0..3 at 40
// to 100 req/s: at 70 req/s with rejection, weight 0 (min_ttft) reaches 98.6%
// attainment with 1.4% rejected, 1 reaches 99.5% / 0.5%, 2 to 8 reach
// 99.6–99.7% / 0.3–0.4%; 4 sits in the middle of that plateau.
const DefaultSLOCacheMissWeight = 4

// SLOCache is pdlb's own policy: cache affinity held in check by the TTFT
// target. Among the pods whose predicted TTFT meets the SLO, it picks the
// one with the least predicted TTFT plus MissWeight times the prefill time
// of the part of the prompt that misses; when no pod meets the SLO it picks
// the least predicted TTFT, which admission then rejects.
//
// Why charge a miss more than its own prefill time, which min_ttft already
// counts? A miss also costs the future: the whole prompt is written into
// that pod's LRU, evicting other sessions' prefixes, and the session's next
// turn finds its prefix on two pods, or on neither, so the fleet's cache
// holds fewer sessions. MissWeight prices that future; 0 is min_ttft, and a
// very large weight is cache_only, whose hotspots the SLO guard then breaks
// up: a pod whose queue would make the request miss its target is passed
// over however warm its cache is.
type SLOCache struct {
	// SLO is the TTFT target in seconds.
	SLO float64
	// MissWeight is the extra cost of a missed token, in units of its own
	// prefill time.
	MissWeight float64
}

// Score implements Scorer.
func (p SLOCache) Score(req *Request, cands []Candidate, out []float64) {
	for i := range cands {
		out[i] = p.score(req, &cands[i])
	}
}

// Pick implements Policy: ScorePolicy{p}.Pick's choice, with the minimum
// found while scoring rather than in a second pass over the scores.
func (p SLOCache) Pick(req *Request, cands []Candidate, scratch []float64) int {
	out := scratch[:len(cands)]
	var m argmin
	for i := range cands {
		out[i] = p.score(req, &cands[i])
		m.add(i, out[i])
	}
	return m.pick(out, req.Rand)
}

// score is c's score for req. With queued tokens q, uncached tokens u and
// a prefill time per token t (PredictedTTFT's terms), the TTFT is (q+u)·t
// and the miss's own prefill time u·t, so the score is
// (q + (1+MissWeight)·u)·t: one division per pod (for t), where dividing
// for the TTFT and for the queue time took two.
func (p SLOCache) score(req *Request, c *Candidate) float64 {
	t := admit.TTFT(1, 0, c.PrefillTokensPerSec, 0)
	q, u := c.QueuedPrefillTokens, float64(uncached(req, c))
	if ttft := (q+u)*t + c.AdapterSec; ttft > p.SLO {
		// Above every pod that meets the SLO, ranked among themselves by
		// TTFT alone.
		return overSLO + ttft
	}
	return (q+(1+p.MissWeight)*u)*t + c.AdapterSec
}

// overSLO lifts the scores of pods that would miss the SLO above any score
// of a pod that meets it (which is at most (1+MissWeight) × SLO).
const overSLO = 1e9

var (
	_ Scorer = SLOCache{}
	_ Policy = SLOCache{}
)

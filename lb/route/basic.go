package route

import "sync/atomic"

// Random picks a candidate uniformly, or in proportion to Weight when any
// candidate has one other than 1.
type Random struct{}

// Pick implements Policy.
func (Random) Pick(req *Request, cands []Candidate, _ []float64) int {
	if len(cands) == 0 {
		return -1
	}
	total := 0.0
	weighted := false
	for i := range cands {
		w := weightOf(&cands[i])
		weighted = weighted || w != 1
		total += w
	}
	if !weighted {
		return int(req.Rand % uint64(len(cands)))
	}
	// Top 53 bits of Rand as a uniform float in [0, total).
	x := float64(req.Rand>>11) / (1 << 53) * total
	for i := range cands {
		x -= weightOf(&cands[i])
		if x < 0 {
			return i
		}
	}
	return len(cands) - 1
}

// RoundRobin cycles through the candidates. The counter is shared by every
// request of the policy, so concurrent picks still spread evenly.
type RoundRobin struct{ next atomic.Uint64 }

// Pick implements Policy.
func (r *RoundRobin) Pick(_ *Request, cands []Candidate, _ []float64) int {
	if len(cands) == 0 {
		return -1
	}
	return int((r.next.Add(1) - 1) % uint64(len(cands)))
}

// LeastRequest scores a pod by the gateway's own in-flight count divided by
// its weight: exact and current, where scraped engine counts lag a scrape.
type LeastRequest struct{}

// Score implements Scorer.
func (LeastRequest) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		out[i] = float64(cands[i].InFlight) / weightOf(&cands[i])
	}
}

func weightOf(c *Candidate) float64 {
	if c.Weight > 0 {
		return c.Weight
	}
	return 1
}

var (
	_ Policy = Random{}
	_ Policy = (*RoundRobin)(nil)
	_ Scorer = LeastRequest{}
)

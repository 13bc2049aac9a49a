package route

import (
	"math/bits"
	"slices"
	"sort"
	"sync/atomic"
)

// BucketPlanner is AIBrix's adaptive bucket serving (AIBRIX_BUCKET_SERVE):
// it keeps a picture of the prompt lengths a model routes and turns the
// rolesets' declared ranges into bands, one roleset per band, so that each
// roleset draws on one share of the traffic proportional to its replicas.
//
// The plan is built in two passes over the elementary segments of the
// length axis (cut at every range boundary). First, a segment only one
// roleset covers is that roleset's band, debited from its share. Then each
// segment several rolesets cover is split among them in proportion to the
// share each still lacks (by replicas when none lacks any), lower ranges
// taking the lower band, with cut points at quantiles of the observed
// traffic in that segment. A roleset covering several shared segments
// debits one share, not one per segment. A shared segment the picture
// holds no traffic in is no roleset's band.
//
// The unit of the traffic is the mode: "throughput" counts prompt tokens,
// "rps" requests. Record is the hot path (two atomic adds, no allocation);
// Rebuild runs off the request path (a ticker), and Roleset reads the
// published plan through one atomic pointer. The plan is advisory: the
// cascade uses its band only while that roleset is still in play.
type BucketPlanner struct {
	tokens bool // throughput mode: weigh a request by its prompt tokens
	count  [histBins]atomic.Uint64
	mass   [histBins]atomic.Uint64
	plan   atomic.Pointer[bandPlan]
}

// NewBucketPlanner returns an empty planner for mode BucketServeThroughput
// or BucketServeRPS.
func NewBucketPlanner(mode string) *BucketPlanner {
	return &BucketPlanner{tokens: mode != BucketServeRPS}
}

// The histogram of prompt lengths: 16 exact bins for lengths below 16, then
// 8 bins per octave up to maxPlanTokens (a length's bin is known to 1/8 of
// its octave, which is as fine as cut points need to be).
const (
	histLinear    = 16
	histPerOctave = 8
	maxPlanTokens = 1 << 24
	histBins      = histLinear + (24-4)*histPerOctave
)

func histBin(n int) int {
	if n < histLinear {
		return max(n, 0)
	}
	n = min(n, maxPlanTokens-1)
	e := bits.Len(uint(n)) - 1 // 4..23
	sub := (n >> (e - 3)) & (histPerOctave - 1)
	return histLinear + (e-4)*histPerOctave + sub
}

// binRange is the lengths [lo, hi) of bin b.
func binRange(b int) (lo, hi int) {
	if b < histLinear {
		return b, b + 1
	}
	e := (b-histLinear)/histPerOctave + 4
	sub := (b - histLinear) % histPerOctave
	lo = (histPerOctave + sub) << (e - 3)
	return lo, lo + 1<<(e-3)
}

// Record adds one routed prompt of n tokens to the picture.
func (p *BucketPlanner) Record(n int) {
	b := histBin(n)
	p.count[b].Add(1)
	p.mass[b].Add(uint64(max(n, 1)))
}

// BucketRoleset is one roleset as Rebuild sees it: its declared range
// (tokens, inclusive; Max 0 unlimited) and how many replicas (complete
// prefill/decode pairs, or pods) it has. Replicas 0 leaves it out.
type BucketRoleset struct {
	Min, Max int
	Replicas int
}

// band is [lo, hi) → roleset.
type band struct {
	lo, hi  int
	roleset int
}

type bandPlan struct{ bands []band }

// Roleset returns the roleset a prompt of n tokens is banded to, or -1
// where the plan holds no band (or there is no plan yet).
func (p *BucketPlanner) Roleset(n int) int {
	pl := p.plan.Load()
	if pl == nil {
		return -1
	}
	i := sort.Search(len(pl.bands), func(i int) bool { return pl.bands[i].hi > n })
	if i < len(pl.bands) && pl.bands[i].lo <= n {
		return pl.bands[i].roleset
	}
	return -1
}

// weight returns the traffic in bin b in the planner's unit.
func (p *BucketPlanner) weight(b int) float64 {
	if p.tokens {
		return float64(p.mass[b].Load())
	}
	return float64(p.count[b].Load())
}

// between is the traffic with lengths in [lo, hi), counting a bin that
// straddles a bound in proportion to the overlap.
func (p *BucketPlanner) between(lo, hi int) float64 {
	sum := 0.0
	for b := histBin(lo); b < histBins; b++ {
		bl, bh := binRange(b)
		if bl >= hi {
			break
		}
		if ol, oh := max(lo, bl), min(hi, bh); oh > ol {
			sum += p.weight(b) * float64(oh-ol) / float64(bh-bl)
		}
	}
	return sum
}

// quantile is the length x in [lo, hi] with between(lo, x) ≈ target; lo
// for a target of 0, which is an empty band.
func (p *BucketPlanner) quantile(lo, hi int, target float64) int {
	if target <= 0 {
		return lo
	}
	for b := histBin(lo); b < histBins && target > 0; b++ {
		bl, bh := binRange(b)
		if bl >= hi {
			break
		}
		ol, oh := max(lo, bl), min(hi, bh)
		if oh <= ol {
			continue
		}
		m := p.weight(b) * float64(oh-ol) / float64(bh-bl)
		if m >= target {
			return ol + int(float64(oh-ol)*target/m)
		}
		target -= m
	}
	return hi
}

// Rebuild computes a new plan from the picture and sets (indexed by
// roleset) and publishes it, then halves the picture so that it follows
// the traffic. Call it from one goroutine, every few seconds.
func (p *BucketPlanner) Rebuild(sets []BucketRoleset) {
	defer p.decay()
	var cuts []int
	replicas := 0
	for _, s := range sets {
		if s.Replicas <= 0 {
			continue
		}
		replicas += s.Replicas
		cuts = append(cuts, s.Min, upper(s))
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	type segment struct {
		lo, hi int
		mass   float64
		cover  []int
	}
	var segs []segment
	total := 0.0
	for i := 0; i+1 < len(cuts); i++ {
		sg := segment{lo: cuts[i], hi: cuts[i+1]}
		for k, s := range sets {
			if s.Replicas > 0 && s.Min <= sg.lo && sg.hi <= upper(s) {
				sg.cover = append(sg.cover, k)
			}
		}
		if len(sg.cover) == 0 {
			continue
		}
		sg.mass = p.between(sg.lo, sg.hi)
		total += sg.mass
		segs = append(segs, sg)
	}
	if total == 0 {
		p.plan.Store(nil)
		return
	}
	left := make([]float64, len(sets)) // share each roleset still lacks
	for k, s := range sets {
		left[k] = total * float64(max(s.Replicas, 0)) / float64(replicas)
	}
	var bands []band
	for _, sg := range segs {
		if len(sg.cover) == 1 {
			k := sg.cover[0]
			left[k] -= sg.mass
			bands = append(bands, band{sg.lo, sg.hi, k})
		}
	}
	for _, sg := range segs {
		if len(sg.cover) == 1 || sg.mass == 0 {
			// A shared segment without traffic has no quantiles to cut
			// at: the cascade chooses there until traffic shows.
			continue
		}
		// Lower ranges take the lower band.
		slices.SortStableFunc(sg.cover, func(a, b int) int { return sets[a].Min - sets[b].Min })
		need := 0.0
		for _, k := range sg.cover {
			need += max(left[k], 0)
		}
		lo, acc := sg.lo, 0.0
		for i, k := range sg.cover {
			frac := float64(sets[k].Replicas) / float64(coverReplicas(sets, sg.cover))
			if need > 0 {
				frac = max(left[k], 0) / need
			}
			acc += frac * sg.mass
			hi := sg.hi
			if i < len(sg.cover)-1 {
				hi = p.quantile(sg.lo, sg.hi, acc)
			}
			left[k] -= frac * sg.mass
			if hi > lo {
				bands = append(bands, band{lo, hi, k})
				lo = hi
			}
		}
	}
	slices.SortFunc(bands, func(a, b band) int { return a.lo - b.lo })
	p.plan.Store(&bandPlan{bands})
}

func coverReplicas(sets []BucketRoleset, cover []int) int {
	n := 0
	for _, k := range cover {
		n += sets[k].Replicas
	}
	return n
}

// upper is the exclusive upper bound of s's range.
func upper(s BucketRoleset) int {
	if s.Max == 0 {
		return maxPlanTokens
	}
	return s.Max + 1
}

// decay halves the picture, rounding the remainder down so that a bin
// without new traffic reaches 0 (rounded up, a 1 would stay for good). Only
// Rebuild subtracts, so a concurrent Record can only leave a bin larger.
func (p *BucketPlanner) decay() {
	for b := range histBins {
		p.count[b].Add(-((p.count[b].Load() + 1) / 2))
		p.mass[b].Add(-((p.mass[b].Load() + 1) / 2))
	}
}

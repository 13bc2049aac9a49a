package route

import (
	"errors"
	"fmt"
	"math"

	"pdlb/lb/admit"
)

// This file is AIBrix's "Pod Selection Algorithm" for prefill/decode
// disaggregation: a cascade over the pods of one model that ends in a
// prefill pod and a decode pod of one roleset, or in a combined pod.
//
//	step 0   prompt-length bucketing; no complete pair → a combined pod
//	         (shouldPickCombined: PD busy and a combined pod idle → it)
//	step 1   prefill imbalance fast path
//	step 2   decode fast paths: request-count, throughput, drain-rate spread
//	step 2b  adaptive bucket serving: the roleset the prompt length is banded to
//	step 3   prefill scoring, std-dev skip, lowest per roleset
//	step 4   decode scoring, cold start, lowest per roleset
//	step 5   pair: min over rolesets of prefill/max_prefill + decode/max_decode
//	then     conditional disaggregation: skip the prefill leg when
//	         the decode pod lacks only a few of the prompt's tokens
//
// A request that must go whole (Request.Whole) takes a combined pod after
// step 0, else the cascade's decode pod without a prefill leg, where the
// decode pods serve it (not needsExchange).
//
// A decision allocates nothing: the caller owns the candidates and a
// PDScratch it reuses.

// PDRole is the part a pod plays (AIBrix's role-name label).
type PDRole uint8

// Roles. The zero value is combined: a pod that runs both phases.
const (
	RoleCombined PDRole = iota
	RolePrefill
	RoleDecode
)

// PDCandidate is one pod of the model as the cascade sees it.
type PDCandidate struct {
	Candidate
	// Role is the pod's part.
	Role PDRole
	// Roleset is the dense index of the pod's roleset, 0 ≤ Roleset < the
	// number of rolesets of the snapshot (the caller numbers them when it
	// builds the snapshot); ignored for combined pods.
	Roleset int32
	// BucketMin and BucketMax bound the prompt lengths the pod serves when
	// bucketing is on (tokens, inclusive; BucketMax 0 means unlimited).
	BucketMin, BucketMax int
	// Down excludes the pod (failing health checks, ejected, draining).
	Down bool
	// Pending is a decode pod's pending-decode counter; nil counts 0.
	Pending *PendingDecode
	// DrainRate is how many requests a decode pod finishes per second:
	// the gateway's own count of them, made a rate at each scrape (the
	// pool's Pod.DrainRate); 0 means unknown.
	DrainRate float64
	// Line is a decode pod's learned step-time line for the conductor
	// decode score; nil uses the default line.
	Line *admit.DecodeLine
}

// covers says whether the pod's bucket holds a prompt of n tokens.
func (c *PDCandidate) covers(n int) bool {
	return n >= c.BucketMin && (c.BucketMax == 0 || n <= c.BucketMax)
}

// PDKind is what a decision asks the gateway to do.
type PDKind uint8

const (
	// PDPair: the prefill leg on Prefill, the decode leg on Decode.
	PDPair PDKind = iota
	// PDLocal: conditional disaggregation; the whole request goes to the
	// decode pod Decode, which prefills the few tokens it lacks itself.
	PDLocal
	// PDCombined: the whole request goes to the combined pod Combined.
	PDCombined
)

// PDFired records which steps of the cascade fired, for metrics and tests.
type PDFired uint16

const (
	// FiredNoPair: no complete prefill/decode pair (bucket or health).
	FiredNoPair PDFired = 1 << iota
	// FiredOverflow: shouldPickCombined sent the request to an idle
	// combined pod.
	FiredOverflow
	FiredPrefillImbalance
	FiredDecodeCount
	FiredDecodeThroughput
	FiredDecodeDrain
	FiredBucketBand
	// FiredLocalPrefill: conditional disaggregation skipped the prefill leg.
	FiredLocalPrefill
)

// PDDecision is the outcome of Decide. Prefill, Decode and Combined index
// the candidate slice, -1 where the kind has none.
type PDDecision struct {
	Kind                      PDKind
	Prefill, Decode, Combined int
	Fired                     PDFired
}

// ErrNoPDPair is returned when no complete prefill/decode pair and no
// combined pod can serve the prompt.
var ErrNoPDPair = errors.New("route: no complete prefill/decode pair and no combined pod")

// PDRouter runs the cascade with one frozen set of options. It is safe for
// concurrent use.
type PDRouter struct {
	opts    PDOptions
	prefill Scorer
	// prefillSkips says the prefill scorer applies the std-dev skip
	// itself (prefix_cache), so the cascade must not apply it again.
	prefillSkips bool
	decode       DecodeScorer
	plan         *BucketPlanner
	// needsExchange: the decode pods refuse a request that did not go
	// through the exchange (ModelProfiles.DecodeNeedsExchange).
	needsExchange bool
}

// NewPDRouter validates o and builds the router.
func NewPDRouter(o PDOptions) (*PDRouter, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ro := o.routeOptions()
	r := &PDRouter{opts: o}
	switch o.PrefillScorePolicy {
	case PrefillPolicyPrefixCache:
		r.prefill, r.prefillSkips = PrefixCache{ro}, true
	case PrefillPolicyLeastRequest:
		r.prefill = LeastRequest{}
	case PrefillPolicyConductor:
		r.prefill = PrefillConductorScore{}
	case PrefillPolicyTokenLoad:
		r.prefill = TokenLoad{ro}
	case PrefillPolicyHybridCacheLoad:
		r.prefill = HybridCacheLoad{ro}
	}
	switch o.DecodeScorePolicy {
	case DecodePolicyLoadBalancing:
		r.decode = DecodeLoadBalancing{WRunning: o.DecodeLBWeightRunning, WThroughput: o.DecodeLBWeightThroughput}
	case DecodePolicyLeastRequest:
		r.decode = DecodeLeastRequestScore{}
	case DecodePolicyConductor:
		r.decode = DecodeConductorScore{}
	case DecodePolicyTokenLoad:
		r.decode = decodeScorerOf{DecodeTokenLoad{ro}}
	}
	if o.BucketServe {
		r.plan = NewBucketPlanner(o.BucketServeMode)
	}
	return r, nil
}

// Options returns the router's options.
func (r *PDRouter) Options() PDOptions { return r.opts }

// Planner returns the adaptive bucket planner, nil unless BucketServe is on.
// The gateway records each routed prompt length on it and rebuilds its plan
// off the request path.
func (r *PDRouter) Planner() *BucketPlanner { return r.plan }

// pdSet is one roleset's state during a decision.
type pdSet struct {
	nPre, nDec       int32
	inPlay           bool
	bestPre, bestDec int32 // candidate index, -1 none
	preScore         float64
	decScore         float64
	preTies, decTies uint64 // pods scoring bestPre's, bestDec's score so far
}

// lowest is one step of a roleset's best-pod scan: the candidate at, with
// score v, becomes *best when it scores lower, or when it ties and wins
// the reservoir draw, so equal pods share the traffic instead of the first
// taking it all. Each draw mixes rnd with the tie count (splitmix64's
// finalizer): the same rnd modulo 2, 3, 4, ... would favour the first pod.
func lowest(best *int32, score *float64, ties *uint64, at int32, v float64, rnd uint64) {
	switch {
	case *best < 0 || v < *score:
		*best, *score, *ties = at, v, 1
	case v == *score:
		*ties++
		if tieDraw(rnd, *ties) {
			*best = at
		}
	}
}

// tieDraw is a reservoir draw: whether the ties-th of equal candidates
// replaces the one kept, with probability 1/ties. It mixes rnd with ties
// (splitmix64's finalizer) so the draws of one request are independent.
func tieDraw(rnd, ties uint64) bool {
	x := rnd + ties*0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return (x^x>>31)%ties == 0
}

// PDScratch holds a decision's working slices. A goroutine reuses one (or
// takes one from a sync.Pool) so decisions allocate nothing once the
// slices have grown to the fleet; the zero value is ready.
type PDScratch struct {
	pre, dec       []Candidate
	preAt, decAt   []int32
	pending        []float64
	lines          []*admit.DecodeLine
	preOut, decOut []float64
	final          []float64
	comb           []int32
	sets           []pdSet
	view           DecodeView
}

func (s *PDScratch) reset(nsets int) {
	if cap(s.sets) < nsets {
		s.sets = make([]pdSet, nsets)
	}
	s.sets = s.sets[:nsets]
	for k := range s.sets {
		s.sets[k] = pdSet{bestPre: -1, bestDec: -1}
	}
	s.pre, s.dec, s.preAt, s.decAt = s.pre[:0], s.dec[:0], s.preAt[:0], s.decAt[:0]
	s.pending, s.lines, s.comb = s.pending[:0], s.lines[:0], s.comb[:0]
}

// grow returns b with length n, reusing its storage when it can.
func grow(b []float64, n int) []float64 {
	if cap(b) < n {
		return make([]float64, n)
	}
	return b[:n]
}

// Decide runs the cascade for req over cands (every pod of the model, any
// role, up or down) and returns the pods to use. req.PromptTokens is the
// prompt's length; each candidate's CachedTokens its prefix match. The
// caller then calls Pick on the decode pod's Pending (PDPair and PDLocal).
func (r *PDRouter) Decide(req *Request, cands []PDCandidate, s *PDScratch) (PDDecision, error) {
	d := PDDecision{Prefill: -1, Decode: -1, Combined: -1}
	o := &r.opts
	n := req.PromptTokens

	// Step 0: which pods may serve this prompt, and which rolesets are
	// complete.
	nsets := 0
	for i := range cands {
		if cands[i].Role != RoleCombined {
			nsets = max(nsets, int(cands[i].Roleset)+1)
		}
	}
	s.reset(nsets)
	for i := range cands {
		c := &cands[i]
		if c.Down || (o.PromptLengthBucketing && !c.covers(n)) {
			continue
		}
		switch c.Role {
		case RolePrefill:
			s.sets[c.Roleset].nPre++
		case RoleDecode:
			s.sets[c.Roleset].nDec++
		default:
			s.comb = append(s.comb, int32(i))
		}
	}
	complete := false
	for k := range s.sets {
		st := &s.sets[k]
		st.inPlay = st.nPre > 0 && st.nDec > 0
		complete = complete || st.inPlay
	}
	if !complete {
		if len(s.comb) == 0 {
			return d, fmt.Errorf("%w for a prompt of %d tokens", ErrNoPDPair, n)
		}
		d.Kind, d.Combined, d.Fired = PDCombined, r.leastLoadedCombined(req, cands, s, math.MaxInt), FiredNoPair
		return d, nil
	}
	for i := range cands {
		c := &cands[i]
		if c.Role == RoleCombined || c.Down || !s.sets[c.Roleset].inPlay || (o.PromptLengthBucketing && !c.covers(n)) {
			continue
		}
		if c.Role == RolePrefill {
			s.pre, s.preAt = append(s.pre, c.Candidate), append(s.preAt, int32(i))
		} else {
			s.dec, s.decAt = append(s.dec, c.Candidate), append(s.decAt, int32(i))
			s.pending, s.lines = append(s.pending, float64(c.Pending.Load())), append(s.lines, c.Line)
		}
	}
	if req.Whole {
		switch {
		case len(s.comb) > 0:
			d.Kind, d.Combined, d.Fired = PDCombined, r.leastLoadedCombined(req, cands, s, math.MaxInt), FiredNoPair
			return d, nil
		case r.needsExchange:
			return d, fmt.Errorf("%w for a request that cannot go through the exchange, whose decode pods refuse it whole", ErrNoPDPair)
		}
	}
	if len(s.comb) > 0 && r.pdBusy(s) {
		if i := r.leastLoadedCombined(req, cands, s, o.CombinedIdleMaxInFlight); i >= 0 {
			d.Kind, d.Combined, d.Fired = PDCombined, i, FiredOverflow
			return d, nil
		}
	}

	// Step 1: prefill imbalance.
	fixedPre, fixedDec := -1, -1 // positions in s.pre, s.dec
	if j, spread := leastInFlight(s.pre); spread >= o.PrefillLoadImbalanceMinSpread {
		fixedPre = j
		s.only(cands[s.preAt[j]].Roleset)
		d.Fired |= FiredPrefillImbalance
	}
	// Step 2: decode fast paths, over the rolesets step 1 left. token_load
	// replaces them (AIBrix: a pod holding one long prompt has the
	// fewest requests).
	if o.DecodeScorePolicy != DecodePolicyTokenLoad {
		if j, why := r.decodeFastPath(cands, s); j >= 0 {
			fixedDec = j
			s.only(cands[s.decAt[j]].Roleset)
			d.Fired |= why
		}
	}
	// Step 2b: the band plan, when its roleset is still in play.
	if r.plan != nil {
		if k := r.plan.Roleset(n); k >= 0 && k < len(s.sets) && s.sets[k].inPlay {
			if fixedPre < 0 && fixedDec < 0 {
				s.only(int32(k))
				d.Fired |= FiredBucketBand
			}
		}
	}
	if d.Fired != 0 {
		// A fast path or the band narrowed the rolesets in play.
		fixedPre, fixedDec = s.compact(cands, fixedPre, fixedDec)
	}

	// Step 3: prefill scores, lowest per roleset.
	s.preOut = grow(s.preOut, len(s.pre))
	if fixedPre >= 0 {
		// The fast path chose the pod, not only its roleset.
		fixOnly(s.preOut, fixedPre)
	} else {
		r.prefill.Score(req, s.pre, s.preOut)
		if !r.prefillSkips {
			limit := inFlightLimit(s.pre, o.StdDevFactor)
			for j := range s.pre {
				if float64(s.pre[j].InFlight) > limit {
					s.preOut[j] = math.Inf(1)
				}
			}
		}
	}
	for j := range s.pre {
		st := &s.sets[cands[s.preAt[j]].Roleset]
		lowest(&st.bestPre, &st.preScore, &st.preTies, s.preAt[j], s.preOut[j], req.Rand)
	}

	// Step 4: decode scores, lowest per roleset.
	s.decOut = grow(s.decOut, len(s.dec))
	if fixedDec >= 0 {
		fixOnly(s.decOut, fixedDec)
	} else {
		// The view lives in the scratch: a pointer to a local passed to
		// an interface method would escape.
		s.view = DecodeView{Cands: s.dec, Pending: s.pending, Lines: s.lines}
		r.decode.ScoreDecode(req, &s.view, s.decOut)
		if o.DecodeScorePolicy != DecodePolicyTokenLoad {
			// Cold start: a pod without metrics competes as a lightly
			// loaded one instead of as an empty one, which every pick
			// would choose until its first scrape.
			for j := range s.dec {
				if !s.dec[j].HasMetrics {
					s.decOut[j] = 1 + s.pending[j]
				}
			}
		}
	}
	for j := range s.dec {
		st := &s.sets[cands[s.decAt[j]].Roleset]
		lowest(&st.bestDec, &st.decScore, &st.decTies, s.decAt[j], s.decOut[j], ^req.Rand)
	}

	// Step 5: the pair.
	k := r.bestPair(req, s)
	d.Prefill, d.Decode = int(s.sets[k].bestPre), int(s.sets[k].bestDec)

	// Conditional disaggregation, or a request that must go whole.
	if lim := o.LocalPrefillMaxTokens; req.Whole || (lim > 0 && !r.needsExchange && n-min(cands[d.Decode].CachedTokens, n) <= lim) {
		d.Kind, d.Prefill = PDLocal, -1
		d.Fired |= FiredLocalPrefill
	}
	return d, nil
}

// fixOnly scores the fixed pod at j 0 and every other pod +Inf, so the
// roleset's lowest is the pod a fast path chose.
func fixOnly(out []float64, j int) {
	for i := range out {
		out[i] = math.Inf(1)
	}
	out[j] = 0
}

// only keeps roleset k alone in play.
func (s *PDScratch) only(k int32) {
	for i := range s.sets {
		s.sets[i].inPlay = int32(i) == k
	}
}

// compact drops the pods of rolesets no longer in play and returns where
// the fixed pods (-1: none) moved.
func (s *PDScratch) compact(cands []PDCandidate, fixedPre, fixedDec int) (int, int) {
	w := 0
	for j := range s.pre {
		if s.sets[cands[s.preAt[j]].Roleset].inPlay {
			if j == fixedPre {
				fixedPre = w
			}
			s.pre[w], s.preAt[w] = s.pre[j], s.preAt[j]
			w++
		}
	}
	s.pre, s.preAt = s.pre[:w], s.preAt[:w]
	w = 0
	for j := range s.dec {
		if s.sets[cands[s.decAt[j]].Roleset].inPlay {
			if j == fixedDec {
				fixedDec = w
			}
			s.dec[w], s.decAt[w], s.pending[w], s.lines[w] = s.dec[j], s.decAt[j], s.pending[j], s.lines[j]
			w++
		}
	}
	s.dec, s.decAt, s.pending, s.lines = s.dec[:w], s.decAt[:w], s.pending[:w], s.lines[:w]
	return fixedPre, fixedDec
}

// leastInFlight returns the position of the pod with the fewest requests
// in flight (the first of equals) and the spread max − min.
func leastInFlight(cands []Candidate) (int, int) {
	lo, hi, at := math.MaxInt, 0, -1
	for j := range cands {
		v := cands[j].InFlight
		if v < lo {
			lo, at = v, j
		}
		hi = max(hi, v)
	}
	return at, hi - lo
}

// decodeFastPath runs step 2's three checks in order over the decode pods
// in play and returns the chosen position in s.dec, or -1.
func (r *PDRouter) decodeFastPath(cands []PDCandidate, s *PDScratch) (int, PDFired) {
	o := &r.opts
	// Request-count and throughput spread, over pods with metrics only: a
	// freshly started pod reports nothing, and routing every request to it
	// would be a thundering herd.
	cntLo, cntHi, cntAt := math.Inf(1), math.Inf(-1), -1
	thrLo, thrHi, thrAt := math.Inf(1), math.Inf(-1), -1
	withMetrics := 0
	for j := range s.dec {
		c := &s.dec[j]
		if !c.HasMetrics || !s.sets[cands[s.decAt[j]].Roleset].inPlay {
			continue
		}
		withMetrics++
		v := float64(c.Running) + s.pending[j]
		if v < cntLo {
			cntLo, cntAt = v, j
		}
		cntHi = max(cntHi, v)
		if c.GenTokensPerSec < thrLo {
			thrLo, thrAt = c.GenTokensPerSec, j
		}
		thrHi = max(thrHi, c.GenTokensPerSec)
	}
	if withMetrics >= 2 {
		if cntHi-cntLo >= float64(o.DecodeLoadImbalanceMinSpread) {
			return cntAt, FiredDecodeCount
		}
		if thrHi-thrLo > o.DecodeThroughputImbalanceMinSpread {
			return thrAt, FiredDecodeThroughput
		}
	}
	// Drain rate: only when every pod in play reports one.
	lo, hi, at, pods := math.Inf(1), 0.0, -1, 0
	for j := range s.dec {
		c := &s.dec[j]
		if !s.sets[cands[s.decAt[j]].Roleset].inPlay {
			continue
		}
		rate := cands[s.decAt[j]].DrainRate
		if !(rate > 0) {
			return -1, 0
		}
		pods++
		v := (float64(c.Running) + s.pending[j]) / rate
		if v < lo {
			lo, at = v, j
		}
		hi = max(hi, v)
	}
	// max/min > threshold, written so that an idle pod (min 0) fires when
	// another pod has work.
	if pods >= 2 && hi > o.DecodeScoreRatioThreshold*lo {
		return at, FiredDecodeDrain
	}
	return -1, 0
}

// pdBusy is shouldPickCombined's load test: PD pairs count as heavily
// loaded when the least loaded eligible prefill pod has
// CombinedPrefillBusy outstanding prefills, or the least loaded decode pod
// CombinedDecodeBusy requests (running + waiting + pending; in flight +
// pending before its first scrape).
func (r *PDRouter) pdBusy(s *PDScratch) bool {
	o := &r.opts
	if o.CombinedPrefillBusy > 0 {
		if j, _ := leastInFlight(s.pre); s.pre[j].InFlight >= o.CombinedPrefillBusy {
			return true
		}
	}
	if o.CombinedDecodeBusy > 0 {
		lo := math.Inf(1)
		for j := range s.dec {
			c := &s.dec[j]
			load := float64(c.InFlight)
			if c.HasMetrics {
				load = float64(c.Running + c.Waiting)
			}
			lo = min(lo, load+s.pending[j])
		}
		return lo >= float64(o.CombinedDecodeBusy)
	}
	return false
}

// leastLoadedCombined returns the eligible combined pod with the fewest
// requests in flight per unit of weight, among those with at most
// maxInFlight; ties go by req.Rand. -1 when none qualifies.
func (r *PDRouter) leastLoadedCombined(req *Request, cands []PDCandidate, s *PDScratch, maxInFlight int) int {
	best, bestLoad, ties := -1, math.Inf(1), uint64(0)
	for _, i := range s.comb {
		c := &cands[i]
		if c.InFlight > maxInFlight {
			continue
		}
		load := float64(c.InFlight) / weightOf(&c.Candidate)
		switch {
		case load < bestLoad:
			best, bestLoad, ties = int(i), load, 1
		case load == bestLoad:
			// Reservoir choice among equals, driven by the request's
			// random number so equal pods share the traffic.
			ties++
			if tieDraw(req.Rand>>8, ties) {
				best = int(i)
			}
		}
	}
	return best
}

// bestPair is step 5: the roleset minimising prefill/max_prefill +
// decode/max_decode over the rolesets with both candidates. Infinite
// scores (skipped or saturated pods) stay infinite, so such a roleset wins
// only when every roleset has one.
func (r *PDRouter) bestPair(req *Request, s *PDScratch) int {
	maxP, maxD := 0.0, 0.0
	for k := range s.sets {
		st := &s.sets[k]
		if !st.inPlay || st.bestPre < 0 || st.bestDec < 0 {
			continue
		}
		if !math.IsInf(st.preScore, 1) {
			maxP = max(maxP, st.preScore)
		}
		if !math.IsInf(st.decScore, 1) {
			maxD = max(maxD, st.decScore)
		}
	}
	s.final = grow(s.final, len(s.sets))
	for k := range s.sets {
		st := &s.sets[k]
		if !st.inPlay || st.bestPre < 0 || st.bestDec < 0 {
			s.final[k] = math.NaN()
			continue
		}
		s.final[k] = normalized(st.preScore, maxP) + normalized(st.decScore, maxD)
	}
	return argminSkipNaN(s.final, req.Rand)
}

// normalized is x/max for a positive max, 0 when every score is 0 (or
// negative), and +Inf for an infinite x.
func normalized(x, maxX float64) float64 {
	if math.IsInf(x, 1) {
		return x
	}
	if maxX > 0 {
		return x / maxX
	}
	return 0
}

// argminSkipNaN is Argmin over the non-NaN entries (NaN marks a roleset
// out of play); ties go by rnd.
func argminSkipNaN(s []float64, rnd uint64) int {
	best, ties := -1, uint64(0)
	for i, v := range s {
		switch {
		case math.IsNaN(v):
		case best < 0 || v < s[best]:
			best, ties = i, 1
		case v == s[best]:
			ties++
			if tieDraw(rnd, ties) {
				best = i
			}
		}
	}
	if best < 0 {
		panic("BUG: route: pd pair pick with no complete roleset")
	}
	return best
}

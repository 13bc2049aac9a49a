package route

import (
	"errors"
	"testing"
)

// pdFleet builds rolesets × (one prefill, one decode) pods followed by
// combined pods, all healthy, with metrics on the decode pods. Candidate
// i's Pod is i.
func pdFleet(rolesets, combined int) []PDCandidate {
	var cands []PDCandidate
	for k := range rolesets {
		cands = append(cands,
			PDCandidate{Role: RolePrefill, Roleset: int32(k)},
			PDCandidate{Role: RoleDecode, Roleset: int32(k), Candidate: Candidate{HasMetrics: true}})
	}
	for range combined {
		cands = append(cands, PDCandidate{Role: RoleCombined})
	}
	for i := range cands {
		cands[i].Pod = int32(i)
	}
	return cands
}

// pre and dec are the positions of roleset k's pods in a pdFleet.
func pre(k int) int { return 2 * k }
func dec(k int) int { return 2*k + 1 }

func newRouter(t testing.TB, edit func(o *PDOptions)) *PDRouter {
	t.Helper()
	o := DefaultPDOptions()
	if edit != nil {
		edit(&o)
	}
	r, err := NewPDRouter(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// decide runs the cascade and checks the decision's kind, pods and fired
// steps (want.Fired is checked as a subset; 0 means "nothing fired").
func decide(t *testing.T, r *PDRouter, req *Request, cands []PDCandidate, want PDDecision) {
	t.Helper()
	got, err := r.Decide(req, cands, &PDScratch{})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if got.Kind != want.Kind || got.Prefill != want.Prefill || got.Decode != want.Decode || got.Combined != want.Combined {
		t.Fatalf("Decide = %+v, want %+v", got, want)
	}
	if got.Fired&want.Fired != want.Fired || (want.Fired == 0 && got.Fired != 0) {
		t.Fatalf("fired = %b, want %b", got.Fired, want.Fired)
	}
}

func pair(k int, fired PDFired) PDDecision {
	return PDDecision{Kind: PDPair, Prefill: pre(k), Decode: dec(k), Combined: -1, Fired: fired}
}

func combinedPick(i int, fired PDFired) PDDecision {
	return PDDecision{Kind: PDCombined, Prefill: -1, Decode: -1, Combined: i, Fired: fired}
}

func TestPDPrefixCachePicksTheRolesetHoldingThePrompt(t *testing.T) {
	r := newRouter(t, nil)
	req := &Request{PromptTokens: 1000}
	cands := pdFleet(4, 0)
	cands[pre(2)].CachedTokens = 800
	decide(t, r, req, cands, pair(2, 0))
	// Flip the cache to roleset 1.
	cands[pre(2)].CachedTokens, cands[pre(1)].CachedTokens = 0, 900
	decide(t, r, req, cands, pair(1, 0))
	// Its decode pod goes down: roleset 1 is incomplete and skipped.
	cands[dec(1)].Down = true
	got, err := r.Decide(req, cands, &PDScratch{})
	if err != nil || got.Prefill == pre(1) || got.Decode == dec(1) || got.Kind != PDPair {
		t.Fatalf("incomplete roleset chosen: %+v %v", got, err)
	}
}

func TestPDNoPairFallsBackToCombined(t *testing.T) {
	r := newRouter(t, nil)
	req := &Request{PromptTokens: 100}
	cands := pdFleet(2, 2)
	cands[dec(0)].Down, cands[pre(1)].Down = true, true
	cands[4].InFlight, cands[5].InFlight = 3, 1
	decide(t, r, req, cands, combinedPick(5, FiredNoPair))
	cands[5].Down = true
	decide(t, r, req, cands, combinedPick(4, FiredNoPair))
	cands[4].Down = true
	if _, err := r.Decide(req, cands, &PDScratch{}); !errors.Is(err, ErrNoPDPair) {
		t.Fatalf("err = %v, want ErrNoPDPair", err)
	}
}

func TestPDBucketing(t *testing.T) {
	r := newRouter(t, func(o *PDOptions) { o.PromptLengthBucketing = true })
	cands := pdFleet(2, 1)
	// Roleset 0 serves 0..2048, roleset 1 2049..8192, the combined pod
	// 8192 and up.
	for _, i := range []int{pre(0), dec(0)} {
		cands[i].BucketMax = 2048
	}
	for _, i := range []int{pre(1), dec(1)} {
		cands[i].BucketMin, cands[i].BucketMax = 2049, 8192
	}
	cands[4].BucketMin = 8192
	f := func(n int, want PDDecision) {
		t.Helper()
		decide(t, r, &Request{PromptTokens: n}, cands, want)
	}
	f(100, pair(0, 0))
	f(2048, pair(0, 0))
	f(4000, pair(1, 0))
	f(10000, combinedPick(4, FiredNoPair))
	// The decode pod of the matching bucket is down: the combined pod's
	// range does not cover 4000, so there is nothing to serve it.
	cands[dec(1)].Down = true
	if _, err := r.Decide(&Request{PromptTokens: 4000}, cands, &PDScratch{}); !errors.Is(err, ErrNoPDPair) {
		t.Fatalf("err = %v, want ErrNoPDPair", err)
	}
	cands[4].BucketMin = 0 // a combined pod without a range takes any prompt
	f(4000, combinedPick(4, FiredNoPair))
	// Half a roleset in range is no roleset: the prefill pod covers the
	// prompt, the decode pod does not.
	cands[dec(1)].Down = false
	cands[dec(1)].BucketMax = 3000
	f(4000, combinedPick(4, FiredNoPair))
}

func TestPDOverflowToIdleCombined(t *testing.T) {
	r := newRouter(t, nil)
	req := &Request{PromptTokens: 100}
	cands := pdFleet(2, 1)
	cands[pre(0)].InFlight, cands[pre(1)].InFlight = 8, 9
	decide(t, r, req, cands, combinedPick(4, FiredOverflow))
	// The combined pod is not idle: PD keeps the request.
	cands[4].InFlight = 1
	decide(t, r, req, cands, pair(0, 0))
	// PD prefill not busy enough, combined idle again: PD.
	cands[4].InFlight, cands[pre(0)].InFlight = 0, 7
	decide(t, r, req, cands, pair(0, 0))
	// Busy decode side: every decode pod at 64 running+waiting+pending.
	cands[dec(0)].Running, cands[dec(0)].Waiting = 60, 4
	cands[dec(1)].Running = 64
	decide(t, r, req, cands, combinedPick(4, FiredOverflow))
	// Both halves off: never overflow.
	r = newRouter(t, func(o *PDOptions) { o.CombinedDecodeBusy, o.CombinedPrefillBusy = 0, 0 })
	decide(t, r, req, cands, pair(0, 0))
}

func TestPDPrefillImbalanceFastPath(t *testing.T) {
	r := newRouter(t, nil)
	req := &Request{PromptTokens: 1000}
	cands := pdFleet(3, 0)
	cands[pre(0)].CachedTokens = 1000 // the cache pulls to roleset 0
	cands[pre(0)].InFlight = 20
	cands[pre(1)].InFlight = 5
	cands[pre(2)].InFlight = 4
	decide(t, r, req, cands, pair(2, FiredPrefillImbalance))
	// Spread 15 < 16: scoring decides (prefix_cache skips roleset 0, more
	// than one standard deviation above the mean, so the least loaded of
	// the others).
	cands[pre(0)].InFlight = 19
	got, _ := r.Decide(req, cands, &PDScratch{})
	if got.Fired&FiredPrefillImbalance != 0 {
		t.Fatalf("fast path fired at spread 15: %+v", got)
	}
	r = newRouter(t, func(o *PDOptions) { o.PrefillLoadImbalanceMinSpread = 15 })
	decide(t, r, req, cands, pair(2, FiredPrefillImbalance))
}

func TestPDDecodeFastPaths(t *testing.T) {
	r := newRouter(t, nil)
	req := &Request{PromptTokens: 100}
	cands := pdFleet(3, 0)
	for k := range 3 {
		cands[dec(k)].Running = 10
		cands[dec(k)].GenTokensPerSec = 1000
	}
	// Request-count spread: 26 vs 10 (16).
	cands[dec(0)].Running = 26
	cands[dec(2)].Running = 9
	decide(t, r, req, cands, pair(2, FiredDecodeCount))
	// Pending decodes count: roleset 2 gains 2 pending, spread 26-10=16 to
	// roleset 1 now.
	var p PendingDecode
	cands[dec(2)].Pending = &p
	t1, t2 := p.Pick(), p.Pick()
	decide(t, r, req, cands, pair(1, FiredDecodeCount))
	t1.Done()
	t2.Done()
	t2.Done() // idempotent
	if p.Load() != 0 {
		t.Fatalf("pending = %d after two Done", p.Load())
	}
	// A pod without metrics is out of the spread.
	cands[dec(0)].HasMetrics = false
	got, _ := r.Decide(req, cands, &PDScratch{})
	if got.Fired&FiredDecodeCount != 0 {
		t.Fatalf("count fast path fired over a pod without metrics: %+v", got)
	}
	cands[dec(0)].HasMetrics, cands[dec(0)].Running, cands[dec(2)].Running = true, 10, 10
	// Throughput spread > 2048: the slowest pod (most headroom).
	cands[dec(1)].GenTokensPerSec = 3049
	decide(t, r, req, cands, PDDecision{Kind: PDPair, Prefill: pre(0), Decode: dec(0), Combined: -1, Fired: FiredDecodeThroughput})
	cands[dec(1)].GenTokensPerSec = 3048 // spread exactly 2048: not above
	// Drain rate: every pod reports one; scores 10/1, 10/2, 10/4.
	cands[dec(0)].DrainRate, cands[dec(1)].DrainRate, cands[dec(2)].DrainRate = 1, 2, 4
	decide(t, r, req, cands, pair(2, FiredDecodeDrain))
	// Ratio 1.25 ≤ 1.5: no fast path.
	cands[dec(0)].DrainRate, cands[dec(1)].DrainRate, cands[dec(2)].DrainRate = 4, 4, 5
	got, _ = r.Decide(req, cands, &PDScratch{})
	if got.Fired != 0 {
		t.Fatalf("fast path fired: %+v", got)
	}
	// One pod without a drain rate: the check does not run.
	cands[dec(0)].DrainRate, cands[dec(1)].DrainRate = 0, 100
	got, _ = r.Decide(req, cands, &PDScratch{})
	if got.Fired != 0 {
		t.Fatalf("drain fast path fired with a pod lacking a rate: %+v", got)
	}
	// token_load replaces the fast paths.
	cands[dec(0)].Running = 100
	r = newRouter(t, func(o *PDOptions) { o.DecodeScorePolicy = DecodePolicyTokenLoad })
	cands[dec(0)].DecodeTokens = 1 // least prompt KV, many requests
	cands[dec(1)].DecodeTokens, cands[dec(2)].DecodeTokens = 5000, 5000
	cands[dec(0)].GenTokensPerSec, cands[dec(1)].GenTokensPerSec, cands[dec(2)].GenTokensPerSec = 0, 0, 0
	decide(t, r, req, cands, pair(0, 0))
}

func TestPDBothFastPathsAgreeOnOneRoleset(t *testing.T) {
	r := newRouter(t, nil)
	cands := pdFleet(3, 0)
	cands[pre(0)].InFlight, cands[pre(1)].InFlight, cands[pre(2)].InFlight = 30, 0, 30
	// The decode pod with the fewest requests is in roleset 2, but step 1
	// left only roleset 1; step 2 runs over it alone.
	cands[dec(0)].Running, cands[dec(1)].Running, cands[dec(2)].Running = 40, 30, 0
	decide(t, r, &Request{PromptTokens: 10}, cands, pair(1, FiredPrefillImbalance))
}

func TestPDDecodeScoringAndColdStart(t *testing.T) {
	r := newRouter(t, nil)
	req := &Request{PromptTokens: 10}
	cands := pdFleet(3, 0)
	// load_balancing: roleset 0 has more requests and less free KV.
	cands[dec(0)].Running, cands[dec(0)].KVUsage = 6, 0.5
	cands[dec(1)].Running, cands[dec(1)].KVUsage = 2, 0.1
	cands[dec(2)].Running, cands[dec(2)].KVUsage = 4, 0.1
	decide(t, r, req, cands, pair(1, 0))
	// Roleset 1's pod loses its metrics (restarted). Over the other two,
	// (no throughput, so that term is 1 for both) roleset 0 scores
	// (6/6 + 1) / (0.5/0.9) = 3.6 and roleset 2 (4/6 + 1) / 1 ≈ 1.67; the
	// cold pod's 1 + pending = 1 wins, and once a decode is pending on it
	// (2 > 1.67) it stops attracting the traffic.
	cands[dec(1)].HasMetrics = false
	decide(t, r, req, cands, pair(1, 0))
	var p PendingDecode
	cands[dec(1)].Pending = &p
	p.Pick()
	decide(t, r, req, cands, pair(2, 0))
	// least_request: running + pending.
	r = newRouter(t, func(o *PDOptions) { o.DecodeScorePolicy = DecodePolicyLeastRequest })
	cands[dec(1)].HasMetrics = true
	cands[dec(1)].Running = 4 // 4 + 1 pending = 5 > 4
	decide(t, r, req, cands, pair(2, 0))
	// conductor: a full KV cache is never chosen while another pod has room.
	r = newRouter(t, func(o *PDOptions) { o.DecodeScorePolicy = DecodePolicyConductor })
	cands[dec(2)].KVUsage = 1
	got, _ := r.Decide(req, cands, &PDScratch{})
	if got.Decode == dec(2) {
		t.Fatalf("conductor chose a full pod: %+v", got)
	}
}

func TestPDPrefillPolicies(t *testing.T) {
	req := &Request{PromptTokens: 8000}
	f := func(policy string, edit func(c []PDCandidate), want int) {
		t.Helper()
		r := newRouter(t, func(o *PDOptions) { o.PrefillScorePolicy = policy })
		cands := pdFleet(3, 0)
		edit(cands)
		decide(t, r, req, cands, pair(want, 0))
	}
	f(PrefillPolicyLeastRequest, func(c []PDCandidate) {
		c[pre(0)].InFlight, c[pre(1)].InFlight, c[pre(2)].InFlight = 3, 1, 2
	}, 1)
	// token_load: one long prompt outweighs several short ones.
	f(PrefillPolicyTokenLoad, func(c []PDCandidate) {
		c[pre(0)].ActiveTokens, c[pre(0)].InFlight = 40000, 1
		c[pre(1)].ActiveTokens, c[pre(1)].InFlight = 12000, 2
		c[pre(2)].ActiveTokens, c[pre(2)].InFlight = 20000, 2
	}, 1)
	// token_load with the std-dev skip: roleset 1's many requests put it
	// more than one deviation above the mean, so it is skipped even though
	// its token load is least.
	f(PrefillPolicyTokenLoad, func(c []PDCandidate) {
		c[pre(0)].ActiveTokens, c[pre(0)].InFlight = 40000, 1
		c[pre(1)].ActiveTokens, c[pre(1)].InFlight = 1000, 12
		c[pre(2)].ActiveTokens, c[pre(2)].InFlight = 20000, 2
	}, 2)
	// hybrid_cache_load between idle pods: the best match.
	f(PrefillPolicyHybridCacheLoad, func(c []PDCandidate) {
		c[pre(0)].CachedTokens, c[pre(1)].CachedTokens, c[pre(2)].CachedTokens = 2000, 7000, 4000
	}, 1)
	// conductor: the queue outweighs a cache hit.
	f(PrefillPolicyConductor, func(c []PDCandidate) {
		c[pre(0)].CachedTokens, c[pre(0)].QueuedPrefillTokens = 8000, 200000
		c[pre(1)].CachedTokens, c[pre(1)].QueuedPrefillTokens = 4000, 0
		c[pre(2)].CachedTokens, c[pre(2)].QueuedPrefillTokens = 0, 0
	}, 1)
}

func TestPDFinalPairNormalisesBothSides(t *testing.T) {
	r := newRouter(t, func(o *PDOptions) {
		o.PrefillScorePolicy, o.DecodeScorePolicy = PrefillPolicyLeastRequest, DecodePolicyLeastRequest
	})
	cands := pdFleet(2, 0)
	// Prefill scores 4 and 1 (normalised 1, 0.25); decode 1 and 8
	// (0.125, 1): roleset 0 sums 1.125, roleset 1 1.25.
	cands[pre(0)].InFlight, cands[pre(1)].InFlight = 4, 1
	cands[dec(0)].Running, cands[dec(1)].Running = 1, 8
	decide(t, r, &Request{PromptTokens: 10}, cands, pair(0, 0))
	cands[dec(1)].Running = 3 // 0.25 + 1 < 1 + 1/3
	decide(t, r, &Request{PromptTokens: 10}, cands, pair(1, 0))
	// A roleset of two prefill pods keeps its best one.
	cands = append(cands, PDCandidate{Role: RolePrefill, Roleset: 0, Candidate: Candidate{Pod: 4}})
	decide(t, r, &Request{PromptTokens: 10}, cands, PDDecision{Kind: PDPair, Prefill: 4, Decode: dec(0), Combined: -1})
}

func TestPDConditionalDisaggregation(t *testing.T) {
	r := newRouter(t, func(o *PDOptions) { o.LocalPrefillMaxTokens = 256 })
	cands := pdFleet(1, 0)
	local := PDDecision{Kind: PDLocal, Prefill: -1, Decode: dec(0), Combined: -1, Fired: FiredLocalPrefill}
	decide(t, r, &Request{PromptTokens: 200}, cands, local)
	decide(t, r, &Request{PromptTokens: 2000}, cands, pair(0, 0))
	cands[dec(0)].CachedTokens = 1800 // the decode pod holds all but 200
	decide(t, r, &Request{PromptTokens: 2000}, cands, local)
	decide(t, newRouter(t, nil), &Request{PromptTokens: 2000}, cands, pair(0, 0))
}

func TestPDBucketBand(t *testing.T) {
	r := newRouter(t, func(o *PDOptions) { o.PromptLengthBucketing, o.BucketServe = true, true })
	cands := pdFleet(2, 0) // both rolesets cover every length
	pl := r.Planner()
	for range 100 {
		pl.Record(1000)
		pl.Record(3000)
	}
	pl.Rebuild([]BucketRoleset{{Replicas: 1}, {Replicas: 1}})
	// Two equal rolesets share one range: the band cut sits between the
	// two lengths, lower lengths to roleset 0.
	cands[pre(0)].InFlight = 5 // scoring alone would pick roleset 1
	decide(t, r, &Request{PromptTokens: 1000}, cands, pair(0, FiredBucketBand))
	decide(t, r, &Request{PromptTokens: 3000}, cands, pair(1, FiredBucketBand))
	// The band's roleset lost its decode pod: the plan is ignored.
	cands[dec(0)].Down = true
	decide(t, r, &Request{PromptTokens: 1000}, cands, pair(1, 0))
}

func TestPDScratchReuseAndGrowth(t *testing.T) {
	r := newRouter(t, nil)
	var s PDScratch
	for _, n := range []int{1, 16, 3, 16} {
		cands := pdFleet(n, 1)
		cands[pre(n-1)].CachedTokens = 100
		got, err := r.Decide(&Request{PromptTokens: 100}, cands, &s)
		if err != nil || got.Prefill != pre(n-1) {
			t.Fatalf("%d rolesets: %+v %v", n, got, err)
		}
	}
}

func TestPDTiesShareTheTraffic(t *testing.T) {
	r := newRouter(t, nil)
	cands := pdFleet(4, 0)
	seen := map[int]bool{}
	for i := range 64 {
		got, err := r.Decide(&Request{PromptTokens: 10, Rand: uint64(i) * 0x9e3779b97f4a7c15}, cands, &PDScratch{})
		if err != nil {
			t.Fatal(err)
		}
		seen[got.Prefill] = true
	}
	if len(seen) < 3 {
		t.Fatalf("equal rolesets got %d distinct picks over 64 requests", len(seen))
	}
}

func TestPDDecideAllocatesNothing(t *testing.T) {
	r := newRouter(t, func(o *PDOptions) { o.PromptLengthBucketing = true })
	cands := benchFleet(16)
	var s PDScratch
	req := &Request{PromptTokens: 3000, Rand: 7}
	if d, err := r.Decide(req, cands, &s); err != nil || d.Fired != 0 || d.Kind != PDPair {
		t.Fatalf("bench fleet: %+v %v (every step should run to the scored pair)", d, err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = r.Decide(req, cands, &s) }); n != 0 {
		t.Fatalf("Decide allocates %v times per call", n)
	}
}

// benchFleet is 16 rolesets of one prefill and one decode pod with mixed
// loads, caches and metrics, and two combined pods.
func benchFleet(rolesets int) []PDCandidate {
	cands := pdFleet(rolesets, 2)
	for k := range rolesets {
		p, d := &cands[pre(k)], &cands[dec(k)]
		p.InFlight = k % 5
		p.CachedTokens = (k * 397) % 3000
		p.BucketMax = 1 << 20
		d.BucketMax = 1 << 20
		d.Running = 3 + k%7
		d.GenTokensPerSec = 900 + float64(k*37)
		d.KVUsage = 0.2 + float64(k%4)/10
		d.DrainRate = float64(d.Running) / (1 + float64(k%3)/10) // ratios ≤ 1.2
	}
	cands[len(cands)-1].InFlight = 3
	cands[len(cands)-2].InFlight = 2
	return cands
}

// TestPDEqualPodsOfARolesetShareTheTraffic: within one roleset, pods that
// score alike (an idle fleet) are chosen by the request's random number,
// not always the first, which took every request of an idle fleet.
func TestPDEqualPodsOfARolesetShareTheTraffic(t *testing.T) {
	r := newRouter(t, nil)
	var cands []PDCandidate
	for i := range 8 {
		role := RolePrefill
		if i >= 4 {
			role = RoleDecode
		}
		cands = append(cands, PDCandidate{Role: role, Candidate: Candidate{Pod: int32(i), HasMetrics: true}})
	}
	var pre, dec [8]int
	var s PDScratch
	for n := range 4000 {
		d, err := r.Decide(&Request{PromptTokens: 100, Rand: uint64(n) * 0x9e3779b97f4a7c15}, cands, &s)
		if err != nil {
			t.Fatal(err)
		}
		pre[d.Prefill]++
		dec[d.Decode]++
	}
	for i := range 4 {
		if pre[i] < 700 || dec[4+i] < 700 {
			t.Fatalf("picks per prefill pod %v, per decode pod %v; want about 1000 each", pre[:4], dec[4:])
		}
	}
}

// TestPDFastPathKeepsItsPod: a fast path picks a pod, not only its
// roleset: the least loaded prefill (step 1) or decode pod (step 2) serves
// the request, not another pod of its roleset drawn at random.
func TestPDFastPathKeepsItsPod(t *testing.T) {
	r := newRouter(t, nil)
	// Roleset 0: prefill pods 0 (idle) and 1 (busy), decode pods 2 and 3;
	// roleset 1: prefill pod 4 (busy), decode pod 5.
	cands := []PDCandidate{
		{Role: RolePrefill, Roleset: 0},
		{Role: RolePrefill, Roleset: 0, Candidate: Candidate{InFlight: 40}},
		{Role: RoleDecode, Roleset: 0, Candidate: Candidate{HasMetrics: true}},
		{Role: RoleDecode, Roleset: 0, Candidate: Candidate{HasMetrics: true}},
		{Role: RolePrefill, Roleset: 1, Candidate: Candidate{InFlight: 40}},
		{Role: RoleDecode, Roleset: 1, Candidate: Candidate{HasMetrics: true}},
	}
	for i := range cands {
		cands[i].Pod = int32(i)
	}
	var s PDScratch
	for n := range 64 {
		d, err := r.Decide(&Request{PromptTokens: 100, Rand: uint64(n) * 0x9e3779b97f4a7c15}, cands, &s)
		if err != nil || d.Fired&FiredPrefillImbalance == 0 || d.Prefill != 0 {
			t.Fatalf("request %d: %+v %v, want prefill pod 0 from the imbalance fast path", n, d, err)
		}
	}
	// Decode: prefill balanced, decode pod 2 idle, 3 and 5 busy.
	cands[1].InFlight, cands[4].InFlight = 0, 0
	cands[3].Running, cands[5].Running = 40, 40
	for n := range 64 {
		d, err := r.Decide(&Request{PromptTokens: 100, Rand: uint64(n) * 0x9e3779b97f4a7c15}, cands, &s)
		if err != nil || d.Fired&FiredDecodeCount == 0 || d.Decode != 2 {
			t.Fatalf("request %d: %+v %v, want decode pod 2 from the count fast path", n, d, err)
		}
	}
}

// TestPDEqualRolesetsAndCombinedPodsShareTheTraffic: equal rolesets (the
// pair step) and equal combined pods each get about their share, where
// drawing rnd modulo 2, 3, 4, ... sent the first three times its share
// and the eighth under half of it.
func TestPDEqualRolesetsAndCombinedPodsShareTheTraffic(t *testing.T) {
	r := newRouter(t, nil)
	const k, n = 8, 8000
	check := func(what string, cands []PDCandidate, at func(PDDecision) int) {
		t.Helper()
		got := make([]int, len(cands))
		var s PDScratch
		for i := range n {
			d, err := r.Decide(&Request{PromptTokens: 10, Rand: uint64(i) * 0x9e3779b97f4a7c15}, cands, &s)
			if err != nil {
				t.Fatal(err)
			}
			got[at(d)]++
		}
		for _, c := range got {
			if c != 0 && (c < n/k*7/10 || c > n/k*13/10) {
				t.Fatalf("%s: picks %v, want about %d each", what, got, n/k)
			}
		}
	}
	check("rolesets", pdFleet(k, 0), func(d PDDecision) int { return d.Prefill })
	cands := pdFleet(1, k)
	cands[dec(0)].Down = true // no pair: the combined pods
	check("combined pods", cands, func(d PDDecision) int { return d.Combined })
}

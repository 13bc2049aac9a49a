package route

import (
	"math"
	"testing"
)

func TestPrefixCacheScore(t *testing.T) {
	req := &Request{PromptTokens: 1000}
	cands := []Candidate{
		{CachedTokens: 900, InFlight: 4}, // 90% match, busiest
		{CachedTokens: 0, InFlight: 0},   // idle, no match
		{CachedTokens: 200, InFlight: 2}, // 20% match
	}
	out := make([]float64, 3)
	// A wide deviation limit isolates the formula from the skip rule.
	wide := DefaultOptions()
	wide.StdDevFactor = 10
	PrefixCache{wide}.Score(req, cands, out)
	want := []float64{10*0.1 + 1, 100*0.1 + 0, 80*0.1 + 0.5}
	for i := range want {
		if math.Abs(out[i]-want[i]) > 1e-9 {
			t.Fatalf("score[%d] = %v, want %v", i, out[i], want[i])
		}
	}
	// A minimum match of 25% drops the 20% match to no match.
	o := wide
	o.MinMatchPct = 25
	PrefixCache{o}.Score(req, cands, out)
	if out[2] != 100*0.1+0.5 {
		t.Fatalf("20%% match below the 25%% minimum scored %v", out[2])
	}
	// A pod far above the mean in-flight count is skipped.
	hot := []Candidate{{CachedTokens: 1000, InFlight: 40}, {InFlight: 1}, {InFlight: 1}, {InFlight: 2}}
	out = make([]float64, 4)
	PrefixCache{DefaultOptions()}.Score(req, hot, out)
	if !math.IsInf(out[0], 1) || Argmin(out, 0) == 0 {
		t.Fatalf("hot pod not skipped: %v", out)
	}
}

func TestCacheAwarePick(t *testing.T) {
	p := CacheAware{DefaultOptions()}
	scratch := make([]float64, 8)
	f := func(name string, req *Request, cands []Candidate, want ...int) {
		t.Helper()
		got := map[int]bool{}
		for r := uint64(0); r < 16; r++ {
			req.Rand = r
			got[p.Pick(req, cands, scratch)] = true
		}
		if len(got) != len(want) {
			t.Fatalf("%s: picked %v, want %v", name, got, want)
		}
		for _, w := range want {
			if !got[w] {
				t.Fatalf("%s: picked %v, want %v", name, got, want)
			}
		}
	}
	req := &Request{PromptTokens: 1000}
	f("longest match above threshold", req, []Candidate{{CachedTokens: 400, InFlight: 5}, {CachedTokens: 800, InFlight: 9}, {InFlight: 0}}, 1)
	f("no match above threshold: emptiest cache", req, []Candidate{{CachedTokens: 100, IndexedBlocks: 50}, {IndexedBlocks: 10}, {IndexedBlocks: 30}}, 1)
	f("ties spread", req, []Candidate{{IndexedBlocks: 5}, {IndexedBlocks: 5}, {IndexedBlocks: 5}}, 0, 1, 2)
	f("imbalanced: least loaded", req, []Candidate{{CachedTokens: 1000, InFlight: 100}, {InFlight: 10}, {InFlight: 20}}, 1)
	f("spread over abs but not rel threshold stays cache-aware", req, []Candidate{{CachedTokens: 1000, InFlight: 200}, {InFlight: 135}}, 0)
	if p.Pick(req, nil, scratch) != -1 {
		t.Fatal("picked from no candidates")
	}
}

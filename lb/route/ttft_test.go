package route

import (
	"math"
	"testing"
)

func TestPredictedTTFT(t *testing.T) {
	f := func(prompt int, c Candidate, transfer, want float64) {
		t.Helper()
		req := &Request{PromptTokens: prompt}
		if got := PredictedTTFT(req, &c, transfer); math.Abs(got-want) > 1e-12 {
			t.Fatalf("PredictedTTFT(%d, %+v) = %v, want %v", prompt, c, got, want)
		}
	}
	f(4000, Candidate{CachedTokens: 2048, QueuedPrefillTokens: 20000, PrefillTokensPerSec: 10000}, 0, 2.1952)
	f(4000, Candidate{CachedTokens: 5000, PrefillTokensPerSec: 20000}, 0.5, 0.5) // cache longer than the prompt
	f(2000, Candidate{}, 0, 0.1)                                                 // unknown speed: admit's default
}

// TestTTFTPolicies checks each of the global-scheduling study's policies
// against its definition on one set of pods: a session cached on a busy pod,
// its system prompt on an idle one, nothing on another idle one.
func TestTTFTPolicies(t *testing.T) {
	cands := []Candidate{
		{Pod: 0, CachedTokens: 6000, QueuedPrefillTokens: 60000, PrefillTokensPerSec: 20000, InFlight: 9}, // 3 s queue
		{Pod: 1, CachedTokens: 2048, PrefillTokensPerSec: 20000, InFlight: 1},                             // 0.3 s of prefill
		{Pod: 2, CachedTokens: 0, QueuedPrefillTokens: 1000, PrefillTokensPerSec: 20000},                  // 0.35 s
		{Pod: 3, CachedTokens: 6000, QueuedPrefillTokens: 80000, PrefillTokensPerSec: 20000},              // 4 s queue
	}
	req := &Request{PromptTokens: 8000, Rand: 3}
	scratch := make([]float64, len(cands))
	f := func(name string, want int) {
		t.Helper()
		p, err := New(name, DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Pick(req, cands, scratch); got != want {
			t.Fatalf("%s picked %d, want %d (scores %v)", name, got, want, scratch)
		}
	}
	f("cache_only", 0)  // most cached, shorter queue of the two
	f("least_queue", 1) // no queue at all
	f("min_ttft", 1)    // 0.30 s beats 0.35 s, 3.1 s and 4.1 s
}

func TestSLOCache(t *testing.T) {
	p := SLOCache{SLO: 2, MissWeight: 4}
	scratch := make([]float64, 3)
	f := func(prompt int, cands []Candidate, want int) {
		t.Helper()
		req := &Request{PromptTokens: prompt, Rand: 1}
		if got := (ScorePolicy{p}).Pick(req, cands, scratch); got != want {
			t.Fatalf("picked %d, want %d (scores %v)", got, want, scratch[:len(cands)])
		}
	}
	warmBusy := Candidate{CachedTokens: 7700, QueuedPrefillTokens: 20000, PrefillTokensPerSec: 20000} // 1.015 s, all hit
	cold := Candidate{CachedTokens: 2048, PrefillTokensPerSec: 20000}                                 // 0.2826 s, all miss
	// min_ttft would take the cold pod (0.28 s < 1.02 s); slo_cache keeps
	// the session where its prefix is while that meets the SLO:
	// 1.015 + 4×0.015 = 1.075 < 0.2826 × 5 = 1.413.
	f(8000, []Candidate{cold, warmBusy}, 1)
	// Once the warm pod's queue would break the SLO, the cold pod it is.
	warmBusy.QueuedPrefillTokens = 40000 // 2.015 s
	f(8000, []Candidate{cold, warmBusy}, 0)
	// When every pod misses the SLO, the least predicted TTFT.
	cold.QueuedPrefillTokens = 60000 // 3.28 s
	f(8000, []Candidate{cold, warmBusy}, 1)
	// Weight 0 is min_ttft.
	p.MissWeight = 0
	warmBusy.QueuedPrefillTokens = 20000
	cold.QueuedPrefillTokens = 0
	f(8000, []Candidate{cold, warmBusy}, 0)
}

func TestDefaultPolicyRegistered(t *testing.T) {
	if _, err := New(DefaultPolicy, DefaultOptions()); err != nil {
		t.Fatal(err)
	}
}

func TestTTFTPolicyAllocs(t *testing.T) {
	cands := make([]Candidate, 64)
	for i := range cands {
		cands[i] = Candidate{CachedTokens: 64 * i, QueuedPrefillTokens: float64(1000 * (i % 7)), PrefillTokensPerSec: 20000}
	}
	scratch := make([]float64, len(cands))
	req := &Request{PromptTokens: 8000}
	for _, name := range []string{"least_queue", "cache_only", "min_ttft", "slo_cache"} {
		p, _ := New(name, DefaultOptions())
		if a := testing.AllocsPerRun(100, func() { req.Rand++; p.Pick(req, cands, scratch) }); a != 0 {
			t.Fatalf("%s: %v allocations per pick", name, a)
		}
	}
}

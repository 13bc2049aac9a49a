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

// TestSeed000Policies checks each of seed 000's policies against its
// definition on one set of pods: a session cached on a busy pod, its system
// prompt on an idle one, nothing on another idle one.
func TestSeed000Policies(t *testing.T) {
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

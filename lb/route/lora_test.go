package route

import "testing"

func TestAdapterCost(t *testing.T) {
	f := func(held bool, used, maxLoras int, want float64) {
		t.Helper()
		if got := AdapterCost(held, used, maxLoras, 0.2); got != want {
			t.Errorf("AdapterCost(%v, %d, %d) = %v, want %v", held, used, maxLoras, got, want)
		}
	}
	f(true, 4, 4, 0)
	f(false, 3, 4, 0.2)
	f(false, 4, 4, 0.4)
}

// TestAdapterAffinity: the policies that score in seconds prefer the pod
// holding the adapter until its queue costs more than a load elsewhere.
func TestAdapterAffinity(t *testing.T) {
	req := &Request{PromptTokens: 1000, Rand: 7}
	f := func(p Policy, queued float64, want int) {
		t.Helper()
		cands := []Candidate{
			{Pod: 0, PrefillTokensPerSec: 20000, QueuedPrefillTokens: queued},
			{Pod: 1, PrefillTokensPerSec: 20000, AdapterSec: 0.2},
		}
		if got := p.Pick(req, cands, make([]float64, 2)); got != want {
			t.Errorf("%T with %v tokens queued on the holder: pick %d, want %d", p, queued, got, want)
		}
	}
	for _, p := range []Policy{ScorePolicy{MinTTFT{}}, SLOCache{SLO: 2}} {
		f(p, 0, 0)
		f(p, 3000, 0)  // 0.15 s of queue < a 0.2 s load
		f(p, 10000, 1) // 0.5 s of queue > a load
	}
}

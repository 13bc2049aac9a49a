package route

import (
	"math/rand/v2"
	"testing"
)

func TestArgminTiesSpread(t *testing.T) {
	s := []float64{3, 1, 2, 1, 1}
	seen := map[int]int{}
	for r := uint64(0); r < 30; r++ {
		seen[Argmin(s, r)]++
	}
	if len(seen) != 3 || seen[1] == 0 || seen[3] == 0 || seen[4] == 0 {
		t.Fatalf("ties went to %v, want all of 1, 3 and 4", seen)
	}
	if Argmin(nil, 0) != -1 {
		t.Fatal("Argmin(nil) != -1")
	}
}

func TestBasicPolicies(t *testing.T) {
	cands := []Candidate{{Pod: 0, InFlight: 5}, {Pod: 1, InFlight: 2}, {Pod: 2, InFlight: 9}}
	scratch := make([]float64, len(cands))
	f := func(name string, want int) {
		t.Helper()
		p, err := New(name, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Pick(&Request{Rand: 7}, cands, scratch); got != want {
			t.Fatalf("%s picked %d, want %d", name, got, want)
		}
		if got := p.Pick(&Request{}, nil, scratch); got != -1 {
			t.Fatalf("%s picked %d from no candidates", name, got)
		}
	}
	f("least_request", 1)
	f("random", 7%3)
	f("round_robin", 0)

	rr := &RoundRobin{}
	for i := 0; i < 6; i++ {
		if got := rr.Pick(&Request{}, cands, scratch); got != i%3 {
			t.Fatalf("round_robin pick %d = %d", i, got)
		}
	}
	if _, err := New("nope", Options{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

func TestRandomWeighted(t *testing.T) {
	cands := []Candidate{{Weight: 1}, {Weight: 3}}
	counts := [2]int{}
	for i := uint64(0); i < 4000; i++ {
		counts[Random{}.Pick(&Request{Rand: i * 0x9e3779b97f4a7c15}, cands, nil)]++
	}
	if counts[1] < 2700 || counts[1] > 3300 {
		t.Fatalf("weight 3 pod got %d of 4000 picks, want about 3000", counts[1])
	}
}

func TestPickAllocs(t *testing.T) {
	cands := make([]Candidate, 64)
	scratch := make([]float64, 64)
	p, _ := New("least_request", Options{})
	req := &Request{}
	if n := testing.AllocsPerRun(100, func() { p.Pick(req, cands, scratch) }); n != 0 {
		t.Fatalf("least_request allocates %v per pick", n)
	}
}

// TestCacheBlindPoliciesIgnoreCachedTokens: a policy the registry marks
// as reading no prefixes picks the same pod whatever the candidates'
// CachedTokens, so the gateway may fill them (for admission's prediction)
// without moving its picks.
func TestCacheBlindPoliciesIgnoreCachedTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range Names() {
		if UsesCache(name) {
			continue
		}
		// Two of each: round_robin's counter moves with each pick.
		blind, _ := New(name, DefaultOptions())
		seeing, _ := New(name, DefaultOptions())
		for range 200 {
			cands := make([]Candidate, 1+rng.IntN(8))
			for i := range cands {
				cands[i] = Candidate{Pod: int32(i), InFlight: rng.IntN(4), Weight: float64(1 + rng.IntN(2)),
					QueuedPrefillTokens: float64(rng.IntN(3) * 1000), PrefillTokensPerSec: 10000,
					ActiveTokens: float64(rng.IntN(3) * 1000), KVTokens: float64(rng.IntN(3) * 1000)}
			}
			req := Request{PromptTokens: 4000, BlockSize: 16, Rand: rng.Uint64()}
			want := blind.Pick(&req, cands, make([]float64, len(cands)))
			for i := range cands {
				cands[i].CachedTokens = 16 * rng.IntN(251)
			}
			if got := seeing.Pick(&req, cands, make([]float64, len(cands))); got != want {
				t.Fatalf("%s picked %d with cached tokens, %d without: %+v", name, got, want, cands)
			}
		}
	}
}

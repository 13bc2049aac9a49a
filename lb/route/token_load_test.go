package route

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"pdlb/ledger"
)

// scoresNear checks out against want to 1e-9.
func scoresNear(t *testing.T, name string, out, want []float64) {
	t.Helper()
	for i := range want {
		if math.Abs(out[i]-want[i]) > 1e-9 {
			t.Fatalf("%s: score[%d] = %v, want %v (all %v)", name, i, out[i], want[i], out)
		}
	}
}

func TestTokenLoadScore(t *testing.T) {
	cands := []Candidate{
		{ActiveTokens: 30000 + 3500},                         // one long prompt computing
		{ActiveTokens: 8 * (100 + 3500)},                     // eight short ones
		{ActiveTokens: 0, KVTokens: 4 * (30000 + 3500)},      // prefilled, KV held for decode
		{InFlight: 50, ActiveTokens: 1000, KVTokens: 100000}, // in-flight count plays no part
	}
	out := make([]float64, len(cands))
	TokenLoad{DefaultOptions()}.Score(&Request{}, cands, out)
	scoresNear(t, "default", out, []float64{33500, 28800, 0.3 * 134000, 1000 + 0.3*100000})
	o := DefaultOptions()
	o.TokenLoadKVWeight = 1
	TokenLoad{o}.Score(&Request{}, cands, out)
	scoresNear(t, "kv weight 1", out, []float64{33500, 28800, 134000, 101000})
}

func TestHybridCacheLoadScore(t *testing.T) {
	req := &Request{PromptTokens: 1000}
	out := make([]float64, 4)
	// f scores cands with o and checks the scores.
	f := func(name string, o Options, cands []Candidate, want ...float64) {
		t.Helper()
		HybridCacheLoad{o}.Score(req, cands, out[:len(cands)])
		scoresNear(t, name, out, want)
	}
	def := DefaultOptions()
	// Idle pods: bare discounts, so the best match wins outright.
	f("idle", def, []Candidate{{CachedTokens: 300}, {CachedTokens: 700}, {}, {ActiveTokens: 0.5, CachedTokens: 1000}},
		1-0.09*0.5, 1-0.49*0.5, 1, 0.5)
	// Busy pods: AIBrix's figures, a 30% match discounts by 4.5%, a 70%
	// match by 24.5%, a full match halves the load.
	f("busy", def, []Candidate{{ActiveTokens: 1000, CachedTokens: 300}, {ActiveTokens: 1000, CachedTokens: 700}, {ActiveTokens: 1000, CachedTokens: 1000}, {KVTokens: 1000}},
		955, 755, 500, 300)
	// The pod holding the prefix loses once it carries more than twice the
	// load of an unmatched neighbour.
	f("affinity limit", def, []Candidate{{ActiveTokens: 2002, CachedTokens: 1000}, {ActiveTokens: 1000}}, 1001, 1000)
	// min_match_pct: a 20% match under a 25% minimum is no match.
	o := def
	o.MinMatchPct = 25
	f("min match", o, []Candidate{{ActiveTokens: 1000, CachedTokens: 200}, {ActiveTokens: 1000, CachedTokens: 250}}, 1000, 1000*(1-0.0625*0.5))
	// factor 1: a full match scores 0 and always wins; factor 0: no discount.
	o = def
	o.HybridCacheLoadFactor = 1
	f("factor 1", o, []Candidate{{ActiveTokens: 1e6, CachedTokens: 1000}, {}}, 0, 1)
	o.HybridCacheLoadFactor = 0
	f("factor 0", o, []Candidate{{ActiveTokens: 10, CachedTokens: 1000}, {ActiveTokens: 10}}, 10, 10)
}

func TestDecodeTokenLoadScore(t *testing.T) {
	out := make([]float64, 4)
	// f scores cands with o and checks the scores.
	f := func(name string, o Options, cands []Candidate, want ...float64) {
		t.Helper()
		DecodeTokenLoad{o}.Score(&Request{}, cands, out[:len(cands)])
		scoresNear(t, name, out, want)
	}
	def := DefaultOptions()
	cands := []Candidate{
		// 4 running at 200 tok/s: 50 tok/s each; 10 s of outstanding age.
		{DecodeTokens: 8000, DecodeAgeSec: 10, HasMetrics: true, Running: 4, GenTokensPerSec: 200},
		// 2 running at 60 tok/s: 30 tok/s each.
		{DecodeTokens: 1000, DecodeAgeSec: 100, HasMetrics: true, Running: 2, GenTokensPerSec: 60},
		// No scrape yet: the mean of the others' rates, 40 tok/s.
		{DecodeTokens: 2000, DecodeAgeSec: 5},
		// Scraped but idle: no rate of its own either.
		{DecodeTokens: 0, DecodeAgeSec: 0, HasMetrics: true, Running: 0, GenTokensPerSec: 0},
	}
	f("growth", def, cands, 8000+50*10, 1000+30*100, 2000+40*5, 0)
	o := def
	o.DecodeOutputGrowth = false
	f("prompts only", o, cands, 8000, 1000, 2000, 0)
	// Nobody has a rate: growth is zero rather than made up.
	f("no rates", def, []Candidate{{DecodeTokens: 5, DecodeAgeSec: 9}, {DecodeTokens: 7, DecodeAgeSec: 1}}, 5, 7)
	// Long outputs: a pod holding fewer prompt tokens but old, fast-growing
	// requests scores above a pod with a fresh long prompt.
	p := ScorePolicy{DecodeTokenLoad{def}}
	old := Candidate{DecodeTokens: 1000, DecodeAgeSec: 120, HasMetrics: true, Running: 2, GenTokensPerSec: 100}
	fresh := Candidate{DecodeTokens: 4000, DecodeAgeSec: 0, HasMetrics: true, Running: 1, GenTokensPerSec: 50}
	if got := p.Pick(&Request{}, []Candidate{old, fresh}, out); got != 1 {
		t.Fatalf("picked %d, want the pod with the fresh prompt (1)", got)
	}
}

// TestDecodeTokenLoadCountsSequences: a request of n choices generates
// n tokens a step, each into KV of its own, and the engines' running
// gauges (whose rate per sequence the growth term takes) count each
// choice: the ledger's age term counts them too. Pod 0 decodes one
// request of 8 choices on a 100-token prompt, pod 1 one of 1 on 300
// tokens; after 10 s at 10 tokens/s a sequence, pod 0 holds 100 + 800
// tokens and pod 1 300 + 100: the next request goes to pod 1.
func TestDecodeTokenLoadCountsSequences(t *testing.T) {
	var now int64
	l := ledger.New(ledger.DefaultConfig(), ledger.Env{Now: func() int64 { return now }})
	l.SetPods([]ledger.Member{{ID: 0, Name: "a"}, {ID: 1, Name: "b"}})
	l.Charge(&ledger.Ticket{ID: 1}, -1, 0, &ledger.Prompt{Tokens: 100, Sequences: 8}, now)
	l.Charge(&ledger.Ticket{ID: 2}, -1, 1, &ledger.Prompt{Tokens: 300, Sequences: 1}, now)
	now += int64(10 * time.Second)
	cands := []Candidate{
		{HasMetrics: true, Running: 8, GenTokensPerSec: 80},
		{HasMetrics: true, Running: 1, GenTokensPerSec: 10},
	}
	for i := range cands {
		cands[i].DecodeTokens, cands[i].DecodeAgeSec = l.Decode(int32(i), now)
	}
	out := make([]float64, len(cands))
	DecodeTokenLoad{DefaultOptions()}.Score(&Request{}, cands, out)
	scoresNear(t, "scores", out, []float64{100 + 8*10*10, 300 + 10*10})
	if got := (ScorePolicy{DecodeTokenLoad{DefaultOptions()}}).Pick(&Request{}, cands, out); got != 1 {
		t.Fatalf("picked pod %d, want pod 1, which holds the less KV", got)
	}
}

func TestTokenLoadRegistryAndDefaults(t *testing.T) {
	for _, name := range []string{"token_load", "hybrid_cache_load"} {
		if _, err := New(name, DefaultOptions()); err != nil {
			t.Fatal(err)
		}
	}
	// route cannot import ledger at run time (the scorers read plain
	// numbers); this test keeps the two copies of AIBrix's defaults equal.
	c, o := ledger.DefaultConfig(), DefaultOptions()
	if o.TokenLoadKVWeight != c.KVWeight || o.HybridCacheLoadFactor != c.HybridCacheLoadFactor ||
		o.MinMatchPct != c.MinMatchPct || o.DecodeOutputGrowth != c.DecodeOutputGrowth {
		t.Fatalf("route defaults %+v disagree with ledger defaults %+v", o, c)
	}
}

func TestTokenLoadPickAllocs(t *testing.T) {
	cands := []Candidate{
		{ActiveTokens: 100, KVTokens: 10, CachedTokens: 500, DecodeTokens: 300, DecodeAgeSec: 2, HasMetrics: true, Running: 1, GenTokensPerSec: 30},
		{ActiveTokens: 50, KVTokens: 900, CachedTokens: 100, DecodeTokens: 100, DecodeAgeSec: 1},
		{ActiveTokens: 70, CachedTokens: 900, DecodeTokens: 200, DecodeAgeSec: 4, HasMetrics: true, Running: 3, GenTokensPerSec: 90},
	}
	req := &Request{PromptTokens: 1000}
	scratch := make([]float64, len(cands))
	token, _ := New("token_load", DefaultOptions())
	hybrid, _ := New("hybrid_cache_load", DefaultOptions())
	for name, p := range map[string]Policy{"token_load": token, "hybrid_cache_load": hybrid, "decode_token_load": ScorePolicy{DecodeTokenLoad{DefaultOptions()}}} {
		if a := testing.AllocsPerRun(100, func() { p.Pick(req, cands, scratch) }); a != 0 {
			t.Fatalf("%s: %v allocs per pick", name, a)
		}
	}
}

// TestReadsLedger checks ReadsLedger against what each registered policy
// does, since the gateway fills the ledger's counters only for the
// policies it reports: the token-ledger ones report it, and every other
// one picks the same pod whatever the counters say.
func TestReadsLedger(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ledgerPolicies := map[string]bool{"token_load": true, "hybrid_cache_load": true}
	pick := func(name string, req *Request, cands []Candidate) int {
		p, err := New(name, DefaultOptions()) // a fresh one: round_robin keeps state
		if err != nil {
			t.Fatal(err)
		}
		return p.Pick(req, cands, make([]float64, len(cands)))
	}
	for _, name := range Names() {
		p, err := New(name, DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		if got := ReadsLedger(p); got != ledgerPolicies[name] {
			t.Errorf("ReadsLedger(%s) = %v, want %v", name, got, ledgerPolicies[name])
		}
		if ledgerPolicies[name] {
			continue
		}
		for trial := 0; trial < 300; trial++ {
			req := &Request{PromptTokens: 2048, BlockSize: 16, Rand: rng.Uint64()}
			cands := make([]Candidate, 2+rng.IntN(8))
			for i := range cands {
				cands[i] = Candidate{Pod: int32(i), CachedTokens: 16 * rng.IntN(129), InFlight: rng.IntN(4),
					QueuedPrefillTokens: float64(rng.IntN(3) * 1000), PrefillTokensPerSec: float64(1 + rng.IntN(3)*5000),
					Weight: 1, IndexedBlocks: rng.IntN(100), HasMetrics: true, Running: rng.IntN(4), Waiting: rng.IntN(2),
					KVUsage: rng.Float64(), GenTokensPerSec: float64(rng.IntN(3) * 100)}
			}
			bare := pick(name, req, cands)
			for i := range cands {
				c := &cands[i]
				c.ActiveTokens, c.KVTokens = float64(rng.IntN(5000)), float64(rng.IntN(5000))
				c.DecodeTokens, c.DecodeAgeSec = float64(rng.IntN(5000)), rng.Float64()*10
			}
			if got := pick(name, req, cands); got != bare {
				t.Fatalf("%s picks %d with ledger counters, %d without, but ReadsLedger is false", name, got, bare)
			}
		}
	}
}

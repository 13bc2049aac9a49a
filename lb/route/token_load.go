package route

// The token-ledger scorers of AIBrix's gateway ("Token Load Scoring Policy",
// "Hybrid Cache-Load Scoring Policy"). They read the ledger through plain
// Candidate numbers the caller fills (ledger.Prefill, ledger.Decode), so
// bench/cluster can drive them from simulated pods.

// TokenLoad is AIBrix's token_load prefill scorer:
//
//	score = active_tokens + kv_weight × kv_tokens
//
// so one long prompt weighs as much as many short ones, where
// least_request counts both as one request each.
type TokenLoad struct{ Opts Options }

// Score implements Scorer.
func (p TokenLoad) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		out[i] = tokenLoad(&cands[i], p.Opts.TokenLoadKVWeight)
	}
}

func tokenLoad(c *Candidate, kvWeight float64) float64 {
	return c.ActiveTokens + kvWeight*c.KVTokens
}

// HybridCacheLoad is AIBrix's hybrid_cache_load prefill scorer:
//
//	r        = match% / 100        (0 below MinMatchPct)
//	discount = 1 − r² × factor
//	score    = load × discount     when load ≥ 1
//	score    = discount            when load < 1 (idle pod)
//
// with load the token_load score. Between idle pods every score is a bare
// discount below 1, so the best prefix match wins; between busy pods the
// match only discounts the load (with factor 0.5 a full match halves it),
// and the square keeps small matches from moving the decision.
type HybridCacheLoad struct{ Opts Options }

// Score implements Scorer.
func (p HybridCacheLoad) Score(req *Request, cands []Candidate, out []float64) {
	for i := range cands {
		c := &cands[i]
		r := matchPct(req, c, p.Opts.MinMatchPct) / 100
		discount := 1 - r*r*p.Opts.HybridCacheLoadFactor
		if load := tokenLoad(c, p.Opts.TokenLoadKVWeight); load >= 1 {
			out[i] = load * discount
		} else {
			out[i] = discount
		}
	}
}

// DecodeTokenLoad is AIBrix's token_load decode scorer:
//
//	score = decode_tokens + generated_tokens
//
// decode_tokens is the prompt KV the gateway sent the pod and not yet saw
// finish; generated_tokens estimates the output those requests produced so
// far, which sits in the same KV cache: Σ rate × sequences × (now −
// routed_at) = rate × DecodeAgeSec, where rate is the pod's generation
// throughput per running sequence (the engines' running gauges count each
// of a request's n choices), or the mean of the other pods' rates when it
// has none yet (no scrape, or nothing running). Without DecodeOutputGrowth
// the score counts prompts only.
type DecodeTokenLoad struct{ Opts Options }

// Score implements Scorer.
func (p DecodeTokenLoad) Score(_ *Request, cands []Candidate, out []float64) {
	if !p.Opts.DecodeOutputGrowth {
		for i := range cands {
			out[i] = cands[i].DecodeTokens
		}
		return
	}
	// First pass: each pod's own rate into out (-1 for none), and their sum.
	sum, n := 0.0, 0
	for i := range cands {
		out[i] = genRate(&cands[i])
		if out[i] >= 0 {
			sum += out[i]
			n++
		}
	}
	for i := range cands {
		c := &cands[i]
		rate := out[i]
		if rate < 0 {
			rate = 0
			if n > 0 {
				// Pods without a rate are not in sum, so this is the mean
				// of the other pods' rates.
				rate = sum / float64(n)
			}
		}
		out[i] = c.DecodeTokens + rate*c.DecodeAgeSec
	}
}

// genRate is c's generation rate per running sequence (tokens/s), -1
// when its metrics do not give one.
func genRate(c *Candidate) float64 {
	if !c.HasMetrics || c.Running <= 0 || !(c.GenTokensPerSec > 0) {
		return -1
	}
	return c.GenTokensPerSec / float64(c.Running)
}

// They read the ledger's prefill counters (ReadsLedger). DecodeTokenLoad
// scores the PD cascade's decode pods only: a pick among combined pods
// takes no decode charge, so it is no policy of the registry.
func (TokenLoad) readsLedger()       {}
func (HybridCacheLoad) readsLedger() {}

var (
	_ Scorer       = TokenLoad{}
	_ Scorer       = HybridCacheLoad{}
	_ Scorer       = DecodeTokenLoad{}
	_ ledgerReader = TokenLoad{}
	_ ledgerReader = HybridCacheLoad{}
)

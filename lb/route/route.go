// Package route decides which pod serves a request.
//
// Policies see the world only through Request and Candidate values and never
// touch sockets, clocks or pod objects, so one implementation serves both the
// live gateway (which fills candidates from pods, the radix index and the
// ledgers) and bench/cluster (which fills them from simulated pods in virtual
// time). A policy's simulated attainment is therefore evidence about the
// gateway, not about a copy of it.
package route

import (
	"errors"
	"fmt"
	"strings"

	"pdlb/lb/admit"
)

// Request is what a policy knows of the request it places. The caller owns
// it; policies must not keep it or its slices after Pick returns.
type Request struct {
	// PromptTokens is the prompt's length in tokens (estimated or counted).
	PromptTokens int
	// Keys are the prompt's chained block keys (radix.AppendBlockKeys), a
	// completion batch's prompts' chains one after another; empty when
	// the gateway has no index for the model.
	Keys []uint64
	// BlockSize is the number of tokens one key covers.
	BlockSize int
	// Rand is a random number the caller draws per request. Policies take
	// every random choice and tie break from it, so a virtual-time run with a
	// fixed seed is deterministic and the hot path needs no locked RNG.
	Rand uint64
	// Whole says the request cannot go through the model's prefill/decode
	// exchange: a completion batch where the exchange hands one prompt's
	// KV over (engines.Kind.ExchangesBatch), or several choices (n),
	// which no engine's exchange carries. PDRouter.Decide
	// sends it whole to a combined pod, else to a decode pod that
	// prefills it itself.
	Whole bool
}

// Candidate is one pod as a policy sees it. Zero means "unknown" for every
// scraped field; HasMetrics says whether the scraped ones are real.
type Candidate struct {
	// Pod is the caller's index of this pod; policies return positions in
	// the candidate slice, and the caller maps them back through Pod.
	Pod int32
	// CachedTokens is how many leading prompt tokens the pod is believed to
	// hold in its prefix cache (radix match depth × block size).
	CachedTokens int
	// InFlight is the number of requests the gateway has sent to the pod and
	// not yet seen finish: exact and always current, unlike scraped metrics.
	InFlight int
	// QueuedPrefillTokens is the uncached prompt tokens charged to the pod
	// whose prefill has not finished yet (tokens).
	QueuedPrefillTokens float64
	// PrefillTokensPerSec is the pod's prefill speed on uncached tokens,
	// learned from observed timings (tokens/s). Zero means unknown.
	PrefillTokensPerSec float64
	// Weight scales the pod's share of traffic (default 1).
	Weight float64
	// IndexedBlocks is how many blocks the prefix index believes the pod
	// holds: how full its cache is, as the gateway sees it.
	IndexedBlocks int
	// ActiveTokens and KVTokens are the prefill token ledger's counters for
	// the pod (tokens; ledger.Prefill): prompt tokens it is computing, and
	// prompt tokens whose KV it still holds for a decode pod.
	ActiveTokens float64
	KVTokens     float64
	// DecodeTokens and DecodeAgeSec are the decode token ledger's view of
	// the pod (ledger.Decode): prompt tokens of its outstanding decode
	// requests, and Σ sequences × (now − routed_at) over them in seconds
	// (a request decodes n sequences for each of its prompts).
	DecodeTokens float64
	DecodeAgeSec float64
	// AdapterSec is how long the pod takes to bring the request's LoRA
	// adapter into a GPU slot before its prefill (seconds): 0 when it
	// holds it or the request names none. The policies that score in
	// seconds (min_ttft, slo_cache) add it to their predicted TTFT.
	AdapterSec float64

	// Scraped from the engine's /metrics.
	HasMetrics bool
	Running    int     // sequences being decoded (each choice of a request is one)
	Waiting    int     // requests queued in the engine
	KVUsage    float64 // fraction of KV blocks in use, 0..1
	// GenTokensPerSec is the pod's generation throughput (tokens/s).
	GenTokensPerSec float64
}

// Policy picks a pod for a request. Pick returns the index in cands of the
// chosen pod, or -1 when cands is empty. scratch has at least len(cands)
// elements the policy may overwrite; the caller owns every slice, so a
// policy allocates nothing per call. Policies are safe for concurrent use.
type Policy interface {
	Pick(req *Request, cands []Candidate, scratch []float64) int
}

// ReadsLedger reports whether p reads the token ledger's counters in its
// candidates (ActiveTokens, KVTokens, DecodeTokens, DecodeAgeSec): p, or
// the Scorer of a ScorePolicy, is a ledgerReader. A caller fills those
// counters, under the ledger's selection lock so that concurrent picks see
// each other's charges, only for such a policy: the others' picks need
// neither, and that lock is what concurrent picks queue on.
func ReadsLedger(p Policy) bool {
	if sp, ok := p.(ScorePolicy); ok {
		_, ok = sp.Scorer.(ledgerReader)
		return ok
	}
	_, ok := p.(ledgerReader)
	return ok
}

// ledgerReader marks the policies and scorers ReadsLedger reports.
type ledgerReader interface{ readsLedger() }

// Scorer is the common shape of a policy: out[i] is the cost of sending req
// to cands[i], lower is better. ScorePolicy turns a Scorer into a Policy.
type Scorer interface {
	Score(req *Request, cands []Candidate, out []float64)
}

// ScorePolicy picks the lowest-scoring candidate, breaking ties at random so
// that equal pods share the traffic instead of it all landing on the first.
type ScorePolicy struct{ Scorer Scorer }

// Pick implements Policy.
func (p ScorePolicy) Pick(req *Request, cands []Candidate, scratch []float64) int {
	if len(cands) == 0 {
		return -1
	}
	out := scratch[:len(cands)]
	p.Scorer.Score(req, cands, out)
	return Argmin(out, req.Rand)
}

// Argmin returns the index of the smallest value in s, choosing among equal
// minima by rnd; -1 for an empty slice.
func Argmin(s []float64, rnd uint64) int {
	var m argmin
	for i, v := range s {
		m.add(i, v)
	}
	return m.pick(s, rnd)
}

// argmin follows the smallest of scores seen one at a time, so a policy
// can find it while it scores (SLOCache.Pick) instead of in a second pass.
// The zero value has seen none.
type argmin struct {
	best, ties int // the first index holding min, and how many hold it
	min        float64
}

// add sees score v at index i; indexes come in increasing order.
func (m *argmin) add(i int, v float64) {
	switch {
	case m.ties == 0 || v < m.min:
		m.best, m.min, m.ties = i, v, 1
	case v == m.min:
		m.ties++
	}
}

// pick returns the index of the smallest score, choosing among equal
// minima by rnd; -1 when it saw none. s holds the scores it saw.
func (m *argmin) pick(s []float64, rnd uint64) int {
	switch m.ties {
	case 0:
		return -1
	case 1:
		return m.best
	}
	k := int(rnd % uint64(m.ties))
	for i := m.best; i < len(s); i++ {
		if s[i] == m.min {
			if k == 0 {
				return i
			}
			k--
		}
	}
	panic("BUG: route: argmin lost a tie")
}

// ErrUnknownPolicy is returned by New for a name not in the registry.
var ErrUnknownPolicy = errors.New("route: unknown policy")

// Options carries the knobs of every policy; New reads those of the policy
// it builds. Start from DefaultOptions: zero is a meaningful value for some
// knobs.
type Options struct {
	// MinMatchPct: prefix matches below this percentage of the prompt count
	// as no match (prefix_cache, hybrid_cache_load; AIBrix's
	// AIBRIX_MIN_MATCH_PCT, default 0 = off).
	MinMatchPct float64
	// StdDevFactor: prefix_cache skips pods whose in-flight count is more
	// than this many standard deviations above the mean (default 1).
	StdDevFactor float64
	// CacheThreshold: cache_aware routes by cache only when the best match
	// covers more than this fraction of the prompt (default 0.3).
	CacheThreshold float64
	// BalanceAbsThreshold and BalanceRelThreshold: cache_aware counts the
	// load as imbalanced, and routes to the least loaded pod, when the
	// in-flight spread exceeds the absolute threshold and the maximum
	// exceeds the relative threshold times the minimum (defaults 64, 1.5).
	BalanceAbsThreshold float64
	BalanceRelThreshold float64
	// TokenLoadKVWeight weighs resident KV tokens against active prefill
	// tokens (token_load, hybrid_cache_load; AIBRIX_TOKEN_LOAD_KV_WEIGHT,
	// default 0.3).
	TokenLoadKVWeight float64
	// HybridCacheLoadFactor is the discount a full prefix match applies to a
	// pod's load, 0..1 (hybrid_cache_load; AIBRIX_HYBRID_CACHE_LOAD_FACTOR,
	// default 0.5).
	HybridCacheLoadFactor float64
	// DecodeOutputGrowth adds the output generated so far to the decode
	// score (decode_token_load; AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH,
	// default true).
	DecodeOutputGrowth bool
	// TTFTSLO is the time-to-first-token target in seconds that slo_cache
	// keeps its picks under (default admit.DefaultInteractiveTTFTSLO, 2).
	TTFTSLO float64
	// MissWeight is what slo_cache charges a missed prompt token beyond its
	// own prefill time, in units of that time (default
	// DefaultSLOCacheMissWeight).
	MissWeight float64
}

// Defaults of Options, as SGLang's model gateway (cache_aware) and AIBrix
// (prefix_cache) ship them.
const (
	DefaultMinMatchPct         = 0
	DefaultStdDevFactor        = 1
	DefaultCacheThreshold      = 0.3
	DefaultBalanceAbsThreshold = 64
	DefaultBalanceRelThreshold = 1.5
	// AIBrix's token_load and hybrid_cache_load defaults.
	DefaultTokenLoadKVWeight     = 0.3
	DefaultHybridCacheLoadFactor = 0.5
	DefaultDecodeOutputGrowth    = true
)

// DefaultOptions returns every knob at its default.
func DefaultOptions() Options {
	return Options{
		MinMatchPct:         DefaultMinMatchPct,
		StdDevFactor:        DefaultStdDevFactor,
		CacheThreshold:      DefaultCacheThreshold,
		BalanceAbsThreshold: DefaultBalanceAbsThreshold,
		BalanceRelThreshold: DefaultBalanceRelThreshold,
		TTFTSLO:             admit.DefaultInteractiveTTFTSLO,
		MissWeight:          DefaultSLOCacheMissWeight,

		TokenLoadKVWeight:     DefaultTokenLoadKVWeight,
		HybridCacheLoadFactor: DefaultHybridCacheLoadFactor,
		DecodeOutputGrowth:    DefaultDecodeOutputGrowth,
	}
}

// registry lists every policy by name: one explicit table rather than
// init-time registration, so the set of policies is visible in one place.
var registry = []struct {
	name string
	// cache says the policy reads Candidate.CachedTokens, so the caller
	// must look the prompt up in the prefix index for it.
	cache bool
	build func(Options) Policy
}{
	{"random", false, func(Options) Policy { return Random{} }},
	{"round_robin", false, func(Options) Policy { return &RoundRobin{} }},
	{"least_request", false, func(Options) Policy { return ScorePolicy{LeastRequest{}} }},
	{"least_queue", false, func(Options) Policy { return ScorePolicy{LeastQueue{}} }},
	{"cache_only", true, func(Options) Policy { return ScorePolicy{CacheOnly{}} }},
	{"min_ttft", true, func(Options) Policy { return ScorePolicy{MinTTFT{}} }},
	{"slo_cache", true, func(o Options) Policy { return SLOCache{SLO: o.TTFTSLO, MissWeight: o.MissWeight} }},
	{"prefix_cache", true, func(o Options) Policy { return ScorePolicy{PrefixCache{o}} }},
	{"cache_aware", true, func(o Options) Policy { return CacheAware{o} }},
	{"token_load", false, func(o Options) Policy { return ScorePolicy{TokenLoad{o}} }},
	{"hybrid_cache_load", true, func(o Options) Policy { return ScorePolicy{HybridCacheLoad{o}} }},
}

// New builds the policy called name.
func New(name string, opts Options) (Policy, error) {
	for _, r := range registry {
		if r.name == name {
			return r.build(opts), nil
		}
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownPolicy, name, strings.Join(Names(), ", "))
}

// UsesCache reports whether the policy called name reads prefix-cache
// matches; false for unknown names.
func UsesCache(name string) bool {
	for _, r := range registry {
		if r.name == name {
			return r.cache
		}
	}
	return false
}

// Names lists the registered policies in table order.
func Names() []string {
	out := make([]string, len(registry))
	for i, r := range registry {
		out[i] = r.name
	}
	return out
}

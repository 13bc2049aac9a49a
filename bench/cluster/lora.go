package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"

	"pdlb/lb/route"
	"pdlb/radix"
)

// The LoRA workload's defaults: 50 adapters of one base model with Zipf
// popularity, each used by an application with its own system prompt.
const (
	DefaultLoRAAdapters     = 50
	DefaultLoRAZipfS        = 1.1
	DefaultLoRASystemTokens = 512
	DefaultLoRAUserTokens   = 256
	DefaultLoRAMaxLoras     = 4
)

// LoRAChat is a fleet serving Adapters LoRA adapters of one base model:
// Poisson arrivals at Rate per second for Duration seconds, each naming
// adapter k (0-based) with probability ∝ 1/(k+1)^ZipfS and sending that
// adapter's system prompt of SystemTokens tokens plus UserTokens new
// ones. An adapter's keys chain from its own seed, as the engine keys its
// blocks apart (radix.SeedWith).
type LoRAChat struct {
	Rate, Duration                     float64
	Adapters, SystemTokens, UserTokens int
	ZipfS                              float64
	BlockSize                          int
	Seed                               uint64
}

// NewLoRAChat returns the workload with its defaults at rate requests per
// second for duration seconds.
func NewLoRAChat(rate, duration float64, blockSize int, seed uint64) LoRAChat {
	return LoRAChat{Rate: rate, Duration: duration, Adapters: DefaultLoRAAdapters, SystemTokens: DefaultLoRASystemTokens,
		UserTokens: DefaultLoRAUserTokens, ZipfS: DefaultLoRAZipfS, BlockSize: blockSize, Seed: seed}
}

type loraRun struct {
	cfg     LoRAChat
	rng     *rand.Rand
	zipf    *rand.Zipf
	names   []string
	systems []chatStream
	t       float64
}

// Start returns a fresh pass over the workload; equal seeds give equal
// passes.
func (c LoRAChat) Start() Workload {
	rng := rand.New(rand.NewPCG(c.Seed, 0x10ad))
	r := &loraRun{cfg: c, rng: rng, zipf: rand.NewZipf(rng, c.ZipfS, 1, uint64(c.Adapters-1))}
	base := radix.Seed("lora-base")
	for k := range c.Adapters {
		name := fmt.Sprintf("adapter-%02d", k)
		s := chatStream{tail: make([]uint32, 0, c.BlockSize)}
		s.extend(rng, c.SystemTokens, c.BlockSize, radix.SeedWith(base, name, ""))
		r.names, r.systems = append(r.names, name), append(r.systems, s)
	}
	return r
}

// Next implements Workload.
func (r *loraRun) Next(a *Arrival) bool {
	if r.t >= r.cfg.Duration {
		return false
	}
	r.t += r.rng.ExpFloat64() / r.cfg.Rate
	k := int(r.zipf.Uint64())
	s := r.systems[k].clone()
	s.extend(r.rng, r.cfg.UserTokens, r.cfg.BlockSize, 0)
	*a = Arrival{Time: r.t, PromptTokens: s.tokens, Keys: s.keys, OutputTokens: 1, Adapter: r.names[k]}
	return true
}

// LoRARow is one policy's outcome on a LoRA workload.
type LoRARow struct {
	Name string `json:"name"`
	Result
}

// CompareLoRA runs w on cfg's fleet (with MaxLoras slots a pod) three
// ways: LoRA-aware placement (slo_cache weighing route.AdapterCost),
// least_request, and the best policy without LoRA awareness (the least
// p99 TTFT of every registered policy run without it).
func CompareLoRA(cfg Config, w LoRAChat, opts route.Options) ([]LoRARow, error) {
	run := func(name string, aware bool) (Result, error) {
		p, err := route.New(name, opts)
		if err != nil {
			return Result{}, err
		}
		c := cfg
		c.Policy, c.LoRAAware = p, aware
		return Run(c, w.Start())
	}
	aware, err := run("slo_cache", true)
	if err != nil {
		return nil, err
	}
	rows := []LoRARow{{"lora-aware slo_cache", aware}}
	best := LoRARow{Result: Result{TTFTP99: math.Inf(1)}}
	for _, name := range route.Names() {
		res, err := run(name, false)
		if err != nil {
			return nil, err
		}
		if name == "least_request" {
			rows = append(rows, LoRARow{name, res})
		}
		if res.TTFTP99 < best.TTFTP99 {
			best = LoRARow{"best without LoRA: " + name, res}
		}
	}
	return append(rows, best), nil
}

// LoRAFloor is what no placement of a LoRA workload can beat, on a fleet
// that starts with no adapter loaded and nothing cached.
type LoRAFloor struct {
	// Slots is the fleet's adapter slots, pods × max_loras: at any
	// instant it holds (or is loading) at most that many adapters.
	Slots int `json:"slots"`
	// MissShare is the popularity mass of the adapters outside the
	// Slots most popular: each request's adapter is drawn independently
	// of what the fleet holds, so at least this share of requests (in
	// expectation) finds its adapter neither loaded nor loading anywhere,
	// and waits for a whole load and the prefill of its new tokens.
	MissShare float64 `json:"miss_share"`
	// ColdShare is the share of the run's requests that are the first of
	// their adapter: they find neither the adapter nor its system prompt
	// anywhere, and wait for a load and their whole prompt's prefill.
	ColdShare float64 `json:"cold_share"`
	// TTFTP99 is the p99 TTFT no placement gets below (seconds): the
	// longer of the two waits whose share exceeds 1%, a load and the
	// prefill of Uncached tokens; 0 when neither does.
	TTFTP99  float64 `json:"ttft_p99_s"`
	Uncached int     `json:"uncached_tokens,omitempty"`
}

// Floor is w's LoRAFloor on cfg's fleet; it draws w's requests once.
func (c LoRAChat) Floor(cfg Config) LoRAFloor {
	f := LoRAFloor{Slots: cfg.Pods * cfg.MaxLoras}
	// rand.Zipf's law with v = 1: P(k) ∝ (1+k)^-s, k = 0..Adapters-1,
	// most popular first.
	total, outside := 0.0, 0.0
	for k := range c.Adapters {
		p := math.Pow(float64(1+k), -c.ZipfS)
		total += p
		if k >= f.Slots {
			outside += p
		}
	}
	f.MissShare = outside / total
	seen, n := map[string]bool{}, 0
	var a Arrival
	for w := c.Start(); w.Next(&a); n++ {
		seen[a.Adapter] = true
	}
	if n > 0 {
		f.ColdShare = float64(len(seen)) / float64(n)
	}
	switch {
	case f.ColdShare > 0.01:
		f.Uncached = c.SystemTokens + c.UserTokens
	case f.MissShare > 0.01:
		f.Uncached = c.UserTokens
	default:
		return f
	}
	f.TTFTP99 = cfg.Physics.AdapterLoadSec + cfg.Physics.PrefillSec(f.Uncached)
	return f
}

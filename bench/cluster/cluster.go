// Package cluster is a discrete-event simulator of a fleet of inference pods
// in virtual time. It runs the real lb/route policies and lb/admit
// controller against pods that follow engines/sim's timing model (prefill
// first in, first out at PrefillTokensPerSec on the part of the prompt that
// missed the pod's LRU prefix cache of CacheBlocks blocks), so a policy's
// simulated SLO attainment is evidence about the gateway.
//
// The pods fill route.Candidate the way the gateway does: CachedTokens from
// the pod's cache, InFlight from what the router sent and has not seen
// finish, QueuedPrefillTokens as the uncached tokens the pod has still to
// compute (the ledger's prefill charges less the progress of the prefill
// running now), PrefillTokensPerSec from an admit.PrefillSpeed that learns
// from the prefills it sees finish.
//
// The global-scheduling study named in this package is the reference the
// simulator reproduces: 8 prefill pods of 20,000 tokens/s under a
// multi-turn chat (20 system prompts of 2,048 tokens, 400 sessions, +300
// tokens a turn) routed randomly, by least queue, by cache only and by
// minimum predicted TTFT, and a 24-instance day in three phases for xPyD.
// Like its simulation, a pod's cache learns a prompt when the request is
// routed, not when its prefill ends, and a request's time to first token
// is when its prefill ends; decode is not modelled.
package cluster

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"pdlb/engines/sim"
	"pdlb/lb/admit"
	"pdlb/lb/route"
)

// DefaultPods is the global-scheduling study's fleet size.
const DefaultPods = 8

// Config describes one simulated run.
type Config struct {
	// Pods is the number of combined pods (default 8).
	Pods int
	// Physics is every pod's timing model (default sim.DefaultPhysics()).
	Physics sim.Physics
	// Policy places each request.
	Policy route.Policy
	// Admission holds the classes' SLOs, by which attainment is measured,
	// and the deferral queue's size.
	Admission admit.Config
	// Reject runs the admission controller: requests predicted to miss
	// their class's targets are rejected or deferred. Without it every
	// request is admitted.
	Reject bool
	// Seed drives the router's random choices.
	Seed uint64
	// FirstTie gives every request Rand 0, so that route.Argmin breaks ties
	// for the first pod in index order, as Python's min() does in the
	// global-scheduling study's simulation, instead of at random as the
	// gateway does. With it, the random policy always picks pod 0: use it for
	// scorers only.
	FirstTie bool
	// KnownSpeed gives the router each pod's configured prefill speed, as
	// the global-scheduling study's router knows it, instead of the speed an
	// admit.PrefillSpeed learns from finished prefills. Learned speeds
	// differ between pods in their last bits (float rounding), which breaks
	// ties as surely as FirstTie would make them.
	KnownSpeed bool
	// MaxLoras gives every pod that many LoRA adapter slots (sim.LoRASlots;
	// default 0: requests' adapters cost nothing). A prefill whose adapter
	// is not in one waits Physics.AdapterLoadSec first.
	MaxLoras int
	// LoRAAware fills Candidate.AdapterSec (route.AdapterCost) as the
	// gateway does; without it the router does not know the adapters.
	LoRAAware bool
}

// DefaultConfig returns the global-scheduling study's fleet with policy and
// admission's defaults, rejection off.
func DefaultConfig(policy route.Policy) Config {
	return Config{Pods: DefaultPods, Physics: sim.DefaultPhysics(), Policy: policy, Admission: admit.DefaultConfig()}
}

var errConfig = errors.New("cluster: invalid config")

// Validate rejects a configuration the simulator cannot run, naming the
// field.
func (c Config) Validate() error {
	switch {
	case c.Pods <= 0:
		return fmt.Errorf("%w: pods = %d must be positive", errConfig, c.Pods)
	case c.MaxLoras < 0:
		return fmt.Errorf("%w: max_loras = %d must not be negative", errConfig, c.MaxLoras)
	case c.Policy == nil:
		return fmt.Errorf("%w: policy is not set", errConfig)
	}
	if err := c.Physics.Validate(); err != nil {
		return err
	}
	return c.Admission.Validate()
}

// Result is a run's outcome, in the global-scheduling study's terms. TTFT
// percentiles are over admitted requests, as the study computes them
// (sorted[n/2] and sorted[int(n×0.99)]).
type Result struct {
	Requests   int     `json:"requests"`
	HitRate    float64 `json:"hit_rate"`   // cached prompt tokens / prompt tokens, admitted requests
	TTFTP50    float64 `json:"ttft_p50_s"` // seconds
	TTFTP99    float64 `json:"ttft_p99_s"` // seconds
	Attainment float64 `json:"attainment"` // requests whose first token came within their class's SLO / all requests
	Rejected   float64 `json:"rejected"`   // rejected requests / all requests

	Deferred int `json:"-"` // requests that waited in the deferral queue
	// AdapterSwaps counts adapters brought into a slot (MaxLoras > 0);
	// LoadWaited is the share of requests whose first token waited for
	// one: their own, or one ahead of them in their pod's queue.
	AdapterSwaps    int     `json:"adapter_swaps,omitempty"`
	SwapsPerRequest float64 `json:"swaps_per_request,omitempty"`
	LoadWaited      float64 `json:"load_waited,omitempty"`
}

// job is a request in a pod's prefill queue.
type job struct {
	start, finish float64
	uncached      int
}

// pod is a simulated pod and the router's view of it.
type pod struct {
	cache *sim.PrefixCache
	speed *admit.PrefillSpeed
	jobs  []job   // prefill FIFO; jobs[0] runs
	busy  float64 // when the last queued prefill ends
	slots sim.LoRASlots
	// loaded is when the last queued prefill that loads an adapter ends.
	loaded float64
}

// run is the state of one simulation.
type run struct {
	cfg     Config
	pods    []pod
	cands   []route.Candidate
	scratch []float64
	rng     *rand.Rand
	ctrl    *admit.Controller
	waiting map[uint64]Arrival // deferred requests by id

	requests, rejected, met, deferred, swaps, loadWaits int
	hitTokens, promptTokens                             int
	ttfts                                               []float64
}

// Run simulates w on the fleet cfg describes.
func Run(cfg Config, w Workload) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	alpha := admit.DefaultSpeedAlpha
	if cfg.KnownSpeed {
		alpha = 0
	}
	r := &run{
		cfg:     cfg,
		pods:    make([]pod, cfg.Pods),
		cands:   make([]route.Candidate, cfg.Pods),
		scratch: make([]float64, cfg.Pods),
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x2007e)),
	}
	for i := range r.pods {
		r.pods[i] = pod{
			cache: sim.NewPrefixCache(cfg.Physics.CacheBlocks),
			speed: admit.NewPrefillSpeed(cfg.Physics.PrefillTokensPerSec, alpha),
			slots: sim.LoRASlots{Max: cfg.MaxLoras},
		}
	}
	if cfg.Reject {
		ctrl, err := admit.New(cfg.Admission)
		if err != nil {
			return Result{}, err
		}
		r.ctrl, r.waiting = ctrl, map[uint64]Arrival{}
	}
	var a Arrival
	for w.Next(&a) {
		r.advance(a.Time)
		r.arrive(&a)
	}
	r.advance(math.Inf(1))
	return r.result(), nil
}

// advance processes every prefill that finishes by t, in time order.
func (r *run) advance(t float64) {
	for {
		next, at := -1, t
		for i := range r.pods {
			if p := &r.pods[i]; len(p.jobs) > 0 && p.jobs[0].finish <= at {
				next, at = i, p.jobs[0].finish
			}
		}
		if next < 0 {
			return
		}
		p := &r.pods[next]
		j := p.jobs[0]
		p.jobs = p.jobs[1:]
		if len(p.jobs) == 0 {
			p.jobs = p.jobs[:0:cap(p.jobs)]
		}
		p.speed.Observe(j.uncached, j.finish-j.start)
		r.drainDeferred(at)
	}
}

// route fills the candidates for a at now and returns the policy's pick and
// its predicted TTFT there.
func (r *run) route(a *Arrival, now float64) (int, float64) {
	bs := r.cfg.Physics.BlockSize
	for i := range r.pods {
		p := &r.pods[i]
		r.cands[i] = route.Candidate{
			Pod:                 int32(i),
			CachedTokens:        min(p.cache.Match(a.Keys)*bs, a.PromptTokens),
			InFlight:            len(p.jobs),
			QueuedPrefillTokens: max(p.busy-now, 0) * r.cfg.Physics.PrefillTokensPerSec,
			PrefillTokensPerSec: p.speed.TokensPerSec(),
		}
		if a.Adapter != "" && r.cfg.LoRAAware {
			r.cands[i].AdapterSec = route.AdapterCost(p.slots.Holds(a.Adapter), p.slots.Len(), p.slots.Max, r.cfg.Physics.AdapterLoadSec)
		}
	}
	req := route.Request{PromptTokens: a.PromptTokens, Keys: a.Keys, BlockSize: bs}
	if !r.cfg.FirstTie {
		req.Rand = r.rng.Uint64()
	}
	i := r.cfg.Policy.Pick(&req, r.cands, r.scratch)
	return i, route.PredictedTTFT(&req, &r.cands[i], 0)
}

func (r *run) arrive(a *Arrival) {
	r.requests++
	id := uint64(r.requests)
	i, ttft := r.route(a, a.Time)
	if r.ctrl == nil {
		r.place(a, i, a.Time)
		return
	}
	switch r.ctrl.Decide(a.Class, "", id, a.Time, ttft, 0).Action {
	case admit.Admit:
		r.place(a, i, a.Time)
	case admit.Reject:
		r.rejected++
	case admit.Defer:
		r.deferred++
		r.waiting[id] = *a
	}
}

// drainDeferred runs when a prefill finishes at now, the moment a deferred
// request's prediction may clear: it rejects those that waited too long and
// admits from the head of the queue while their predictions fit.
func (r *run) drainDeferred(now float64) {
	if r.ctrl == nil || len(r.waiting) == 0 {
		return
	}
	for {
		d, ok := r.ctrl.Expired(now)
		if !ok {
			break
		}
		delete(r.waiting, d.ID)
		r.rejected++
	}
	for {
		d, ok := r.ctrl.Head()
		if !ok {
			return
		}
		a := r.waiting[d.ID]
		i, ttft := r.route(&a, now)
		if !r.ctrl.Retry(d.ID, now, ttft, 0) {
			return
		}
		delete(r.waiting, d.ID)
		r.place(&a, i, now)
	}
}

// place starts a's prefill on pod i at now and records its outcome, which
// the FIFO already fixes: its first token comes when its prefill ends. The
// candidates are still those route filled for a.
func (r *run) place(a *Arrival, i int, now float64) {
	p := &r.pods[i]
	hit := r.cands[i].CachedTokens
	unc := a.PromptTokens - hit
	start := max(p.busy, now)
	p.busy = start + r.cfg.Physics.PrefillSec(unc)
	// The FIFO runs prefills in placement order, so the slots see the
	// adapters in the order the pod uses them.
	waited := now < p.loaded
	if a.Adapter != "" && p.slots.Max > 0 && p.slots.Use(a.Adapter) {
		p.busy += r.cfg.Physics.AdapterLoadSec
		p.loaded, waited = p.busy, true
		r.swaps++
	}
	if waited {
		r.loadWaits++
	}
	p.jobs = append(p.jobs, job{start: start, finish: p.busy, uncached: unc})
	p.cache.Store(a.Keys, nil, nil)

	ttft := p.busy - a.Time
	r.ttfts = append(r.ttfts, ttft)
	if ttft <= r.cfg.Admission.Classes[a.Class].TTFTSLO {
		r.met++
	}
	r.hitTokens += hit
	r.promptTokens += a.PromptTokens
}

func (r *run) result() Result {
	res := Result{Requests: r.requests, Deferred: r.deferred}
	if r.requests == 0 {
		return res
	}
	n := float64(r.requests)
	res.AdapterSwaps, res.SwapsPerRequest, res.LoadWaited = r.swaps, float64(r.swaps)/n, float64(r.loadWaits)/n
	res.Attainment = float64(r.met) / n
	res.Rejected = float64(r.rejected) / n
	if r.promptTokens > 0 {
		res.HitRate = float64(r.hitTokens) / float64(r.promptTokens)
	}
	if len(r.ttfts) > 0 {
		slices.Sort(r.ttfts)
		res.TTFTP50 = r.ttfts[len(r.ttfts)/2]
		res.TTFTP99 = r.ttfts[int(float64(len(r.ttfts))*0.99)]
	}
	return res
}

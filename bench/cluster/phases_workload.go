package cluster

import (
	"math"
	"math/rand/v2"
	"strconv"

	"pdlb/lb/admit"
	"pdlb/lb/plan"
	"pdlb/radix"
)

// DefaultPhasePrefixes is how many shared prefixes (system prompts,
// documents' common preambles, agents' tool definitions) each phase's
// prompts draw from.
const DefaultPhasePrefixes = 8

// PhasedWorkload is a sequence of phases of PhaseSec seconds each, every
// phase a Poisson stream at its rate whose prompts have its shape: a shared
// prefix of round(hit × isl / block) blocks, drawn from Prefixes per phase,
// then a unique part, so that a pod that holds the phase's prefixes serves
// the phase's hit rate from cache. Prompt lengths are uniform in
// [isl/2 + prefix/2, 3isl/2 − prefix/2] (mean isl, never shorter than the
// prefix) and output lengths uniform in [osl/2, 3osl/2] (mean osl).
//
// A unique part's block keys are fresh random numbers rather than hashes of
// fresh random tokens: no other prompt holds them either way, and drawing
// one number a block instead of 64 keeps a 16,000-token prompt cheap.
type PhasedWorkload struct {
	Phases    []plan.Phase
	PhaseSec  float64
	Prefixes  int
	BlockSize int
	Seed      uint64
}

// PhaseOf returns the index of the phase an arrival at t belongs to.
func (w PhasedWorkload) PhaseOf(t float64) int {
	return min(max(int(t/w.PhaseSec), 0), len(w.Phases)-1)
}

// phasedRun is the state of one pass over a PhasedWorkload.
type phasedRun struct {
	w        PhasedWorkload
	rng      *rand.Rand
	prefixes [][][]uint64 // per phase, per prefix: its block keys
	phase    int
	t        float64
}

// Start returns a fresh pass over the workload; equal seeds give equal
// passes.
func (w PhasedWorkload) Start() Workload {
	rng := rand.New(rand.NewPCG(w.Seed, 0x9ba5e5))
	r := &phasedRun{w: w, rng: rng, prefixes: make([][][]uint64, len(w.Phases))}
	toks := make([]uint32, 0, 64*w.BlockSize)
	for i, ph := range w.Phases {
		n := int(math.Round(ph.HitRate * ph.PromptTokens / float64(w.BlockSize)))
		seed := radix.Seed("phase-" + strconv.Itoa(i))
		for range w.Prefixes {
			toks = toks[:0]
			for range n * w.BlockSize {
				toks = append(toks, rng.Uint32())
			}
			r.prefixes[i] = append(r.prefixes[i], radix.AppendBlockKeys(nil, seed, toks, w.BlockSize))
		}
	}
	return r
}

// Next implements Workload.
func (r *phasedRun) Next(a *Arrival) bool {
	for {
		if r.phase >= len(r.w.Phases) {
			return false
		}
		ph := r.w.Phases[r.phase]
		end := float64(r.phase+1) * r.w.PhaseSec
		if r.t < float64(r.phase)*r.w.PhaseSec {
			r.t = float64(r.phase) * r.w.PhaseSec
		}
		// Exponential gaps at this phase's rate; a gap that crosses the
		// phase's end starts the next phase afresh (memorylessness makes
		// that a Poisson stream at each phase's rate).
		if ph.Rate > 0 {
			if t := r.t + r.rng.ExpFloat64()/ph.Rate; t < end {
				r.t = t
				r.fill(a, ph)
				return true
			}
		}
		r.phase++
	}
}

// fill draws one arrival of phase ph at r.t.
func (r *phasedRun) fill(a *Arrival, ph plan.Phase) {
	bs := r.w.BlockSize
	prefix := r.prefixes[r.phase][r.rng.IntN(len(r.prefixes[r.phase]))]
	shared := len(prefix) * bs
	// Uniform around the mean with half-width (isl − shared)/2, so the
	// unique part is never negative.
	spread := max(ph.PromptTokens-float64(shared), 0)
	prompt := max(shared, int(math.Round(ph.PromptTokens-spread/2+r.rng.Float64()*spread)))
	output := max(1, int(math.Round(ph.OutputTokens/2+r.rng.Float64()*ph.OutputTokens)))
	keys := make([]uint64, len(prefix), prompt/bs)
	copy(keys, prefix)
	for len(keys) < cap(keys) {
		keys = append(keys, r.rng.Uint64())
	}
	*a = Arrival{Time: r.t, PromptTokens: prompt, Keys: keys, OutputTokens: output, Class: admit.Interactive}
}

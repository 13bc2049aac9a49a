package cluster

import (
	"math/rand/v2"

	"pdlb/lb/admit"
	"pdlb/radix"
)

// Arrival is one request as a workload hands it to the simulator.
type Arrival struct {
	// Time is when the request arrives, in seconds since the run began.
	Time float64
	// PromptTokens is the prompt's length in tokens.
	PromptTokens int
	// Keys are the prompt's chained block keys (radix.AppendBlockKeys), one
	// per full block. The slice stays valid for the whole run: workloads
	// hand out prefixes of append-only per-session slices.
	Keys []uint64
	// OutputTokens is how many tokens the request generates.
	OutputTokens int
	// Class is the request's priority class.
	Class admit.Class
	// Adapter is the LoRA adapter the request names ("" for none); its
	// keys chain from the adapter's seed.
	Adapter string
}

// Workload yields arrivals in non-decreasing time order. Next fills a and
// returns true, or returns false when the workload is over.
type Workload interface {
	Next(a *Arrival) bool
}

// The global-scheduling study's multi-turn chat workload, its defaults named
// after its text.
const (
	DefaultChatSystems      = 20
	DefaultChatSystemTokens = 2048
	DefaultChatSessions     = 400
	DefaultChatTurnTokens   = 300
)

// SeedChat is the global-scheduling study's multi-turn chat: Systems system
// prompts of SystemTokens random tokens, Sessions conversations each starting
// from a random system prompt, and Poisson arrivals at Rate per second for
// Duration seconds, each picking a random session, appending TurnTokens
// random tokens to it and sending the whole conversation so far. Like the
// seed, the model's answers are not appended and no output is generated.
type SeedChat struct {
	Rate, Duration                              float64
	Systems, SystemTokens, Sessions, TurnTokens int
	BlockSize                                   int
	Seed                                        uint64
}

// NewSeedChat returns the global-scheduling study's workload at rate requests
// per second for duration seconds, with keys of blockSize-token blocks.
func NewSeedChat(rate, duration float64, blockSize int, seed uint64) SeedChat {
	return SeedChat{
		Rate: rate, Duration: duration,
		Systems: DefaultChatSystems, SystemTokens: DefaultChatSystemTokens,
		Sessions: DefaultChatSessions, TurnTokens: DefaultChatTurnTokens,
		BlockSize: blockSize, Seed: seed,
	}
}

// chatStream is a token stream whose block keys are built as it grows: the
// tokens of the trailing partial block wait in tail, and only the keys are
// kept, so a session costs 8 bytes per block rather than 4 per token.
type chatStream struct {
	keys   []uint64
	tail   []uint32
	tokens int
}

// extend appends n random tokens, keying every block they complete. The
// chain continues from the last key (or seed for the first block), which is
// exactly what radix.AppendBlockKeys computes over the whole prompt.
func (s *chatStream) extend(rng *rand.Rand, n, blockSize int, seed uint64) {
	for range n {
		s.tail = append(s.tail, rng.Uint32())
		if len(s.tail) == blockSize {
			prev := seed
			if len(s.keys) > 0 {
				prev = s.keys[len(s.keys)-1]
			}
			s.keys = radix.AppendBlockKeys(s.keys, prev, s.tail, blockSize)
			s.tail = s.tail[:0]
		}
	}
	s.tokens += n
}

// clone returns a copy that grows independently of s.
func (s *chatStream) clone() chatStream {
	return chatStream{
		keys:   append([]uint64(nil), s.keys...),
		tail:   append(make([]uint32, 0, cap(s.tail)), s.tail...),
		tokens: s.tokens,
	}
}

// chatRun is the state of one pass over a SeedChat.
type chatRun struct {
	cfg      SeedChat
	rng      *rand.Rand
	sessions []chatStream
	seed     uint64 // the first link of every key chain
	t        float64
}

// Start returns a fresh pass over the workload; equal seeds give equal
// passes.
func (c SeedChat) Start() Workload {
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed000))
	seed := radix.Seed("seed-chat")
	systems := make([]chatStream, c.Systems)
	for i := range systems {
		systems[i].tail = make([]uint32, 0, c.BlockSize)
		systems[i].extend(rng, c.SystemTokens, c.BlockSize, seed)
	}
	r := &chatRun{cfg: c, rng: rng, sessions: make([]chatStream, c.Sessions), seed: seed}
	for i := range r.sessions {
		r.sessions[i] = systems[rng.IntN(len(systems))].clone()
	}
	return r
}

// Next implements Workload.
func (r *chatRun) Next(a *Arrival) bool {
	if r.t >= r.cfg.Duration {
		return false
	}
	// As in the study, the arrival that crosses Duration is still sent.
	r.t += r.rng.ExpFloat64() / r.cfg.Rate
	s := &r.sessions[r.rng.IntN(len(r.sessions))]
	s.extend(r.rng, r.cfg.TurnTokens, r.cfg.BlockSize, r.seed)
	*a = Arrival{Time: r.t, PromptTokens: s.tokens, Keys: s.keys[:len(s.keys):len(s.keys)], Class: admit.Interactive}
	return true
}

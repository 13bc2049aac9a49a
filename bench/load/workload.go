// Package load is pdlb's LLM-aware load generator: it sends OpenAI chat and
// completions requests (streaming by default) at a constant or Poisson rate
// or at a fixed concurrency, and measures what an LLM user feels: time to
// first token, time per output token, end-to-end latency and SLO attainment
// per priority class. tools/pdlb's `pdlb load` wires flags to it.
package load

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"pdlb/bench/cluster"
	"pdlb/engines/tokenize"
	"pdlb/lb/admit"
)

// Request is one request a workload produces. Its text fields are shared
// with the workload (a session's turns are an append-only slice), so a
// Request stays valid while the workload keeps generating.
type Request struct {
	// At is when a trace says the request arrives, since the run began;
	// workloads without arrival times leave it zero and the run's arrival
	// process decides.
	At float64
	// Session is the conversation the request belongs to, sent as
	// x-session-key; "" sends no header.
	Session string
	// Class is the priority class, sent as x-priority.
	Class admit.Class
	// System and Turns make a chat request: an optional system message and
	// the user turns so far, oldest first. When both are empty the request
	// is a completion of Prompt.
	System string
	Turns  []string
	Prompt string
	// PromptTokens is the prompt's length in engines/tokenize tokens (the
	// chat template adds a few per message).
	PromptTokens int
	// OutputTokens is the max_tokens asked for.
	OutputTokens int
}

// Chat says the request goes to /v1/chat/completions.
func (r *Request) Chat() bool { return r.System != "" || len(r.Turns) > 0 }

// Workload yields requests in a deterministic order. Next fills r and
// returns true, or returns false when the workload is over (only traces
// end; the run's bound stops the others).
type Workload interface {
	Next(r *Request) bool
}

// Workload names, as --workload takes them.
const (
	WorkloadSeedChat = "seed-chat"
	WorkloadLongDocs = "long-docs"
	WorkloadAgents   = "agents"
	WorkloadMixed    = "mixed"
	WorkloadTrace    = "trace"
)

// WorkloadNames lists the workloads NewWorkload knows.
var WorkloadNames = []string{WorkloadSeedChat, WorkloadLongDocs, WorkloadAgents, WorkloadMixed, WorkloadTrace}

// Defaults of the synthetic workloads. Chat is the global-scheduling study's
// (its shape from bench/cluster); long documents and agents follow the
// global-scheduling study's evening and night phases (16,000-token prompts
// with a 20% shared prefix and 300 output tokens; 6,000-token prompts with an
// 80% shared prefix and 2,000 output tokens); the mix is AIBrix's 100- and
// 30,000-token prompts.
const (
	DefaultChatOutputTokens  = 128
	DefaultDocInstruction    = 3200
	DefaultDocTokens         = 12800
	DefaultDocOutputTokens   = 300
	DefaultAgentPrefixes     = 4
	DefaultAgentPrefixTokens = 4800
	DefaultAgentTaskTokens   = 1200
	DefaultAgentOutputTokens = 2000
	DefaultMixShortTokens    = 100
	DefaultMixLongTokens     = 30000
	DefaultMixLongFraction   = 0.1
	DefaultMixOutputTokens   = 100
)

// WorkloadSpec selects and shapes a workload. Zero fields take the
// workload's defaults.
type WorkloadSpec struct {
	// Name is one of WorkloadNames.
	Name string
	// Seed makes the workload: equal specs give equal request sequences.
	Seed uint64
	// OutputTokens overrides the workload's max_tokens (trace lines keep
	// their own unless they give none).
	OutputTokens int
	// LongFraction is the mixed workload's share of long prompts
	// (default 0.1); 0 < LongFraction ≤ 1.
	LongFraction float64
	// BatchFraction is the share of requests sent as batch class, drawn
	// per request (default 0: all interactive; trace lines keep theirs).
	BatchFraction float64
	// Trace holds the records of the trace workload
	// (cluster.ReadTraceRecords).
	Trace []cluster.TraceRecord
}

// NewWorkload returns a fresh pass over the workload spec names.
func NewWorkload(spec WorkloadSpec) (Workload, error) {
	if !(spec.BatchFraction >= 0 && spec.BatchFraction <= 1) {
		return nil, fmt.Errorf("load: batch fraction %v must be in [0, 1]", spec.BatchFraction)
	}
	if spec.OutputTokens < 0 {
		return nil, fmt.Errorf("load: output tokens %d must not be negative", spec.OutputTokens)
	}
	out := func(def int) int {
		if spec.OutputTokens > 0 {
			return spec.OutputTokens
		}
		return def
	}
	g := gen{rng: rand.New(rand.NewPCG(spec.Seed, 0x10ad)), batch: spec.BatchFraction}
	switch spec.Name {
	case WorkloadSeedChat:
		return newSeedChat(g, out(DefaultChatOutputTokens)), nil
	case WorkloadLongDocs:
		return &sharedPrefix{gen: g, kind: "doc", prefixes: []string{g.text(DefaultDocInstruction)},
			prefixTokens: DefaultDocInstruction, bodyTokens: DefaultDocTokens, output: out(DefaultDocOutputTokens)}, nil
	case WorkloadAgents:
		w := &sharedPrefix{gen: g, kind: "agent", prefixTokens: DefaultAgentPrefixTokens,
			bodyTokens: DefaultAgentTaskTokens, output: out(DefaultAgentOutputTokens)}
		for range DefaultAgentPrefixes {
			w.prefixes = append(w.prefixes, g.text(DefaultAgentPrefixTokens))
		}
		return w, nil
	case WorkloadMixed:
		f := spec.LongFraction
		if f == 0 {
			f = DefaultMixLongFraction
		}
		if !(f > 0 && f <= 1) {
			return nil, fmt.Errorf("load: long fraction %v must be in (0, 1]", f)
		}
		return &mixed{gen: g, long: f, output: out(DefaultMixOutputTokens)}, nil
	case WorkloadTrace:
		if len(spec.Trace) == 0 {
			return nil, fmt.Errorf("load: the trace workload needs a trace with at least one line")
		}
		return &traceReplay{gen: g, recs: spec.Trace, output: spec.OutputTokens, sessions: map[string]string{}}, nil
	}
	return nil, fmt.Errorf("load: unknown workload %q (known: %v)", spec.Name, WorkloadNames)
}

// gen is what every synthetic workload draws from: one seeded source, so a
// workload is a pure function of its seed.
type gen struct {
	rng   *rand.Rand
	batch float64
}

// class draws a request's priority class.
func (g *gen) class() admit.Class {
	if g.batch > 0 && g.rng.Float64() < g.batch {
		return admit.Batch
	}
	return admit.Interactive
}

// letters are the characters of generated text: lower-case ASCII needs no
// JSON escaping and is a byte a character, so n tokens are exactly
// n×tokenize.BytesPerToken bytes.
const letters = "etaoinshrdlucmfwypvbgkjqxz"

// text returns random words of tokens tokens (tokenize.BytesPerToken bytes
// each). Random words make two texts share no prefix beyond a few bytes,
// so only the prefixes a workload shares on purpose hit a prefix cache.
func (g *gen) text(tokens int) string {
	b := make([]byte, tokens*tokenize.BytesPerToken)
	for i := range b {
		// A space about every six bytes, as in English text.
		if i > 0 && b[i-1] != ' ' && g.rng.IntN(6) == 0 {
			b[i] = ' '
			continue
		}
		b[i] = letters[g.rng.IntN(len(letters))]
	}
	return string(b)
}

// seedChat is the global-scheduling study's multi-turn chat: a pool of system
// prompts, sessions each starting from one of them, and every request picking
// a session, appending a user turn and sending the whole conversation. As in
// the global-scheduling study (and bench/cluster), answers are not appended,
// so the live run sends the prompts the simulator models.
type seedChat struct {
	gen
	systems  []string
	sessions []chatSession
	output   int
}

type chatSession struct {
	system int
	turns  []string
}

func newSeedChat(g gen, output int) *seedChat {
	w := &seedChat{gen: g, output: output, sessions: make([]chatSession, cluster.DefaultChatSessions)}
	for range cluster.DefaultChatSystems {
		w.systems = append(w.systems, g.text(cluster.DefaultChatSystemTokens))
	}
	for i := range w.sessions {
		w.sessions[i].system = g.rng.IntN(len(w.systems))
	}
	return w
}

// Next implements Workload.
func (w *seedChat) Next(r *Request) bool {
	i := w.rng.IntN(len(w.sessions))
	s := &w.sessions[i]
	s.turns = append(s.turns, w.text(cluster.DefaultChatTurnTokens))
	*r = Request{
		Session:      "chat-" + strconv.Itoa(i),
		Class:        w.class(),
		System:       w.systems[s.system],
		Turns:        s.turns[:len(s.turns):len(s.turns)],
		PromptTokens: cluster.DefaultChatSystemTokens + len(s.turns)*cluster.DefaultChatTurnTokens,
		OutputTokens: w.output,
	}
	return true
}

// sharedPrefix is a chat request of one of a few long shared system
// prompts and a fresh user message: long documents (one instruction, a new
// document each time) and agents (a few tool-laden system prompts, a new
// task each time).
type sharedPrefix struct {
	gen
	kind                     string
	prefixes                 []string
	prefixTokens, bodyTokens int
	output                   int
	n                        int
}

// Next implements Workload.
func (w *sharedPrefix) Next(r *Request) bool {
	p := w.rng.IntN(len(w.prefixes))
	w.n++
	*r = Request{
		Session:      w.kind + "-" + strconv.Itoa(w.n),
		Class:        w.class(),
		System:       w.prefixes[p],
		Turns:        []string{w.text(w.bodyTokens)},
		PromptTokens: w.prefixTokens + w.bodyTokens,
		OutputTokens: w.output,
	}
	return true
}

// mixed is AIBrix's case for token-aware load balancing: completions of
// short and very long prompts that share nothing.
type mixed struct {
	gen
	long   float64
	output int
}

// Next implements Workload.
func (w *mixed) Next(r *Request) bool {
	n := DefaultMixShortTokens
	if w.rng.Float64() < w.long {
		n = DefaultMixLongTokens
	}
	*r = Request{Class: w.class(), Prompt: w.text(n), PromptTokens: n, OutputTokens: w.output}
	return true
}

// traceReplay sends a trace's records at their times as completions. A
// record's text is sent as it is; a length-only record continues its
// session's text (extended with fresh random words as needed, so a
// session's turns share their prefix, as bench/cluster replays them) or,
// without a session, gets fresh text.
type traceReplay struct {
	gen
	recs     []cluster.TraceRecord
	next     int
	output   int
	sessions map[string]string
}

// Next implements Workload.
func (w *traceReplay) Next(r *Request) bool {
	if w.next == len(w.recs) {
		return false
	}
	rec := &w.recs[w.next]
	w.next++
	*r = Request{At: rec.Time, Session: rec.Session, Class: rec.Class, OutputTokens: rec.OutputTokens}
	if r.OutputTokens == 0 {
		r.OutputTokens = w.output
	}
	if w.batch > 0 && rec.Class == admit.Interactive {
		r.Class = w.class()
	}
	switch {
	case rec.Prompt != nil:
		r.Prompt = *rec.Prompt
		r.PromptTokens = tokenize.Count([]byte(r.Prompt))
	case rec.Session != "":
		s := w.sessions[rec.Session]
		if grow := rec.PromptTokens - len(s)/tokenize.BytesPerToken; grow > 0 {
			s += w.text(grow)
			w.sessions[rec.Session] = s
		}
		r.Prompt = s[:rec.PromptTokens*tokenize.BytesPerToken]
		r.PromptTokens = rec.PromptTokens
	default:
		r.Prompt = w.text(rec.PromptTokens)
		r.PromptTokens = rec.PromptTokens
	}
	return true
}

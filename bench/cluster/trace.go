package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"

	"pdlb/engines/tokenize"
	"pdlb/lb/admit"
	"pdlb/radix"
)

// traceLine is one JSONL line of a trace:
//
//	{"t": 0.25, "session": "u17", "prompt": "<|user|>\nhi\n", "output_tokens": 40}
//	{"t": 0.31, "session": "u17", "prompt_tokens": 2400, "priority": "batch"}
//
// t is the arrival in seconds since the trace began. The prompt is either
// its text (tokenized with engines/tokenize, so equal text prefixes share
// blocks as they do in the gateway), or only its length in prompt_tokens:
// then a line with a session continues that session's synthetic token
// stream (the prompt is its first prompt_tokens tokens, extended with fresh
// random tokens as needed, so a session's turns share their prefix), and a
// line without one gets fresh random tokens that share nothing. Unknown
// fields are ignored.
type traceLine struct {
	T            *float64 `json:"t"`
	Session      string   `json:"session"`
	Prompt       *string  `json:"prompt"`
	PromptTokens *int     `json:"prompt_tokens"`
	OutputTokens int      `json:"output_tokens"`
	Priority     string   `json:"priority"`
}

var errTrace = errors.New("cluster: bad trace")

// Trace is a recorded workload, replayed in arrival order.
type Trace struct {
	arrivals []Arrival
}

// ReadTrace reads a JSONL trace (see traceLine), keying prompts in blocks
// of blockSize tokens; seed drives the synthetic tokens of length-only
// prompts. Lines are sorted by arrival time (stable, so equal times keep
// file order); blank lines are skipped.
func ReadTrace(r io.Reader, blockSize int, seed uint64) (*Trace, error) {
	rng := rand.New(rand.NewPCG(seed, 0x7ace))
	chain := radix.Seed("trace")
	sessions := map[string]*chatStream{}
	var tokens []uint32
	tr := &Trace{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l traceLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", errTrace, n, err)
		}
		class, err := admit.ParseClass(l.Priority)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: line %d: %v", errTrace, n, err)
		case l.T == nil || *l.T < 0:
			return nil, fmt.Errorf("%w: line %d: \"t\" must be a non-negative number of seconds", errTrace, n)
		case (l.Prompt == nil) == (l.PromptTokens == nil):
			return nil, fmt.Errorf("%w: line %d: give exactly one of \"prompt\" and \"prompt_tokens\"", errTrace, n)
		case l.PromptTokens != nil && *l.PromptTokens < 0:
			return nil, fmt.Errorf("%w: line %d: \"prompt_tokens\" = %d must not be negative", errTrace, n, *l.PromptTokens)
		case l.OutputTokens < 0:
			return nil, fmt.Errorf("%w: line %d: \"output_tokens\" = %d must not be negative", errTrace, n, l.OutputTokens)
		}
		a := Arrival{Time: *l.T, OutputTokens: l.OutputTokens, Class: class}
		switch {
		case l.Prompt != nil:
			tokens = tokenize.Append(tokens[:0], []byte(*l.Prompt))
			a.PromptTokens = len(tokens)
			a.Keys = radix.AppendBlockKeys(nil, chain, tokens, blockSize)
		case l.Session != "":
			s := sessions[l.Session]
			if s == nil {
				s = &chatStream{tail: make([]uint32, 0, blockSize)}
				sessions[l.Session] = s
			}
			if grow := *l.PromptTokens - s.tokens; grow > 0 {
				s.extend(rng, grow, blockSize, chain)
			}
			a.PromptTokens = *l.PromptTokens
			k := a.PromptTokens / blockSize
			a.Keys = s.keys[:k:k]
		default:
			s := chatStream{tail: make([]uint32, 0, blockSize)}
			s.extend(rng, *l.PromptTokens, blockSize, chain)
			a.PromptTokens, a.Keys = s.tokens, s.keys
		}
		tr.arrivals = append(tr.arrivals, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", errTrace, err)
	}
	slices.SortStableFunc(tr.arrivals, func(x, y Arrival) int {
		switch {
		case x.Time < y.Time:
			return -1
		case x.Time > y.Time:
			return 1
		}
		return 0
	})
	return tr, nil
}

// Len returns the number of requests in the trace.
func (t *Trace) Len() int { return len(t.arrivals) }

// Start returns a fresh pass over the trace.
func (t *Trace) Start() Workload { return &traceRun{arrivals: t.arrivals} }

type traceRun struct {
	arrivals []Arrival
	next     int
}

// Next implements Workload.
func (r *traceRun) Next(a *Arrival) bool {
	if r.next == len(r.arrivals) {
		return false
	}
	*a = r.arrivals[r.next]
	r.next++
	return true
}

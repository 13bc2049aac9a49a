package cluster

import (
	"bufio"
	"bytes"
	"cmp"
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
// its text or only its length in prompt_tokens (see ReadTrace and
// bench/load for what each replay makes of a length). Unknown fields are
// ignored.
type traceLine struct {
	T            *float64 `json:"t"`
	Session      string   `json:"session"`
	Prompt       *string  `json:"prompt"`
	PromptTokens *int     `json:"prompt_tokens"`
	OutputTokens int      `json:"output_tokens"`
	Priority     string   `json:"priority"`
}

var errTrace = errors.New("cluster: bad trace")

// TraceRecord is one validated line of a JSONL trace (see traceLine). The
// simulator and the live load generator (bench/load) replay the same files
// through this one reader.
type TraceRecord struct {
	// Time is the arrival in seconds since the trace began.
	Time float64
	// Session names the conversation the request continues; "" for none.
	Session string
	// Prompt is the prompt's text, or nil when only PromptTokens is given.
	Prompt *string
	// PromptTokens is the prompt's length in tokens when Prompt is nil.
	PromptTokens int
	// OutputTokens is how many tokens the request generates.
	OutputTokens int
	// Class is the request's priority class.
	Class admit.Class
}

// ReadTraceRecords reads and checks a JSONL trace, returning its records
// sorted by arrival time (stable, so equal times keep file order); blank
// lines are skipped.
func ReadTraceRecords(r io.Reader) ([]TraceRecord, error) {
	var recs []TraceRecord
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
		rec := TraceRecord{Time: *l.T, Session: l.Session, Prompt: l.Prompt, OutputTokens: l.OutputTokens, Class: class}
		if l.PromptTokens != nil {
			rec.PromptTokens = *l.PromptTokens
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", errTrace, err)
	}
	slices.SortStableFunc(recs, func(x, y TraceRecord) int { return cmp.Compare(x.Time, y.Time) })
	return recs, nil
}

// Trace is a recorded workload, replayed in arrival order.
type Trace struct {
	arrivals []Arrival
}

// ReadTrace reads a JSONL trace (see ReadTraceRecords), keying prompts in
// blocks of blockSize tokens; seed drives the synthetic tokens of
// length-only prompts. A prompt's text is tokenized with engines/tokenize,
// so equal text prefixes share blocks as they do in the gateway. A
// length-only line with a session continues that session's synthetic token
// stream (the prompt is its first prompt_tokens tokens, extended with fresh
// random tokens as needed, so a session's turns share their prefix), and
// one without a session gets fresh random tokens that share nothing.
func ReadTrace(r io.Reader, blockSize int, seed uint64) (*Trace, error) {
	recs, err := ReadTraceRecords(r)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x7ace))
	chain := radix.Seed("trace")
	sessions := map[string]*chatStream{}
	var tokens []uint32
	tr := &Trace{arrivals: make([]Arrival, 0, len(recs))}
	for _, rec := range recs {
		a := Arrival{Time: rec.Time, OutputTokens: rec.OutputTokens, Class: rec.Class}
		switch {
		case rec.Prompt != nil:
			tokens = tokenize.Append(tokens[:0], []byte(*rec.Prompt))
			a.PromptTokens = len(tokens)
			a.Keys = radix.AppendBlockKeys(nil, chain, tokens, blockSize)
		case rec.Session != "":
			s := sessions[rec.Session]
			if s == nil {
				s = &chatStream{tail: make([]uint32, 0, blockSize)}
				sessions[rec.Session] = s
			}
			if grow := rec.PromptTokens - s.tokens; grow > 0 {
				s.extend(rng, grow, blockSize, chain)
			}
			a.PromptTokens = rec.PromptTokens
			k := a.PromptTokens / blockSize
			a.Keys = s.keys[:k:k]
		default:
			s := chatStream{tail: make([]uint32, 0, blockSize)}
			s.extend(rng, rec.PromptTokens, blockSize, chain)
			a.PromptTokens, a.Keys = s.tokens, s.keys
		}
		tr.arrivals = append(tr.arrivals, a)
	}
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

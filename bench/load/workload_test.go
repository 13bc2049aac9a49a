package load

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"pdlb/bench/cluster"
	"pdlb/engines/tokenize"
	"pdlb/lb/admit"
)

// bodies returns the first n requests of spec as their bodies and headers.
func bodies(t *testing.T, spec WorkloadSpec, n int) []string {
	t.Helper()
	w := mustWorkload(t, spec)
	var out []string
	var r Request
	for range n {
		if !w.Next(&r) {
			break
		}
		out = append(out, r.Session+"|"+r.Class.String()+"|"+string(r.AppendBody(nil, BodyOptions{Model: "m", Stream: true})))
	}
	return out
}

func TestWorkloadDeterministic(t *testing.T) {
	for _, name := range []string{WorkloadSeedChat, WorkloadLongDocs, WorkloadAgents, WorkloadMixed} {
		spec := WorkloadSpec{Name: name, Seed: 7, BatchFraction: 0.3}
		a, b := bodies(t, spec, 30), bodies(t, spec, 30)
		if len(a) != 30 || strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Fatalf("%s: equal seeds gave different requests", name)
		}
		spec.Seed = 8
		if c := bodies(t, spec, 30); strings.Join(a, "\n") == strings.Join(c, "\n") {
			t.Fatalf("%s: seeds 7 and 8 gave equal requests", name)
		}
	}
}

// TestSeedChatShape checks the global-scheduling study's shape: system
// prompts of 2,048 tokens, +300 tokens a turn, the whole history resent, a
// session key.
func TestSeedChatShape(t *testing.T) {
	w := mustWorkload(t, WorkloadSpec{Name: WorkloadSeedChat, Seed: 1})
	last := map[string][]string{}
	systems := map[string]bool{}
	var r Request
	for range 2000 {
		w.Next(&r)
		if !r.Chat() || r.Session == "" || r.Class != admit.Interactive || r.OutputTokens != DefaultChatOutputTokens {
			t.Fatalf("request %+v: want an interactive chat with a session", r.Session)
		}
		if tokenize.Count([]byte(r.System)) != cluster.DefaultChatSystemTokens {
			t.Fatalf("system prompt of %d tokens", tokenize.Count([]byte(r.System)))
		}
		systems[r.System] = true
		prev := last[r.Session]
		if len(r.Turns) != len(prev)+1 || strings.Join(r.Turns[:len(prev)], "") != strings.Join(prev, "") {
			t.Fatalf("session %s: %d turns after %d, not the history plus one", r.Session, len(r.Turns), len(prev))
		}
		if got := tokenize.Count([]byte(r.Turns[len(r.Turns)-1])); got != cluster.DefaultChatTurnTokens {
			t.Fatalf("turn of %d tokens", got)
		}
		if r.PromptTokens != cluster.DefaultChatSystemTokens+len(r.Turns)*cluster.DefaultChatTurnTokens {
			t.Fatalf("PromptTokens %d for %d turns", r.PromptTokens, len(r.Turns))
		}
		last[r.Session] = r.Turns
	}
	if len(systems) != cluster.DefaultChatSystems || len(last) > cluster.DefaultChatSessions {
		t.Fatalf("%d system prompts, %d sessions", len(systems), len(last))
	}
	// The body resends the history as messages: system first, then users.
	var b struct {
		Messages []struct{ Role, Content string }
		Stream   bool
		Options  *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(r.AppendBody(nil, BodyOptions{Model: "m", Stream: true}), &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Messages) != 1+len(r.Turns) || b.Messages[0].Role != "system" || b.Messages[1].Role != "user" ||
		!b.Stream || b.Options == nil || !b.Options.IncludeUsage {
		t.Fatalf("body %+v", b)
	}
	// As a Responses request: the system prompt as instructions, the
	// turns as input, stored nowhere.
	o := BodyOptions{Model: "m", Stream: true, API: APIResponses}
	var rb struct {
		Instructions string
		Input        []struct{ Role, Content string }
		Store        *bool
		Stream       bool
		MaxOutput    int `json:"max_output_tokens"`
	}
	if err := json.Unmarshal(r.AppendBody(nil, o), &rb); err != nil {
		t.Fatal(err)
	}
	if r.Path(o) != "/v1/responses" || rb.Instructions != r.System || len(rb.Input) != len(r.Turns) || rb.Input[0].Role != "user" ||
		rb.Store == nil || *rb.Store || !rb.Stream || rb.MaxOutput != r.OutputTokens {
		t.Fatalf("Responses body %+v to %s", rb, r.Path(o))
	}
}

func TestWorkloadShapes(t *testing.T) {
	f := func(name string, prompt, output int, shared float64) {
		t.Helper()
		w := mustWorkload(t, WorkloadSpec{Name: name, Seed: 3})
		var r Request
		w.Next(&r)
		got := tokenize.Count([]byte(r.System + strings.Join(r.Turns, "") + r.Prompt))
		if got != prompt || r.PromptTokens != prompt || r.OutputTokens != output {
			t.Fatalf("%s: prompt %d (%d claimed) output %d, want %d and %d", name, got, r.PromptTokens, r.OutputTokens, prompt, output)
		}
		if s := float64(tokenize.Count([]byte(r.System))) / float64(prompt); math.Abs(s-shared) > 1e-9 {
			t.Fatalf("%s: shared prefix %.2f of the prompt, want %.2f", name, s, shared)
		}
	}
	f(WorkloadLongDocs, DefaultDocInstruction+DefaultDocTokens, DefaultDocOutputTokens, 0.2)
	f(WorkloadAgents, DefaultAgentPrefixTokens+DefaultAgentTaskTokens, DefaultAgentOutputTokens, 0.8)

	// AIBrix's mix: only the two lengths, in about the asked proportion.
	w := mustWorkload(t, WorkloadSpec{Name: WorkloadMixed, LongFraction: 0.25})
	long := 0
	var r Request
	for range 400 {
		w.Next(&r)
		switch r.PromptTokens {
		case DefaultMixLongTokens:
			long++
		case DefaultMixShortTokens:
		default:
			t.Fatalf("mixed prompt of %d tokens", r.PromptTokens)
		}
		if r.Chat() || tokenize.Count([]byte(r.Prompt)) != r.PromptTokens {
			t.Fatal("mixed requests are completions of PromptTokens tokens")
		}
	}
	if long < 70 || long > 130 {
		t.Fatalf("%d long of 400, want about 100", long)
	}
}

func TestTraceReplay(t *testing.T) {
	trace := `{"t": 0.5, "session": "a", "prompt_tokens": 100, "output_tokens": 5}
{"t": 0.1, "prompt": "<|user|>\nhi\n", "priority": "batch"}
{"t": 0.9, "session": "a", "prompt_tokens": 250}
{"t": 1.0, "prompt_tokens": 10}
`
	recs, err := cluster.ReadTraceRecords(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	w := mustWorkload(t, WorkloadSpec{Name: WorkloadTrace, Trace: recs, OutputTokens: 7})
	var got []Request
	var r Request
	for w.Next(&r) {
		got = append(got, r)
	}
	if len(got) != 4 {
		t.Fatalf("%d requests, want 4", len(got))
	}
	// Sorted by time; text sent as it is; a session's turns share their
	// prefix; output tokens from the line, else the spec's.
	if got[0].At != 0.1 || got[0].Prompt != "<|user|>\nhi\n" || got[0].Class != admit.Batch || got[0].OutputTokens != 7 {
		t.Fatalf("first request %+v", got[0])
	}
	a1, a2 := got[1], got[2]
	if a1.Session != "a" || a1.PromptTokens != 100 || a1.OutputTokens != 5 || len(a1.Prompt) != 400 ||
		a2.PromptTokens != 250 || !strings.HasPrefix(a2.Prompt, a1.Prompt) {
		t.Fatalf("session turns %+v / %+v", a1.PromptTokens, a2.PromptTokens)
	}
	if got[3].Session != "" || got[3].PromptTokens != 10 || strings.HasPrefix(a2.Prompt, got[3].Prompt) {
		t.Fatalf("sessionless request %+v", got[3])
	}
	// The body keeps the template's angle brackets unescaped.
	if b := got[0].AppendBody(nil, BodyOptions{Model: "m"}); !bytes.Contains(b, []byte(`"prompt":"<|user|>\nhi\n"`)) {
		t.Fatalf("body %s", b)
	}
}

func TestWorkloadSpecErrors(t *testing.T) {
	for _, spec := range []WorkloadSpec{
		{Name: "nope"},
		{Name: WorkloadTrace},
		{Name: WorkloadMixed, LongFraction: 1.5},
		{Name: WorkloadSeedChat, BatchFraction: -0.1},
		{Name: WorkloadSeedChat, OutputTokens: -1},
	} {
		if _, err := NewWorkload(spec); err == nil {
			t.Fatalf("NewWorkload(%+v) succeeded", spec)
		}
	}
}

func TestVegetaTargets(t *testing.T) {
	var buf bytes.Buffer
	n, err := WriteVegetaTargets(&buf, mustWorkload(t, WorkloadSpec{Name: WorkloadSeedChat}), 5, "http://127.0.0.1:8080", BodyOptions{Model: "m"})
	if err != nil || n != 5 {
		t.Fatalf("wrote %d, %v", n, err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines", len(lines))
	}
	var tg struct {
		Method, URL string
		Body        []byte
		Header      map[string][]string
	}
	if err := json.Unmarshal([]byte(lines[0]), &tg); err != nil {
		t.Fatal(err)
	}
	var body struct{ Model string }
	if tg.Method != "POST" || tg.URL != "http://127.0.0.1:8080/v1/chat/completions" || json.Unmarshal(tg.Body, &body) != nil ||
		body.Model != "m" || tg.Header["X-Session-Key"] == nil || tg.Header["Content-Type"][0] != "application/json" {
		t.Fatalf("target %s", lines[0])
	}
}

package gateway

import (
	"strconv"
	"strings"
	"testing"

	"pdlb/engines/tokenize"
	"pdlb/lb/openai"
	"pdlb/lb/route"
)

// TestHomesBound: the table holds the ids of its last max puts: an id is
// forgotten once max puts came after its last, so one put again (a
// conversation's next turn) stays while others go; a deleted id is gone
// and counted no more.
func TestHomesBound(t *testing.T) {
	const max = 3
	h := newHomes(max)
	put := func(id, pod string) { h.put(id, home{model: "m", pod: pod}, max) }
	has := func(want ...string) {
		t.Helper()
		if h.len() != len(want) {
			t.Errorf("%d ids held, want %v (order %v)", h.len(), want, h.order)
		}
		for _, id := range want {
			if _, ok := h.get([]byte(id)); !ok {
				t.Errorf("%s forgotten (order %v)", id, h.order)
			}
		}
	}
	for i := range 5 {
		put("r"+strconv.Itoa(i), "p"+strconv.Itoa(i))
	}
	has("r2", "r3", "r4")
	if got, _ := h.get([]byte("r3")); got.pod != "p3" {
		t.Errorf("r3 on %q", got.pod)
	}
	// r2, the oldest, put again: r3 is the oldest now.
	put("r2", "q")
	put("r5", "p5")
	has("r2", "r4", "r5")
	if got, _ := h.get([]byte("r2")); got.pod != "q" {
		t.Errorf("r2 put again on %q", got.pod)
	}
	// One kept busy outlives a run of new ones.
	for i := range 10 {
		put("busy", "b")
		put("n"+strconv.Itoa(i), "p")
	}
	has("busy", "n8", "n9")
	h.forget([]byte("n9"))
	has("busy", "n8")
	put("n10", "p")
	put("n11", "p")
	has("n10", "n11") // busy's last put is three puts back
	if len(h.order) != max {
		t.Errorf("order grew to %d", len(h.order))
	}
	// "" would pass for a hole, never to be deleted.
	put("", "p")
	put("n12", "p")
	put("n13", "p")
	has("n11", "n12", "n13")
	if newHomes(0) != nil {
		t.Error("a bound of 0 keeps a table")
	}
}

// TestKeepHomeOverloaded: a conversation keeps to its pod until that pod
// has more requests in flight than the least loaded by both of
// cache_aware's balance thresholds (64 more, and 1.5 times); a stored
// response's pod is kept whatever its load.
func TestKeepHomeOverloaded(t *testing.T) {
	_, m := stagesGateway(t, 0, nil)
	home := m.Combined[0].Config.Name
	cands := func(load ...int) []route.Candidate {
		out := make([]route.Candidate, len(load))
		for i, n := range load {
			out[i] = route.Candidate{Pod: m.CombinedLoads[i].ID, InFlight: n}
		}
		return out
	}
	for _, c := range []struct {
		load []int
		soft bool
		kept int // candidates left
	}{
		{[]int{10, 0, 0}, true, 1},
		{[]int{64, 0, 5}, true, 1},      // 64 more: not past the absolute threshold
		{[]int{100, 40, 70}, true, 1},   // 60 more
		{[]int{100, 35, 70}, true, 3},   // 65 more, and 2.9 times
		{[]int{200, 135, 140}, true, 1}, // 65 more, 1.48 times
		{[]int{100, 0, 0}, false, 1},
	} {
		if got := keepHome(m, cands(c.load...), home, c.soft); len(got) != c.kept || c.kept == 1 && got[0].Pod != m.CombinedLoads[0].ID {
			t.Errorf("%v soft %v: kept %v", c.load, c.soft, got)
		}
	}
}

// TestBudgetedResponses: an API key's budget is charged a Responses
// request's prompt tokens, or its body's size when its input cannot be
// rendered (the engine judges it): never nothing.
func TestBudgetedResponses(t *testing.T) {
	x := &completion{req: openai.NewRequest()}
	for body, rendered := range map[string]bool{
		`{"model":"m","input":"a prompt of some words"}`:                              true,
		`{"model":"m","input":[],"instructions":"` + strings.Repeat("x", 4000) + `"}`: false,
	} {
		if err := x.req.Parse(openai.KindResponses, []byte(body)); err != nil {
			t.Fatal(err)
		}
		want := tokenize.CountLen(len(body))
		if rendered {
			want = x.req.PromptTokens()
		}
		if got := budgeted(x, []byte(body)); got != want || got == 0 {
			t.Errorf("%.60s: charged %d, want %d", body, got, want)
		}
	}
}

// TestSessionOfResponses: a Responses request's session header is its
// session's, as a chat's is (the ledger charges a session's growth), but
// for a follow-up whose history is elsewhere (previous_response_id,
// previous_response, previous_input_messages); an API without a prompt
// has none.
func TestSessionOfResponses(t *testing.T) {
	x := &completion{req: openai.NewRequest()}
	x.hdr[hdrSession] = []byte("conv-7")
	for kind, want := range map[openai.Kind]string{openai.KindResponses: "conv-7", openai.KindChat: "conv-7", openai.KindOther: ""} {
		x.req.Kind = kind
		if got := sessionOf(x); got != want {
			t.Errorf("%s: session %q, want %q", kind, got, want)
		}
	}
	// A follow-up by previous_response_id, or with vLLM's
	// previous_response or previous_input_messages, sends its new input
	// alone: its growth over the session's last prompt means nothing.
	for _, body := range []string{
		`{"model":"m","input":"more","previous_response_id":"resp_1"}`,
		`{"model":"m","input":"more","previous_input_messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","previous_response":{"id":"resp_1","output":[]},"input":"more"}`,
	} {
		if err := x.req.Parse(openai.KindResponses, []byte(body)); err != nil {
			t.Fatal(err)
		}
		if got := sessionOf(x); got != "" {
			t.Errorf("%s: session %q, want none", body, got)
		}
	}
	// Each key counts on its own (a client dumping every field sends the
	// other null); null or an empty list is no history.
	for body, continues := range map[string]bool{
		`{"model":"m","input":"x","previous_input_messages":[{"role":"user","content":"hi"}],"previous_response":null}`: true,
		`{"model":"m","input":"x","previous_response":{"id":"r","output":[]},"previous_input_messages":null}`:           true,
		`{"model":"m","input":"x","previous_input_messages":[{"role":"user"}],"previous_input_messages":null}`:          false,
		`{"model":"m","input":"x","previous_input_messages":[ ],"previous_response":null}`:                              false,
	} {
		if err := x.req.Parse(openai.KindResponses, []byte(body)); err != nil || (sessionOf(x) == "") != continues {
			t.Errorf("%s: %v, session %q, want a follow-up %v", body, err, sessionOf(x), continues)
		}
	}
	// Chats do not read the keys.
	if err := x.req.Parse(openai.KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"previous_response":{"id":"r"}}`)); err != nil || sessionOf(x) != "conv-7" {
		t.Errorf("a chat with previous_response: %v, session %q", err, sessionOf(x))
	}
}

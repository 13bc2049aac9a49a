package trtllm

import (
	"errors"
	"testing"
	"time"

	"pdlb/engines"
)

func newPD(t *testing.T, s Style) *PD {
	t.Helper()
	p, err := NewPD(s, 3)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestContextFirst(t *testing.T) {
	p := newPD(t, ContextFirst)
	x := &engines.Exchange{ID: 123456789, Chat: true}
	orig := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":32}`)
	got, err := p.PrefillBody(nil, orig, x)
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":32,"disaggregated_params":{"request_type":"context_only","disagg_request_id":123456789}}`
	if err != nil || string(got) != want {
		t.Fatalf("context body\n got %s %v\nwant %s", got, err, want)
	}
	ctx := []byte(`{"id":"c","prompt_token_ids":[1,2,3],"choices":[{"index":0,"message":{"content":"A"},"finish_reason":"length","disaggregated_params":{"request_type":"context_only","first_gen_tokens":[9],"ctx_request_id":77,"encoded_opaque_state":"b3BhcXVl","draft_tokens":null}}]}`)
	if p.PrefillAnswers(ctx) {
		t.Fatal("a length-finished context response answers the request")
	}
	dst := append(make([]byte, 0, 8), "keep"...)
	got, err = p.DecodeBody(dst, orig, ctx, x)
	want = `keep{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":32,"disaggregated_params":{"request_type":"generation_only","first_gen_tokens":[9],"ctx_request_id":77,"encoded_opaque_state":"b3BhcXVl","draft_tokens":null},"prompt_token_ids":[1,2,3]}`
	if err != nil || string(got) != want {
		t.Fatalf("generation body\n got %s %v\nwant %s", got, err, want)
	}
	// Completions: the returned ids replace the prompt.
	x.Chat = false
	got, _ = p.DecodeBody(nil, []byte(`{"prompt":"hi","max_tokens":4}`), ctx, x)
	want = `{"prompt":[1,2,3],"max_tokens":4,"disaggregated_params":{"request_type":"generation_only","first_gen_tokens":[9],"ctx_request_id":77,"encoded_opaque_state":"b3BhcXVl","draft_tokens":null}}`
	if string(got) != want {
		t.Fatalf("completion generation body\n got %s\nwant %s", got, want)
	}
	f := func(reason string, answers bool) {
		t.Helper()
		resp := []byte(`{"choices":[{"finish_reason":` + reason + `,"disaggregated_params":{}}]}`)
		if p.PrefillAnswers(resp) != answers {
			t.Fatalf("finish_reason %s: answers = %v", reason, !answers)
		}
	}
	f(`"stop"`, true)
	f(`"length"`, false)
	f(`"not_finished"`, false)
	f(`null`, false)
	for _, bad := range []string{`{"choices":[]}`, `{"choices":[{"finish_reason":"length"}]}`, `{}`} {
		if _, err := p.DecodeBody(nil, orig, []byte(bad), x); !errors.Is(err, engines.ErrPrefillResponse) {
			t.Fatalf("DecodeBody(%s) err = %v", bad, err)
		}
	}
	if p.Concurrent() || p.PrefillInfoPath() != "" {
		t.Fatal("context_first is sequential and needs no server info")
	}
}

func TestGenerationFirst(t *testing.T) {
	p := newPD(t, GenerationFirst)
	x := &engines.Exchange{ID: 99, PrefillInfo: []byte(`{"disaggregated_params":{"ctx_info_endpoint":"tcp://10.0.0.5:4000","ctx_dp_rank":0}}`)}
	orig := []byte(`{"prompt":"hi","stream":true}`)
	got, _ := p.PrefillBody(nil, orig, x)
	if string(got) != `{"prompt":"hi","stream":false,"disaggregated_params":{"request_type":"context_only","disagg_request_id":99,"schedule_style":1}}` {
		t.Fatalf("context body %s", got)
	}
	got, err := p.DecodeBody(nil, orig, nil, x)
	want := `{"prompt":"hi","stream":true,"disaggregated_params":{"request_type":"generation_only","disagg_request_id":99,"schedule_style":1,"ctx_info_endpoint":"tcp://10.0.0.5:4000","ctx_dp_rank":0}}`
	if err != nil || string(got) != want {
		t.Fatalf("generation body\n got %s %v\nwant %s", got, err, want)
	}
	for _, info := range []string{``, `{}`, `{"disaggregated_params":{}}`, `{"disaggregated_params":null}`} {
		x.PrefillInfo = []byte(info)
		if _, err := p.DecodeBody(nil, orig, nil, x); !errors.Is(err, engines.ErrPrefillResponse) {
			t.Fatalf("server info %q: err = %v", info, err)
		}
	}
	if !p.Concurrent() || p.PrefillInfoPath() != ServerInfoPath || p.PrefillAnswers([]byte(`{"choices":[{"finish_reason":"stop"}]}`)) {
		t.Fatal("generation_first runs both legs at once after reading /server_info")
	}
}

func TestIDs(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	g, err := NewIDs(1023, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	ms := now.Sub(idEpoch).Milliseconds()
	a, b := g.Next(), g.Next()
	if a != ms<<22|1023<<12|1 || b != a+1 {
		t.Fatalf("ids %d %d, want %d and the next", a, b, ms<<22|1023<<12|1)
	}
	// Before the epoch, ids still land in the global range.
	g, _ = NewIDs(0, func() time.Time { return idEpoch.Add(-time.Hour) })
	if id := g.Next(); id < minGlobalID {
		t.Fatalf("id %d below 2^42", id)
	}
	for _, bad := range []int{-1, 1024} {
		if _, err := NewIDs(bad, time.Now); err == nil {
			t.Fatalf("machine id %d accepted", bad)
		}
	}
	if _, err := ParseStyle("gen_first"); err == nil {
		t.Fatal("unknown style accepted")
	}
	if s, _ := ParseStyle("generation_first"); s != GenerationFirst {
		t.Fatal("generation_first")
	}
}

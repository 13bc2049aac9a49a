package vllm

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"pdlb/engines"
)

func TestPDBodies(t *testing.T) {
	var p PD
	x := &engines.Exchange{RequestID: "r1", Chat: true}
	f := func(in, want string) {
		t.Helper()
		got, err := p.PrefillBody(nil, []byte(in), x)
		if err != nil || string(got) != want {
			t.Fatalf("PrefillBody(%s)\n got %s %v\nwant %s", in, got, err, want)
		}
	}
	kv := `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	f(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"temperature":0.7}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":1,"temperature":0.7,"kv_transfer_params":`+kv+`}`)
	f(`{"model":"m","prompt":"x","max_completion_tokens":9,"min_tokens":4}`,
		`{"model":"m","prompt":"x","max_completion_tokens":1,"kv_transfer_params":`+kv+`,"stream":false,"max_tokens":1}`)
	// A Messages request's enabled thinking goes (newer vLLM refuses a
	// budget not under max_tokens); disabled, which shapes the prompt,
	// and adaptive stay.
	f(`{"model":"m","max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[]}`,
		`{"model":"m","max_tokens":1,"messages":[],"kv_transfer_params":`+kv+`,"stream":false}`)
	f(`{"model":"m","max_tokens":4096,"thinking":{"type":"disabled"},"messages":[]}`,
		`{"model":"m","max_tokens":1,"thinking":{"type":"disabled"},"messages":[],"kv_transfer_params":`+kv+`,"stream":false}`)
	f(`{"model":"m","max_tokens":4096,"thinking":{"type":"adaptive"},"messages":[]}`,
		`{"model":"m","max_tokens":1,"thinking":{"type":"adaptive"},"messages":[],"kv_transfer_params":`+kv+`,"stream":false}`)

	resp := []byte(`{"id":"c1","choices":[{"text":"a"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600}}`)
	orig := `{"model":"m","prompt":"x","stream":true,"max_tokens":64}`
	got, err := p.DecodeBody(nil, []byte(orig), resp, x)
	want := `{"model":"m","prompt":"x","stream":true,"max_tokens":64,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600}}`
	if err != nil || string(got) != want {
		t.Fatalf("DecodeBody\n got %s %v\nwant %s", got, err, want)
	}
	// A prefill whose token stopped it hands no KV over: the decode pod
	// gets the client's body, any kv_transfer_params of its dropped.
	got, err = p.DecodeBody(nil, []byte(`{"model":"m","prompt":"x","kv_transfer_params":{"a":1},"max_tokens":64}`), []byte(`{"choices":[{"text":""}],"kv_transfer_params": null}`), x)
	if want := `{"model":"m","prompt":"x","max_tokens":64}`; err != nil || string(got) != want {
		t.Fatalf("DecodeBody after a stopped prefill\n got %s %v\nwant %s", got, err, want)
	}
	for _, bad := range []string{`{"choices":[]}`, `{"kv_transfer_params":[]}`, `oops`} {
		if _, err := p.DecodeBody(nil, []byte(orig), []byte(bad), x); !errors.Is(err, engines.ErrPrefillResponse) {
			t.Fatalf("DecodeBody(prefill %s) err = %v", bad, err)
		}
	}
	if path, body := p.Abort(nil, x); path != "" || body != nil || p.Concurrent() || p.PrefillAnswers(resp) {
		t.Fatal("vLLM aborts by closing and runs the legs in order")
	}
}

// FuzzPrefillBody checks that the prefill rewrite of any JSON object is
// valid JSON in which every client field but the rewritten ones is
// unchanged and the rewritten ones hold the prefill values.
func FuzzPrefillBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":"a\"}","max_tokens":3,"max_completion_tokens":2,"min_tokens":1,"stream":true,"stream":false}`,
		"{ \"a\" : [ 1 , 2 ] ,\n\"kv_transfer_params\":{}}",
		`{}`, `[]`, `{"\u006dax_tokens":5}`,
	} {
		f.Add([]byte(s))
	}
	var p PD
	rewritten := map[string]bool{"kv_transfer_params": true, "stream": true, "max_tokens": true,
		"max_completion_tokens": true, "stream_options": true, "min_tokens": true}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil {
			return
		}
		out, err := p.PrefillBody(nil, body, &engines.Exchange{})
		if err != nil {
			// sonic and encoding/json disagree only on what they
			// reject; a body one accepts and the other not is skipped.
			return
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("output is not JSON: %v\n in %s\nout %s", err, body, out)
		}
		for k, v := range in {
			if rewritten[k] {
				continue
			}
			if !reflect.DeepEqual([]byte(got[k]), []byte(v)) {
				t.Fatalf("field %q changed: %s → %s", k, v, got[k])
			}
		}
		if string(got["stream"]) != "false" || string(got["max_tokens"]) != "1" || got["stream_options"] != nil || got["min_tokens"] != nil {
			t.Fatalf("prefill fields wrong: %s", out)
		}
		if _, ok := in["max_completion_tokens"]; ok != (got["max_completion_tokens"] != nil) {
			t.Fatalf("max_completion_tokens presence changed: %s", out)
		}
		var kv map[string]any
		if json.Unmarshal(got["kv_transfer_params"], &kv) != nil || kv["do_remote_decode"] != true {
			t.Fatalf("kv_transfer_params wrong: %s", out)
		}
	})
}

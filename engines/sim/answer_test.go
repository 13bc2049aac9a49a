package sim

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"pdlb/engines"
)

// keysOf is the sorted keys of a JSON object, joined by spaces.
func keysOf(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return strings.Join(slices.Sorted(maps.Keys(m)), " ")
}

// TestAnswerFields: a whole answer has the fields of its engine's
// response model, as the engine dumps it. vLLM dumps every field of its
// models, nulls included. SGLang's CompletionResponse and
// ChatCompletionResponse (sglang/srt/entrypoints/openai/protocol.py) carry
// metadata (the weight version) and, in each choice, matched_stop, and
// drop hidden_states, token_ids, prompt_token_ids, meta_info and sglext
// when unset; its UsageInfo has reasoning_tokens and no vLLM field.
func TestAnswerFields(t *testing.T) {
	type shape struct{ body, choice, message, usage string }
	for _, tc := range []struct {
		engine engines.Kind
		chat   bool
		want   shape
	}{
		{engine: engines.VLLM, want: shape{
			body:   "choices created id kv_transfer_params model object service_tier system_fingerprint usage",
			choice: "finish_reason index logprobs prompt_logprobs stop_reason text",
			usage:  "completion_tokens prompt_tokens prompt_tokens_details total_tokens",
		}},
		{engine: engines.VLLM, chat: true, want: shape{
			body:    "choices created id kv_transfer_params model object prompt_logprobs service_tier system_fingerprint usage",
			choice:  "finish_reason index logprobs message stop_reason",
			message: "annotations audio content function_call reasoning_content refusal role tool_calls",
			usage:   "completion_tokens prompt_tokens prompt_tokens_details total_tokens",
		}},
		{engine: engines.SGLang, want: shape{
			body:   "choices created id metadata model object usage",
			choice: "finish_reason index logprobs matched_stop text",
			usage:  "completion_tokens prompt_tokens prompt_tokens_details reasoning_tokens total_tokens",
		}},
		{engine: engines.SGLang, chat: true, want: shape{
			body:    "choices created id metadata model object usage",
			choice:  "finish_reason index logprobs matched_stop message",
			message: "content reasoning_content role tool_calls",
			usage:   "completion_tokens prompt_tokens prompt_tokens_details reasoning_tokens total_tokens",
		}},
	} {
		p := testPod(t, Config{Model: "m", Engine: tc.engine, Speedup: 1000, DefaultMaxTokens: 4})
		path, body := "/v1/completions", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 3}
		if tc.chat {
			path, body = "/v1/chat/completions", chatBody("hello", map[string]any{"model": "m", "max_tokens": 3})
		}
		status, b := post(t, testClient(t), "http://"+p.Addr()+path, body)
		var r struct {
			Choices []json.RawMessage
			Usage   json.RawMessage
		}
		if err := json.Unmarshal(b, &r); status != 200 || err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s %s: %d %s", tc.engine, path, status, b)
		}
		got := shape{body: keysOf(t, b), choice: keysOf(t, r.Choices[0]), usage: keysOf(t, r.Usage)}
		if tc.chat {
			var c struct{ Message json.RawMessage }
			if err := json.Unmarshal(r.Choices[0], &c); err != nil {
				t.Fatal(err)
			}
			got.message = keysOf(t, c.Message)
		}
		if got != tc.want {
			t.Errorf("%s %s: fields\n%+v, want\n%+v\nbody %s", tc.engine, path, got, tc.want, b)
		}
	}
}

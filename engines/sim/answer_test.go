package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
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
// TensorRT-LLM dumps every field of its models
// (tensorrt_llm/serve/openai_protocol.py, JSONResponse(content=
// response.model_dump()) in openai_server.py): its chat message has
// reasoning and tool_calls [], its choices stop_reason,
// disaggregated_params and avg_decoded_tokens_per_iter, its usage
// prompt_tokens_details, its body prompt_token_ids.
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
		{engine: engines.TRTLLM, want: shape{
			body:   "choices created id model object prompt_token_ids usage",
			choice: "avg_decoded_tokens_per_iter context_logits disaggregated_params finish_reason index logprobs stop_reason text token_ids",
			usage:  "completion_tokens prompt_tokens prompt_tokens_details total_tokens",
		}},
		{engine: engines.TRTLLM, chat: true, want: shape{
			body:    "choices created id model object prompt_token_ids prompt_token_ids_b64 usage",
			choice:  "avg_decoded_tokens_per_iter disaggregated_params finish_reason index logprobs message mm_embedding_handle stop_reason",
			message: "content reasoning reasoning_content role tool_calls",
			usage:   "completion_tokens prompt_tokens prompt_tokens_details total_tokens",
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

// TestEcho: vLLM's completion echo puts the prompt's text before the
// answer's, in the whole body and in a stream's first delta of each
// choice; with max_tokens 0 (lm-eval's loglikelihood requests) it
// generates one token (CompletionRequest.to_sampling_params), which usage
// counts, and answers the prompt alone. Without echo, 0 is refused. The
// sim cannot detokenize a prompt of ids, and says so.
func TestEcho(t *testing.T) {
	p := testPod(t, Config{Model: "m", Engine: engines.VLLM, Speedup: 1000, DefaultMaxTokens: 40})
	url := "http://" + p.Addr() + "/v1/completions"
	const prompt = "hello \"echo\"\nworld" // escaped in JSON
	for _, tc := range []struct {
		body   map[string]any
		tokens int  // completion tokens counted
		only   bool // the prompt's text alone
	}{
		{body: map[string]any{"echo": true, "max_tokens": 0, "logprobs": 1}, tokens: 1, only: true},
		{body: map[string]any{"echo": true, "max_tokens": 3}, tokens: 3},
		{body: map[string]any{"echo": true, "max_tokens": 2, "n": 2}, tokens: 4},
	} {
		body := map[string]any{"model": "m", "prompt": prompt}
		maps.Copy(body, tc.body)
		status, b := post(t, testClient(t), url, body)
		var r struct {
			Choices []struct {
				Text         string
				FinishReason string `json:"finish_reason"`
			}
			Usage usageJSON
		}
		if err := json.Unmarshal(b, &r); status != 200 || err != nil || len(r.Choices) == 0 {
			t.Fatalf("%v: %d %s", tc.body, status, b)
		}
		for _, c := range r.Choices {
			if !strings.HasPrefix(c.Text, prompt) || (c.Text == prompt) != tc.only || c.FinishReason != "length" {
				t.Errorf("%v: text %q, finish %q; want the prompt %q (alone: %v), length", tc.body, c.Text, c.FinishReason, prompt, tc.only)
			}
		}
		if r.Usage.CompletionTokens != tc.tokens {
			t.Errorf("%v: %d completion tokens, want %d", tc.body, r.Usage.CompletionTokens, tc.tokens)
		}
		body["stream"] = true
		_, events := stream(t, testClient(t), t.Context(), url, body)
		streamed := make([]string, len(r.Choices))
		for _, c := range parseChunks(t, events) {
			for _, ch := range c.Choices {
				if ch.Index >= len(streamed) || ch.Text == nil {
					t.Fatalf("%v streamed: choice %d, text %v", tc.body, ch.Index, ch.Text)
				}
				streamed[ch.Index] += *ch.Text
			}
		}
		for i, text := range streamed {
			if !strings.HasPrefix(text, prompt) || (text == prompt) != tc.only {
				t.Errorf("%v streamed: choice %d's text %q, want the prompt %q first (alone: %v)", tc.body, i, text, prompt, tc.only)
			}
		}
	}
	status, b := post(t, testClient(t), url, map[string]any{"model": "m", "prompt": prompt, "max_tokens": 0})
	if status != 400 || !strings.Contains(string(b), "max_tokens must be at least 1, got 0.") {
		t.Errorf("max_tokens 0 without echo: %d %s, want a 400", status, b)
	}
	status, b = post(t, testClient(t), url, map[string]any{"model": "m", "prompt": []int{1, 2, 3}, "echo": true})
	if status != 400 || !strings.Contains(string(b), "the sim echoes string prompts only") {
		t.Errorf("echo of token ids: %d %s, want the sim's 400", status, b)
	}
}

// TestTRTNonPositiveMaxTokens: trtllm-serve's request models take any
// int for max_tokens, which only its executor's worker checks
// (_deduce_max_tokens, in tensorrt_llm/executor/base_worker.py); the
// server answers the error's text as a 400 BadRequestError
// (create_error_response). null is absent: the context's rest.
func TestTRTNonPositiveMaxTokens(t *testing.T) {
	p := testPod(t, Config{Model: "m", Engine: engines.TRTLLM, Speedup: 1000, DefaultMaxTokens: 40})
	for _, tc := range []struct {
		chat   bool
		budget map[string]any
		tokens int // when served
	}{
		{budget: map[string]any{"max_tokens": 0}},
		{budget: map[string]any{"max_tokens": -3}},
		{budget: map[string]any{"max_tokens": nil}, tokens: 40},
		{chat: true, budget: map[string]any{"max_tokens": 0}},
		{chat: true, budget: map[string]any{"max_completion_tokens": -1}},
		{chat: true, budget: map[string]any{"max_tokens": nil}, tokens: 40},
	} {
		path, body := "/v1/completions", map[string]any{"model": "m", "prompt": "hello"}
		maps.Copy(body, tc.budget)
		if tc.chat {
			path, body = "/v1/chat/completions", chatBody("hello", map[string]any{"model": "m"})
			maps.Copy(body, tc.budget)
		}
		status, b := post(t, testClient(t), "http://"+p.Addr()+path, body)
		if tc.tokens > 0 {
			var r struct{ Usage usageJSON }
			if err := json.Unmarshal(b, &r); status != 200 || err != nil || r.Usage.CompletionTokens != tc.tokens {
				t.Errorf("%s %v: %d %s, want %d tokens", path, tc.budget, status, b, tc.tokens)
			}
			continue
		}
		var e struct {
			Object, Message, Type string
			Param                 *string
			Code                  int
		}
		want := fmt.Sprintf("`max_tokens` (%v) must be greater than 0", cmp.Or(tc.budget["max_tokens"], tc.budget["max_completion_tokens"]))
		if err := json.Unmarshal(b, &e); status != 400 || err != nil || e.Object != "error" || e.Type != "BadRequestError" || e.Param != nil || e.Code != 400 ||
			e.Message != want {
			t.Errorf("%s %v: %d %s, want TensorRT-LLM's 400 saying %q", path, tc.budget, status, b, want)
		}
	}
}

// TestTRTBudgetOverContext: TensorRT-LLM's worker (_deduce_max_tokens)
// holds a max_tokens above what the context leaves to that rest, with a
// warning, where vLLM and SGLang refuse it; a prompt that leaves no room
// it refuses, budget or none.
func TestTRTBudgetOverContext(t *testing.T) {
	const limit = 64
	p := testPod(t, Config{Model: "m", Engine: engines.TRTLLM, Speedup: 1000, DefaultMaxTokens: 40, MaxModelLen: limit})
	url := "http://" + p.Addr() + "/v1/completions"
	status, b := post(t, testClient(t), url, map[string]any{"model": "m", "prompt": tokenRange(1000, 56), "max_tokens": 20})
	var r struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		}
		Usage usageJSON
	}
	if err := json.Unmarshal(b, &r); status != 200 || err != nil || len(r.Choices) != 1 || r.Usage.CompletionTokens != limit-56 || r.Choices[0].FinishReason != "length" {
		t.Errorf("56 tokens and max_tokens 20: %d %s, want %d tokens, length", status, b, limit-56)
	}
	for _, body := range []map[string]any{
		{"model": "m", "prompt": tokenRange(1000, limit), "max_tokens": 5},
		{"model": "m", "prompt": tokenRange(1000, limit+2)},
	} {
		n := len(body["prompt"].([]uint32))
		want := fmt.Sprintf("`default_max_tokens` (%d) must be greater than 0, `default_max_tokens` (%[1]d) = max_seq_len (%d) - `splited_prompt_len` (%d) - `query_token_len` (0)", limit-n, limit, n)
		status, b := post(t, testClient(t), url, body)
		var e struct{ Message, Type string }
		if err := json.Unmarshal(b, &e); status != 400 || err != nil || e.Type != "BadRequestError" || e.Message != want {
			t.Errorf("%d prompt tokens: %d %s, want a 400 saying %q", n, status, b, want)
		}
	}
}

// chunkFields is one stream chunk's field sets: the body's, its first
// choice's, that choice's delta's and its usage's ("null" when the chunk
// says usage null, "-" for none), and the choice's finish reason when
// it has one.
func chunkFields(t *testing.T, data []byte) string {
	t.Helper()
	var c struct {
		Choices []json.RawMessage
		Usage   json.RawMessage
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("chunk %s: %v", data, err)
	}
	parts := []string{keysOf(t, data), "-", "-", "-"}
	if len(c.Choices) > 0 {
		parts[1] = keysOf(t, c.Choices[0])
		var ch struct {
			Delta        json.RawMessage
			FinishReason *string `json:"finish_reason"`
		}
		if err := json.Unmarshal(c.Choices[0], &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Delta != nil {
			parts[2] = keysOf(t, ch.Delta)
		}
		if ch.FinishReason != nil {
			parts = append(parts, *ch.FinishReason)
		}
	}
	switch {
	case string(c.Usage) == "null":
		parts[3] = "null"
	case c.Usage != nil:
		parts[3] = keysOf(t, c.Usage)
	}
	return strings.Join(parts, " | ")
}

// TestStreamFields: a stream's chunks have the fields of their engine's
// chunk models, as the engine dumps them, and end with [DONE]. vLLM dumps
// with exclude_unset: a chat's finish rides on its last delta with
// stop_reason, and usage only where sent. SGLang's chat chunks
// (build_sse_content, sglang/srt/entrypoints/openai/sse_utils.py) omit
// an unset usage, always carry the delta's reasoning_content and the
// choice's matched_stop, and the finish comes in a chunk of its own once
// every choice ended (serving_chat.py); its usage chunk dumps every
// UsageInfo field. Its completion chunks dump everything, "usage": null
// included, and its usage chunk drops nulls (serving_completions.py).
// TensorRT-LLM dumps its chat chunks with exclude_none (no logprobs, no
// unset finish_reason or stop_reason; an empty reasoning_content) and
// writes each role chunk as "data: {...} \n\n", its completion chunks
// and usage chunks whole (postprocess_handlers.py).
// continuous_usage_stats puts usage in each content chunk. The pod may
// send several tokens in one chunk, so runs of like chunks count as one
// and a line marked "?" (an unfinished choice's delta, where the last
// carries the finish) may be missing.
func TestStreamFields(t *testing.T) {
	const (
		body     = "choices created id model object"
		bodyU    = body + " usage"
		vllmU    = "completion_tokens prompt_tokens total_tokens"
		sglangU  = "completion_tokens prompt_tokens prompt_tokens_details reasoning_tokens total_tokens"
		sglangCU = "completion_tokens prompt_tokens reasoning_tokens total_tokens"
		trtU     = "completion_tokens prompt_tokens prompt_tokens_details total_tokens"
	)
	for _, tc := range []struct {
		engine     engines.Kind
		chat       bool
		continuous bool
		want       []string
	}{
		{engine: engines.VLLM, chat: true, want: []string{
			body + " | delta finish_reason index logprobs | content role | -",
			"?" + body + " | delta finish_reason index logprobs | content | -",
			body + " | delta finish_reason index logprobs stop_reason | content | - | length",
			bodyU + " | - | - | " + vllmU,
		}},
		{engine: engines.VLLM, chat: true, continuous: true, want: []string{
			bodyU + " | delta finish_reason index logprobs | content role | " + vllmU,
			"?" + bodyU + " | delta finish_reason index logprobs | content | " + vllmU,
			bodyU + " | delta finish_reason index logprobs stop_reason | content | " + vllmU + " | length",
			bodyU + " | - | - | " + vllmU,
		}},
		{engine: engines.VLLM, want: []string{
			"?" + body + " | finish_reason index logprobs stop_reason text | - | -",
			body + " | finish_reason index logprobs stop_reason text | - | - | length",
			bodyU + " | - | - | " + vllmU,
		}},
		{engine: engines.SGLang, chat: true, want: []string{
			body + " | delta finish_reason index logprobs matched_stop | content reasoning_content role | -",
			body + " | delta finish_reason index logprobs matched_stop | content reasoning_content | -",
			body + " | delta finish_reason index logprobs matched_stop | reasoning_content | - | length",
			bodyU + " | - | - | " + sglangU,
		}},
		{engine: engines.SGLang, chat: true, continuous: true, want: []string{
			body + " | delta finish_reason index logprobs matched_stop | content reasoning_content role | -",
			bodyU + " | delta finish_reason index logprobs matched_stop | content reasoning_content | " + sglangU,
			body + " | delta finish_reason index logprobs matched_stop | reasoning_content | - | length",
			bodyU + " | - | - | " + sglangU,
		}},
		{engine: engines.SGLang, want: []string{
			"?" + bodyU + " | finish_reason index logprobs matched_stop text | - | null",
			bodyU + " | finish_reason index logprobs matched_stop text | - | null | length",
			bodyU + " | - | - | " + sglangCU,
		}},
		{engine: engines.SGLang, continuous: true, want: []string{
			"?" + bodyU + " | finish_reason index logprobs matched_stop text | - | " + sglangU,
			bodyU + " | finish_reason index logprobs matched_stop text | - | " + sglangU + " | length",
			bodyU + " | - | - | " + sglangCU,
		}},
		{engine: engines.TRTLLM, chat: true, want: []string{
			body + " | delta index | role | -",
			"?" + body + " | avg_decoded_tokens_per_iter delta index | content reasoning_content | -",
			body + " | avg_decoded_tokens_per_iter delta finish_reason index | content reasoning_content | - | length",
			bodyU + " | - | - | " + trtU,
		}},
		{engine: engines.TRTLLM, chat: true, continuous: true, want: []string{
			bodyU + " | delta index | role | " + trtU,
			"?" + bodyU + " | avg_decoded_tokens_per_iter delta index | content reasoning_content | " + trtU,
			bodyU + " | avg_decoded_tokens_per_iter delta finish_reason index | content reasoning_content | " + trtU + " | length",
			bodyU + " | - | - | " + trtU,
		}},
		{engine: engines.TRTLLM, want: []string{
			"?" + bodyU + " | avg_decoded_tokens_per_iter finish_reason index logprobs stop_reason text token_ids | - | null",
			bodyU + " | avg_decoded_tokens_per_iter finish_reason index logprobs stop_reason text token_ids | - | null | length",
			bodyU + " | - | - | " + trtU,
		}},
		{engine: engines.TRTLLM, continuous: true, want: []string{
			"?" + bodyU + " | avg_decoded_tokens_per_iter finish_reason index logprobs stop_reason text token_ids | - | " + trtU,
			bodyU + " | avg_decoded_tokens_per_iter finish_reason index logprobs stop_reason text token_ids | - | " + trtU + " | length",
			bodyU + " | - | - | " + trtU,
		}},
	} {
		p := testPod(t, Config{Model: "m", Engine: tc.engine, Speedup: 1000})
		opts := map[string]any{"include_usage": true, "continuous_usage_stats": tc.continuous}
		path, req := "/v1/completions", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 3, "stream": true, "stream_options": opts}
		if tc.chat {
			path, req = "/v1/chat/completions", chatBody("hello", map[string]any{"model": "m", "max_tokens": 3, "stream": true, "stream_options": opts})
		}
		_, events := stream(t, testClient(t), t.Context(), "http://"+p.Addr()+path, req)
		parseChunks(t, events) // ends with [DONE]
		if role := events[0].data; tc.engine == engines.TRTLLM && tc.chat && !strings.HasSuffix(string(role), "} ") {
			t.Errorf("TensorRT-LLM's role chunk %q, want a space after it", role)
		}
		var got []string
		for _, e := range events[:len(events)-1] {
			got = append(got, chunkFields(t, e.data))
		}
		got = slices.Compact(got)
		var want []string
		for _, l := range tc.want {
			if opt, ok := strings.CutPrefix(l, "?"); !ok {
				want = append(want, l)
			} else if slices.Contains(got, opt) {
				want = append(want, opt)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s %s continuous %v: chunks\n%s\nwant\n%s", tc.engine, path, tc.continuous, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

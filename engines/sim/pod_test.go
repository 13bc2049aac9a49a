package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/tokenize"
)

// fast is a speedup at which the tests' requests take milliseconds.
const fast = 1000

// chatTokens renders one user message as the gateway does.
func chatTokens(content string) []uint32 {
	text := tokenize.AppendTurn(nil, []byte("user"), []byte(content))
	text = append(text, tokenize.GenerationPrompt...)
	return tokenize.Append(nil, text)
}

func TestChatNonStreaming(t *testing.T) {
	p := testPod(t, Config{Model: "m1", Speedup: fast, Seed: 7})
	c := testClient(t)
	status, body := post(t, c, "http://"+p.Addr()+"/v1/chat/completions", chatBody("hello there", map[string]any{"model": "m1", "max_tokens": 9}))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var resp struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
			StopReason   any    `json:"stop_reason"`
		} `json:"choices"`
		Usage usageJSON `json:"usage"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	prompt := chatTokens("hello there")
	want := string(newTextStream(7, prompt).appendText(nil, 0, 9))
	switch {
	case !strings.HasPrefix(resp.ID, "chatcmpl-"), resp.Object != "chat.completion", resp.Model != "m1",
		resp.Created < time.Now().Add(-time.Minute).Unix(), len(resp.Choices) != 1:
		t.Fatalf("envelope: %s", body)
	case resp.Choices[0].Message.Role != "assistant", resp.Choices[0].Message.Content != want,
		resp.Choices[0].FinishReason != "length", resp.Choices[0].StopReason != nil:
		t.Fatalf("choice: %s, want content %q", body, want)
	case resp.Usage != usageJSON{PromptTokens: len(prompt), CompletionTokens: 9, TotalTokens: len(prompt) + 9}:
		t.Fatalf("usage %+v, prompt has %d tokens", resp.Usage, len(prompt))
	}
}

func TestCompletionsNonStreaming(t *testing.T) {
	p := testPod(t, Config{Speedup: fast, DefaultMaxTokens: 5})
	c := testClient(t)
	url := "http://" + p.Addr() + "/v1/completions"
	prompt := "The quick brown fox jumps"
	ids := tokenize.Append(nil, []byte(prompt))
	texts := map[string]string{}
	for name, pr := range map[string]any{"string": prompt, "ids": ids, "list": []string{prompt}} {
		status, body := post(t, c, url, map[string]any{"prompt": pr})
		if status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", name, status, body)
		}
		var resp struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage usageJSON `json:"usage"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(resp.ID, "cmpl-") || resp.Object != "text_completion" || len(resp.Choices) != 1 ||
			resp.Choices[0].FinishReason != "stop" || resp.Usage.PromptTokens != len(ids) || resp.Usage.CompletionTokens != 5 {
			t.Fatalf("%s: %s", name, body)
		}
		texts[name] = resp.Choices[0].Text
	}
	if texts["string"] != texts["ids"] || texts["string"] != texts["list"] || len(texts["string"]) != 5*4 {
		t.Fatalf("one prompt, three spellings, different answers: %q", texts)
	}
}

func TestStreamingChunks(t *testing.T) {
	p := testPod(t, Config{Speedup: fast, Seed: 3})
	c := testClient(t)
	base := "http://" + p.Addr()
	f := func(path string, body map[string]any, chat, usage bool) {
		t.Helper()
		resp, events := stream(t, c, context.Background(), base+path, body)
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("%s: Content-Type %q", path, ct)
		}
		chunks := parseChunks(t, events)
		wantObject, prefix := "text_completion", "cmpl-"
		if chat {
			wantObject, prefix = "chat.completion.chunk", "chatcmpl-"
		}
		for i, ch := range chunks {
			if !strings.HasPrefix(ch.ID, prefix) || ch.ID != chunks[0].ID || ch.Object != wantObject || ch.Model != DefaultModel || ch.Created == 0 {
				t.Fatalf("%s: chunk %d envelope: %s", path, i, events[i].data)
			}
		}
		last := chunks[len(chunks)-1]
		if usage {
			if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 12 ||
				last.Usage.TotalTokens != last.Usage.PromptTokens+12 {
				t.Fatalf("%s: usage chunk %s", path, events[len(chunks)-1].data)
			}
			chunks = chunks[:len(chunks)-1]
		}
		for i, ch := range chunks {
			if ch.Usage != nil || len(ch.Choices) != 1 || ch.Choices[0].Index != 0 {
				t.Fatalf("%s: chunk %d: %s", path, i, events[i].data)
			}
			done := ch.Choices[0].FinishReason != nil
			if done != (i == len(chunks)-1) {
				t.Fatalf("%s: finish_reason on chunk %d of %d: %s", path, i, len(chunks), events[i].data)
			}
		}
		if chat {
			d := chunks[0].Choices[0].Delta
			if d == nil || d.Role == nil || *d.Role != "assistant" || d.Content == nil || *d.Content != "" {
				t.Fatalf("first chat chunk is not the role chunk: %s", events[0].data)
			}
		}
		text, finish := streamedText(chunks)
		if finish != "length" || len(text) != 12*4 {
			t.Fatalf("%s: text %q finish %q", path, text, finish)
		}
	}
	f("/v1/chat/completions", chatBody("stream me", map[string]any{"stream": true, "max_tokens": 12}), true, false)
	f("/v1/chat/completions", chatBody("stream me", map[string]any{"stream": true, "max_completion_tokens": 12,
		"stream_options": map[string]any{"include_usage": true}}), true, true)
	// vLLM's include_usage defaults to true once stream_options is given.
	f("/v1/completions", map[string]any{"prompt": "stream me", "stream": true, "max_tokens": 12,
		"stream_options": map[string]any{}}, false, true)
	f("/v1/completions", map[string]any{"prompt": "stream me", "stream": true, "max_tokens": 12}, false, false)
	// max_completion_tokens is chat's: a completion request ignores it.
	f("/v1/completions", map[string]any{"prompt": "stream me", "stream": true, "max_tokens": 12, "max_completion_tokens": 3}, false, false)

	// Streamed and whole answers agree.
	_, body := post(t, c, base+"/v1/chat/completions", chatBody("stream me", map[string]any{"max_tokens": 12}))
	_, events := stream(t, c, context.Background(), base+"/v1/chat/completions", chatBody("stream me", map[string]any{"stream": true, "max_tokens": 12}))
	text, _ := streamedText(parseChunks(t, events))
	if !strings.Contains(string(body), `"content":"`+text+`"`) {
		t.Fatalf("streamed %q, whole %s", text, body)
	}
}

// TestIncludeUsageDefaultPerEngine: stream_options without include_usage
// streams usage on vLLM and TensorRT-LLM (StreamOptions.include_usage
// defaults to True in their openai protocol.py), not on SGLang (False);
// an explicit null streams none on any engine.
func TestIncludeUsageDefaultPerEngine(t *testing.T) {
	for _, tc := range []struct {
		engine engines.Kind
		usage  bool
	}{{engines.VLLM, true}, {engines.SGLang, false}, {engines.TRTLLM, true}} {
		p := testPod(t, Config{Speedup: fast, Engine: tc.engine})
		_, events := stream(t, testClient(t), context.Background(), "http://"+p.Addr()+"/v1/completions",
			map[string]any{"prompt": "stream me", "stream": true, "max_tokens": 3, "stream_options": map[string]any{}})
		chunks := parseChunks(t, events)
		if got := chunks[len(chunks)-1].Usage != nil; got != tc.usage {
			t.Errorf("%s: usage chunk %v, want %v: %s", tc.engine, got, tc.usage, events[len(chunks)-1].data)
		}
		// An explicit null is None, which every engine's check reads as
		// false (vLLM's should_include_usage: `include_usage or ...`).
		_, events = stream(t, testClient(t), context.Background(), "http://"+p.Addr()+"/v1/completions",
			map[string]any{"prompt": "stream me", "stream": true, "max_tokens": 3, "stream_options": map[string]any{"include_usage": nil}})
		chunks = parseChunks(t, events)
		if chunks[len(chunks)-1].Usage != nil {
			t.Errorf("%s: include_usage null streamed a usage chunk: %s", tc.engine, events[len(chunks)-1].data)
		}
	}
}

// TestLaxFields: the pod reads its int and bool request fields as the
// engines' pydantic v2 lax mode does ("8", 8.0 and true for an int;
// "yes", "on", 1 for a bool), as the gateway passes them on, and refuses
// what pydantic refuses.
func TestLaxFields(t *testing.T) {
	p := testPod(t, Config{Speedup: fast})
	c := testClient(t)
	base := "http://" + p.Addr()

	_, events := stream(t, c, context.Background(), base+"/v1/chat/completions", map[string]any{
		"messages": []map[string]any{{"role": "user", "content": "hi"}}, "stream": "yes",
		"max_tokens": "8", "min_tokens": 2.0, "add_generation_prompt": "True", "add_special_tokens": 0,
		"stream_options": map[string]any{"include_usage": "on", "continuous_usage_stats": 1.0},
	})
	chunks := parseChunks(t, events)
	if _, finish := streamedText(chunks); finish != "length" {
		t.Errorf("stream finished with %q, want length", finish)
	}
	for _, ch := range chunks {
		if ch.Usage == nil {
			t.Fatalf("chunk without usage, though continuous_usage_stats is 1.0: %+v", ch)
		}
	}
	if u := chunks[len(chunks)-1].Usage; len(chunks[len(chunks)-1].Choices) != 0 || u.CompletionTokens != 8 {
		t.Errorf("last chunk %+v, want the usage chunk of 8 tokens", chunks[len(chunks)-1])
	}

	status, out := post(t, c, base+"/v1/completions", map[string]any{
		"prompt": "tell me a long story", "stream": "off", "max_tokens": 5.0, "max_completion_tokens": nil,
		"truncate_prompt_tokens": " 2 ", "add_special_tokens": "1",
	})
	var resp struct{ Usage usageJSON }
	if err := json.Unmarshal(out, &resp); status != http.StatusOK || err != nil ||
		resp.Usage.PromptTokens != 2 || resp.Usage.CompletionTokens != 5 {
		t.Errorf("lax completion: %d %s, want 200 with 2 prompt and 5 completion tokens", status, out)
	}

	for _, bad := range []map[string]any{{"max_tokens": "8.5"}, {"max_tokens": 8.5}, {"stream": "maybe"}, {"stream": 2}, {"stream": " true"}} {
		bad["prompt"] = "hi"
		if status, out := post(t, c, base+"/v1/completions", bad); status != http.StatusBadRequest {
			t.Errorf("%v: %d %s, want 400", bad, status, out)
		}
	}
}

func TestIncrementalStreaming(t *testing.T) {
	// 80 tokens at batch 1: 80 × 10.2 ms simulated, about 160 ms of wall
	// time at speedup 5, against a first token after a 0.5 ms prefill.
	p := testPod(t, Config{Speedup: 5})
	c := testClient(t)
	_, events := stream(t, c, context.Background(), "http://"+p.Addr()+"/v1/completions",
		map[string]any{"prompt": "tell me a long story", "stream": true, "max_tokens": 80})
	chunks := parseChunks(t, events)
	if len(chunks) < 10 {
		t.Fatalf("80 tokens came in %d chunks", len(chunks))
	}
	first, last := events[0].at, events[len(events)-2].at
	if last < 100*time.Millisecond || first > last/4 {
		t.Fatalf("first chunk after %v, last after %v: not incremental", first, last)
	}
}

func TestErrors(t *testing.T) {
	p := testPod(t, Config{Model: "m1", Speedup: fast, MaxModelLen: 100})
	c := testClient(t)
	base := "http://" + p.Addr()
	f := func(path string, body any, wantStatus int, wantType, wantIn string) {
		t.Helper()
		var status int
		var out []byte
		if s, ok := body.(string); ok {
			resp, err := c.Post(base+path, "application/json", strings.NewReader(s))
			if err != nil {
				t.Fatal(err)
			}
			var e apiError
			_ = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			out, _ = json.Marshal(e)
			status = resp.StatusCode
		} else {
			status, out = post(t, c, base+path, body)
		}
		var e apiError
		if err := json.Unmarshal(out, &e); err != nil || status != wantStatus || e.Error.Code != wantStatus ||
			e.Error.Type != wantType || !strings.Contains(e.Error.Message, wantIn) {
			t.Fatalf("%s %v: status %d body %s; want %d %s containing %q", path, body, status, out, wantStatus, wantType, wantIn)
		}
	}
	f("/v1/chat/completions", chatBody("hi", map[string]any{"model": "other"}), 404, "NotFoundError", "The model `other` does not exist.")
	f("/v1/completions", `{"prompt": "hi",`, 400, "BadRequestError", "invalid JSON")
	f("/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 0}, 400, "BadRequestError", "max_tokens must be at least 1")
	f("/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 100}, 400, "BadRequestError", "maximum context length is 100 tokens")
	f("/v1/completions", map[string]any{"prompt": ""}, 400, "BadRequestError", "empty")
	f("/v1/completions", map[string]any{"prompt": []any{"a", []int{1}}}, 400, "BadRequestError", "a batch is all strings")
	f("/v1/completions", map[string]any{"prompt": []any{}}, 400, "BadRequestError", "must not be empty")
	f("/v1/chat/completions", map[string]any{"messages": []any{}}, 400, "BadRequestError", "messages")

	// A completion's default max_tokens (16) must fit the context as its
	// own would; a chat's output without one is cut to fit, ending as
	// vLLM's max_tokens of the context's rest does.
	f("/v1/completions", map[string]any{"prompt": strings.Repeat("abcd", 90)}, 400, "BadRequestError", "you requested 106 tokens (90 in the messages, 16 in the completion)")
	status, body := post(t, c, base+"/v1/chat/completions", chatBody(strings.Repeat("abcd", 80), nil))
	var r struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(body, &r); status != 200 || err != nil || r.Usage.CompletionTokens != 100-r.Usage.PromptTokens || !strings.Contains(string(body), `"finish_reason":"length"`) {
		t.Fatalf("status %d: %s", status, body)
	}
	if status, _ := get(t, c, base+"/nowhere"); status != 404 {
		t.Fatalf("unknown path: %d", status)
	}
	if status, _ := get(t, c, base+"/v1/completions"); status != 405 {
		t.Fatalf("GET on a POST route: %d", status)
	}
}

func TestHealthModelsVersion(t *testing.T) {
	for _, eng := range engines.Kinds {
		p := testPod(t, Config{Model: "org/model-" + string(eng), Engine: eng, Speedup: fast})
		c := testClient(t)
		base := "http://" + p.Addr()
		if status, body := get(t, c, base+"/health"); status != 200 || len(body) != 0 {
			t.Fatalf("%s /health: %d %q", eng, status, body)
		}
		status, body := get(t, c, base+"/v1/models")
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID          string `json:"id"`
				Object      string `json:"object"`
				OwnedBy     string `json:"owned_by"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &list); err != nil || status != 200 || list.Object != "list" || len(list.Data) != 1 ||
			list.Data[0].ID != "org/model-"+string(eng) || list.Data[0].Object != "model" || list.Data[0].MaxModelLen != DefaultMaxModelLen {
			t.Fatalf("%s /v1/models: %d %s", eng, status, body)
		}
	}
}

func TestTokenizeAgreesWithTokenizer(t *testing.T) {
	p := testPod(t, Config{Speedup: fast})
	c := testClient(t)
	url := "http://" + p.Addr() + "/tokenize"
	type tokenized struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	f := func(body map[string]any, want []uint32) {
		t.Helper()
		status, out := post(t, c, url, body)
		var got tokenized
		if err := json.Unmarshal(out, &got); err != nil || status != 200 {
			t.Fatalf("%d %s", status, out)
		}
		if got.Count != len(want) || got.MaxModelLen != DefaultMaxModelLen || len(got.Tokens) != len(want) {
			t.Fatalf("%v: got %+v, want %d tokens", body, got, len(want))
		}
		for i := range want {
			if got.Tokens[i] != want[i] {
				t.Fatalf("%v: token %d = %d, want %d", body, i, got.Tokens[i], want[i])
			}
		}
	}
	f(map[string]any{"prompt": "Hello, world! 12345"}, tokenize.Append(nil, []byte("Hello, world! 12345")))
	f(chatBody("what is a GPU?", nil), chatTokens("what is a GPU?"))
	parts := tokenize.AppendTurnOpen(nil, []byte("user"))
	parts = append(parts, "part one, \npart two"...) // joined by "\n", as vLLM joins them
	parts = tokenize.AppendTurnClose(parts)
	f(map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{
		{"type": "text", "text": "part one, "}, {"type": "image_url", "image_url": map[string]any{"url": "x"}}, {"type": "text", "text": "part two"},
	}}}, "add_generation_prompt": false}, tokenize.Append(nil, parts))
}

func TestDeterministicText(t *testing.T) {
	a := testPod(t, Config{Name: "a", Speedup: fast, Seed: 11, HashSeed: 1})
	b := testPod(t, Config{Name: "b", Speedup: fast, Seed: 11, HashSeed: 2, Engine: engines.SGLang})
	other := testPod(t, Config{Name: "c", Speedup: fast, Seed: 12})
	c := testClient(t)
	answer := func(p *Pod, prompt string) string {
		t.Helper()
		status, body := post(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 16})
		var resp struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &resp); err != nil || status != 200 || len(resp.Choices) != 1 {
			t.Fatalf("%d %s", status, body)
		}
		return resp.Choices[0].Text
	}
	x, y := answer(a, "same prompt"), answer(b, "same prompt")
	if x != y {
		t.Fatalf("equal seeds, different text: %q vs %q", x, y)
	}
	if x == answer(other, "same prompt") {
		t.Fatal("different seeds, same text")
	}
	if x == answer(a, "another prompt") {
		t.Fatal("different prompts, same text")
	}
}

// TestRefusesAsVLLMSamplingChecks: vLLM answers 400 to stream_options
// without stream (its validate_stream_options, a non-empty object only)
// and to min_tokens above max_tokens (SamplingParams._verify_args), the
// fields engines/vllm's PrefillBody strips for that reason; a sim that
// served them would hide a prefill body that kept them.
func TestRefusesAsVLLMSamplingChecks(t *testing.T) {
	p := testPod(t, Config{Model: "m1", Speedup: fast, MaxModelLen: 100})
	c := testClient(t)
	base := "http://" + p.Addr()
	f := func(body map[string]any, wantStatus int, wantIn string) {
		t.Helper()
		status, out := post(t, c, base+"/v1/chat/completions", chatBody("hi", body))
		if status != wantStatus || !strings.Contains(string(out), wantIn) {
			t.Fatalf("%v: status %d body %s; want %d containing %q", body, status, out, wantStatus, wantIn)
		}
	}
	f(map[string]any{"max_tokens": 1, "stream_options": map[string]any{"include_usage": true}}, 400, "Stream options can only be defined when `stream=True`.")
	f(map[string]any{"stream": false, "max_tokens": 1, "stream_options": map[string]any{"include_usage": false}}, 400, "Stream options")
	f(map[string]any{"max_tokens": 1, "min_tokens": 2}, 400, "min_tokens must be less than or equal to max_tokens=1, got 2.")
	f(map[string]any{"max_tokens": 4, "min_tokens": -1}, 400, "min_tokens must be greater than or equal to 0, got -1.")
	// Without max_tokens the bound is what the context leaves.
	f(map[string]any{"min_tokens": 99}, 400, "min_tokens must be less than or equal to max_tokens=")
	// What vLLM lets through.
	f(map[string]any{"max_tokens": 1, "stream_options": map[string]any{}}, 200, `"finish_reason":"length"`)
	f(map[string]any{"max_tokens": 1, "stream_options": nil}, 200, `"finish_reason":"length"`)
	f(map[string]any{"max_tokens": 2, "min_tokens": 2}, 200, `"completion_tokens":2`)
}

// TestResponseIDIsJSON: the response id echoes the client's request_id,
// which JSON allows to hold any character; the body must stay valid JSON,
// streamed or whole, as vLLM's pydantic dump keeps it.
func TestResponseIDIsJSON(t *testing.T) {
	p := testPod(t, Config{Speedup: fast})
	c := testClient(t)
	const rid = "a\x01b\"é"
	status, body := post(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 2, "request_id": rid})
	var whole struct{ ID string }
	if err := json.Unmarshal(body, &whole); status != 200 || err != nil || whole.ID != "cmpl-"+rid {
		t.Fatalf("status %d, %v: %q", status, err, body)
	}
	_, events := stream(t, c, context.Background(), "http://"+p.Addr()+"/v1/chat/completions",
		chatBody("hi", map[string]any{"stream": true, "max_tokens": 2, "request_id": rid}))
	for _, ch := range parseChunks(t, events) {
		if ch.ID != "chatcmpl-"+rid {
			t.Fatalf("chunk id %q", ch.ID)
		}
	}
}

// TestErrorBodiesByEngine: a whole-body error has the engine's own shape:
// vLLM nests it under "error", SGLang and TensorRT-LLM dump their
// ErrorResponse at the top level with "object": "error".
func TestErrorBodiesByEngine(t *testing.T) {
	type body struct {
		Object  string        `json:"object"`
		Message string        `json:"message"`
		Type    string        `json:"type"`
		Param   *string       `json:"param"`
		Code    int           `json:"code"`
		Error   *apiErrorInfo `json:"error"`
	}
	for _, k := range engines.Kinds {
		p := testPod(t, Config{Model: "m1", Engine: k, Speedup: fast})
		c := testClient(t)
		f := func(path string, req any, wantStatus int, wantParam string) {
			t.Helper()
			status, b := post(t, c, "http://"+p.Addr()+path, req)
			var e body
			if err := json.Unmarshal(b, &e); err != nil || status != wantStatus {
				t.Fatalf("%s %s: %d %s", k, path, status, b)
			}
			if k == engines.VLLM {
				if e.Error == nil || e.Object != "" || e.Error.Code != wantStatus || e.Error.Message == "" || e.Error.Param == nil || *e.Error.Param != wantParam {
					t.Fatalf("%s %s: %s, want vLLM's nested error naming %q", k, path, b, wantParam)
				}
				return
			}
			if e.Error != nil || e.Object != "error" || e.Code != wantStatus || e.Message == "" || e.Type == "" || e.Param == nil || *e.Param != wantParam {
				t.Fatalf("%s %s: %s, want a top-level ErrorResponse naming %q", k, path, b, wantParam)
			}
		}
		f("/v1/completions", map[string]any{"model": "other", "prompt": "hi"}, 404, "model")
		f("/v1/chat/completions", map[string]any{"model": "m1", "messages": []map[string]any{{"role": "user", "content": nil}}}, 400, "messages[0].content")
	}
}

// TestContinuousUsageWithoutIncludeUsage: continuous_usage_stats puts
// usage in every chunk only with include_usage on vLLM and TensorRT-LLM
// (should_include_usage: include_usage and continuous_usage_stats), and
// on its own on SGLang.
func TestContinuousUsageWithoutIncludeUsage(t *testing.T) {
	for _, tc := range []struct {
		engine engines.Kind
		usage  bool
	}{{engines.VLLM, false}, {engines.SGLang, true}, {engines.TRTLLM, false}} {
		p := testPod(t, Config{Speedup: fast, Engine: tc.engine})
		_, events := stream(t, testClient(t), context.Background(), "http://"+p.Addr()+"/v1/completions",
			map[string]any{"prompt": "stream me", "stream": true, "max_tokens": 3,
				"stream_options": map[string]any{"include_usage": false, "continuous_usage_stats": true}})
		for i, ch := range parseChunks(t, events) {
			if got := ch.Usage != nil; got != tc.usage {
				t.Errorf("%s: chunk %d has usage %v, want %v: %s", tc.engine, i, got, tc.usage, events[i].data)
			}
		}
	}
}

// TestCompletionDefaultMaxTokens: a completion without max_tokens stops
// at 16 tokens ("length") on vLLM and SGLang, their CompletionRequest's
// default, and runs to its natural length on TensorRT-LLM (None) and in a
// chat.
func TestCompletionDefaultMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		engine       engines.Kind
		chat, length bool
		want         int
	}{
		{engines.VLLM, false, true, 16},
		{engines.SGLang, false, true, 16},
		{engines.TRTLLM, false, false, 40},
		{engines.VLLM, true, false, 40},
	} {
		p := testPod(t, Config{Model: "m", Engine: tc.engine, Speedup: 1000, DefaultMaxTokens: 40})
		path, body := "/v1/completions", any(map[string]any{"model": "m", "prompt": "hello"})
		if tc.chat {
			path, body = "/v1/chat/completions", chatBody("hello", nil)
		}
		status, b := post(t, testClient(t), "http://"+p.Addr()+path, body)
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			}
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(b, &r); status != 200 || err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s %s: %d %s", tc.engine, path, status, b)
		}
		if r.Usage.CompletionTokens != tc.want || (r.Choices[0].FinishReason == "length") != tc.length {
			t.Errorf("%s %s: %d tokens, finish %q; want %d, length %v", tc.engine, path, r.Usage.CompletionTokens, r.Choices[0].FinishReason, tc.want, tc.length)
		}
	}
}

// TestNullMaxTokens: an explicit null max_tokens (or
// max_completion_tokens) is absent on every engine but a completion on
// SGLang, whose CompletionRequest types it int = 16 and refuses null, as
// it refuses a budget that is not positive in its own words; vLLM's
// normalize_null_max_tokens gives a completion's null its default.
func TestNullMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		engine engines.Kind
		chat   bool
		budget map[string]any
		want   int    // tokens, when served
		refuse string // in the 400's body, when refused
	}{
		{engine: engines.VLLM, budget: map[string]any{"max_tokens": nil}, want: 16},
		{engine: engines.TRTLLM, budget: map[string]any{"max_tokens": nil}, want: 40},
		{engine: engines.SGLang, budget: map[string]any{"max_tokens": nil}, refuse: "max_tokens: Input should be a valid integer"},
		{engine: engines.SGLang, budget: map[string]any{"max_tokens": 0}, refuse: "max_tokens: Value error, max_tokens must be positive"},
		{engine: engines.SGLang, budget: map[string]any{"max_tokens": -3}, refuse: "max_tokens: Value error, max_tokens must be positive"},
		{engine: engines.VLLM, budget: map[string]any{"max_tokens": 0}, refuse: "max_tokens must be at least 1, got 0."},
		{engine: engines.VLLM, chat: true, budget: map[string]any{"max_tokens": nil, "max_completion_tokens": nil}, want: 40},
		{engine: engines.SGLang, chat: true, budget: map[string]any{"max_tokens": nil, "max_completion_tokens": nil}, want: 40},
		{engine: engines.TRTLLM, chat: true, budget: map[string]any{"max_tokens": nil}, want: 40},
		{engine: engines.SGLang, chat: true, budget: map[string]any{"max_completion_tokens": nil, "max_tokens": 5}, want: 5},
	} {
		p := testPod(t, Config{Model: "m", Engine: tc.engine, Speedup: 1000, DefaultMaxTokens: 40})
		path, body := "/v1/completions", map[string]any{"model": "m", "prompt": "hello"}
		for k, v := range tc.budget {
			body[k] = v
		}
		if tc.chat {
			path, body = "/v1/chat/completions", chatBody("hello", tc.budget)
		}
		status, b := post(t, testClient(t), "http://"+p.Addr()+path, body)
		if tc.refuse != "" {
			if status != 400 || !strings.Contains(string(b), tc.refuse) {
				t.Errorf("%s %s %v: %d %s, want a 400 saying %q", tc.engine, path, tc.budget, status, b, tc.refuse)
			}
			continue
		}
		var r struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(b, &r); status != 200 || err != nil || r.Usage.CompletionTokens != tc.want {
			t.Errorf("%s %s %v: %d %s, want %d tokens", tc.engine, path, tc.budget, status, b, tc.want)
		}
	}
}

// TestChatBudgetField: vLLM holds a chat to max_completion_tokens when it
// is sent, 0 included, else to max_tokens; SGLang takes
// max_completion_tokens or max_tokens (ChatCompletionRequest's
// to_sampling_params), so its 0 falls through to max_tokens, or to no
// budget (the context's rest) without one.
func TestChatBudgetField(t *testing.T) {
	for _, tc := range []struct {
		engine engines.Kind
		budget map[string]any
		want   int    // tokens, when served
		refuse string // in the 400's body, when refused
	}{
		{engine: engines.SGLang, budget: map[string]any{"max_completion_tokens": 0, "max_tokens": 5}, want: 5},
		{engine: engines.SGLang, budget: map[string]any{"max_completion_tokens": 0}, want: 40},
		{engine: engines.SGLang, budget: map[string]any{"max_completion_tokens": 3, "max_tokens": 5}, want: 3},
		{engine: engines.VLLM, budget: map[string]any{"max_completion_tokens": 0, "max_tokens": 5}, refuse: "max_tokens must be at least 1, got 0."},
		{engine: engines.VLLM, budget: map[string]any{"max_completion_tokens": 3, "max_tokens": 5}, want: 3},
	} {
		p := testPod(t, Config{Model: "m", Engine: tc.engine, Speedup: 1000, DefaultMaxTokens: 40})
		status, b := post(t, testClient(t), "http://"+p.Addr()+"/v1/chat/completions", chatBody("hello", tc.budget))
		if tc.refuse != "" {
			if status != 400 || !strings.Contains(string(b), tc.refuse) {
				t.Errorf("%s %v: %d %s, want a 400 saying %q", tc.engine, tc.budget, status, b, tc.refuse)
			}
			continue
		}
		var r struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(b, &r); status != 200 || err != nil || r.Usage.CompletionTokens != tc.want {
			t.Errorf("%s %v: %d %s, want %d tokens", tc.engine, tc.budget, status, b, tc.want)
		}
	}
}

// TestCompletionDefaultFillsContext: vLLM and SGLang take a completion's
// default budget (16) for the request's own before they look at the
// context, so a prompt that leaves less than 16 tokens of it is refused
// as one asking max_tokens 16 is, and vLLM's truncate_prompt_tokens -1
// keeps max_model_len - 16 tokens of the prompt; TensorRT-LLM (None) and
// a chat run to the context's end.
func TestCompletionDefaultFillsContext(t *testing.T) {
	const limit, rest = 64, -1                        // rest: the context's, limit - prompt
	long := chatBody(strings.Repeat("abcd", 40), nil) // about 45 tokens
	for _, tc := range []struct {
		engine engines.Kind
		path   string
		body   map[string]any
		prompt int    // prompt tokens served, when served (0: any)
		want   int    // tokens generated, when served
		refuse string // in the 400's body, when refused
	}{
		{engine: engines.VLLM, body: map[string]any{"prompt": tokenRange(1000, 56)}, refuse: "However, you requested 72 tokens (56 in the messages, 16 in the completion)"},
		{engine: engines.VLLM, body: map[string]any{"prompt": tokenRange(1000, 56), "max_tokens": nil}, refuse: "However, you requested 72 tokens"},
		{engine: engines.SGLang, body: map[string]any{"prompt": tokenRange(1000, 56)}, refuse: "However, you requested 72 tokens"},
		{engine: engines.TRTLLM, body: map[string]any{"prompt": tokenRange(1000, 56)}, prompt: 56, want: rest},
		{engine: engines.VLLM, body: map[string]any{"prompt": tokenRange(1000, 100), "truncate_prompt_tokens": -1}, prompt: limit - 16, want: 16},
		{engine: engines.VLLM, body: map[string]any{"prompt": tokenRange(1000, 100), "truncate_prompt_tokens": 50}, refuse: "truncate_prompt_tokens=50 cannot be greater than max_model_len - max_tokens = 48."},
		{engine: engines.VLLM, path: "/v1/chat/completions", body: long, want: rest},
		{engine: engines.SGLang, path: "/v1/chat/completions", body: long, want: rest},
	} {
		p := testPod(t, Config{Model: "m", Engine: tc.engine, Speedup: 1000, DefaultMaxTokens: 40, MaxModelLen: limit})
		path := cmp.Or(tc.path, "/v1/completions")
		status, b := post(t, testClient(t), "http://"+p.Addr()+path, tc.body)
		if tc.refuse != "" {
			if status != 400 || !strings.Contains(string(b), tc.refuse) {
				t.Errorf("%s %s: %d %s, want a 400 saying %q", tc.engine, path, status, b, tc.refuse)
			}
			continue
		}
		var r struct {
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		err := json.Unmarshal(b, &r)
		want := tc.want
		if want == rest {
			want = limit - r.Usage.PromptTokens
		}
		if status != 200 || err != nil || tc.prompt != 0 && r.Usage.PromptTokens != tc.prompt || r.Usage.CompletionTokens != want {
			t.Errorf("%s %s: %d %s, want %d prompt tokens and %d generated", tc.engine, path, status, b, tc.prompt, want)
		}
	}
}

package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"pdlb/engines"
	"pdlb/engines/prompt"
	"pdlb/internal/tokfiles"
)

// qwen3Truth is a real vLLM 0.26 Qwen3's ids for one user message, read
// from its KV events.
var qwen3Truth = []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198}

func TestPodCountsTheModelsTokens(t *testing.T) {
	m, err := prompt.Load(prompt.Config{Tokenizer: tokfiles.Dir(t, "qwen3")})
	if err != nil {
		t.Fatal(err)
	}
	p := testPod(t, Config{Prompt: m, Speedup: 1000})
	c := testClient(t)
	base := "http://" + p.Addr()
	msgs := map[string]any{"messages": []map[string]any{{"role": "user", "content": "Where is the capital of China?"}}}
	status, b := post(t, c, base+"/tokenize", msgs)
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if status != 200 || json.Unmarshal(b, &tok) != nil || tok.Count != len(qwen3Truth) || len(tok.Tokens) != len(qwen3Truth) {
		t.Fatalf("/tokenize: %d %s", status, b)
	}
	for i, id := range qwen3Truth {
		if tok.Tokens[i] != id {
			t.Fatalf("/tokenize ids %v, want vLLM's %v", tok.Tokens, qwen3Truth)
		}
	}
	status, b = post(t, c, base+"/v1/chat/completions", chatBody("Where is the capital of China?", map[string]any{"max_tokens": 2}))
	var resp struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if status != 200 || json.Unmarshal(b, &resp) != nil || resp.Usage.PromptTokens != len(qwen3Truth) {
		t.Fatalf("chat: %d %s", status, b)
	}
	// A completion prompt is encoded with special tokens, which Qwen3's
	// tokenizer does not add.
	status, b = post(t, c, base+"/v1/completions", map[string]any{"prompt": "Where is the capital of China?", "max_tokens": 1})
	if status != 200 || json.Unmarshal(b, &resp) != nil || resp.Usage.PromptTokens != 7 {
		t.Fatalf("completion: %d %s", status, b)
	}
}

func TestPodRefusesMessagesAsVLLM(t *testing.T) {
	p := testPod(t, Config{Speedup: 1000})
	c := testClient(t)
	f := func(messages any, param string) {
		t.Helper()
		status, b := post(t, c, "http://"+p.Addr()+"/v1/chat/completions", map[string]any{"messages": messages})
		var e struct {
			Error struct {
				Type  string `json:"type"`
				Param string `json:"param"`
				Code  int    `json:"code"`
			} `json:"error"`
		}
		if status != 400 || json.Unmarshal(b, &e) != nil || e.Error.Param != param || e.Error.Code != 400 || !strings.Contains(string(b), param) {
			t.Fatalf("%v: %d %s, want a 400 naming %s", messages, status, b, param)
		}
	}
	f([]map[string]any{{"role": "user", "content": nil}}, "messages[0].content")
	f([]map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": []map[string]any{{"type": "function"}}}}, "messages[1].tool_calls[0].id")
	f([]map[string]any{{"role": "user", "content": []map[string]any{{"type": "video_frame"}}}}, "messages[0].content[0].type")
}

// TestPodTruncatesPromptsAsVLLM: a vLLM pod keeps the last
// truncate_prompt_tokens tokens of the prompt (the first, with
// truncation_side "right"), the tokenizer's BOS spared; prompts that
// differ only before the kept tokens then share their cached blocks.
// SGLang has no such field and keeps the whole prompt.
func TestPodTruncatesPromptsAsVLLM(t *testing.T) {
	m, err := prompt.Load(prompt.Config{Tokenizer: tokfiles.Dir(t, "llama3.1")})
	if err != nil {
		t.Fatal(err)
	}
	phys := DefaultPhysics()
	phys.BlockSize = 16
	p := testPod(t, Config{Prompt: m, Speedup: 1000, Physics: phys, MaxModelLen: 4096})
	c := testClient(t)
	usage := func(base string, body map[string]any) int {
		t.Helper()
		status, b := post(t, c, base+"/v1/completions", body)
		var resp struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal(b, &resp) != nil {
			t.Fatalf("%v: %d %s", body, status, b)
		}
		return resp.Usage.PromptTokens
	}
	base := "http://" + p.Addr()
	tail := strings.Repeat("The river runs north past the old mill and the stone bridge. ", 12)
	text := strings.Repeat("alpha ", 100) + "\n" + tail
	if n := usage(base, map[string]any{"prompt": text, "max_tokens": 1}); n < 200 {
		t.Fatalf("the whole prompt is %d tokens", n)
	}
	if n := usage(base, map[string]any{"prompt": text, "max_tokens": 1, "truncate_prompt_tokens": 64}); n != 64 {
		t.Fatalf("truncate_prompt_tokens 64: %d prompt tokens", n)
	}
	before := p.Stats().HitTokens
	other := strings.Repeat("beta gamma ", 70) + "\n" + tail
	if n := usage(base, map[string]any{"prompt": other, "max_tokens": 1, "truncate_prompt_tokens": 64, "truncation_side": "left"}); n != 64 {
		t.Fatalf("truncation_side left: %d prompt tokens", n)
	}
	if hit := p.Stats().HitTokens - before; hit < 48 {
		t.Fatalf("a prompt whose last 64 tokens were just served hit %d cached tokens", hit)
	}
	ids := make([]int, 100)
	for i := range ids {
		ids[i] = 1000 + i
	}
	if n := usage(base, map[string]any{"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 40, "truncation_side": "right"}); n != 40 {
		t.Fatalf("truncation_side right: %d prompt tokens", n)
	}
	if n := usage(base, map[string]any{"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": -1}); n != 100 {
		t.Fatalf("truncate_prompt_tokens -1 of a prompt that fits: %d prompt tokens", n)
	}
	for _, bad := range []map[string]any{
		{"truncate_prompt_tokens": -2},
		{"truncate_prompt_tokens": 4096, "max_tokens": 1},
		{"truncate_prompt_tokens": 8, "truncation_side": "middle"},
	} {
		bad["prompt"] = ids
		if status, b := post(t, c, base+"/v1/completions", bad); status != 400 {
			t.Errorf("%v: %d %s, want 400", bad, status, b)
		}
	}

	sgl := testPod(t, Config{Engine: engines.SGLang, Speedup: 1000})
	if n := usage("http://"+sgl.Addr(), map[string]any{"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 40}); n != 100 {
		t.Fatalf("SGLang: %d prompt tokens, want the whole prompt", n)
	}
}

// TestPodTruncatesPromptsAsTRTLLM: TensorRT-LLM cuts only the text it
// tokenizes itself, completions and chats alike, keeping the last
// truncate_prompt_tokens ids (its tokenizer truncates on the left, the
// BOS it adds spared); token ids, a completion's or a generation leg's
// prompt_token_ids, stay whole. It takes no value under 1 and, refusing
// unknown fields, no truncation_side.
func TestPodTruncatesPromptsAsTRTLLM(t *testing.T) {
	m, err := prompt.Load(prompt.Config{Tokenizer: tokfiles.Dir(t, "llama3.1")})
	if err != nil {
		t.Fatal(err)
	}
	phys := DefaultPhysics()
	phys.BlockSize = 16
	p := testPod(t, Config{Engine: engines.TRTLLM, Prompt: m, Speedup: 1000, Physics: phys, MaxModelLen: 4096})
	c := testClient(t)
	base := "http://" + p.Addr()
	usage := func(path string, body map[string]any) int {
		t.Helper()
		status, b := post(t, c, base+path, body)
		var resp struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal(b, &resp) != nil {
			t.Fatalf("%s %v: %d %s", path, body, status, b)
		}
		return resp.Usage.PromptTokens
	}
	tail := strings.Repeat("The river runs north past the old mill and the stone bridge. ", 12)
	if n := usage("/v1/completions", map[string]any{"prompt": strings.Repeat("alpha ", 100) + "\n" + tail, "max_tokens": 1, "truncate_prompt_tokens": 64}); n != 64 {
		t.Fatalf("completion text, truncate_prompt_tokens 64: %d prompt tokens", n)
	}
	before := p.Stats().HitTokens
	if n := usage("/v1/completions", map[string]any{"prompt": strings.Repeat("beta gamma ", 70) + "\n" + tail, "max_tokens": 1, "truncate_prompt_tokens": 64}); n != 64 {
		t.Fatalf("other completion text: %d prompt tokens", n)
	}
	if hit := p.Stats().HitTokens - before; hit < 48 {
		t.Fatalf("a prompt whose last 64 tokens were just served hit %d cached tokens", hit)
	}
	if n := usage("/v1/chat/completions", chatBody(tail, map[string]any{"max_tokens": 1, "truncate_prompt_tokens": 32})); n != 32 {
		t.Fatalf("chat, truncate_prompt_tokens 32: %d prompt tokens", n)
	}
	ids := make([]int, 100)
	for i := range ids {
		ids[i] = 1000 + i
	}
	if n := usage("/v1/completions", map[string]any{"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 40}); n != 100 {
		t.Fatalf("completion ids: %d prompt tokens, want them whole", n)
	}
	if n := usage("/v1/chat/completions", chatBody("hi", map[string]any{"prompt_token_ids": ids, "max_tokens": 1, "truncate_prompt_tokens": 40})); n != 100 {
		t.Fatalf("chat prompt_token_ids: %d prompt tokens, want them whole", n)
	}
	for _, bad := range []map[string]any{
		{"truncate_prompt_tokens": 0},
		{"truncate_prompt_tokens": -1},
		{"truncate_prompt_tokens": 8, "truncation_side": "left"},
	} {
		bad["prompt"] = "hello there"
		if status, b := post(t, c, base+"/v1/completions", bad); status != 400 || !strings.Contains(string(b), `"object":"error"`) {
			t.Errorf("%v: %d %s, want TensorRT-LLM's 400", bad, status, b)
		}
	}
}

// TestPodServesBatches: a completion whose prompt is a list of strings or
// of token-id lists is a batch, and every engine runs each prompt as its
// own request: one choice per prompt, indexed by it (n is 1), each the
// answer the prompt alone gets, each prompt's blocks cached on their own,
// and the usage summed. Streamed, each chunk carries its prompt's index;
// vLLM and SGLang end with one usage chunk summing the prompts,
// TensorRT-LLM sends each prompt's own as that prompt finishes.
func TestPodServesBatches(t *testing.T) {
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	type response struct {
		Choices []struct {
			Index        int
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage usage
	}
	ids := func(from, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = from + i
		}
		return out
	}
	for _, e := range engines.Kinds {
		t.Run(string(e), func(t *testing.T) {
			phys := DefaultPhysics()
			phys.BlockSize = 16
			p := testPod(t, Config{Engine: e, Speedup: 1000, Physics: phys})
			c := testClient(t)
			url := "http://" + p.Addr() + "/v1/completions"
			ask := func(body map[string]any) response {
				t.Helper()
				status, b := post(t, c, url, body)
				var r response
				if status != 200 || json.Unmarshal(b, &r) != nil {
					t.Fatalf("%d %s", status, b)
				}
				return r
			}
			for _, prompts := range [][]any{
				{strings.Repeat("the first prompt of the batch ", 10), strings.Repeat("and the second one, a longer one ", 14)},
				{ids(1000, 70), ids(5000, 90)},
			} {
				batch := ask(map[string]any{"prompt": prompts, "max_tokens": 7})
				var sum usage
				each := make([]usage, len(prompts))
				for i, pr := range prompts {
					before := p.Stats().HitTokens
					alone := ask(map[string]any{"prompt": pr, "max_tokens": 7})
					n := alone.Usage.PromptTokens
					if hit := p.Stats().HitTokens - before; hit < int64(n/16*16) {
						t.Fatalf("prompt %d alone after the batch: %d of its %d tokens cached", i, hit, n)
					}
					if len(batch.Choices) != len(prompts) || batch.Choices[i].Index != i ||
						batch.Choices[i].Text != alone.Choices[0].Text || batch.Choices[i].FinishReason != "length" {
						t.Fatalf("batch choices %+v; prompt %d alone answers %+v", batch.Choices, i, alone.Choices)
					}
					each[i] = alone.Usage
					sum.PromptTokens += n
					sum.CompletionTokens += alone.Usage.CompletionTokens
				}
				if batch.Usage != sum {
					t.Fatalf("batch usage %+v, want the prompts' sum %+v", batch.Usage, sum)
				}

				resp, events := stream(t, c, context.Background(), url, map[string]any{"prompt": prompts, "max_tokens": 7, "stream": true,
					"stream_options": map[string]any{"include_usage": true}})
				texts := make([]string, len(prompts))
				var usages []usage
				for _, ch := range parseChunks(t, events) {
					for _, choice := range ch.Choices {
						texts[choice.Index] += *choice.Text
					}
					if ch.Usage != nil {
						usages = append(usages, usage{ch.Usage.PromptTokens, ch.Usage.CompletionTokens})
					}
				}
				for i := range prompts {
					if texts[i] != batch.Choices[i].Text {
						t.Fatalf("streamed prompt %d: %q, want %q", i, texts[i], batch.Choices[i].Text)
					}
				}
				want := []usage{sum}
				if e == engines.TRTLLM {
					want = each
					if len(usages) == 2 && usages[0] != want[0] {
						usages[0], usages[1] = usages[1], usages[0] // the prompts may finish in either order
					}
				}
				if resp.StatusCode != 200 || fmt.Sprint(usages) != fmt.Sprint(want) {
					t.Fatalf("streamed batch: %d, usage chunks %v, want %v", resp.StatusCode, usages, want)
				}
			}
		})
	}
}

// TestPodReadsTokenIDsAsPydantic: a completions prompt of token ids is
// read as the engines' pydantic model reads its union of a list of ints,
// a list of lists of ints, a string and a list of strings: a list of
// strings only is a batch of texts (the exact match wins), and any other
// list is ids, each taken as a lax int (1.0, "2" and true too) that is
// not negative; what no member of the union takes is refused.
func TestPodReadsTokenIDsAsPydantic(t *testing.T) {
	p := testPod(t, Config{Speedup: fast})
	c := testClient(t)
	url := "http://" + p.Addr() + "/v1/completions"
	answer := func(prompt string) (status, choices int, got string) {
		t.Helper()
		status, b := post(t, c, url, json.RawMessage(`{"max_tokens":3,"prompt":`+prompt+`}`))
		var r struct {
			Choices []struct{ Text string }
			Usage   usageJSON
		}
		if status == 200 && json.Unmarshal(b, &r) != nil {
			t.Fatalf("prompt %s: %s", prompt, b)
		}
		return status, len(r.Choices), fmt.Sprint(r.Choices, r.Usage)
	}
	if status, choices, got := answer(`["1","2"]`); status != 200 || choices != 2 {
		t.Errorf(`prompt ["1","2"]: %d %s, want a batch of two texts`, status, got)
	}
	for lax, strict := range map[string]string{
		`[1.0,"2",true,3e0]`:  `[1,2,1,3]`,
		`["1",2]`:             `[1,2]`,
		`[" 7 ","0_8",false]`: `[7,8,0]`,
		`[["7"],[false,2.0]]`: `[[7],[0,2]]`,
		`[["1","2"],[3]]`:     `[[1,2],[3]]`,
		`[1,"1e0"]`:           ``,
		`[1.5]`:               ``,
		`[-1]`:                ``,
		`[null]`:              ``,
		`["1","a",2]`:         ``,
		`[[1],2]`:             ``,
		`[[1],["x"]]`:         ``,
		`[{"id":1}]`:          ``,
	} {
		status, _, got := answer(lax)
		if strict == "" {
			if status != 400 {
				t.Errorf("prompt %s: %d %s, want 400", lax, status, got)
			}
			continue
		}
		if wantStatus, _, want := answer(strict); status != 200 || wantStatus != 200 || got != want {
			t.Errorf("prompt %s: %d %s, want %s's %s", lax, status, got, strict, want)
		}
	}
}

// TestPodAnswersNChoices: n asks every engine for that many answers to
// each prompt: choice p×n+j is prompt p's j-th, sampled apart from the
// others (the first is the prompt's n=1 answer), and the usage counts
// each prompt once and every choice's tokens. Streamed, each chunk
// carries its choice's index, a chat opens each choice with its role
// chunk, and the usage chunks sum the choices as the engine sums them.
// vLLM refuses n below 1, above its VLLM_MAX_N_SEQUENCES default, or
// above 1 with greedy sampling; SGLang samples greedily n times.
func TestPodAnswersNChoices(t *testing.T) {
	type response struct {
		Choices []struct {
			Index        int
			Text         string
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage usageJSON
	}
	for _, e := range engines.Kinds {
		t.Run(string(e), func(t *testing.T) {
			p := testPod(t, Config{Engine: e, Speedup: fast})
			c := testClient(t)
			base := "http://" + p.Addr()
			ask := func(path string, body map[string]any) response {
				t.Helper()
				status, b := post(t, c, base+path, body)
				var r response
				if status != 200 || json.Unmarshal(b, &r) != nil {
					t.Fatalf("%v: %d %s", body, status, b)
				}
				return r
			}
			text := func(r response, i int) string { return r.Choices[i].Text + r.Choices[i].Message.Content }
			for _, tc := range []struct {
				path    string
				prompts []map[string]any // each prompt alone
				body    map[string]any   // all of them, n of each
			}{
				{"/v1/chat/completions", []map[string]any{chatBody("choose", nil)}, chatBody("choose", nil)},
				{"/v1/completions", []map[string]any{{"prompt": []int{50, 51}}, {"prompt": []int{7, 8, 9}}}, map[string]any{"prompt": [][]int{{50, 51}, {7, 8, 9}}}},
			} {
				const n, maxTokens = 3, 5
				tc.body["n"], tc.body["max_tokens"] = "3", maxTokens
				whole := ask(tc.path, tc.body)
				var want usageJSON
				for i, pr := range tc.prompts {
					pr["max_tokens"] = maxTokens
					alone := ask(tc.path, pr)
					want.PromptTokens += alone.Usage.PromptTokens
					for j := range n {
						k := i*n + j
						if len(whole.Choices) != len(tc.prompts)*n || whole.Choices[k].Index != k || whole.Choices[k].FinishReason != "length" ||
							(j == 0) != (text(whole, k) == text(alone, 0)) {
							t.Fatalf("%s n=%d: choices %+v; prompt %d alone answers %+v", tc.path, n, whole.Choices, i, alone.Choices)
						}
					}
				}
				want.CompletionTokens = len(tc.prompts) * n * maxTokens
				want.TotalTokens = want.PromptTokens + want.CompletionTokens
				if whole.Usage != want {
					t.Fatalf("%s n=%d: usage %+v, want %+v", tc.path, n, whole.Usage, want)
				}

				tc.body["stream"], tc.body["stream_options"] = true, map[string]any{"include_usage": true}
				resp, events := stream(t, c, context.Background(), base+tc.path, tc.body)
				texts := make([]string, len(whole.Choices))
				roles := make([]int, len(whole.Choices))
				var usages []usageJSON
				for _, ch := range parseChunks(t, events) {
					for _, choice := range ch.Choices {
						switch d := choice.Delta; {
						case d != nil && d.Role != nil:
							if texts[choice.Index] != "" {
								t.Fatalf("%s: choice %d's role chunk after its text", tc.path, choice.Index)
							}
							roles[choice.Index]++
						case d != nil && d.Content != nil: // SGLang's finish chunk has none
							texts[choice.Index] += *d.Content
						case d != nil:
						default:
							texts[choice.Index] += *choice.Text
						}
					}
					if ch.Usage != nil {
						usages = append(usages, *ch.Usage)
					}
				}
				for k := range whole.Choices {
					if texts[k] != text(whole, k) || tc.path == "/v1/chat/completions" && roles[k] != 1 {
						t.Fatalf("%s: streamed choice %d %q after %d role chunks, want %q after one", tc.path, k, texts[k], roles[k], text(whole, k))
					}
				}
				var sum usageJSON
				for _, u := range usages {
					sum.PromptTokens += u.PromptTokens
					sum.CompletionTokens += u.CompletionTokens
					sum.TotalTokens += u.TotalTokens
					if e == engines.TRTLLM && u.CompletionTokens != n*maxTokens {
						t.Fatalf("%s: TensorRT-LLM's usage chunk %+v, want one per prompt of its %d choices", tc.path, u, n)
					}
				}
				if wantChunks := map[bool]int{false: 1, true: len(tc.prompts)}[e == engines.TRTLLM]; resp.StatusCode != 200 || len(usages) != wantChunks || sum != want {
					t.Fatalf("%s: %d, usage chunks %+v, want %d summing %+v", tc.path, resp.StatusCode, usages, wantChunks, want)
				}
			}

			refuse := func(body map[string]any, wantIn string) {
				t.Helper()
				status, b := post(t, c, base+"/v1/completions", body)
				if wantIn == "" {
					if status != 200 {
						t.Errorf("%v: %d %s, want it served", body, status, b)
					}
					return
				}
				if status != 400 || !strings.Contains(string(b), wantIn) {
					t.Errorf("%v: %d %s, want a 400 saying %q", body, status, b, wantIn)
				}
			}
			refuse(map[string]any{"prompt": "x", "max_tokens": 1, "n": 0}, "n must be at least 1, got 0.")
			greedy := map[string]any{"prompt": "x", "max_tokens": 1, "n": 2, "temperature": "0.0"}
			big := map[string]any{"prompt": "x", "max_tokens": 1, "n": 16385}
			if e == engines.VLLM {
				refuse(greedy, "n must be 1 when using greedy sampling, got 2.")
				refuse(big, "n must be at most 16384, got 16385.")
			}
			if e == engines.SGLang {
				refuse(greedy, "")
			}
			refuse(map[string]any{"prompt": "x", "max_tokens": 1, "n": 1, "temperature": 0}, "")
		})
	}
}

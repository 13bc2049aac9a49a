package sim

import (
	"encoding/json"
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

package sim

import (
	"encoding/json"
	"strings"
	"testing"

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

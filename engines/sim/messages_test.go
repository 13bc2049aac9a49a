package sim

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"pdlb/engines/prompt"
	"pdlb/internal/tokfiles"
)

// TestMessages: Anthropic's Messages API as vLLM serves it: the answer's
// text, stop reason and usage, whole and as named events; the system
// field and system-role messages joined, Claude Code's billing header
// dropped, the prompt the same as the chat it makes; vLLM's refusals.
func TestMessages(t *testing.T) {
	p := testPod(t, Config{Model: "m", Speedup: 100, DefaultMaxTokens: 8})
	c := testClient(t)
	base := "http://" + p.Addr()
	msgs := []any{
		map[string]any{"role": "user", "content": "hello there"},
		map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "hi"}}},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "and"}, map[string]any{"type": "text", "text": "more", "cache_control": map[string]string{"type": "ephemeral"}}}},
	}
	system := []any{map[string]any{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=12345;"}, map[string]any{"type": "text", "text": "be brief"}}
	code, b := post(t, c, base+"/v1/messages", map[string]any{"model": "m", "max_tokens": 5, "system": system, "messages": msgs})
	var whole struct {
		Type, Role, StopReason string
		Content                []struct{ Type, Text string }
		Usage                  struct{ InputTokens, OutputTokens int }
	}
	if code != 200 || json.Unmarshal(b, &whole) != nil {
		t.Fatalf("%d %s", code, b)
	}
	if !strings.Contains(string(b), `"stop_reason":"max_tokens"`) || whole.Type != "message" || whole.Role != "assistant" || len(whole.Content) != 1 || whole.Content[0].Text == "" {
		t.Errorf("whole answer: %s", b)
	}
	// The same prompt as the chat vLLM makes of it.
	chat := []any{
		map[string]any{"role": "system", "content": "be brief"},
		msgs[0], map[string]any{"role": "assistant", "content": "hi"},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "and"}, map[string]any{"type": "text", "text": "more"}}},
	}
	code, cb := post(t, c, base+"/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 5, "messages": chat})
	var chatAns struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	if code != 200 || json.Unmarshal(cb, &chatAns) != nil || !strings.Contains(string(b), `"input_tokens":`+strconv.Itoa(chatAns.Usage.PromptTokens)) {
		t.Errorf("messages %s, the chat's prompt %s", b, cb)
	}
	code, sb := post(t, c, base+"/v1/messages", map[string]any{"model": "m", "max_tokens": 5, "stream": true, "messages": msgs[:1]})
	events := strings.Split(strings.TrimSuffix(string(sb), "\n\n"), "\n\n")
	var names []string
	var text strings.Builder
	for _, ev := range events {
		name, data, _ := strings.Cut(ev, "\n")
		names = append(names, strings.TrimPrefix(name, "event: "))
		var d struct {
			Delta struct{ Text string }
		}
		_ = json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &d)
		text.WriteString(d.Delta.Text)
	}
	got := strings.Join(names, ",")
	if code != 200 || !strings.HasPrefix(got, "message_start,content_block_start,content_block_delta") ||
		!strings.HasSuffix(got, "content_block_delta,content_block_stop,message_delta,message_stop") || text.Len() == 0 {
		t.Errorf("stream %d: %s", code, sb)
	}
	if !strings.Contains(events[len(events)-2], `"output_tokens":5`) || !strings.Contains(events[len(events)-2], `"stop_reason":"max_tokens"`) {
		t.Errorf("message_delta: %s", events[len(events)-2])
	}
	for _, c2 := range []struct {
		body map[string]any
		code int
		want string
	}{
		{map[string]any{"model": "m", "messages": msgs}, 400, `"max_tokens: Field required"`},
		{map[string]any{"model": "m", "max_tokens": nil, "messages": msgs}, 400, `"max_tokens: Input should be a valid integer"`},
		{map[string]any{"model": "m", "max_tokens": 0, "messages": msgs}, 400, `"max_tokens: Value error, max_tokens must be positive"`},
		{map[string]any{"model": "m", "max_tokens": -2, "messages": msgs}, 400, `"max_tokens: Value error, max_tokens must be positive"`},
		{map[string]any{"model": "other", "max_tokens": 1, "messages": msgs}, 404, "does not exist"},
		{map[string]any{"model": "m", "max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "document"}}}}}, 400, "messages[0].content[0].type"},
		{map[string]any{"model": "m", "max_tokens": 1024, "thinking": map[string]any{"type": "enabled", "budget_tokens": 1024}, "messages": msgs}, 400, "budget_tokens must be less than max_tokens"},
		{map[string]any{"model": "m", "max_tokens": 4096, "thinking": map[string]any{"type": "enabled", "budget_tokens": 512}, "messages": msgs}, 400, "greater than or equal to 1024"},
	} {
		if code, b := post(t, c, base+"/v1/messages", c2.body); code != c2.code || !strings.Contains(string(b), c2.want) {
			t.Errorf("%v: %d %s", c2.body, code, b)
		}
	}
}

// TestMessagesTools: a Messages request with tool_use and tool_result
// blocks, thinking and tools is served as the chat vLLM makes of it: its
// prompt is that chat's, token for token, on a pod with the model's
// tokenizer and template.
func TestMessagesTools(t *testing.T) {
	m, err := prompt.Load(prompt.Config{Tokenizer: tokfiles.Dir(t, "qwen3")})
	if err != nil {
		t.Fatal(err)
	}
	p := testPod(t, Config{Model: "m", Speedup: 100, DefaultMaxTokens: 8, Prompt: m})
	c := testClient(t)
	base := "http://" + p.Addr()
	tool := map[string]any{"name": "Read", "input_schema": map[string]any{"properties": map[string]any{"path": map[string]string{"type": "string"}}}}
	messages := map[string]any{"model": "m", "max_tokens": 5, "tools": []any{tool}, "messages": []any{
		map[string]any{"role": "user", "content": "Read /a"},
		map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "thinking", "thinking": "read it", "signature": "s"},
			map[string]any{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": map[string]any{"path": "/a"}}}},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": []any{map[string]any{"type": "text", "text": "x"}, map[string]any{"type": "text", "text": "y"}}},
			map[string]any{"type": "text", "text": "go on"}}},
	}}
	chat := map[string]any{"model": "m", "max_tokens": 5, "tools": []any{map[string]any{"type": "function", "function": map[string]any{
		"name": "Read", "description": nil, "parameters": map[string]any{"properties": map[string]any{"path": map[string]string{"type": "string"}}, "type": "object"}}}},
		"messages": []any{
			map[string]any{"role": "user", "content": "Read /a"},
			map[string]any{"role": "assistant", "reasoning": "read it", "tool_calls": []any{map[string]any{"id": "toolu_1", "type": "function",
				"function": map[string]any{"name": "Read", "arguments": `{"path": "/a"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": "toolu_1", "content": "x\ny"},
			map[string]any{"role": "user", "content": "go on"},
		}}
	code, b := post(t, c, base+"/v1/messages", messages)
	code2, cb := post(t, c, base+"/v1/chat/completions", chat)
	var ma struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		}
	}
	var ch struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	if code != 200 || code2 != 200 || json.Unmarshal(b, &ma) != nil || json.Unmarshal(cb, &ch) != nil ||
		ma.Usage.InputTokens == 0 || ma.Usage.InputTokens != ch.Usage.PromptTokens {
		t.Errorf("messages %d %s\nchat %d %s", code, b, code2, cb)
	}
}

// TestCountTokens: /v1/messages/count_tokens counts the prompt a
// Messages request prefills, as vLLM's does; what vLLM refuses is a 400.
func TestCountTokens(t *testing.T) {
	p := testPod(t, Config{Model: "m", Speedup: 100, DefaultMaxTokens: 8})
	c := testClient(t)
	base := "http://" + p.Addr()
	req := map[string]any{"model": "m", "system": "be brief", "messages": []any{map[string]any{"role": "user", "content": "hello there"}}}
	code, b := post(t, c, base+"/v1/messages/count_tokens", req)
	var n struct {
		InputTokens int `json:"input_tokens"`
	}
	if code != 200 || json.Unmarshal(b, &n) != nil || n.InputTokens == 0 {
		t.Fatalf("count_tokens: %d %s", code, b)
	}
	req["max_tokens"] = 1
	code, b = post(t, c, base+"/v1/messages", req)
	if code != 200 || !strings.Contains(string(b), `"input_tokens":`+strconv.Itoa(n.InputTokens)) {
		t.Errorf("count_tokens said %d; the request: %d %s", n.InputTokens, code, b)
	}
	req["messages"] = []any{map[string]any{"role": "tool", "content": "x"}}
	if code, b = post(t, c, base+"/v1/messages/count_tokens", req); code != 400 || !strings.Contains(string(b), "messages[0].role") {
		t.Errorf("a tool role: %d %s", code, b)
	}
}

// TestMessagesCacheSalt: a Messages request's cache_salt salts its
// blocks, as newer vLLM releases pass it to the chat they make, and a
// salt vLLM refuses is a 400.
func TestMessagesCacheSalt(t *testing.T) {
	phys := DefaultPhysics()
	phys.BlockSize = 16
	sink := &recordingSink{}
	p := testPod(t, Config{Model: "m", Physics: phys, Speedup: fast, KVEvents: sink})
	c := testClient(t)
	req := map[string]any{"model": "m", "max_tokens": 1, "cache_salt": "tenant-a",
		"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("a few words to fill blocks ", 20)}}}
	if code, b := post(t, c, "http://"+p.Addr()+"/v1/messages", req); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	first := false
	for _, e := range sink.take() {
		if e.kind == "stored" && !e.hasParent {
			first = true
			if e.salt != "tenant-a" {
				t.Errorf("the first block's salt %q, want tenant-a", e.salt)
			}
		}
	}
	if !first {
		t.Fatal("no block stored")
	}
	req["cache_salt"] = ""
	if code, b := post(t, c, "http://"+p.Addr()+"/v1/messages", req); code != 400 || !strings.Contains(string(b), "cache_salt") {
		t.Errorf("an empty salt: %d %s, want vLLM's 400", code, b)
	}
}

// TestCountTokensIgnoresOutputConfig: vLLM's count_tokens request has no
// output_config or thinking; a value /v1/messages would refuse is not
// refused, and thinking disabled does not change the count.
func TestCountTokensIgnoresOutputConfig(t *testing.T) {
	p := testPod(t, Config{Model: "m", Speedup: 100})
	c := testClient(t)
	base := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hello there"}}}
	code, plain := post(t, c, "http://"+p.Addr()+"/v1/messages/count_tokens", base)
	base["output_config"], base["thinking"] = map[string]any{"effort": "bad"}, map[string]any{"type": "disabled"}
	code2, other := post(t, c, "http://"+p.Addr()+"/v1/messages/count_tokens", base)
	if code != 200 || code2 != 200 || string(plain) != string(other) {
		t.Errorf("%d %s; with output_config and thinking %d %s", code, plain, code2, other)
	}
}

package sim

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
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
		{map[string]any{"model": "m", "messages": msgs}, 400, "max_tokens"},
		{map[string]any{"model": "other", "max_tokens": 1, "messages": msgs}, 404, "does not exist"},
		{map[string]any{"model": "m", "max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image"}}}}}, 400, "text blocks only"},
	} {
		if code, b := post(t, c, base+"/v1/messages", c2.body); code != c2.code || !strings.Contains(string(b), c2.want) {
			t.Errorf("%v: %d %s", c2.body, code, b)
		}
	}
}

package prompt

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pdlb/engines/chat"
	"pdlb/internal/racebuild"
	"pdlb/internal/tokfiles"
)

// qwen3Truth is a real vLLM 0.26 Qwen3's ids for one user message, read
// from its KV events.
var qwen3Truth = []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198}

func load(t testing.TB, c Config) *Model {
	t.Helper()
	m, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestChatAsVLLM(t *testing.T) {
	m := load(t, Config{Tokenizer: tokfiles.Dir(t, "qwen3")})
	body := []byte(`{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Where is the capital of China?"}]}`)
	ids, err := m.Chat(nil, body, false)
	if err != nil || !slices.Equal(ids, qwen3Truth) {
		t.Fatalf("ids %v (%v), want vLLM's %v", ids, err, qwen3Truth)
	}
	// chat_template_kwargs reach the template: Qwen3 without thinking
	// closes an empty think block after the generation prompt.
	off, err := m.Chat(nil, []byte(`{"messages":[{"role":"user","content":"Where is the capital of China?"}],"chat_template_kwargs":{"enable_thinking":false}}`), false)
	if err != nil || !slices.Equal(off[:len(qwen3Truth)], qwen3Truth) || len(off) <= len(qwen3Truth) {
		t.Fatalf("enable_thinking false: %v %v", off, err)
	}
	// The server's defaults are under the request's.
	quiet := load(t, Config{Tokenizer: tokfiles.Dir(t, "qwen3"), ChatTemplateKwargs: map[string]any{"enable_thinking": false}})
	if got, err := quiet.Chat(nil, body, false); err != nil || !slices.Equal(got, off) {
		t.Fatalf("default kwargs: %v %v, want %v", got, err, off)
	}
	var re *chat.RequestError
	if _, err := m.Chat(nil, []byte(`{"messages":[{"role":"user","content":null}]}`), false); !errors.As(err, &re) || re.Param != "messages[0].content" {
		t.Fatalf("a user message with null content: %v", err)
	}
}

func TestCompletionSpecialTokens(t *testing.T) {
	m := load(t, Config{Tokenizer: tokfiles.Dir(t, "llama3.1")})
	with := m.Completion(nil, []byte("Hello"), true)
	without := m.Completion(nil, []byte("Hello"), false)
	if len(with) != len(without)+1 || with[0] != 128000 || !slices.Equal(with[1:], without) {
		t.Fatalf("with special tokens %v, without %v: want BOS 128000 in front", with, without)
	}
}

func TestLoad(t *testing.T) {
	if m, err := Load(Config{}); m != nil || err != nil {
		t.Fatalf("no tokenizer: %v %v, want the stand-in (nil)", m, err)
	}
	f := func(c Config, want string) {
		t.Helper()
		if _, err := Load(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%+v: error %v, want %q", c, err, want)
		}
	}
	f(Config{ChatTemplate: "{{ x }}"}, "need a tokenizer")
	f(Config{ChatTemplateKwargs: map[string]any{"enable_thinking": false}}, "need a tokenizer")
	f(Config{Tokenizer: t.TempDir()}, "tokenizer.json")
	dir := tokfiles.Dir(t, "qwen3")
	f(Config{Tokenizer: dir, ChatTemplate: filepath.Join(t.TempDir(), "missing.jinja")}, "missing.jinja")
	f(Config{Tokenizer: dir, ChatTemplate: "{% for %}"}, "cannot render this chat template")

	// A template override, as a file and as text.
	tmpl := "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
	file := filepath.Join(t.TempDir(), "t.jinja")
	if err := os.WriteFile(file, []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{tmpl, file} {
		m := load(t, Config{Tokenizer: dir, ChatTemplate: v})
		ids, err := m.Chat(nil, []byte(`{"messages":[{"role":"user","content":"Where is the capital of China?"}]}`), false)
		if err != nil || !slices.Equal(ids, qwen3Truth[:12]) {
			t.Fatalf("override %q: %v %v, want %v", v, ids, err, qwen3Truth[:12])
		}
	}
}

// A model whose tokenizer has no chat template renders no chat, and says
// so; its completions still encode.
func TestNoTemplate(t *testing.T) {
	m := load(t, Config{Tokenizer: tokfiles.Dir(t, "llama2")})
	if _, err := m.Chat(nil, []byte(`{"messages":[{"role":"user","content":"hi"}]}`), false); !errors.Is(err, ErrNoTemplate) {
		t.Fatalf("chat without a template: %v", err)
	}
	if ids := m.Completion(nil, []byte("hi"), true); len(ids) == 0 || ids[0] != 1 {
		t.Fatalf("llama2 completion %v: want BOS 1 first", ids)
	}
}

func TestChatAllocatesNothing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	m := load(t, Config{Tokenizer: tokfiles.Dir(t, "qwen3")})
	body := multiTurn(t, "a new question about the weather in Lisbon")
	ids, err := m.Chat(nil, body, false)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() {
		if ids, err = m.Chat(ids[:0], body, false); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%.1f allocations per seen request, want 0", n)
	}
}

// multiTurn is a chat of about 2,048 Qwen3 tokens: a system prompt and
// seven exchanges, then a user turn of about 300 tokens ending in last.
func multiTurn(t testing.TB, last string) []byte {
	t.Helper()
	para := "The gateway routes each request to the pod whose prefix cache holds most of its prompt, weighing that against the queue.\n"
	msgs := []map[string]string{{"role": "system", "content": "You are a careful assistant for an inference platform team."}}
	for range 7 {
		msgs = append(msgs,
			map[string]string{"role": "user", "content": strings.TrimSpace(strings.Repeat(para, 5))},
			map[string]string{"role": "assistant", "content": strings.TrimSpace(strings.Repeat(para, 5))})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": strings.Repeat(para, 14) + last})
	b, err := json.Marshal(map[string]any{"model": "qwen3", "messages": msgs, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

package chat

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomBody builds a chat request, mostly inside the fast path's
// envelope, sometimes outside it: contents with template literals or edge
// whitespace, empty contents, reasoning, names, tool calls and results,
// kwargs, continue_final_message.
func randomBody(rng *rand.Rand) []byte {
	if rng.IntN(2) == 0 {
		return plainBody(rng)
	}
	pieces := []string{"hello", "world", " ", "\n", "\n\n", "é", "中文", "🙂", "{{", "%}", "'", "\"", "\\", "<", ">", "user", "assistant", "42"}
	hazards := []string{"</think>", "<think>", "<|im_end|>", "<|im_start|>", "<tool_response>", "</tool_response>", "<|eot_id|>", "<start_of_turn>", " ", "\n", ""}
	content := func() string {
		var b strings.Builder
		for range 1 + rng.IntN(8) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := b.String()
		if rng.IntN(5) != 0 {
			s = strings.TrimSpace(s)
		}
		if rng.IntN(6) == 0 {
			h := hazards[rng.IntN(len(hazards))]
			if rng.IntN(2) == 0 {
				s = h + s
			} else {
				s += h
			}
		}
		if rng.IntN(30) == 0 {
			s = ""
		}
		return s
	}
	var msgs []map[string]any
	n := 1 + rng.IntN(9)
	for i := range n {
		role := []string{"system", "user", "assistant", "user", "assistant", "tool"}[rng.IntN(6)]
		if i == 0 && rng.IntN(2) == 0 {
			role = "system"
		}
		m := map[string]any{"role": role, "content": content()}
		switch {
		case role == "tool":
			m["tool_call_id"] = "c1"
		case role == "assistant" && rng.IntN(8) == 0:
			m["reasoning_content"] = content()
		case role == "assistant" && rng.IntN(8) == 0:
			m["tool_calls"] = []any{map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "f", "arguments": `{"x": 1}`}}}
		case rng.IntN(20) == 0:
			m["name"] = "bob"
		case rng.IntN(20) == 0:
			m["content"] = []any{map[string]any{"type": "text", "text": content()}, map[string]any{"type": "text", "text": content()}}
		}
		msgs = append(msgs, m)
	}
	body := map[string]any{"messages": msgs}
	switch rng.IntN(6) {
	case 0:
		body["add_generation_prompt"] = false
	case 1:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
	case 2:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
	case 3:
		body["add_generation_prompt"] = false
		body["continue_final_message"] = true
	}
	raw, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return raw
}

// plainBody is a conversation inside the envelope as chats mostly are: an
// optional system message, then user and assistant turns.
func plainBody(rng *rand.Rand) []byte {
	words := []string{"hello", "world", "é", "中文", "🙂", "{{", "'", "\"", "<b>", "user", "42", "a\nb", "x  y"}
	var msgs []map[string]any
	if rng.IntN(2) == 0 {
		msgs = append(msgs, map[string]any{"role": "system", "content": "Be brief."})
	}
	for i := range 1 + rng.IntN(8) {
		var b strings.Builder
		for j := range 1 + rng.IntN(10) {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[rng.IntN(len(words))])
		}
		content := b.String()
		switch rng.IntN(16) {
		case 0:
			content += "\n" // pasted text often ends so
		case 1:
			content = " " + content + "\n\n"
		}
		msgs = append(msgs, map[string]any{"role": []string{"user", "assistant"}[i%2], "content": content})
	}
	body := map[string]any{"messages": msgs}
	if rng.IntN(3) == 0 {
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": rng.IntN(2) == 0}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return raw
}

// TestFastPathMatchesJinja renders random conversations inside and outside
// the envelope with Render and with the Jinja path: the bytes, and whether
// an error came, must agree. It also checks that the fast path served a
// good share of them, and that RenderSegments points at the contents.
func TestFastPathMatchesJinja(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3.1", "gemma3"} {
		t.Run(model, func(t *testing.T) {
			tmpl := loadTemplate(t, model)
			rng := rand.New(rand.NewPCG(1, 2))
			c := AcquireConversation()
			defer ReleaseConversation(c)
			fast := 0
			const n = 3000
			for range n {
				body := randomBody(rng)
				if err := c.ParseRequest(body); err != nil {
					t.Fatalf("%s: %v", body, err)
				}
				defaults := map[string]any(nil)
				if rng.IntN(4) == 0 {
					defaults = map[string]any{"enable_thinking": false}
				}
				got, segs, err := tmpl.RenderSegments([]byte("x"), c, defaults)
				tmpl.learners.Wait() // later requests with these kwargs take the plan
				want, wantErr := tmpl.renderJinja(c, defaults)
				if (err == nil) != (wantErr == nil) {
					t.Fatalf("%s: Render error %v, Jinja error %v", body, err, wantErr)
				}
				if err != nil {
					continue
				}
				if string(got[1:]) != want {
					t.Fatalf("%s (fast path %v):\n got %q\nwant %q", body, len(segs) > 0, got[1:], want)
				}
				if len(segs) == 0 {
					continue // the Jinja path
				}
				fast++
				if len(segs) != c.Len() {
					t.Fatalf("%s: %d segments for %d messages", body, len(segs), c.Len())
				}
				for i, s := range segs {
					if g := string(got[1:][s.Start:s.End]); g != c.str(c.msgs[i].content) {
						t.Fatalf("%s: segment %d is %q", body, i, g)
					}
				}
			}
			t.Logf("%s: %d of %d conversations on the fast path", model, fast, n)
			if fast < n/6 {
				t.Errorf("fast path served %d of %d", fast, n)
			}
		})
	}
}

// TestFastPathRefusals: templates whose output the plan cannot describe
// render a three-message conversation with Jinja (no segments), and
// rightly; RenderFast says so (ErrJinja) rather than render it.
func TestFastPathRefusals(t *testing.T) {
	c := AcquireConversation()
	defer ReleaseConversation(c)
	if err := c.ParseRequest([]byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}`)); err != nil {
		t.Fatal(err)
	}
	f := func(src string, wantFast bool) {
		t.Helper()
		tmpl, err := Compile(src, map[string]string{"bos_token": "<s>"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tmpl.Render(nil, c, nil); err != nil {
			t.Fatal(err)
		}
		tmpl.learners.Wait()
		got, segs, err := tmpl.RenderSegments(nil, c, nil)
		want, wantErr := tmpl.renderJinja(c, nil)
		if err != nil || wantErr != nil || string(got) != want {
			t.Fatalf("%q: got %q %v, want %q %v", src, got, err, want, wantErr)
		}
		if fast := len(segs) > 0; fast != wantFast {
			t.Errorf("%q: fast path %v, want %v", src, fast, wantFast)
		}
		// RenderFast renders what the fast path does, and nothing else.
		dst := []byte("x")
		got, err = tmpl.RenderFast(dst, c, nil)
		if wantFast && (err != nil || string(got) != "x"+want) || !wantFast && (err != ErrJinja || string(got) != "x") {
			t.Errorf("%q: RenderFast %q %v (fast path %v)", src, got, err, wantFast)
		}
	}
	f(`{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}`, true)
	// The day is part of the prompt: a plan a day.
	f(`{{ strftime_now("%d %b %Y") }}{% for m in messages %}{{ m.content }}{% endfor %}`, true)
	// Content printed twice.
	f(`{% for m in messages %}{{ m.content }}|{{ m.content }}{% endfor %}`, false)
	// Output depends on the content's length.
	f(`{% for m in messages %}{{ m.content }}{{ m.content | length }}{% endfor %}`, false)
	// Output depends on the number of messages.
	f(`{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}`, false)
	f(`{% for m in messages %}{{ m.content }}{% if loop.index == 3 %}!{% endif %}{% endfor %}`, false)
}

// TestConcurrentRender: goroutines render on one template while its plans
// are learnt (run with -race).
func TestConcurrentRender(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3")
	bodies := [][]byte{
		[]byte(`{"messages":[{"role":"user","content":"hi"}]}`),
		[]byte(`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}}`),
		[]byte(`{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"low"}`),
	}
	done := make(chan error)
	for g := range 6 {
		go func() {
			c := AcquireConversation()
			defer ReleaseConversation(c)
			var err error
			for i := range 20 {
				body := bodies[(g+i)%len(bodies)]
				if err = c.ParseRequest(body); err != nil {
					break
				}
				var got []byte
				if got, err = tmpl.Render(nil, c, nil); err != nil {
					break
				}
				want, _ := tmpl.renderJinja(c, nil)
				if string(got) != want {
					err = errors.New("fast path differs: " + string(got))
					break
				}
			}
			done <- err
		}()
	}
	for range 6 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	tmpl.learners.Wait()
}

// TestContentOK: contents the fast path takes, given trigger literals.
func TestContentOK(t *testing.T) {
	var p plan
	for _, lit := range []string{"<|im_end|>", "</think>", "<think>", "# Tools"} {
		p.addTrigger(lit)
	}
	f := func(content string, want bool) {
		t.Helper()
		if got := p.contentOK([]byte(content)); got != want {
			t.Errorf("contentOK(%q) = %v, want %v", content, got, want)
		}
	}
	f("hello", true)
	f("a < b and c <| d", true)
	f("<|im_end", true)
	f("# Tool", true)
	f(" padded\n", true) // edges are judged per context when rendering
	f("x</think>y", false)
	f("<<think>", false)
	f("end<|im_end|>", false)
	f("# Tools", false)
	f("", false)
	f(" \n\t\u00a0", false)
}

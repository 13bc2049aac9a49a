package chat

import (
	"encoding/json"
	"strings"
	"testing"
)

// chatBody is an 8-turn Qwen3 chat of about 8 KB of content (about 2,048
// tokens): a system message, 8 user turns and 7 answers, the last user
// turn about 1.2 KB (about 300 tokens).
func chatBody(tb testing.TB) []byte {
	tb.Helper()
	para := "The quick brown fox jumps over the lazy dog while the gateway routes requests by prefix-cache hits. "
	msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
	for i := range 8 {
		n := 5
		if i == 7 {
			n = 12
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": strings.TrimSpace(strings.Repeat(para, n))})
		if i < 7 {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": strings.TrimSpace(strings.Repeat(para, 4))})
		}
	}
	raw, err := json.Marshal(map[string]any{"model": "qwen3", "messages": msgs, "stream": true, "max_tokens": 256})
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

func BenchmarkParseRequest(b *testing.B) {
	body := chatBody(b)
	c := AcquireConversation()
	defer ReleaseConversation(c)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := c.ParseRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

// What a render benchmark times once the plan is learnt.
const (
	renderJinja    = iota // the Jinja renderer alone
	renderFast            // the fast path
	parseAndRender        // parse the body, render on the fast path
)

func benchRender(b *testing.B, mode int) {
	tmpl := loadTemplate(b, "qwen3")
	body := chatBody(b)
	c := AcquireConversation()
	defer ReleaseConversation(c)
	if err := c.ParseRequest(body); err != nil {
		b.Fatal(err)
	}
	dst, err := tmpl.Render(nil, c, nil) // starts learning the plan
	if err != nil {
		b.Fatal(err)
	}
	tmpl.learners.Wait()
	b.ReportAllocs()
	for b.Loop() {
		switch mode {
		case renderJinja:
			if _, err := tmpl.renderJinja(c, nil); err != nil {
				b.Fatal(err)
			}
			continue
		case parseAndRender:
			if err := c.ParseRequest(body); err != nil {
				b.Fatal(err)
			}
		}
		if dst, err = tmpl.Render(dst[:0], c, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(dst)), "prompt-bytes")
}

func BenchmarkRenderJinja(b *testing.B)    { benchRender(b, renderJinja) }
func BenchmarkRenderFastPath(b *testing.B) { benchRender(b, renderFast) }

// BenchmarkParseAndRender is the gateway's per-request work here: parse
// the body, render the prompt on the fast path.
func BenchmarkParseAndRender(b *testing.B) { benchRender(b, parseAndRender) }

// TestSteadyStateAllocs: parsing a plain chat and rendering it on the fast
// path allocate nothing once the buffers have grown.
func TestSteadyStateAllocs(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3")
	body := chatBody(t)
	kwBody := []byte(strings.Replace(string(body), `"stream":true`, `"stream":true,"chat_template_kwargs":{"enable_thinking":false}`, 1))
	c := AcquireConversation()
	defer ReleaseConversation(c)
	dst := make([]byte, 0, 16<<10)
	for _, b := range [][]byte{body, kwBody} {
		run := func() {
			if err := c.ParseRequest(b); err != nil {
				t.Fatal(err)
			}
			var segs []Segment
			var err error
			if dst, segs, err = tmpl.RenderSegments(dst[:0], c, map[string]any{"enable_thinking": true}); err != nil || len(segs) == 0 {
				t.Fatalf("fast path: %d segments, %v", len(segs), err)
			}
		}
		if err := c.ParseRequest(b); err != nil {
			t.Fatal(err)
		}
		if _, err := tmpl.Render(nil, c, map[string]any{"enable_thinking": true}); err != nil {
			t.Fatal(err)
		}
		tmpl.learners.Wait()
		run()
		if n := testing.AllocsPerRun(50, run); n != 0 {
			t.Errorf("ParseRequest + RenderSegments: %v allocs per run, want 0", n)
		}
	}
}

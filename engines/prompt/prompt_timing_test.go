package prompt

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"pdlb/engines/chat"
	"pdlb/internal/tokfiles"
	"pdlb/radix"
)

// benchChat is the gateway's per-request work on a model with real files:
// parse the body, render the template, encode, and make the index's block
// keys (16 tokens a block), for a 2,048-token multi-turn chat.
func benchChat(b *testing.B, newTurn bool) {
	m := load(b, Config{Tokenizer: tokfiles.Dir(b, "qwen3")})
	bodies := [][]byte{multiTurn(b, "a question seen before")}
	if newTurn {
		// Every request ends in a turn the caches have not seen; the
		// earlier turns were seen.
		bodies = make([][]byte, 4096)
		for i := range bodies {
			bodies[i] = multiTurn(b, "question number "+strconv.Itoa(i))
		}
	}
	var ids []uint32
	var keys []uint64
	var err error
	if ids, err = m.Chat(ids, bodies[0], false); err != nil {
		b.Fatal(err)
	}
	seed := radix.Seed("qwen3")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if ids, err = m.Chat(ids[:0], bodies[i%len(bodies)], false); err != nil {
			b.Fatal(err)
		}
		keys = radix.AppendBlockKeys(keys[:0], seed, ids, 16)
		i++
	}
	b.ReportMetric(float64(len(ids)), "tokens")
}

// BenchmarkChatSeen: the same conversation again (a retry, or a client
// resending): every segment is in the tokenizer's cache.
func BenchmarkChatSeen(b *testing.B) { benchChat(b, false) }

// BenchmarkChatNewTurn: a conversation whose new user turn of about 300
// tokens is new (its words are not).
func BenchmarkChatNewTurn(b *testing.B) { benchChat(b, true) }

// agentLoop is a coding agent's turn as a Messages API request: a long
// system prompt, 12 tools, and turns of tool calls and their results,
// resent whole.
func agentLoop(turns int) []byte {
	tools := make([]any, 12)
	for i := range tools {
		tools[i] = map[string]any{"name": "tool" + strconv.Itoa(i), "description": strings.Repeat("Does one thing well. ", 20),
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{
				"path": map[string]string{"type": "string", "description": "An absolute path."},
				"n":    map[string]any{"type": "integer", "minimum": 1}}, "required": []string{"path"}}}
	}
	msgs := []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "Why does the build fail?"}}}}
	for i := range turns {
		id := "toolu_" + strconv.Itoa(i)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "text", "text": "Let me look at file " + strconv.Itoa(i) + "."},
				map[string]any{"type": "tool_use", "id": id, "name": "tool1", "input": map[string]any{"path": "/src/f" + strconv.Itoa(i) + ".go", "n": i + 1}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": id,
				"content": strings.Repeat("func f() { return g(x) } // line "+strconv.Itoa(i)+"\n", 12)}}})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4096, "stream": true, "tools": tools, "messages": msgs,
		"system": []any{map[string]any{"type": "text", "text": strings.Repeat("You are a careful coding agent. ", 60)}}})
	return body
}

// benchAgent is the gateway's work for an agent loop of turns on Qwen3's
// files (every segment seen before): as a Messages request, converted to
// vLLM's chat first, or as that chat.
func benchAgent(b *testing.B, messages bool, turns int) {
	m := load(b, Config{Tokenizer: tokfiles.Dir(b, "qwen3")})
	body := agentLoop(turns)
	render := m.Messages
	if !messages {
		converted, exact, err := chat.AppendMessages(nil, body, chat.InlineUnknown)
		if err != nil || !exact {
			b.Fatal(err, exact)
		}
		body = converted
		render = func(dst []uint32, body []byte) ([]uint32, error) { return m.Chat(dst, body, false) }
	}
	ids, err := render(nil, body)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if ids, err = render(ids[:0], body); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ids)), "tokens")
	b.ReportMetric(float64(len(body)), "bytes")
}

// BenchmarkMessagesAgentLoop: the Messages request, converted and
// rendered.
func BenchmarkMessagesAgentLoop(b *testing.B) { benchAgent(b, true, 20) }

// BenchmarkMessagesLongAgentLoop: a 200-turn loop (150 KB), a long Claude
// Code session, which the gateway renders whole every request.
func BenchmarkMessagesLongAgentLoop(b *testing.B) { benchAgent(b, true, 200) }

// BenchmarkChatAgentLoop: the same conversation as vLLM's chat request.
func BenchmarkChatAgentLoop(b *testing.B) { benchAgent(b, false, 20) }

// BenchmarkChatManyTools: one short message with 25 tools of about 2 KB
// each, the size of a coding agent's tool list, which it resends every
// request: the template dumps them all (tojson) each time.
func BenchmarkChatManyTools(b *testing.B) {
	m := load(b, Config{Tokenizer: tokfiles.Dir(b, "qwen3")})
	tools := make([]any, 25)
	for i := range tools {
		tools[i] = map[string]any{"type": "function", "function": map[string]any{"name": "tool" + strconv.Itoa(i),
			"description": strings.Repeat("Does one thing well, and says so at length. ", 45),
			"parameters": map[string]any{"type": "object", "required": []string{"path"}, "properties": map[string]any{
				"path": map[string]string{"type": "string", "description": "An absolute path."},
				"n":    map[string]any{"type": "integer", "minimum": 1}}}}}
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "tools": tools, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	var ids []uint32
	var err error
	b.ReportAllocs()
	for b.Loop() {
		if ids, err = m.Chat(ids[:0], body, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(body)), "bytes")
}

package openai

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// Prompt lines the benchmark bodies repeat, from fewest escapes to most:
// prose with none, prose with a few, and source code quoting JSON as agents
// send it (a \n every line, \" around every name; an escape every 7 bytes).
const (
	plainLine = `The quick brown fox jumps over the lazy dog, then naps in the afternoon sun. `
	proseLine = `The quick brown fox jumps over the lazy dog; \"quoted\" text\tand a newline\n. `
	codeLine  = `\tif err := json.Unmarshal([]byte(\"{\\\"city\\\":\\\"Paris\\\"}\"), \u0026v); err != nil {\n\t\treturn fmt.Errorf(\"decode: %w\", err)\n\t}\n`
)

// chatBody builds a chat request of about size bytes shaped like real
// traffic: a system prompt, a few turns with escapes in their text, a
// content-parts message, tools and sampling fields the extractor skips.
func chatBody(size int) []byte { return chatBodyOf(size, proseLine) }

// chatBodyOf is chatBody with line as the text the turns repeat.
func chatBodyOf(size int, line string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},`)
	b.WriteString(`"temperature":0.7,"top_p":0.95,"n":1,"stop":["\n\nUser:"],`)
	b.WriteString(`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],`)
	b.WriteString(`"messages":[{"role":"system","content":"You are a helpful assistant.\nAnswer briefly and cite \"sources\"."}`)
	for turn := 0; b.Len() < size-200; turn++ {
		role := "user"
		if turn%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":"`, role)
		for i := 0; i < 4 && b.Len() < size-200; i++ {
			b.WriteString(line)
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`,{"role":"user","content":[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]`)
	b.WriteString(`,"max_tokens":256,"user":"session-1234"}`)
	return []byte(b.String())
}

// fullRequest is the baseline: what a gateway decoding the whole body with
// encoding/json into structs would need.
type fullRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	MaxTokens     *int   `json:"max_tokens"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Role    string `json:"role"`
		Content any    `json:"content"` // a string or a list of parts
	} `json:"messages"`
	Temperature float64           `json:"temperature"`
	Tools       []json.RawMessage `json:"tools"`
}

func BenchmarkExtract(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"1KB", chatBody(1 << 10)},
		{"32KB", chatBody(32 << 10)},
		{"32KB-plain", chatBodyOf(32<<10, plainLine)},
		{"32KB-code", chatBodyOf(32<<10, codeLine)},
	} {
		name, body := c.name, c.body
		b.Run(name+"/sonic", func(b *testing.B) {
			r := NewRequest()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Parse(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/encoding_json", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var req fullRequest
				if err := json.Unmarshal(body, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

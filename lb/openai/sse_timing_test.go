package openai

import (
	"strings"
	"testing"
)

// BenchmarkSSE splits a chat stream and counts its tokens, fed in reads of
// 61 bytes (most events span reads) and 4 KiB (most lie within one).
// b.SetBytes is the stream's size, so MB/s is relay throughput.
func BenchmarkSSE(b *testing.B) {
	stream := []byte(strings.Repeat(strings.Join(chatStream[1:4], ""), 100))
	for _, read := range []struct {
		name string
		size int
	}{{"read61B", 61}, {"read4KB", 4 << 10}} {
		b.Run(read.name, func(b *testing.B) {
			var s Splitter
			var c TokenCounter
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			events := 0
			for b.Loop() {
				s.Reset()
				c.Reset()
				for off := 0; off < len(stream); off += read.size {
					s.Feed(stream[off:min(off+read.size, len(stream))])
					for ev, ok := s.Next(); ok; ev, ok = s.Next() {
						c.Observe(ev)
						events++
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
		})
	}
}

// BenchmarkObserveBody finds the usage of a whole 1 KB chat completion, laid
// out as vLLM writes it (usage after the choices, then two more fields).
func BenchmarkObserveBody(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("lorem ipsum dolor sit amet ", 36) + `","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
		`"usage":{"prompt_tokens":256,"total_tokens":456,"completion_tokens":200,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var c TokenCounter
	for b.Loop() {
		c.Reset()
		c.ObserveBody(body)
	}
	if c.Tokens() != 200 {
		b.Fatalf("%d tokens, want 200", c.Tokens())
	}
}

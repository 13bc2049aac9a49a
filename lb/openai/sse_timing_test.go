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

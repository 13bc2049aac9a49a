package hf

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// benchText is testdata/bench.txt, 9 KB of prose in several scripts and
// code, the text bench/tokenize/ref.mjs times HF's Rust tokenizer on.
func benchText(b *testing.B) []byte {
	b.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", "bench.txt"))
	if err != nil {
		b.Fatal(err)
	}
	return text
}

// benchEncode times Append of bench.txt on tok, for each model, after one
// warm-up encode.
func benchEncode(b *testing.B, caches func(*Tokenizer) *Tokenizer) {
	text := benchText(b)
	for _, model := range []string{"qwen3", "llama3.1", "llama2"} {
		b.Run(model, func(b *testing.B) {
			tok := caches(load(b, model))
			dst := tok.Append(nil, text, false)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dst = tok.Append(dst[:0], text, false)
			}
			b.ReportMetric(float64(len(dst)), "tokens/op")
		})
	}
}

// BenchmarkEncodeCold encodes with no cache: every word goes through BPE.
func BenchmarkEncodeCold(b *testing.B) {
	benchEncode(b, func(t *Tokenizer) *Tokenizer { return withCaches(t, 0) })
}

// BenchmarkEncodeWarm encodes with the word cache warm and no segment
// cache: a new text made of known words.
func BenchmarkEncodeWarm(b *testing.B) {
	benchEncode(b, func(t *Tokenizer) *Tokenizer {
		c := withCaches(t, wordCacheBytes)
		c.segments = nil
		return c
	})
}

// BenchmarkEncodeWarmParallel is BenchmarkEncodeWarm on every core at
// once, as the event loops and workers tokenize: they share the word
// cache.
func BenchmarkEncodeWarmParallel(b *testing.B) {
	text := benchText(b)
	tok := withCaches(load(b, "qwen3"), wordCacheBytes)
	tok.segments = nil
	tok.Append(nil, text, false)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var dst []uint32
		for pb.Next() {
			dst = tok.Append(dst[:0], text, false)
		}
	})
}

// BenchmarkSegmentHit encodes a text already seen: one segment-cache hit.
func BenchmarkSegmentHit(b *testing.B) {
	benchEncode(b, func(t *Tokenizer) *Tokenizer { return withCaches(t, segmentCacheBytes) })
}

// BenchmarkChatTurn encodes a Qwen3 chat prompt of eight turns of bench.txt
// (about 9 KB) whose last user turn is new each time, as a conversation
// grows: the earlier turns are segment-cache hits.
func BenchmarkChatTurn(b *testing.B) {
	text := benchText(b)
	tok := withCaches(load(b, "qwen3"), segmentCacheBytes)
	var history []byte
	for i, n := 0, len(text)/8; i < 7; i++ {
		role := [2]string{"user", "assistant"}[i%2]
		history = fmt.Appendf(history, "<|im_start|>%s\n%s<|im_end|>\n", role, text[i*n:(i+1)*n])
	}
	last := text[7*len(text)/8:]
	prompt := make([]byte, 0, len(history)+len(last)+64)
	dst := tok.Append(nil, history, false)
	b.SetBytes(int64(len(history) + len(last)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		prompt = fmt.Appendf(append(prompt[:0], history...), "<|im_start|>user\n%d %s<|im_end|>\n<|im_start|>assistant\n", i, last)
		dst = tok.Append(dst[:0], prompt, false)
	}
}

package hf

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestAddedJump: a set whose tokens all start with one byte jumps between
// that byte's occurrences; it must find what the byte-by-byte scan of a
// set with more first bytes finds, flags and all, on texts dense with
// near misses.
func TestAddedJump(t *testing.T) {
	toks := []struct {
		content string
		tok     addedToken
	}{
		{"<|im_start|>", addedToken{id: 1}},
		{"<|im_end|>", addedToken{id: 2, rstrip: true}},
		{"<think>", addedToken{id: 3, lstrip: true}},
		{"<|im", addedToken{id: 4, singleWord: true}},
		{"<", addedToken{id: 5, singleWord: true}},
	}
	var jump, scan addedSet
	for _, x := range toks {
		jump.add(x.content, x.tok)
		scan.add(x.content, x.tok)
	}
	scan.add("\x00never", addedToken{id: 6})
	if len(jump.nodes[0].keys) != 1 || len(scan.nodes[0].keys) != 2 {
		t.Fatalf("first bytes: %q and %q", jump.nodes[0].keys, scan.nodes[0].keys)
	}
	parts := []string{"<|im_start|>", "<|im_end|>", "<think>", "<|im", "<", "<|", "a", " ", "  ", "word", "<thin", "\n", "é"}
	rng := rand.New(rand.NewPCG(1, 2))
	gap := func(dst []uint32, part []byte, first bool) []uint32 {
		dst = append(dst, 1000+uint32(len(part)))
		if first {
			dst = append(dst, 999)
		}
		return dst
	}
	for range 5000 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		text := []byte(b.String())
		if got, want := jump.split(nil, text, gap), scan.split(nil, text, gap); !slices.Equal(got, want) {
			t.Fatalf("%q: jumping %v, scanning %v", text, got, want)
		}
	}
}

// TestAppendWithin: a text with more new bytes than the bound is not
// encoded (false, dst as it came); within the bound, or once its
// segments are cached, its ids are Append's.
func TestAppendWithin(t *testing.T) {
	tok := withCaches(load(t, "qwen3"), segmentCacheBytes)
	text := []byte("<|im_start|>user\n" + strings.Repeat("Keep every figure of the report. ", 200) + "<|im_end|>\n<|im_start|>assistant\n")
	want := withCaches(tok, 0).Append(nil, text, false)
	dst := []uint32{7}
	if got, ok := tok.AppendWithin(dst, text, false, 1000); ok || !slices.Equal(got, dst) {
		t.Fatalf("over the bound: %v and %d ids, want false and dst alone", ok, len(got))
	}
	if got, ok := tok.AppendWithin(dst, text, false, len(text)); !ok || !slices.Equal(got, append([]uint32{7}, want...)) {
		t.Fatalf("within the bound: %v, %d ids, want %d", ok, len(got), len(want)+1)
	}
	// Every segment is cached now: nothing is new.
	if got, ok := tok.AppendWithin(nil, text, false, 0); !ok || !slices.Equal(got, want) {
		t.Fatalf("seen: %v, %d ids, want %d", ok, len(got), len(want))
	}
}

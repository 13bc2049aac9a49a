package kvindex

import (
	"fmt"

	"runtime"
	"testing"

	"pdlb/engines"
	"pdlb/radix"
)

// nopIndex measures the feed alone.
type nopIndex struct{}

func (nopIndex) Insert(int32, []uint64)      {}
func (nopIndex) Remove(int32, []uint64, int) {}
func (nopIndex) RemovePod(int32)             {}

func benchPod(b *testing.B, maxBlocks int) *Pod {
	b.Helper()
	return newIndexer(b, nopIndex{}, Config{MaxBlocks: maxBlocks}).Pod(0, model)
}

// BenchmarkStoredDecodeStep is the event a decoding sequence emits every
// 16 tokens: one block chained after the previous one, so the feed walks
// the whole prefix to build the chain it inserts. Sequences grow to 1,024
// blocks (16k tokens); the op is one event at the average depth, 512.
func BenchmarkStoredDecodeStep(b *testing.B) {
	p := benchPod(b, 0)
	tokens := prompt(radix.DefaultBlockSize, 1)
	hash := []uint64{0}
	depth := 0
	b.ReportAllocs()
	for b.Loop() {
		if depth == 1024 {
			p.AllBlocksCleared()
			depth = 0
		}
		parent := hash[0]
		hash[0]++
		p.BlockStored(parent, depth > 0, hash, tokens, radix.DefaultBlockSize, engines.ExtraKeys{})
		depth++
	}
}

// BenchmarkStoredPrefill is a 512-token prompt's prefill in one event, no
// parent; evicted again so the pod stays small. "plain" is 32 engine blocks
// of the gateway's 16 tokens; "salted" the same with a cache salt and an
// adapter (the seed folds them in); "multimodal" with a digest in every
// block (keyed block by block); "page1" 512 blocks of one token, as SGLang
// sends by default (each gateway key gathers the tokens of 16 blocks).
func BenchmarkStoredPrefill(b *testing.B) {
	const bs = radix.DefaultBlockSize
	media := make([]uint64, 32)
	for i := range media {
		media[i] = uint64(i + 1)
	}
	for _, c := range []struct {
		name      string
		blockSize int
		extra     engines.ExtraKeys
	}{
		{"plain", bs, engines.ExtraKeys{}},
		{"salted", bs, engines.ExtraKeys{LoRA: "sql-lora", CacheSalt: "tenant-a"}},
		{"multimodal", bs, engines.ExtraKeys{Media: media}},
		{"page1", 1, engines.ExtraKeys{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			p := benchPod(b, 0)
			tokens := prompt(32*bs, 2)
			hashes := make([]uint64, len(tokens)/c.blockSize)
			b.ReportAllocs()
			for b.Loop() {
				for i := range hashes {
					hashes[i]++
				}
				p.BlockStored(0, false, hashes, tokens, c.blockSize, c.extra)
				p.BlockRemoved(hashes)
			}
		})
	}
}

// BenchmarkMemoryPerBlock reports the heap a pod's map takes per engine
// block (runtime heap growth over 2^17 blocks in chains of 64).
func BenchmarkMemoryPerBlock(b *testing.B) {
	const blocks = 1 << 17
	tokens := prompt(64*radix.DefaultBlockSize, 3)
	hashes := make([]uint64, 64)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		p := benchPod(b, blocks)
		for c := range blocks / 64 {
			for i := range hashes {
				hashes[i] = uint64(c*64 + i + 1)
			}
			p.BlockStored(0, false, hashes, tokens, radix.DefaultBlockSize, engines.ExtraKeys{})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if p.Blocks() != blocks {
			b.Fatalf("%d blocks held, want %d", p.Blocks(), blocks)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/blocks, "B/block")
		runtime.KeepAlive(p)
	}
}

// BenchmarkRemovedEviction is an engine evicting a whole prompt, deepest
// block first (as vLLM's free queue gives them up), from a radix tree; the
// op stores the prompt again and evicts it. "joined" is the removals in one
// BlockRemoved, as the subscriber hands a run of them over; "per block" one
// call per block, as the engines send them, whose cost grows with the
// square of the prompt's length.
func BenchmarkRemovedEviction(b *testing.B) {
	for _, blocks := range []int{128, 2048} {
		for _, joined := range []bool{true, false} {
			name := fmt.Sprintf("%d-blocks/per-block", blocks)
			if joined {
				name = fmt.Sprintf("%d-blocks/joined", blocks)
			}
			b.Run(name, func(b *testing.B) { benchEviction(b, blocks, joined) })
		}
	}
}

func benchEviction(b *testing.B, blocks int, joined bool) {
	p := newIndexer(b, newTree(b), Config{}).Pod(0, model)
	tokens := prompt(blocks*radix.DefaultBlockSize, 4)
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	deepestFirst := make([]uint64, blocks)
	for i, h := range hashes {
		deepestFirst[blocks-1-i] = h
	}
	b.ReportAllocs()
	for b.Loop() {
		p.BlockStored(0, false, hashes, tokens, radix.DefaultBlockSize, engines.ExtraKeys{})
		if joined {
			p.BlockRemoved(deepestFirst)
			continue
		}
		for i := range deepestFirst {
			p.BlockRemoved(deepestFirst[i : i+1])
		}
	}
	if p.Blocks() != 0 {
		b.Fatalf("%d blocks left", p.Blocks())
	}
}

// BenchmarkLongestRank is the gateway's question for a request to a pod
// of 8 ranks: a prompt of 256 blocks (4k tokens), rank 3 holding all of
// it, the others the first half.
func BenchmarkLongestRank(b *testing.B) {
	ranks := newIndexer(b, nopIndex{}, Config{}).Ranks(0, model, 8)
	toks := prompt(256*radix.DefaultBlockSize, 1)
	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	for r, feed := range ranks {
		n := 128
		if r == 3 {
			n = 256
		}
		feed.BlockStored(0, false, hashes[:n], toks[:n*radix.DefaultBlockSize], radix.DefaultBlockSize, engines.ExtraKeys{})
	}
	keys := radix.AppendBlockKeys(nil, radix.Seed(model), toks, radix.DefaultBlockSize)
	b.ReportAllocs()
	for b.Loop() {
		if r, n, _ := ranks[0].LongestRank(keys); r != 3 || n != 256 {
			b.Fatalf("LongestRank = rank %d, %d blocks", r, n)
		}
	}
}

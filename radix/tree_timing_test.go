package radix

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The benchmark fleet: 64 pods; prompts of 2,048 tokens (128 blocks of 16)
// that start with one of 8 system prompts of 512 tokens (32 blocks), each
// with its own 1,536-token tail, until the tree holds a million blocks.
const (
	benchPods       = 64
	benchBlock      = 16
	benchPrompt     = 2048
	benchSystem     = 512
	benchSystems    = 8
	benchBlocks     = 1_000_000
	benchPromptKeys = benchPrompt / benchBlock
)

type benchFleet struct {
	seed    uint64
	systems [][]uint32
	r       *rand.Rand
	toks    []uint32
}

func newBenchFleet() *benchFleet {
	f := &benchFleet{seed: Seed("bench-model"), r: rand.New(rand.NewPCG(1, 2)), toks: make([]uint32, benchPrompt)}
	for range benchSystems {
		s := make([]uint32, benchSystem)
		for i := range s {
			s[i] = f.r.Uint32()
		}
		f.systems = append(f.systems, s)
	}
	return f
}

// prompt appends the keys of a new prompt (a random system prompt and a
// fresh tail) to dst.
func (f *benchFleet) prompt(dst []uint64) []uint64 {
	copy(f.toks, f.systems[f.r.IntN(benchSystems)])
	for i := benchSystem; i < benchPrompt; i++ {
		f.toks[i] = f.r.Uint32()
	}
	return AppendBlockKeys(dst, f.seed, f.toks, benchBlock)
}

// fill inserts new prompts, pod by pod in turn, until the tree holds
// benchBlocks blocks, and returns the last 64 prompts' keys; prompt j of
// them went to pod j.
func (f *benchFleet) fill(tr *Tree) [][]uint64 {
	keys := make([]uint64, 0, benchPromptKeys)
	last := make([][]uint64, benchPods)
	for i := 0; tr.keysInUse < benchBlocks && i < 2*benchBlocks/benchPromptKeys; i++ {
		keys = f.prompt(keys[:0])
		tr.Insert(int32(i%benchPods), keys)
		last[i%benchPods] = append(last[i%benchPods][:0], keys...)
	}
	return last
}

var bench struct {
	once          sync.Once
	tree          *Tree
	fleet         *benchFleet
	prompts       [][]uint64
	heapPerBlock  float64
	arenaPerBlock float64
}

// benchTree builds the million-block tree once per process and measures
// its memory: the live heap it added (after a GC) and its arena bytes.
func benchTree(b *testing.B) *Tree {
	bench.once.Do(func() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr, err := New(Options{MaxPods: benchPods})
		if err != nil {
			b.Fatal(err)
		}
		bench.fleet = newBenchFleet()
		bench.prompts = bench.fleet.fill(tr)
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := tr.Stats()
		promptBytes := len(bench.prompts) * benchPromptKeys * 8
		bench.heapPerBlock = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)-int64(promptBytes)) / float64(st.Blocks)
		bench.arenaPerBlock = float64(st.Bytes) / float64(st.Blocks)
		bench.tree = tr
	})
	return bench.tree
}

// BenchmarkMatch matches 2,048-token prompts (128 keys) against a tree of a
// million blocks over 64 pods. Targets: ≤ 1 µs/op, 0 allocs/op, ≤ 64 bytes
// per stored block (B/block: live heap growth while building, divided by
// distinct blocks; arena-B/block: Stats.Bytes per block).
func BenchmarkMatch(b *testing.B) {
	tr := benchTree(b)
	out := make([]int32, benchPods)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		tr.Match(bench.prompts[i&63], out)
	}
	b.StopTimer()
	if tr.Match(bench.prompts[0], out); out[0] != benchPromptKeys {
		b.Fatalf("pod 0 matched %d of its own %d keys", out[0], benchPromptKeys)
	}
	b.ReportMetric(bench.heapPerBlock, "B/block")
	b.ReportMetric(bench.arenaPerBlock, "arena-B/block")
}

// BenchmarkInsert inserts prompts into a full tree of a million blocks
// whose pods are at capacity, so every new block also evicts one (steady
// state). Prompts are made before the timer starts. Target ≤ 5 µs/op.
//
//	new:    a 128-block prompt: a cached 32-block system prompt and 96 new
//	        blocks (a prefill's BlockStored).
//	extend: 16 new blocks after a 112-block prompt the pod holds (a decode
//	        step's BlockStored; kvindex passes the chain from its start).
//	touch:  a 128-block prompt the pod already holds (recency only).
func BenchmarkInsert(b *testing.B) {
	// Room for a pod's share of the million blocks plus every system
	// prompt, which all pods hold.
	opts := Options{MaxPods: benchPods, PodCapacity: benchBlocks/benchPods + benchSystems*benchSystem/benchBlock}
	full := func(b *testing.B) (*Tree, *benchFleet, [][]uint64) {
		tr, err := New(opts)
		if err != nil {
			b.Fatal(err)
		}
		f := newBenchFleet()
		return tr, f, f.fill(tr)
	}
	b.Run("new", func(b *testing.B) {
		tr, f, _ := full(b)
		prompts := make([][]uint64, b.N)
		for i := range prompts {
			prompts[i] = f.prompt(nil)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			tr.Insert(int32(i%benchPods), prompts[i])
		}
		b.StopTimer()
		st := tr.Stats()
		b.ReportMetric(float64(st.Blocks), "blocks")
		b.ReportMetric(float64(st.Bytes)/float64(st.Blocks), "arena-B/block")
	})
	b.Run("extend", func(b *testing.B) {
		tr, f, _ := full(b)
		const stem = benchPromptKeys - 16
		bases := make([][]uint64, 1024)
		for j := range bases {
			bases[j] = f.prompt(nil)[:stem]
			tr.Insert(int32(j%benchPods), bases[j])
		}
		toks := make([]uint32, 16*benchBlock)
		prompts := make([][]uint64, b.N)
		for i := range prompts {
			base := bases[i%len(bases)]
			for t := range toks {
				toks[t] = f.r.Uint32()
			}
			prompts[i] = AppendBlockKeys(append(base[:stem:stem], make([]uint64, 0, 16)...), base[stem-1], toks, benchBlock)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			tr.Insert(int32(i%len(bases)%benchPods), prompts[i])
		}
	})
	b.Run("touch", func(b *testing.B) {
		tr, _, held := full(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			tr.Insert(int32(i&63), held[i&63])
		}
	})
}

// BenchmarkMatchParallel runs Match on every P (b.RunParallel) over the
// million-block tree, alone and while one goroutine keeps inserting fresh
// prompts and removing their tails again. ns/op is wall time per Match over
// all goroutines; ns/match is each Match's own latency (goroutine time per
// Match, which includes waiting for a CPU when goroutines outnumber them),
// to compare with BenchmarkMatch's ns/op; retries/match is how often a
// writer made a Match walk again. Target: with the writer, within 2x of
// single-goroutine Match.
func BenchmarkMatchParallel(b *testing.B) {
	tr := benchTree(b)
	for _, writer := range []bool{false, true} {
		name := "readers"
		if writer {
			name = "readers+writer"
		}
		b.Run(name, func(b *testing.B) {
			var stop atomic.Bool
			var writes atomic.Int64
			var wg sync.WaitGroup
			if writer {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f := newBenchFleet()
					keys := make([]uint64, 0, benchPromptKeys)
					for i := 0; !stop.Load(); i++ {
						keys = f.prompt(keys[:0])
						pod := int32(i % benchPods)
						tr.Insert(pod, keys)
						tr.Remove(pod, keys, len(keys)-benchSystem/benchBlock)
						writes.Add(2)
					}
				}()
			}
			var busy, matches atomic.Int64
			retries0 := tr.Stats().MatchRetries
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				out := make([]int32, benchPods)
				n := 0
				t0 := time.Now()
				for i := 0; pb.Next(); i++ {
					tr.Match(bench.prompts[i&63], out)
					n++
				}
				busy.Add(int64(time.Since(t0)))
				matches.Add(int64(n))
			})
			elapsed := time.Since(start)
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			b.ReportMetric(float64(busy.Load())/float64(matches.Load()), "ns/match")
			b.ReportMetric(float64(tr.Stats().MatchRetries-retries0)/float64(matches.Load()), "retries/match")
			if writer {
				b.ReportMetric(float64(writes.Load())/elapsed.Seconds(), "writes/s")
			}
		})
	}
}

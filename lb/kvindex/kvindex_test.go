package kvindex

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"pdlb/engines"
	"pdlb/radix"
)

// fakeIndex records the keys each pod holds and every call. Its mutex
// makes it safe for concurrent writers, as Index requires.
type fakeIndex struct {
	mu      sync.Mutex
	held    map[int32]map[uint64]bool
	inserts [][]uint64
	removes [][]uint64
	podRems []int32
}

func newFake() *fakeIndex { return &fakeIndex{held: map[int32]map[uint64]bool{}} }

func (f *fakeIndex) Insert(pod int32, keys []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inserts = append(f.inserts, slices.Clone(keys))
	if f.held[pod] == nil {
		f.held[pod] = map[uint64]bool{}
	}
	for _, k := range keys {
		f.held[pod][k] = true
	}
}

// Remove records the keys of the blocks removed: chain's last n.
func (f *fakeIndex) Remove(pod int32, chain []uint64, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := chain[len(chain)-n:]
	f.removes = append(f.removes, slices.Clone(keys))
	for _, k := range keys {
		delete(f.held[pod], k)
	}
}

func (f *fakeIndex) RemovePod(pod int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.podRems = append(f.podRems, pod)
	delete(f.held, pod)
}

// match is the naive Match: how many leading keys pod holds.
func (f *fakeIndex) match(pod int32, keys []uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range keys {
		if !f.held[pod][k] {
			return i
		}
	}
	return len(keys)
}

const model = "m"

// prompt returns n tokens, distinct per salt.
func prompt(n int, salt uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = salt<<16 | uint32(i)
	}
	return t
}

// gatewayKeys is what the gateway computes for tokens.
func gatewayKeys(tokens []uint32, blockSize int) []uint64 {
	return radix.AppendBlockKeys(nil, radix.Seed(model), tokens, blockSize)
}

// newIndexer returns New(idx, cfg), failing the test on an error.
func newIndexer(tb testing.TB, idx Index, cfg Config) *Indexer {
	tb.Helper()
	ix, err := New(idx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return ix
}

// newTree returns an empty radix tree with the default options.
func newTree(tb testing.TB) *radix.Tree {
	tb.Helper()
	tree, err := radix.New(radix.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return tree
}

func newPod(t *testing.T, cfg Config) (*fakeIndex, *Pod) {
	t.Helper()
	f := newFake()
	return f, newIndexer(t, f, cfg).Pod(7, model)
}

func TestStoredKeysAreTheGatewaysKeys(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	tokens := prompt(20, 1) // 5 blocks of 4
	want := gatewayKeys(tokens, 4)

	// The engine stores the prompt in two events: blocks 0-1 start it,
	// blocks 2-4 chain after engine block 1. Engine hashes are arbitrary.
	p.BlockStored(0, false, []uint64{900, 901}, tokens[:8], 4, engines.ExtraKeys{})
	p.BlockStored(901, true, []uint64{902, 903, 904}, tokens[8:], 4, engines.ExtraKeys{})
	if !slices.Equal(f.inserts[0], want[:2]) || !slices.Equal(f.inserts[1], want) {
		t.Fatalf("inserted %x, want chains %x and %x", f.inserts, want[:2], want)
	}
	if got := f.match(7, want); got != 5 {
		t.Fatalf("match = %d, want 5", got)
	}
	// A second prompt sharing the first 3 blocks branches from engine
	// block 902.
	other := append(slices.Clone(tokens[:12]), prompt(4, 2)...)
	p.BlockStored(902, true, []uint64{950}, other[12:], 4, engines.ExtraKeys{})
	if got := f.match(7, gatewayKeys(other, 4)); got != 4 {
		t.Fatalf("branch match = %d, want 4", got)
	}
	if p.Blocks() != 6 || p.Counters.Stored.Load() != 6 {
		t.Fatalf("blocks %d stored %d, want 6 6", p.Blocks(), p.Counters.Stored.Load())
	}
}

func TestRemovalByEngineHash(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	tokens := prompt(12, 1)
	keys := gatewayKeys(tokens, 4)
	p.BlockStored(0, false, []uint64{10, 11, 12}, tokens, 4, engines.ExtraKeys{})

	p.BlockRemoved([]uint64{12, 999}) // 999 is unknown: ignored
	if !slices.Equal(f.removes[0], keys[2:3]) {
		t.Fatalf("removed %x, want %x", f.removes[0], keys[2:3])
	}
	if got := f.match(7, keys); got != 2 {
		t.Fatalf("match = %d, want 2", got)
	}
	p.BlockRemoved([]uint64{12}) // twice: nothing more
	if len(f.removes) != 1 {
		t.Fatalf("a second removal of the same block wrote %x", f.removes[1:])
	}
	if p.Blocks() != 2 || len(p.byHash) != 2 {
		t.Fatalf("blocks %d map %d, want 2 2", p.Blocks(), len(p.byHash))
	}
}

// vLLM does not deduplicate cached blocks: a block computed again (the
// last block of a repeated block-aligned prompt, or one two requests
// computed at once) is a second physical copy under the same hash, stored
// and evicted with an event each. The block stays until its last copy goes.
func TestCopiesOfABlock(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	tokens := prompt(12, 1)
	keys := gatewayKeys(tokens, 4)
	p.BlockStored(0, false, []uint64{10, 11, 12}, tokens, 4, engines.ExtraKeys{})
	p.BlockStored(11, true, []uint64{12}, tokens[8:], 4, engines.ExtraKeys{})

	p.BlockRemoved([]uint64{12})
	if got := f.match(7, keys); got != 3 || p.Blocks() != 3 {
		t.Fatalf("one of two copies evicted: match %d blocks %d, want 3 3", got, p.Blocks())
	}
	p.BlockRemoved([]uint64{12})
	if got := f.match(7, keys); got != 2 || p.Blocks() != 2 {
		t.Fatalf("both copies evicted: match %d blocks %d, want 2 2", got, p.Blocks())
	}
	// Stored again after its last copy went, it is one copy again.
	p.BlockStored(11, true, []uint64{12}, tokens[8:], 4, engines.ExtraKeys{})
	p.BlockRemoved([]uint64{12})
	if got := f.match(7, keys); got != 2 {
		t.Fatalf("revived and evicted: match %d, want 2", got)
	}
}

// vLLM's per-request kv_cache_report_mode "full" also reports a prefix-cache
// hit as a BlockStored from the prompt's first block, for blocks the engine
// holds and evicts once each: the report is no copy, and the blocks go with
// their one BlockRemoved.
func TestHitReportsAreNoCopies(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	tokens := prompt(20, 1)
	keys := gatewayKeys(tokens, 4)
	p.BlockStored(0, false, []uint64{10, 11, 12}, tokens[:12], 4, engines.ExtraKeys{})
	// A longer prompt hits three blocks and computes two more.
	p.BlockStored(0, false, []uint64{10, 11, 12}, tokens[:12], 4, engines.ExtraKeys{})
	p.BlockStored(12, true, []uint64{13, 14}, tokens[12:], 4, engines.ExtraKeys{})
	if got := f.match(7, keys); got != 5 || p.Blocks() != 5 {
		t.Fatalf("after the report: match %d blocks %d, want 5 5", got, p.Blocks())
	}
	p.BlockRemoved([]uint64{14, 13, 12, 11, 10})
	if got := f.match(7, keys); got != 0 || p.Blocks() != 0 {
		t.Fatalf("every block evicted: match %d blocks %d, want 0 0", got, p.Blocks())
	}
}

// A freed slot is reused for a new block: its keys are the new block's,
// and engines whose blocks are the gateway's size keep no tokens (the
// reuse panicked there, slicing the empty token table).
func TestSlotReuse(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	first := prompt(12, 1)
	p.BlockStored(0, false, []uint64{10, 11, 12}, first, 4, engines.ExtraKeys{})
	p.BlockRemoved([]uint64{12, 11, 10})
	second := prompt(8, 2)
	p.BlockStored(0, false, []uint64{20, 21}, second, 4, engines.ExtraKeys{})
	if got := f.match(7, gatewayKeys(second, 4)); got != 2 || f.match(7, gatewayKeys(first, 4)) != 0 {
		t.Fatalf("after reuse: match %d of the new prompt, %d of the removed one", got, f.match(7, gatewayKeys(first, 4)))
	}
	if p.Blocks() != 2 {
		t.Fatalf("blocks %d, want 2", p.Blocks())
	}
}

func TestBlockSizeSplitting(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	tokens := prompt(32, 3)
	keys := gatewayKeys(tokens, 4) // 8 gateway blocks
	// Engine blocks of 16 tokens: each maps to 4 gateway keys.
	p.BlockStored(0, false, []uint64{1}, tokens[:16], 16, engines.ExtraKeys{})
	p.BlockStored(1, true, []uint64{2}, tokens[16:], 16, engines.ExtraKeys{})
	if got := f.match(7, keys); got != 8 {
		t.Fatalf("match = %d, want 8", got)
	}
	p.BlockRemoved([]uint64{2})
	if !slices.Equal(f.removes[0], keys[4:]) {
		t.Fatalf("removed %x, want %x", f.removes[0], keys[4:])
	}
	if got := f.match(7, keys); got != 4 {
		t.Fatalf("match after removal = %d, want 4", got)
	}
}

func TestDroppedEvents(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	p.BlockStored(0, false, []uint64{1}, prompt(6, 1), 6, engines.ExtraKeys{}) // 6 is not a multiple of 4
	p.BlockStored(0, false, []uint64{1}, prompt(7, 1), 4, engines.ExtraKeys{}) // 7 tokens for one block of 4
	p.BlockStored(0, false, []uint64{1, 2}, prompt(8, 1), 4, engines.ExtraKeys{})
	p.BlockStored(2, true, []uint64{3}, prompt(8, 2), 8, engines.ExtraKeys{})  // block size changed
	p.BlockStored(77, true, []uint64{4}, prompt(4, 3), 4, engines.ExtraKeys{}) // parent unknown
	if m, o := p.Counters.Mismatched.Load(), p.Counters.Orphans.Load(); m != 3 || o != 1 {
		t.Fatalf("mismatched %d orphans %d, want 3 1", m, o)
	}
	if len(f.inserts) != 1 || p.Blocks() != 2 {
		t.Fatalf("inserts %d blocks %d, want 1 2", len(f.inserts), p.Blocks())
	}
}

func TestClear(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	p.BlockStored(0, false, []uint64{1, 2}, prompt(8, 1), 4, engines.ExtraKeys{})
	p.AllBlocksCleared()
	if !slices.Equal(f.podRems, []int32{7}) || len(f.held[7]) != 0 {
		t.Fatalf("RemovePod calls %v, held %v", f.podRems, f.held[7])
	}
	if p.Blocks() != 0 || len(p.byHash) != 0 || len(p.slots) != 0 {
		t.Fatalf("state left after clear: blocks %d map %d slots %d", p.Blocks(), len(p.byHash), len(p.slots))
	}
	// The old chain is gone: a child of block 2 cannot be keyed.
	p.BlockStored(2, true, []uint64{3}, prompt(4, 2), 4, engines.ExtraKeys{})
	if p.Counters.Orphans.Load() != 1 {
		t.Fatalf("orphans = %d, want 1", p.Counters.Orphans.Load())
	}
	// After a clear the block size may change (a restarted engine).
	p.BlockStored(0, false, []uint64{5}, prompt(8, 3), 8, engines.ExtraKeys{})
	if p.Blocks() != 1 || p.Counters.Mismatched.Load() != 0 {
		t.Fatalf("blocks %d mismatched %d after re-store", p.Blocks(), p.Counters.Mismatched.Load())
	}
}

func TestParentRemovedBeforeChild(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4})
	tokens := prompt(16, 1)
	keys := gatewayKeys(tokens, 4)
	p.BlockStored(0, false, []uint64{1, 2}, tokens[:8], 4, engines.ExtraKeys{})
	p.BlockRemoved([]uint64{1}) // the root goes first: a tombstone keeps the chain
	if p.Blocks() != 1 || len(p.slots)-len(p.free) != 2 {
		t.Fatalf("blocks %d slots in use %d, want 1 2", p.Blocks(), len(p.slots)-len(p.free))
	}
	// A child of block 2 is still keyed through the tombstone.
	p.BlockStored(2, true, []uint64{3}, tokens[8:12], 4, engines.ExtraKeys{})
	if !slices.Equal(f.inserts[len(f.inserts)-1], keys[:3]) {
		t.Fatalf("chain through tombstone %x, want %x", f.inserts[len(f.inserts)-1], keys[:3])
	}
	// Removing the leaves frees everything, tombstone included.
	p.BlockRemoved([]uint64{3, 2})
	if p.Blocks() != 0 || len(p.byHash) != 0 || len(p.slots) != len(p.free) {
		t.Fatalf("blocks %d map %d slots %d free %d, want all released", p.Blocks(), len(p.byHash), len(p.slots), len(p.free))
	}
	// Freed slots are reused with their keys overwritten.
	p.BlockStored(0, false, []uint64{4}, tokens[:4], 4, engines.ExtraKeys{})
	if got := f.match(7, keys); got != 1 || len(p.slots) != 3 {
		t.Fatalf("match %d slots %d after reuse, want 1 3", got, len(p.slots))
	}
}

func TestMaxBlocks(t *testing.T) {
	f, p := newPod(t, Config{BlockSize: 4, MaxBlocks: 3})
	p.BlockStored(0, false, []uint64{1, 2}, prompt(8, 1), 4, engines.ExtraKeys{})
	p.BlockStored(2, true, []uint64{3}, prompt(4, 2), 4, engines.ExtraKeys{})
	p.BlockStored(0, false, []uint64{4}, prompt(4, 3), 4, engines.ExtraKeys{}) // a fourth block: over the bound
	if p.Counters.Overflows.Load() != 1 || !slices.Equal(f.podRems, []int32{7}) {
		t.Fatalf("overflows %d RemovePod %v, want 1 [7]", p.Counters.Overflows.Load(), f.podRems)
	}
	if p.Blocks() != 1 || f.match(7, gatewayKeys(prompt(4, 3), 4)) != 1 {
		t.Fatalf("blocks %d after overflow, want the new block alone", p.Blocks())
	}
	p.BlockStored(0, false, []uint64{5, 6}, prompt(8, 4), 4, engines.ExtraKeys{})
	p.BlockStored(6, true, []uint64{7}, prompt(4, 5), 4, engines.ExtraKeys{}) // over again, and its parent goes with the clear
	if p.Counters.Overflows.Load() != 2 || p.Counters.Orphans.Load() != 1 || p.Blocks() != 0 {
		t.Fatalf("overflows %d orphans %d blocks %d, want 2 1 0",
			p.Counters.Overflows.Load(), p.Counters.Orphans.Load(), p.Blocks())
	}
}

func TestConfigValidate(t *testing.T) {
	f := func(cfg Config, want string) {
		t.Helper()
		_, err := New(newFake(), cfg)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("New(%+v) err = %v, want it to mention %q", cfg, err, want)
		}
	}
	f(Config{BlockSize: -1}, "BlockSize -1")
	f(Config{MaxBlocks: -2}, "MaxBlocks -2")
	ix, err := New(newFake(), Config{})
	if err != nil || ix.cfg.BlockSize != radix.DefaultBlockSize || ix.cfg.MaxBlocks != DefaultMaxBlocks {
		t.Fatalf("defaults: %+v, %v", ix.cfg, err)
	}
}

// TestRemovalsShareAChain removes blocks that share a chain in one event,
// in any order, from a real tree: each block is named by its chain, built
// while the slots it runs through are held, and runs of blocks next to each
// other in one chain go in one Remove. Engine blocks 1-2-3-4 are one
// prompt; 5 branches off after 2.
func TestRemovalsShareAChain(t *testing.T) {
	tokens := prompt(16, 1)
	branch := append(slices.Clone(tokens[:8]), prompt(4, 2)...)
	for _, c := range []struct {
		removed []uint64
		match   [2]int // leading blocks still held of each prompt
		calls   int    // Remove calls
	}{
		{[]uint64{2, 3}, [2]int{1, 1}, 1},
		{[]uint64{3, 2}, [2]int{1, 1}, 1},
		{[]uint64{1, 2, 3}, [2]int{0, 0}, 1},
		{[]uint64{4, 3}, [2]int{2, 3}, 1},
		{[]uint64{3, 5, 2}, [2]int{1, 1}, 2},
		{[]uint64{4, 5, 3, 2, 1}, [2]int{0, 0}, 3},
		{[]uint64{2, 4, 3, 1, 5}, [2]int{0, 0}, 4},
	} {
		tree := newTree(t)
		f := newFake()
		ix := newIndexer(t, both{f, tree}, Config{BlockSize: 4})
		p := ix.Pod(7, model)
		p.BlockStored(0, false, []uint64{1, 2, 3, 4}, tokens, 4, engines.ExtraKeys{})
		p.BlockStored(2, true, []uint64{5}, branch[8:], 4, engines.ExtraKeys{})
		p.BlockRemoved(c.removed)
		for i, keys := range [][]uint64{gatewayKeys(tokens, 4), gatewayKeys(branch, 4)} {
			out := make([]int32, 8)
			tree.Match(keys, out)
			if got := f.match(7, keys); out[7] != int32(c.match[i]) || got != c.match[i] {
				t.Fatalf("removing %v: prompt %d: tree matches %d blocks, fake %d, want %d", c.removed, i, out[7], got, c.match[i])
			}
		}
		if len(f.removes) != c.calls {
			t.Fatalf("removing %v: %d Remove calls %x, want %d", c.removed, len(f.removes), f.removes, c.calls)
		}
		if st := tree.Stats(); st.PodBlocks[7] != 5-len(c.removed) {
			t.Fatalf("removing %v: the tree holds %d blocks, want %d", c.removed, st.PodBlocks[7], 5-len(c.removed))
		}
	}
}

// TestRanksKeepEachOthersBlocks: the ranks of a data-parallel pod cache
// alone, each with its own events, and often the same prompt under the
// same engine hashes (one PYTHONHASHSEED). The pod holds a block while any
// rank does: one rank's eviction or clear leaves the other's copy in the
// index.
func TestRanksKeepEachOthersBlocks(t *testing.T) {
	tree := newTree(t)
	f := newFake()
	ix := newIndexer(t, both{f, tree}, Config{BlockSize: 4})
	ranks := ix.Ranks(7, model, 2)
	shared, other := prompt(12, 1), prompt(8, 2)
	match := func(tokens []uint32, want int) {
		t.Helper()
		keys := gatewayKeys(tokens, 4)
		out := make([]int32, 8)
		tree.Match(keys, out)
		if got := f.match(7, keys); out[7] != int32(want) || got != want {
			t.Fatalf("tree matches %d blocks, fake %d, want %d", out[7], got, want)
		}
	}
	for _, r := range ranks {
		r.BlockStored(0, false, []uint64{10, 11, 12}, shared, 4, engines.ExtraKeys{})
	}
	ranks[1].BlockStored(0, false, []uint64{20, 21}, other, 4, engines.ExtraKeys{})
	match(shared, 3)

	ranks[1].BlockRemoved([]uint64{12, 11, 10})
	match(shared, 3)
	ranks[1].BlockStored(0, false, []uint64{10, 11, 12}, shared, 4, engines.ExtraKeys{})
	ranks[1].BlockStored(11, true, []uint64{12}, shared[8:], 4, engines.ExtraKeys{}) // a second copy: the clear takes both
	ranks[1].AllBlocksCleared()
	match(other, 0)
	match(shared, 3)

	ranks[0].BlockRemoved([]uint64{12})
	match(shared, 2)
	ranks[0].AllBlocksCleared()
	match(shared, 0)
}

// TestLongestRank: of a pod's ranks a and b, LongestRank names the one
// holding the longest prefix, on a pod of three ranks and on one of 200,
// whose ranks span words of the rank mask.
func TestLongestRank(t *testing.T) {
	for _, c := range []struct{ n, a, b int }{{3, 0, 1}, {200, 70, 199}} {
		ix := newIndexer(t, newTree(t), Config{BlockSize: 4})
		ranks := ix.Ranks(7, model, c.n)
		a, b := ranks[c.a], ranks[c.b]
		toks := prompt(16, 1)
		keys := gatewayKeys(toks, 4)
		want := func(rank, blocks, next int) {
			t.Helper()
			if r, bl, n := ranks[2].LongestRank(keys); r != rank || bl != blocks || n != next {
				t.Fatalf("%d ranks: LongestRank = rank %d, %d blocks, next %d; want rank %d, %d, %d", c.n, r, bl, n, rank, blocks, next)
			}
		}
		want(-1, 0, 0)
		a.BlockStored(0, false, []uint64{10, 11}, toks[:8], 4, engines.ExtraKeys{})
		want(c.a, 2, 0)
		b.BlockStored(0, false, []uint64{20, 21, 22}, toks[:12], 4, engines.ExtraKeys{})
		want(c.b, 3, 2)
		a.BlockStored(11, true, []uint64{12, 13}, toks[8:], 4, engines.ExtraKeys{})
		want(c.a, 4, 3)
		a.BlockRemoved([]uint64{13})
		want(-1, 0, 0) // a and b hold three blocks each
		// The same tokens under other engine hashes: b holds its keys
		// twice, and keeps them when one of its copies goes.
		b.BlockStored(0, false, []uint64{30, 31, 32, 33}, toks, 4, engines.ExtraKeys{})
		b.BlockRemoved([]uint64{20, 21, 22})
		want(c.b, 4, 3)
		b.AllBlocksCleared()
		want(c.a, 3, 0)
		// Keys gone and held again (a wide mask's words reused).
		a.AllBlocksCleared()
		want(-1, 0, 0)
		b.BlockStored(0, false, []uint64{40}, toks[:4], 4, engines.ExtraKeys{})
		want(c.b, 1, 0)
		if n := testing.AllocsPerRun(100, func() { a.LongestRank(keys) }); n != 0 {
			t.Fatalf("%d ranks: LongestRank allocates %v times", c.n, n)
		}
	}
	ix := newIndexer(t, newTree(t), Config{BlockSize: 4})
	if r, _, _ := ix.Ranks(8, model, MaxRankedRanks+1)[0].LongestRank(gatewayKeys(prompt(16, 1), 4)); r != -1 {
		t.Fatalf("a pod of %d ranks: LongestRank = rank %d, want -1", MaxRankedRanks+1, r)
	}
}

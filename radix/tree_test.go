package radix

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// chain returns the block keys of a prompt of one-token blocks, so tests
// can write prompts as token lists and prefixes share keys.
func chain(toks ...uint32) []uint64 { return AppendBlockKeys(nil, 1, toks, 1) }

func seq(from, n uint32) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = from + uint32(i)
	}
	return s
}

func cat(parts ...[]uint32) []uint32 {
	var s []uint32
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

func newTree(t testing.TB, opts Options) *Tree {
	t.Helper()
	tr, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestOptionsValidate(t *testing.T) {
	f := func(o Options, want string) {
		t.Helper()
		_, err := New(o)
		switch {
		case want == "" && err != nil:
			t.Fatalf("New(%+v) = %v, want no error", o, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("New(%+v) = %v, want an error containing %q", o, err, want)
		}
	}
	f(Options{}, "")
	f(Options{MaxPods: 1, PodCapacity: 1}, "")
	f(Options{MaxPods: 1024}, "")
	f(Options{MaxPods: MaxPodsLimit}, "")
	f(Options{MaxPods: -1}, "Options.MaxPods = -1")
	f(Options{MaxPods: MaxPodsLimit + 1}, "Options.MaxPods = 4097")
	f(Options{PodCapacity: -5}, "Options.PodCapacity = -5")
}

func TestDefaults(t *testing.T) {
	tr := newTree(t, Options{})
	if tr.maxPods != DefaultMaxPods || tr.words != 1 || tr.capacity != 0 {
		t.Fatalf("zero Options gave %d pods, %d words, capacity %d", tr.maxPods, tr.words, tr.capacity)
	}
	if got := len(newTree(t, Options{MaxPods: 1024}).holders(root)); got != 16 {
		t.Fatalf("a 1024-pod tree has %d words per node, want 16", got)
	}
}

// op is one step of a scenario: insert, remove or clear a pod.
type op struct {
	kind byte // 'i', 'r', 'c'
	pod  int32
	toks []uint32 // the chain for 'i'; the blocks (by position in it) for 'r' come from pick
	pick []int
}

func ins(pod int32, toks ...uint32) op { return op{kind: 'i', pod: pod, toks: toks} }
func rem(pod int32, toks []uint32, pick ...int) op {
	return op{kind: 'r', pod: pod, toks: toks, pick: pick}
}
func clr(pod int32) op { return op{kind: 'c', pod: pod} }

// run applies ops to a fresh tree and to the model, checking invariants
// after each, and returns the tree.
func run(t *testing.T, opts Options, ops []op) (*Tree, *model) {
	t.Helper()
	tr := newTree(t, opts)
	m := newModel(tr.maxPods, opts.PodCapacity)
	for _, o := range ops {
		keys := chain(o.toks...)
		switch o.kind {
		case 'i':
			tr.Insert(o.pod, keys)
			m.insert(o.pod, keys)
		case 'r':
			for _, i := range o.pick {
				tr.Remove(o.pod, keys[:i+1], 1)
				m.remove(o.pod, keys[:i+1], 1)
			}
		case 'c':
			tr.RemovePod(o.pod)
			m.removePod(o.pod)
		}
		check(t, tr, m)
	}
	return tr, m
}

func TestScenarios(t *testing.T) {
	a := seq(100, 10)                  // a 10-block prompt
	b := cat(seq(100, 5), seq(200, 5)) // shares a's first 5 blocks
	c := seq(300, 3)
	// f runs ops, then matches each query against the model and checks the
	// tree's node and block counts.
	f := func(name string, opts Options, ops []op, queries [][]uint32, nodes, blocks int) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			tr, m := run(t, opts, ops)
			for _, q := range queries {
				agree(t, tr, m, chain(q...))
			}
			if st := tr.Stats(); st.Nodes != nodes || st.Blocks != blocks {
				t.Fatalf("%d nodes, %d blocks; want %d, %d", st.Nodes, st.Blocks, nodes, blocks)
			}
		})
	}
	f("one chain is one node", Options{}, []op{ins(0, a...)}, [][]uint32{a, b, a[:3]}, 1, 10)
	f("shorter insert splits for recency", Options{}, []op{ins(0, a...), ins(0, a[:4]...)}, [][]uint32{a}, 2, 10)
	f("divergence splits the edge", Options{}, []op{ins(0, a...), ins(1, b...)}, [][]uint32{a, b}, 3, 15)
	f("same chain, two pods, one node", Options{}, []op{ins(0, a...), ins(1, a...)}, [][]uint32{a}, 1, 10)
	f("prefix held by another pod", Options{}, []op{ins(0, a...), ins(1, a[:6]...)}, [][]uint32{a, a[:8]}, 2, 10)
	f("remove in the middle of an edge", Options{},
		[]op{ins(0, a...), ins(1, a...), rem(0, a, 4)}, [][]uint32{a}, 3, 10)
	f("removing the neighbour merges the gap", Options{},
		[]op{ins(0, a...), ins(1, a...), rem(0, a, 4), rem(0, a, 5)}, [][]uint32{a}, 3, 10)
	f("removes in any order merge back", Options{},
		[]op{ins(0, a...), ins(1, a...), rem(0, a, 7, 5, 6, 4)}, [][]uint32{a}, 3, 10)
	f("reinsert heals the split", Options{},
		[]op{ins(0, a...), ins(1, a...), rem(0, a, 4), ins(0, a...)}, [][]uint32{a}, 1, 10)
	f("gap keeps deeper blocks for later", Options{},
		[]op{ins(0, a...), rem(0, a, 2), ins(0, a[:3]...)}, [][]uint32{a}, 2, 10)
	f("last holder leaving frees the blocks", Options{},
		[]op{ins(0, a...), ins(1, b...), rem(1, b, 5, 6, 7, 8, 9)}, [][]uint32{a, b}, 2, 10)
	f("unknown keys are ignored", Options{},
		[]op{ins(0, a...), rem(0, c, 0, 1, 2), rem(1, a, 0, 1)}, [][]uint32{a}, 1, 10)
	// b's shared head and its tail now agree, but their labels were
	// stored apart, so they stay two nodes (merges never copy keys).
	f("RemovePod", Options{},
		[]op{ins(0, a...), ins(1, b...), ins(2, c...), clr(0)}, [][]uint32{a, b, c}, 3, 13)
	f("RemovePod of every pod empties the tree", Options{},
		[]op{ins(0, a...), ins(1, b...), clr(1), clr(0)}, [][]uint32{a, b}, 0, 0)
	f("eviction drops the oldest chain's deepest blocks", Options{PodCapacity: 12},
		[]op{ins(0, a...), ins(0, c...)}, [][]uint32{a, c}, 2, 12)
	f("eviction order follows use", Options{PodCapacity: 13},
		[]op{ins(0, a...), ins(0, c...), ins(0, a[:2]...), ins(0, seq(400, 4)...)}, [][]uint32{a, c, seq(400, 4)}, 4, 13)
	f("a chain longer than capacity keeps its head", Options{PodCapacity: 4},
		[]op{ins(0, a...)}, [][]uint32{a}, 1, 4)
	f("eviction of one pod leaves the others", Options{PodCapacity: 10},
		[]op{ins(1, a...), ins(0, a...), ins(0, c...)}, [][]uint32{a, c}, 3, 13)
	f("wide trees", Options{MaxPods: 1024},
		[]op{ins(1000, a...), ins(64, b...), ins(1023, a[:3]...), rem(64, b, 0)}, [][]uint32{a, b}, 5, 15)
}

func TestMatchOutWidth(t *testing.T) {
	tr := newTree(t, Options{MaxPods: 70})
	a := chain(seq(1, 8)...)
	tr.Insert(69, a)
	tr.Insert(3, a[:2])
	f := func(n int, want []int32) {
		t.Helper()
		out := make([]int32, n)
		for i := range out {
			out[i] = -7
		}
		tr.Match(a, out)
		for p := range out {
			if out[p] != want[p] {
				t.Fatalf("out[%d] = %d, want %d (len(out) = %d)", p, out[p], want[p], n)
			}
		}
	}
	want := make([]int32, 80)
	want[3], want[69] = 2, 8
	f(0, want)
	f(3, want)
	f(4, want)
	f(64, want)
	f(70, want)
	f(80, want) // pods beyond MaxPods hold nothing
	out := make([]int32, 70)
	tr.Match(nil, out)
	for p, d := range out {
		if d != 0 {
			t.Fatalf("empty prompt: pod %d has %d", p, d)
		}
	}
}

func TestLongChainSpansNodes(t *testing.T) {
	tr, m := run(t, Options{}, []op{ins(0, seq(0, 2*poolLen+5)...), ins(1, seq(0, poolLen+1)...)})
	agree(t, tr, m, chain(seq(0, 2*poolLen+5)...))
	if st := tr.Stats(); st.Nodes != 4 || st.Blocks != 2*poolLen+5 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEvacuation(t *testing.T) {
	// Fill several label chunks, then free 90% of each chain batch: sparse
	// chunks must be emptied and reused, so the arena stops growing.
	tr := newTree(t, Options{})
	m := newModel(tr.maxPods, 0)
	var keep [][]uint64
	stored := 0
	for round := range 6 {
		var batch [][]uint64
		for i := range 200 {
			k := chain(uint32(round), uint32(i), 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7)
			tr.Insert(int32(i%64), k)
			m.insert(int32(i%64), k)
			batch = append(batch, k)
			stored += len(k)
		}
		for i, k := range batch {
			if i%10 == 0 {
				keep = append(keep, k)
				continue
			}
			tr.Remove(int32(i%64), k, len(k))
			m.remove(int32(i%64), k, len(k))
		}
		check(t, tr, m)
	}
	for _, k := range keep {
		agree(t, tr, m, k)
	}
	// Chunks in use, the fill chunk aside, are at most one per
	// evacuateBelow keys.
	blocks := tr.Stats().Blocks
	inUse := len(tr.pool) - len(tr.freeChunks)
	if inUse > 1+(blocks+evacuateBelow-1)/evacuateBelow || len(tr.pool) >= stored/poolLen {
		t.Fatalf("%d label chunks (%d free) hold %d keys; %d keys were stored in all", len(tr.pool), len(tr.freeChunks), blocks, stored)
	}
}

// TestRandomAgainstModel drives the tree and the naive model with 100,000
// random operations over 64 pods and compares every Match.
func TestRandomAgainstModel(t *testing.T) {
	for _, capacity := range []int{0, 48} {
		ops := 100_000
		if testing.Short() {
			ops = 10_000
		}
		t.Run("capacity="+strconv.Itoa(capacity), func(t *testing.T) {
			randomOps(t, rand.New(rand.NewPCG(1, uint64(capacity))), Options{MaxPods: 64, PodCapacity: capacity}, ops)
		})
	}
}

// prompts makes random prompts that share prefixes: each new one copies a
// random prefix of an earlier one and appends random tokens from a small
// alphabet, so chains diverge at every depth and meet again in the tree.
type prompts struct {
	r    *rand.Rand
	seen [][]uint32
}

func (g *prompts) next() []uint32 {
	var p []uint32
	if len(g.seen) > 0 && g.r.IntN(4) != 0 {
		base := g.seen[g.r.IntN(len(g.seen))]
		p = append(p, base[:g.r.IntN(len(base)+1)]...)
	}
	for n := 1 + g.r.IntN(12); n > 0; n-- {
		p = append(p, uint32(g.r.IntN(4)))
	}
	if len(g.seen) < 500 {
		g.seen = append(g.seen, p)
	} else {
		g.seen[g.r.IntN(len(g.seen))] = p
	}
	return p
}

func (g *prompts) old() []uint32 {
	if len(g.seen) == 0 {
		return g.next()
	}
	return g.seen[g.r.IntN(len(g.seen))]
}

// keysOf returns the keys of toks: their chain, or one time in ten the
// tokens themselves, which are not a chain (keys repeat within and across
// sequences; each sequence is still its own path).
func keysOf(r *rand.Rand, toks []uint32) []uint64 {
	if r.IntN(10) != 0 {
		return chain(toks...)
	}
	keys := make([]uint64, len(toks))
	for i, tok := range toks {
		keys[i] = uint64(tok)
	}
	return keys
}

func randomOps(t *testing.T, r *rand.Rand, opts Options, n int) {
	tr := newTree(t, opts)
	m := newModel(opts.MaxPods, opts.PodCapacity)
	g := &prompts{r: r}
	for i := range n {
		// A few busy pods share most chains; the rest are spread thin.
		pod := int32(r.IntN(8))
		if r.IntN(4) == 0 {
			pod = int32(r.IntN(opts.MaxPods))
		}
		switch k := r.IntN(100); {
		case k < 55:
			toks := g.old()
			if r.IntN(3) == 0 {
				toks = g.next()
			}
			keys := keysOf(r, toks)
			tr.Insert(pod, keys)
			m.insert(pod, keys)
		case k < 95:
			keys := keysOf(r, g.old())
			switch r.IntN(3) {
			case 0: // a tail, as an engine evicts
				n := 1 + r.IntN(len(keys))
				tr.Remove(pod, keys, n)
				m.remove(pod, keys, n)
			case 1: // a stretch in the middle
				from := r.IntN(len(keys))
				to := from + 1 + r.IntN(len(keys)-from)
				tr.Remove(pod, keys[:to], to-from)
				m.remove(pod, keys[:to], to-from)
			default: // any blocks, in any order
				for _, j := range r.Perm(len(keys)) {
					if r.IntN(2) == 0 {
						tr.Remove(pod, keys[:j+1], 1)
						m.remove(pod, keys[:j+1], 1)
					}
				}
			}
		default:
			tr.RemovePod(pod)
			m.removePod(pod)
		}
		agree(t, tr, m, keysOf(r, g.old()))
		if i%5000 == 0 {
			check(t, tr, m)
		}
	}
	check(t, tr, m)
}

// TestConcurrentMatch runs readers against one busy writer (go test -race
// checks the seqlock discipline). Pod 0 holds fixed chains the writer never
// touches for pod 0, while other pods insert and remove chains that share
// them, so pod 0's nodes split, merge and move under the readers: every
// Match that validates must see what pod 0 held before the writer started.
func TestConcurrentMatch(t *testing.T) {
	tr := newTree(t, Options{MaxPods: 64, PodCapacity: 200})
	r := rand.New(rand.NewPCG(7, 7))
	g := &prompts{r: r}
	var stable [][]uint64
	for range 20 {
		k := chain(g.next()...)
		stable = append(stable, k)
		tr.Insert(0, k)
	}
	// What pod 0 holds of each chain (capacity may have trimmed some).
	want := make([]int32, len(stable))
	out := make([]int32, 1)
	for i, k := range stable {
		tr.Match(k, out)
		want[i] = out[0]
	}
	writes := 5_000
	if testing.Short() {
		writes = 1_000
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]int32, 64)
			var st matchState
			rr := rand.New(rand.NewPCG(uint64(w), 3))
			// Readers keep going until the writer is done and they have
			// matched a while, however the scheduler ran them.
			for n := 0; n < 1000 || !done.Load(); n++ {
				i := rr.IntN(len(stable))
				k := stable[i]
				ok := tr.matchOnce(k, out, &st)
				for p, d := range out {
					if d < 0 || int(d) > len(k) {
						t.Errorf("pod %d matched %d of %d keys", p, d, len(k))
						return
					}
				}
				if ok {
					if out[0] != want[i] {
						t.Errorf("validated Match gave pod 0 %d keys of chain %d, want %d", out[0], i, want[i])
						return
					}
				}
			}
		}()
	}
	for n := range writes {
		if n%64 == 0 {
			runtime.Gosched() // let readers in even on one CPU
		}
		pod := int32(1 + r.IntN(63))
		switch k := r.IntN(10); {
		case k < 6:
			tr.Insert(pod, chain(g.next()...))
		case k < 9:
			keys := chain(g.old()...)
			tr.Remove(pod, keys, 1+r.IntN(len(keys)))
		default:
			tr.RemovePod(pod)
		}
	}
	done.Store(true)
	wg.Wait()
	check(t, tr, nil)
}

func TestKeysThatAreNotChains(t *testing.T) {
	// Keys that are not a chain (or a 64-bit collision) repeat: the tree
	// is a trie over key sequences, so each sequence is its own path, the
	// tree stays consistent, and Match is exact along paths.
	tr := newTree(t, Options{})
	m := newModel(tr.maxPods, 0)
	f := func(pod int32, keys []uint64, match []uint64, want []int32) {
		t.Helper()
		if keys != nil {
			tr.Insert(pod, keys)
			m.insert(pod, keys)
		}
		check(t, tr, m)
		agree(t, tr, m, match)
		out := make([]int32, len(want))
		tr.Match(match, out)
		for p := range want {
			if out[p] != want[p] {
				t.Fatalf("after inserting %v for pod %d, Match(%v) = %v, want %v", keys, pod, match, out, want)
			}
		}
	}
	f(0, []uint64{1, 2, 3}, []uint64{1, 2, 3}, []int32{3, 0, 0})
	f(1, []uint64{9, 2, 5}, []uint64{9, 2, 5}, []int32{0, 3, 0})
	f(1, []uint64{5, 1}, []uint64{5, 1}, []int32{0, 2, 0})
	f(2, []uint64{2}, []uint64{2}, []int32{0, 0, 1})
	f(2, []uint64{1, 3}, []uint64{1, 2, 3}, []int32{3, 0, 1})
	f(2, []uint64{7, 7}, []uint64{7, 7}, []int32{0, 0, 2})
	// Key 2 after 9 and key 2 after 1 are different blocks.
	f(2, []uint64{9, 2}, []uint64{1, 2, 3}, []int32{3, 0, 1})
	f(0, []uint64{5, 1, 2}, []uint64{5, 1, 2}, []int32{3, 2, 0})
	// Children of different parents that start with the same key.
	f(3, []uint64{5, 2, 1}, []uint64{5, 2, 1}, []int32{1, 1, 0, 3})
	f(3, []uint64{9, 1}, []uint64{9, 1}, []int32{0, 1, 1, 2})
	tr.Remove(1, []uint64{9, 2, 5}, 2)
	m.remove(1, []uint64{9, 2, 5}, 2)
	f(0, nil, []uint64{9, 2, 5}, []int32{0, 1, 2, 1})
	for _, c := range [][]uint64{{1, 2, 3}, {9, 2, 5}, {5, 1, 2}, {2}, {1, 3}, {7, 7}, {9, 2}, {5, 2, 1}, {9, 1}} {
		for pod := range int32(4) {
			tr.Remove(pod, c, len(c))
			m.remove(pod, c, len(c))
		}
	}
	check(t, tr, m)
	if st := tr.Stats(); st.Nodes != 0 || st.Blocks != 0 {
		t.Fatalf("emptied tree has %+v", st)
	}
}

func TestBadPodPanics(t *testing.T) {
	tr := newTree(t, Options{MaxPods: 4})
	f := func(name string, call func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Fatalf("%s with a pod out of range did not panic", name)
			}
		}()
		call()
	}
	f("Insert", func() { tr.Insert(4, chain(1)) })
	f("Remove", func() { tr.Remove(-1, chain(1), 1) })
	f("RemovePod", func() { tr.RemovePod(4) })
}

func TestMatchNoAlloc(t *testing.T) {
	tr := newTree(t, Options{MaxPods: 1024})
	keys := chain(seq(1, 128)...)
	tr.Insert(1000, keys)
	tr.Insert(3, keys[:40])
	out := make([]int32, 1024)
	if n := testing.AllocsPerRun(100, func() { tr.Match(keys, out) }); n != 0 {
		t.Fatalf("Match allocates %v times per call", n)
	}
	if out[1000] != 128 || out[3] != 40 {
		t.Fatalf("pod 1000 matched %d, pod 3 %d; want 128 and 40", out[1000], out[3])
	}
}

// TestReinsertAfterRemove re-adds chains soon after removing them, so
// positions and label chunks are freed and reused while the start index's
// slots for the same keys come and go.
func TestReinsertAfterRemove(t *testing.T) {
	tr := newTree(t, Options{MaxPods: 4})
	m := newModel(4, 0)
	chains := make([][]uint64, 8)
	for i := range chains {
		chains[i] = chain(seq(uint32(i)<<16, 300)...)
	}
	for round := range 1000 {
		k := chains[round%len(chains)]
		pod := int32(round % 4)
		tr.Insert(pod, k)
		m.insert(pod, k)
		agree(t, tr, m, k)
		if round%3 != 0 {
			tr.Remove(pod, k, len(k)-round%7)
			m.remove(pod, k, len(k)-round%7)
		} else {
			tr.RemovePod(pod)
			m.removePod(pod)
		}
		agree(t, tr, m, k)
		// At once, while the removed keys still sit at their freed
		// positions.
		tr.Insert(pod^1, k)
		m.insert(pod^1, k)
		agree(t, tr, m, k)
		check(t, tr, m)
	}
}

// TestVacate hands a slot from a pod that left to the next one: the
// leaver's blocks go, and writes still naming it (a request or a KV event
// on its way) never land on its successor.
func TestVacate(t *testing.T) {
	tr := newTree(t, Options{MaxPods: 4})
	keys := chain(seq(1, 8)...)
	next := int32(2 + 1<<SlotBits)
	tr.Insert(2, keys)
	tr.Insert(1, keys[:3])
	tr.Vacate(2, next)
	out := make([]int32, 4)
	want := func(when string, d2 int32) {
		t.Helper()
		tr.Match(keys, out)
		if out[1] != 3 || out[2] != d2 {
			t.Fatalf("%s: depths %v, want 3 for slot 1 and %d for slot 2", when, out, d2)
		}
	}
	want("after Vacate", 0)
	tr.Insert(2, keys)
	tr.Remove(2, keys, 8)
	tr.RemovePod(2)
	want("after the leaver's late writes", 0)
	tr.Insert(next, keys[:5])
	tr.Insert(2, keys)
	want("after the successor's insert", 5)
	tr.Remove(2, keys, 8)
	tr.RemovePod(2)
	tr.Vacate(2, 2+2<<SlotBits)
	want("after the leaver's writes and a stale Vacate", 5)
	if st := tr.Stats(); st.PodBlocks[2] != 5 || Slot(next) != 2 {
		t.Fatalf("slot 2 holds %d blocks, want 5; Slot(%d) = %d", st.PodBlocks[2], next, Slot(next))
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Vacate to another slot did not panic")
		}
	}()
	tr.Vacate(next, 3)
}

// TestMatchChains: a batch's prompts are keyed each from the seed, and a
// pod's match is the sum of its matches of each prompt.
func TestMatchChains(t *testing.T) {
	seed := Seed("m")
	a, b := seq(0, 40), seq(1000, 40) // 2 full blocks of 16 each
	keys, chains := AppendBatchKeys(nil, nil, seed, cat(a, b), []int{40, 80}, 16)
	if want := AppendBlockKeys(AppendBlockKeys(nil, seed, a, 16), seed, b, 16); !slices.Equal(keys, want) || !slices.Equal(chains, []int{2, 4}) {
		t.Fatalf("keys %x chains %v, want %x [2 4]", keys, chains, want)
	}
	one := AppendBlockKeys(nil, seed, a, 16)
	if got, c := AppendBatchKeys(nil, nil, seed, a, []int{40}, 16); !slices.Equal(got, one) || c != nil {
		t.Errorf("one prompt: %x %v, want %x and no chains", got, c, one)
	}
	tr := newTree(t, Options{MaxPods: 4})
	tr.Insert(0, keys[:3])                        // a whole, b's first block alone: not b's
	tr.Insert(1, keys[2:])                        // b whole
	tr.Insert(2, append(keys[:1:1], keys[2:]...)) // a's first, then b chained after it: not b's
	out, scratch := make([]int32, 4), make([]int32, 4)
	tr.MatchChains(keys, chains, out, scratch)
	if !slices.Equal(out, []int32{2, 2, 1, 0}) {
		t.Errorf("MatchChains: %v, want [2 2 1 0]", out)
	}
	// InsertChains records each prompt's chain from the root: pod 3 then
	// holds both prompts whole, and a's keys chained before b's are not
	// b's.
	tr.InsertChains(3, keys, chains)
	tr.MatchChains(keys, chains, out, scratch)
	if !slices.Equal(out, []int32{2, 2, 1, 4}) {
		t.Errorf("MatchChains after InsertChains: %v, want [2 2 1 4]", out)
	}
	tr.Match(keys, out)
	if out[3] != 2 {
		t.Errorf("the batch's keys as one chain: pod 3 holds %d, want 2 (a's alone)", out[3])
	}
}

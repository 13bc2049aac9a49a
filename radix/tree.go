// Package radix is the gateway's prefix index: a compressed radix tree of
// chained block keys (AppendBlockKeys) that tells, for a prompt, how many of
// its leading blocks each pod holds in its KV cache.
//
// # Shape
//
// The tree is a trie over key sequences: a path of keys from the root is a
// prompt prefix. Each node holds a run of keys (its label; runs are
// compressed edges) and a bitset of the pods that hold every block of that
// run; a pod holding only part of a run splits it, and neighbours that
// agree again are merged back. Real keys are chains (each hashes its parent
// key and its block), so a key names its whole prefix and appears at one
// position only, but the tree does not rely on it: a key that also appears
// elsewhere, by a 64-bit collision or input that is not a chain, is simply
// a different position on a different path. Nodes and labels live in
// arenas indexed by int32 (fixed-size chunks that never move, plus free
// lists), so the tree has no per-node heap pointers for the GC to scan and
// no allocation per operation once the arenas have grown.
//
// One open-addressing index, the start index, maps (parent node, first
// key) to the child's label position, and an owner array maps a position
// to its node (see startIndex): children are found through it, so a node
// needs no child table, and every walk, readers' and the writer's, goes
// from the root child by child. A node points to its parent. No key is
// indexed by itself, so Remove names blocks by their chain (a path from the
// root) and walks to them as Match does.
//
// # Recency and capacity
//
// Each pod has an LRU list over the runs it holds and a capacity in blocks.
// Insert touches the chain deepest block first, so in every pod's order a
// block is older than its ancestors and eviction (least recently used first,
// deepest blocks of a run first) always drops a pod's leaves before their
// parents, as engines do. Match does not change recency: it is a guess about
// where to route, not a use of the cache; only the engine's own store (its
// KV events, fed to Insert) says a block was used.
//
// # Concurrency
//
// Insert, Remove, RemovePod and Stats take an internal mutex, so writers may
// call from several goroutines (one KV-event subscriber per pod). Match takes
// no lock: every node carries a sequence number the writer makes odd while it
// changes that node, and every field a reader looks at is read and written
// with sync/atomic. A reader waits (spinning, then yielding) only while the
// one node it is reading is mid-update, records the sequence of each node it
// passes, and checks them again at the end; if a node on its path changed,
// it walks again (at most matchAttempts times, then keeps its last answer,
// so a reader is never starved by a busy writer). A Match that validates is
// exact for one instant during the call. Readers look children up in the
// start index; every slot a lookup finds is confirmed against the arena
// and the node (the key at that position, the node owning it, that node
// starting there under the parent the reader comes from). Key positions
// have a sequence of their own (moves), odd while one node's label moves
// out of a sparse chunk or while a deletion shifts start index slots back:
// a reader whose lookup misses while it changed looks again, so neither
// shows as a missing block (see startIndex). Measured under a writer
// inserting and removing 96-block prompts back to back, at most about one
// Match in a million walks twice (BenchmarkMatchParallel).
package radix

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

const (
	// DefaultMaxPods is the number of pods a zero Options.MaxPods gives: one
	// 64-bit bitset word per node.
	DefaultMaxPods = 64
	// MaxPodsLimit is the most pods one tree tracks. Match keeps one bit per
	// pod in a fixed array on its stack (512 bytes at this width).
	MaxPodsLimit = 1 << SlotBits
	maxWords     = MaxPodsLimit / 64
	// SlotBits is how many low bits of a pod's id name its slot, its bit
	// in the holder sets and its index in Match's out; the bits above tell
	// apart the pods that hold one slot one after another (Vacate), so a
	// write still on its way for a pod that left never lands on the pod
	// that took its slot. Ids below MaxPods are the slots' first holders.
	SlotBits = 12
)

// Slot is the slot of the pod with id pod.
func Slot(pod int32) int32 { return pod & (MaxPodsLimit - 1) }

// Options configure New. The zero value is a 64-pod tree without capacity
// limits.
type Options struct {
	// MaxPods is the number of pods tracked, in slots 0..MaxPods-1; it fixes
	// the width of every node's holder bitset (default 64, at most 4096).
	MaxPods int
	// PodCapacity is each pod's cache size in blocks: an Insert that takes a
	// pod beyond it evicts that pod's least recently used blocks (default 0:
	// unlimited).
	PodCapacity int
}

// Validate reports the first bad field, naming it and quoting its value.
// Zero fields are valid: they mean their defaults.
func (o Options) Validate() error {
	if o.MaxPods < 0 || o.MaxPods > MaxPodsLimit {
		return fmt.Errorf("radix: Options.MaxPods = %d: want 1..%d, or 0 for %d", o.MaxPods, MaxPodsLimit, DefaultMaxPods)
	}
	if o.PodCapacity < 0 {
		return fmt.Errorf("radix: Options.PodCapacity = %d: want a number of blocks, or 0 for unlimited", o.PodCapacity)
	}
	return nil
}

// Tree is the prefix index. Build it with New. Match is safe for any number
// of concurrent callers alongside the writers; see the package doc.
type Tree struct {
	maxPods  int
	words    int // holder bitset words per node: ceil(maxPods/64)
	capacity int // blocks per pod; 0 = unlimited

	// Published to readers. Directories are copied when they grow; the
	// chunks they point to never move.
	nodeDir atomic.Pointer[[]*nodeChunk]
	poolDir atomic.Pointer[[]*poolChunk]
	starts  atomic.Pointer[startIndex] // every node's (parent, first key) (startIndex)
	// moves is a sequence for relocations of keys: odd while a node's label
	// moves out of a sparse chunk or start index slots shift back after a
	// deletion, bumped when a new start index is published. A reader that
	// misses a key looks again if it changed meanwhile.
	moves atomic.Uint64
	// retries counts Match walks repeated because a node on the path
	// changed (Stats.MatchRetries); only that rare path writes it.
	retries atomic.Uint64

	mu sync.Mutex // serialises writers; everything below is theirs alone

	nodes     []*nodeChunk // the writer's view of nodeDir
	nodeHigh  int          // nodes ever handed out from the chunks
	nodeCount int          // nodes in the tree, root included
	freeNode  int32        // head of the free node list, linked by nextSib

	pool       []*poolChunk // the writer's view of poolDir
	live       []int        // keys in use per pool chunk
	keysInUse  int          // keys in use in all pool chunks
	fill       int32        // the chunk new labels are appended to; none before the first
	fillOff    int          // next free position in the fill chunk
	freeChunks []int32      // chunks with no key in use

	entries   []entry // per-pod LRU entries, one per (pod, node) held
	freeEntry int32   // head of the free entry list, linked by newer
	pairs     pairTable
	pods      []podState

	path []int32 // Insert's scratch: the nodes the chain passes, root excluded
}

// root is the node every chain hangs from; it has no label and holds no key
// (so owner 0 can mean "no node").
const root int32 = 0

// New returns an empty tree, or an error naming the bad option.
func New(opts Options) (*Tree, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.MaxPods == 0 {
		opts.MaxPods = DefaultMaxPods
	}
	t := &Tree{
		maxPods:   opts.MaxPods,
		words:     (opts.MaxPods + 63) / 64,
		capacity:  opts.PodCapacity,
		freeNode:  none,
		fill:      none,
		freeEntry: none,
		pairs:     newPairTable(),
		pods:      make([]podState, opts.MaxPods),
	}
	for i := range t.pods {
		t.pods[i] = podState{oldest: none, newest: none, holder: int32(i)}
	}
	t.nodeDir.Store(&t.nodes)
	t.poolDir.Store(&t.pool)
	t.starts.Store(newStartIndex(minIndexSlots))
	if r := t.newNode(0, none); r != root {
		panic("BUG: radix: the root is not node 0")
	}
	return t, nil
}

// Insert records that pod holds the chain keys[0:len(keys)] and makes those
// blocks its most recently used, then evicts the pod's least recently used
// blocks beyond its capacity. Insert panics if pod's slot is outside
// 0..MaxPods-1, and ignores a pod that no longer holds its slot.
func (t *Tree) Insert(id int32, keys []uint64) {
	pod := t.checkPod(id)
	if len(keys) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pods[pod].holder != id {
		return
	}
	path := t.path[:0]
	parent, i := root, 0
	for i < len(keys) {
		c := t.childAt(parent, keys[i])
		if c == none {
			path = t.extend(pod, parent, keys, i, path)
			break
		}
		s := t.spanOf(c)
		m := t.commonPrefix(s, keys[i:])
		if m < s.len() {
			// The chain ends or leaves the run inside it: the pod now holds
			// (or has just used) only the first m blocks.
			c = t.split(c, m)
		}
		if !t.holds(c, pod) {
			t.addPod(c, pod)
		}
		path = append(path, c)
		parent, i = c, i+m
	}
	// Deepest first, so the chain's first block ends most recent.
	for j := len(path) - 1; j >= 0; j-- {
		t.touch(path[j], pod)
	}
	// Runs split apart earlier may agree again now that the pod holds them
	// all: join each with its parent, deepest first; the child is the node
	// that stays.
	for j := len(path) - 1; j > 0; j-- {
		if t.onlyChild(path[j-1]) == path[j] && t.canMerge(path[j-1], path[j]) {
			t.merge(path[j-1], path[j])
			path[j-1] = path[j]
		}
	}
	t.path = path
	t.evict(pod)
}

// Remove records that pod no longer holds the last n blocks of chain, a
// prompt's keys from its first block on (as an engine's BlockRemoved names
// a block, whose prefix the caller knows). n may be up to len(chain).
// Blocks the tree does not hold for the pod on that path are ignored, as
// is a pod that no longer holds its slot. Remove panics if pod's slot is
// outside 0..MaxPods-1.
func (t *Tree) Remove(id int32, chain []uint64, n int) {
	pod := t.checkPod(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pods[pod].holder != id {
		return
	}
	lo := max(len(chain)-n, 0)
	// Deepest node first: each step walks from the root to the node that
	// holds the deepest block still to go, as what earlier steps split,
	// merged or freed leaves no path to reuse.
	for hi := len(chain); hi > lo; {
		c, at, end := t.locate(chain[:hi])
		if end <= lo {
			return // the tree holds nothing deeper on this path
		}
		from := max(at, lo)
		if t.holds(c, pod) {
			// Give the blocks [from, end) a node of their own, so the pod
			// can leave it alone.
			if k := end - at; k < t.spanOf(c).len() {
				c = t.split(c, k)
			}
			if k := from - at; k > 0 {
				t.split(c, k)
			}
			t.dropPod(c, pod)
			t.settle(c)
		}
		hi = from
	}
}

// locate walks keys from the root and returns the deepest node it reaches,
// the depth at which that node's label starts, and how many keys match in
// all (end is 0, with c the root, when not even keys[0] is stored).
func (t *Tree) locate(keys []uint64) (c int32, at, end int) {
	c = root
	for end < len(keys) {
		ch := t.childAt(c, keys[end])
		if ch == none {
			break
		}
		s := t.spanOf(ch)
		m := t.commonPrefix(s, keys[end:])
		c, at, end = ch, end, end+m
		if m < s.len() {
			break
		}
	}
	return c, at, end
}

// RemovePod records that pod holds nothing: an engine restart or its
// AllBlocksCleared event. It panics if pod's slot is outside
// 0..MaxPods-1, and ignores a pod that no longer holds its slot.
func (t *Tree) RemovePod(id int32) {
	pod := t.checkPod(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pods[pod].holder == id {
		t.clearPod(pod)
	}
}

// Vacate records that pod left the pool: its blocks go, and its slot
// passes to next, the id of the slot's next pod (the same slot, other
// upper bits); from now on writes naming pod are ignored. It panics if the
// two ids name different slots or one outside 0..MaxPods-1, and ignores a
// pod that no longer holds its slot.
func (t *Tree) Vacate(id, next int32) {
	pod := t.checkPod(id)
	if t.checkPod(next) != pod || next == id {
		panic(fmt.Sprintf("BUG: radix: Vacate(%d, %d): not the same slot under another id", id, next))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pods[pod].holder == id {
		t.clearPod(pod)
		t.pods[pod].holder = next
	}
}

// clearPod drops every block the pod in slot pod holds.
func (t *Tree) clearPod(pod int32) {
	for e := t.pods[pod].oldest; e != none; e = t.pods[pod].oldest {
		c := t.entries[e].node
		t.dropPod(c, pod)
		t.settle(c)
	}
}

// Stats describe the tree for GET /admin/index.
type Stats struct {
	// Nodes is the number of nodes (runs of keys), the root excluded.
	Nodes int
	// Blocks is the number of blocks stored (positions in the tree).
	Blocks int
	// PodBlocks[p] is the number of blocks pod p holds.
	PodBlocks []int
	// MatchRetries is the number of times a Match walked again because a
	// writer changed a node on its path.
	MatchRetries uint64
	// Bytes is the size of the arenas the tree has allocated: node and
	// label chunks, the start index, LRU entries and the (pod, node) table.
	// Arenas grow and are reused but never shrink.
	Bytes int64
}

// Stats returns the tree's counts. It takes the writers' lock and allocates
// PodBlocks, so it is for the admin page, not the request path.
func (t *Tree) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Stats{
		Nodes:        t.nodeCount - 1,
		Blocks:       t.keysInUse,
		PodBlocks:    make([]int, t.maxPods),
		MatchRetries: t.retries.Load(),
	}
	for p := range t.pods {
		st.PodBlocks[p] = t.pods[p].blocks
	}
	st.Bytes = int64(len(t.nodes))*int64(unsafe.Sizeof(nodeChunk{})+nodeLen*uintptr(t.words)*8) +
		int64(len(t.pool))*int64(unsafe.Sizeof(poolChunk{})) +
		int64(len(t.starts.Load().slots))*8 +
		int64(cap(t.entries))*int64(unsafe.Sizeof(entry{})) +
		t.pairs.bytes() +
		int64(len(t.pods))*int64(unsafe.Sizeof(podState{}))
	return st
}

// checkPod returns the slot of the pod with id pod; it panics if the id
// is negative or its slot outside 0..MaxPods-1.
func (t *Tree) checkPod(id int32) int32 {
	pod := Slot(id)
	if id < 0 || int(pod) >= t.maxPods {
		panic(fmt.Sprintf("radix: pod %d outside 0..%d", id, t.maxPods-1))
	}
	return pod
}

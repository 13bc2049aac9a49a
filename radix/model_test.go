package radix

import (
	"fmt"
	"math/bits"
	"testing"
)

// model is the naive index the tree is checked against: per pod a set of
// held keys with a recency stamp each. Insert stamps the chain deepest key
// first (so the first key is the most recent), eviction drops the lowest
// stamps, and Match scans each pod's set key by key.
type model struct {
	capacity int
	held     []map[uint64]uint64
	clock    uint64
}

func newModel(pods, capacity int) *model {
	m := &model{capacity: capacity, held: make([]map[uint64]uint64, pods)}
	for p := range m.held {
		m.held[p] = map[uint64]uint64{}
	}
	return m
}

func (m *model) insert(pod int32, keys []uint64) {
	h := m.held[pod]
	for i := len(keys) - 1; i >= 0; i-- {
		m.clock++
		h[keys[i]] = m.clock
	}
	for m.capacity > 0 && len(h) > m.capacity {
		var oldest uint64
		first := true
		for k, s := range h {
			if first || s < h[oldest] {
				oldest, first = k, false
			}
		}
		delete(h, oldest)
	}
}

func (m *model) remove(pod int32, keys []uint64) {
	for _, k := range keys {
		delete(m.held[pod], k)
	}
}

func (m *model) removePod(pod int32) { clear(m.held[pod]) }

func (m *model) match(keys []uint64, out []int32) {
	for p := range out {
		n := 0
		if p < len(m.held) {
			for n < len(keys) {
				if _, ok := m.held[p][keys[n]]; !ok {
					break
				}
				n++
			}
		}
		out[p] = int32(n)
	}
}

// agree checks the tree's Match against the model's on keys.
func agree(t testing.TB, tr *Tree, m *model, keys []uint64) {
	t.Helper()
	got := make([]int32, len(m.held)+1)
	want := make([]int32, len(got))
	tr.Match(keys, got)
	m.match(keys, want)
	for p := range got {
		if got[p] != want[p] {
			t.Fatalf("Match(%d keys): pod %d got %d, model %d\ngot  %v\nwant %v", len(keys), p, got[p], want[p], got, want)
		}
	}
}

// check verifies the tree's internal invariants and that it holds exactly
// what the model holds.
func check(t testing.TB, tr *Tree, m *model) {
	t.Helper()
	if err := tr.verify(m); err != nil {
		t.Fatal(err)
	}
}

// verify walks the whole tree; it must be called with no writer running.
func (t *Tree) verify(m *model) error {
	blocks := make([]int, t.maxPods)
	nodes, keys := 0, 0
	live := make([]int, len(t.pool))
	order := make([]map[int32]int, t.maxPods) // pod → node → position in its LRU list
	for p := range t.pods {
		order[p] = map[int32]int{}
		i := 0
		last := none
		for e := t.pods[p].oldest; e != none; e = t.entries[e].newer {
			x := t.entries[e]
			if x.pod != int32(p) || x.older != last || t.pairs.get(pairKey(x.node, x.pod)) != e {
				return fmt.Errorf("pod %d: LRU entry %d is %+v", p, e, x)
			}
			order[p][x.node] = i
			i++
			last = e
		}
		if t.pods[p].newest != last {
			return fmt.Errorf("pod %d: newest entry %d, list ends at %d", p, t.pods[p].newest, last)
		}
	}
	held := make([]map[uint64]bool, t.maxPods)
	for p := range held {
		held[p] = map[uint64]bool{}
	}
	var walk func(parent, c int32) error
	walk = func(parent, c int32) error {
		n := t.nd(c)
		s := span(n.span)
		nodes++
		keys += s.len()
		if s.len() == 0 || s.len() > poolLen {
			return fmt.Errorf("node %d: label length %d", c, s.len())
		}
		if s.top() != (parent == root) {
			return fmt.Errorf("node %d: top flag %v under parent %d", c, s.top(), parent)
		}
		if parent != root && n.prev != t.keyAt(t.spanOf(parent).start()+uint32(t.spanOf(parent).len())-1) {
			return fmt.Errorf("node %d: prev key is not its parent's last key", c)
		}
		if got := t.parentOf(c); got != parent {
			return fmt.Errorf("node %d: parentOf = %d, want %d", c, got, parent)
		}
		if n.ver&1 != 0 {
			return fmt.Errorf("node %d: sequence %d left odd", c, n.ver)
		}
		live[s.start()>>poolBits] += s.len()
		if got, owner, ok := t.findStart(t.keyAt(s.start())); !ok || got != s.start() || owner != c {
			return fmt.Errorf("node %d: start index has its first key at %d (%v), owner %d", c, got, ok, owner)
		}
		for j, k := range t.label(s) {
			pos := s.start() + uint32(j)
			if t.ownerOf(pos) != c {
				return fmt.Errorf("node %d: position %d owned by %d", c, pos, t.ownerOf(pos))
			}
			if got, _, ok := t.find(k); !ok || got != pos {
				return fmt.Errorf("node %d: key %x indexed at %d (%v), want %d", c, k, got, ok, pos)
			}
		}
		holders := 0
		for w, word := range t.holders(c) {
			for ; word != 0; word &= word - 1 {
				p := w<<6 + bits.TrailingZeros64(word)
				holders++
				blocks[p] += s.len()
				if _, ok := order[p][c]; !ok {
					return fmt.Errorf("node %d: pod %d holds it but has no LRU entry", c, p)
				}
				if parent != root && t.holds(parent, int32(p)) && order[p][c] > order[p][parent] {
					return fmt.Errorf("node %d: pod %d used it after its parent", c, p)
				}
				for _, k := range t.label(s) {
					held[p][k] = true
				}
			}
		}
		if holders == 0 && n.firstChild == none {
			return fmt.Errorf("node %d: no holders and no children", c)
		}
		prevSib := none
		for ch := n.firstChild; ch != none; ch = t.nd(ch).nextSib {
			if t.nd(ch).prevSib != prevSib {
				return fmt.Errorf("node %d: child %d has prevSib %d, want %d", c, ch, t.nd(ch).prevSib, prevSib)
			}
			prevSib = ch
			if err := walk(c, ch); err != nil {
				return err
			}
		}
		return nil
	}
	for ch := t.nd(root).firstChild; ch != none; ch = t.nd(ch).nextSib {
		if err := walk(root, ch); err != nil {
			return err
		}
	}
	if nodes != t.nodeCount-1 {
		return fmt.Errorf("walked %d nodes, count says %d", nodes, t.nodeCount-1)
	}
	if keys != t.keysInUse {
		return fmt.Errorf("walked %d keys, %d positions in use", keys, t.keysInUse)
	}
	for c := range live {
		if live[c] != t.live[c] {
			return fmt.Errorf("chunk %d: %d keys in use, count says %d", c, live[c], t.live[c])
		}
	}
	// With no insert under way, a position is allocated exactly when a
	// node owns it: the writer's test for stale key index slots.
	for pos := uint32(0); pos < uint32(len(t.pool))<<poolBits; pos++ {
		if inUse := t.inUse[pos>>6]&(1<<(pos&63)) != 0; inUse != (t.ownerOf(pos) != 0) {
			return fmt.Errorf("position %d: allocated %v, owned by %d", pos, inUse, t.ownerOf(pos))
		}
	}
	// The start index deletes eagerly: it holds the nodes' first keys.
	if n := t.starts.Load().used; n != nodes {
		return fmt.Errorf("start index holds %d keys, want %d", n, nodes)
	}
	for p := range t.pods {
		if blocks[p] != t.pods[p].blocks || len(order[p]) != countBits(t, int32(p)) {
			return fmt.Errorf("pod %d: holds %d blocks in %d nodes, counts say %d blocks, %d entries", p, blocks[p], countBits(t, int32(p)), t.pods[p].blocks, len(order[p]))
		}
		if t.capacity > 0 && blocks[p] > t.capacity {
			return fmt.Errorf("pod %d: holds %d blocks over capacity %d", p, blocks[p], t.capacity)
		}
	}
	if m != nil {
		for p := range m.held {
			if len(m.held[p]) != len(held[p]) {
				return fmt.Errorf("pod %d: tree holds %d keys, model %d", p, len(held[p]), len(m.held[p]))
			}
			for k := range m.held[p] {
				if !held[p][k] {
					return fmt.Errorf("pod %d: model holds key %x, tree does not", p, k)
				}
			}
		}
	}
	return nil
}

func (t *Tree) ownerOf(pos uint32) int32 { return t.pool[pos>>poolBits].owner[pos&poolMask] }

func countBits(t *Tree, pod int32) int {
	n := 0
	for c := int32(1); c < int32(t.nodeHigh); c++ {
		if t.spanOf(c).len() > 0 && t.holds(c, pod) {
			n++
		}
	}
	return n
}

package radix

import (
	"fmt"
	"math/bits"
	"testing"
)

// model is the naive index the tree is checked against: it names every
// path of keys it has seen (a path is a parent path and a key, so a key
// that appears in two sequences is two paths) and keeps per pod a set of
// held paths with a recency stamp each. Insert stamps the chain deepest
// block first (so the first block is the most recent), eviction drops the
// lowest stamps, Remove walks the chain's paths, and Match scans each
// pod's set block by block.
type model struct {
	capacity int
	paths    map[modelEdge]int32 // path ids from 1; 0 is the empty path
	held     []map[int32]uint64
	clock    uint64
}

type modelEdge struct {
	parent int32
	key    uint64
}

func newModel(pods, capacity int) *model {
	m := &model{capacity: capacity, paths: map[modelEdge]int32{}, held: make([]map[int32]uint64, pods)}
	for p := range m.held {
		m.held[p] = map[int32]uint64{}
	}
	return m
}

// path returns the id of keys[:i+1] for every i, as long as they are
// known (or all of them, naming new ones, when add is set).
func (m *model) path(keys []uint64, add bool) []int32 {
	var ids []int32
	parent := int32(0)
	for _, k := range keys {
		id, ok := m.paths[modelEdge{parent, k}]
		if !ok {
			if !add {
				break
			}
			id = int32(len(m.paths) + 1)
			m.paths[modelEdge{parent, k}] = id
		}
		ids = append(ids, id)
		parent = id
	}
	return ids
}

func (m *model) insert(pod int32, keys []uint64) {
	h := m.held[pod]
	ids := m.path(keys, true)
	for i := len(ids) - 1; i >= 0; i-- {
		m.clock++
		h[ids[i]] = m.clock
	}
	for m.capacity > 0 && len(h) > m.capacity {
		var oldest int32
		first := true
		for k, s := range h {
			if first || s < h[oldest] {
				oldest, first = k, false
			}
		}
		delete(h, oldest)
	}
}

// remove drops the last n blocks of chain.
func (m *model) remove(pod int32, chain []uint64, n int) {
	for i, id := range m.path(chain, false) {
		if i >= len(chain)-n {
			delete(m.held[pod], id)
		}
	}
}

func (m *model) removePod(pod int32) { clear(m.held[pod]) }

func (m *model) match(keys []uint64, out []int32) {
	ids := m.path(keys, false)
	for p := range out {
		n := 0
		if p < len(m.held) {
			for n < len(ids) {
				if _, ok := m.held[p][ids[n]]; !ok {
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
	held := make([]map[int32]bool, t.maxPods) // pod → model path ids
	for p := range held {
		held[p] = map[int32]bool{}
	}
	var walk func(parent, c int32, pathIDs []int32) error
	walk = func(parent, c int32, pathIDs []int32) error {
		n := t.nd(c)
		s := span(n.span)
		nodes++
		keys += s.len()
		if s.len() == 0 || s.len() > poolLen {
			return fmt.Errorf("node %d: label length %d", c, s.len())
		}
		if got := t.parentOf(c); got != parent {
			return fmt.Errorf("node %d: parent %d, want %d", c, got, parent)
		}
		if n.ver&1 != 0 {
			return fmt.Errorf("node %d: sequence %d left odd", c, n.ver)
		}
		live[s.start()>>poolBits] += s.len()
		if got := t.childAt(parent, t.keyAt(s.start())); got != c {
			return fmt.Errorf("node %d: the start index finds %d under parent %d", c, got, parent)
		}
		for j := range s.len() {
			pos := s.start() + uint32(j)
			if t.ownerOf(pos) != c {
				return fmt.Errorf("node %d: position %d owned by %d", c, pos, t.ownerOf(pos))
			}
		}
		if m != nil {
			// The model's ids of this label's paths.
			last := int32(0)
			if len(pathIDs) > 0 {
				last = pathIDs[len(pathIDs)-1]
			}
			pathIDs = pathIDs[:0:0]
			for _, k := range t.label(s) {
				id, ok := m.paths[modelEdge{last, k}]
				if !ok {
					return fmt.Errorf("node %d: key %x is on a path the model never stored", c, k)
				}
				pathIDs = append(pathIDs, id)
				last = id
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
				for _, id := range pathIDs {
					held[p][id] = true
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
			if err := walk(c, ch, pathIDs); err != nil {
				return err
			}
		}
		return nil
	}
	for ch := t.nd(root).firstChild; ch != none; ch = t.nd(ch).nextSib {
		if err := walk(root, ch, nil); err != nil {
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
	// The start index deletes eagerly: it holds the nodes' starts.
	if n := t.starts.Load().used; n != nodes {
		return fmt.Errorf("start index holds %d slots, want %d", n, nodes)
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
				return fmt.Errorf("pod %d: tree holds %d blocks, model %d", p, len(held[p]), len(m.held[p]))
			}
			for id := range m.held[p] {
				if !held[p][id] {
					return fmt.Errorf("pod %d: model holds path %d, tree does not", p, id)
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

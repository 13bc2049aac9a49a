package radix

import (
	"math/bits"
	"sync/atomic"
)

const (
	nodeBits = 10
	nodeLen  = 1 << nodeBits // nodes per chunk
	nodeMask = nodeLen - 1

	none      int32 = -1
	elsewhere int32 = -2 // childAt: the key is stored, but not under this parent
)

// node is one run of keys. Fields readers use are read and written with
// sync/atomic; the writer may read them plainly, since only it writes them.
type node struct {
	ver  uint32 // sequence number, odd while the writer changes the node
	span uint64 // the label, see span
	prev uint64 // the key just before the label: the parent's last key (0 under the root)

	// Writer-only. Children form a doubly linked sibling list; a node on
	// the free list links through nextSib.
	firstChild, nextSib, prevSib int32
}

type nodeChunk struct {
	hdr     [nodeLen]node
	holders []uint64 // Tree.words per node: bit p set when pod p holds the whole run (atomic)
}

// span packs a label: its first position in the label arena (32 bits), a
// flag for children of the root, and its length in keys (at most poolLen).
// A length of 0 marks a free node. One word, so readers load it at once.
type span uint64

const topBit = 1 << 31

func mkSpan(start uint32, n int, top bool) span {
	s := span(start)<<32 | span(n)
	if top {
		s |= topBit
	}
	return s
}

func (s span) start() uint32 { return uint32(s >> 32) }
func (s span) len() int      { return int(uint32(s) &^ topBit) }
func (s span) top() bool     { return s&topBit != 0 }

func (t *Tree) nd(i int32) *node { return &t.nodes[i>>nodeBits].hdr[i&nodeMask] }

func (t *Tree) holders(i int32) []uint64 {
	o := int(i&nodeMask) * t.words
	return t.nodes[i>>nodeBits].holders[o : o+t.words : o+t.words]
}

func (t *Tree) spanOf(i int32) span { return span(t.nd(i).span) }

func (t *Tree) holds(i, pod int32) bool { return t.holders(i)[pod>>6]&(1<<(pod&63)) != 0 }

func (t *Tree) holdsNone(i int32) bool {
	for _, w := range t.holders(i) {
		if w != 0 {
			return false
		}
	}
	return true
}

// beginWrite and endWrite bracket every change readers could see.
func beginWrite(n *node) { atomic.AddUint32(&n.ver, 1) }
func endWrite(n *node)   { atomic.AddUint32(&n.ver, 1) }

func (t *Tree) setSpan(i int32, s span) {
	n := t.nd(i)
	beginWrite(n)
	atomic.StoreUint64(&n.span, uint64(s))
	endWrite(n)
}

// newNode takes a node from the free list or the arena, with no holders
// and no children.
func (t *Tree) newNode(s span, prev uint64) int32 {
	i := t.freeNode
	if i != none {
		t.freeNode = t.nd(i).nextSib
	} else {
		if t.nodeHigh == len(t.nodes)<<nodeBits {
			c := &nodeChunk{holders: make([]uint64, nodeLen*t.words)}
			nodes := append(t.nodes[:len(t.nodes):len(t.nodes)], c)
			t.nodes = nodes
			t.nodeDir.Store(&nodes)
		}
		i = int32(t.nodeHigh)
		t.nodeHigh++
	}
	t.nodeCount++
	n := t.nd(i)
	n.firstChild, n.nextSib, n.prevSib = none, none, none
	beginWrite(n)
	atomic.StoreUint64(&n.span, uint64(s))
	atomic.StoreUint64(&n.prev, prev)
	h := t.holders(i)
	for w := range h {
		atomic.StoreUint64(&h[w], 0)
	}
	endWrite(n)
	return i
}

func (t *Tree) releaseNode(i int32) {
	t.setSpan(i, 0)
	t.nd(i).nextSib = t.freeNode
	t.freeNode = i
	t.nodeCount--
}

func (t *Tree) linkChild(parent, c int32) {
	p, n := t.nd(parent), t.nd(c)
	n.prevSib, n.nextSib = none, p.firstChild
	if p.firstChild != none {
		t.nd(p.firstChild).prevSib = c
	}
	p.firstChild = c
}

func (t *Tree) unlinkChild(parent, c int32) {
	n := t.nd(c)
	if n.prevSib != none {
		t.nd(n.prevSib).nextSib = n.nextSib
	} else {
		t.nd(parent).firstChild = n.nextSib
	}
	if n.nextSib != none {
		t.nd(n.nextSib).prevSib = n.prevSib
	}
}

func (t *Tree) onlyChild(i int32) int32 {
	c := t.nd(i).firstChild
	if c == none || t.nd(c).nextSib != none {
		return none
	}
	return c
}

// parentOf finds a node's parent through the key before its label: keys
// name positions, so the node whose label ends with that key is the parent.
// Splits and merges never change a node's prev, so children need no
// back-pointer to update.
func (t *Tree) parentOf(i int32) int32 {
	n := t.nd(i)
	if span(n.span).top() {
		return root
	}
	_, p, ok := t.find(n.prev)
	if !ok {
		panic("BUG: radix: a node's parent key is not in the index")
	}
	return p
}

// childAt returns the node whose label starts with keys[i] under parent,
// none if keys[i] is not stored, or elsewhere if it is stored under another
// parent or inside a run.
func (t *Tree) childAt(parent int32, keys []uint64, i int) int32 {
	pos, c, ok := t.findStart(keys[i])
	if !ok {
		// Stored inside a run, if at all: extend's indexPut tells.
		return none
	}
	n := t.nd(c)
	s := span(n.span)
	if s.start() != pos {
		return elsewhere
	}
	if parent == root {
		if !s.top() {
			return elsewhere
		}
	} else if s.top() || n.prev != keys[i-1] {
		return elsewhere
	}
	return c
}

// commonPrefix returns how many leading keys of the label s and keys agree.
func (t *Tree) commonPrefix(s span, keys []uint64) int {
	label := t.label(s)
	n := min(len(label), len(keys))
	m := 0
	for m < n && label[m] == keys[m] {
		m++
	}
	return m
}

// extend hangs new nodes holding keys[i:] under parent, with pod their only
// holder, and appends them to path. A label holds at most poolLen keys, so
// a very long chain becomes several nodes.
func (t *Tree) extend(pod, parent int32, keys []uint64, i int, path []int32) []int32 {
	for i < len(keys) {
		n := min(len(keys)-i, poolLen)
		start := t.allocKeys(n)
		t.writeKeys(start, keys[i:i+n])
		// Index the keys before the node exists: a reader that finds one
		// meets owner 0 ("no node") until setOwner publishes the node.
		t.prefetch(keys[i : i+n])
		k := 0
		for k < n && t.indexPut(keys[i+k], start+uint32(k)) {
			k++
		}
		if k < n {
			t.releaseKeys(start+uint32(k), n-k)
		}
		if k == 0 {
			return path
		}
		prev := uint64(0)
		if i > 0 {
			prev = keys[i-1]
		}
		c := t.newNode(mkSpan(start, k, parent == root), prev)
		t.addPod(c, pod)
		t.linkChild(parent, c)
		t.setOwner(start, k, c)
		t.startPut(keys[i], start)
		path = append(path, c)
		if k < n {
			return path
		}
		parent, i = c, i+n
	}
	return path
}

// split cuts c's label after m keys and returns the new node d holding the
// rest. d takes over c's children and holders and becomes c's only child;
// in every holder's LRU order d sits just before c (its blocks are deeper,
// so older).
func (t *Tree) split(c int32, m int) int32 {
	cn := t.nd(c)
	s := span(cn.span)
	start, n := s.start(), s.len()
	cut := start + uint32(m)
	d := t.newNode(mkSpan(cut, n-m, false), t.keyAt(cut-1))
	dn := t.nd(d)
	hc, hd := t.holders(c), t.holders(d)
	beginWrite(dn)
	for w := range hc {
		atomic.StoreUint64(&hd[w], hc[w])
	}
	endWrite(dn)
	dn.firstChild = cn.firstChild
	cn.firstChild = d
	// Order matters to readers: d is complete before the keys point to it,
	// and they point to it, and the start index to its first, before c
	// stops covering them.
	t.setOwner(cut, n-m, d)
	t.startPut(t.keyAt(cut), cut)
	t.setSpan(c, mkSpan(start, m, s.top()))
	for w, word := range hc {
		for ; word != 0; word &= word - 1 {
			pod := int32(w<<6 + bits.TrailingZeros64(word))
			t.insertBefore(pod, t.newEntry(d, pod), t.pairs.get(pairKey(c, pod)))
		}
	}
	return d
}

// settle tidies the tree after a pod left node c: a node with neither
// holders nor children goes (and so may its parent), and runs that now
// agree with their only child or their parent are merged.
func (t *Tree) settle(c int32) {
	for c != root {
		if t.holdsNone(c) && t.nd(c).firstChild == none {
			p := t.parentOf(c)
			t.removeLeaf(p, c)
			c = p
			continue
		}
		if ch := t.onlyChild(c); ch != none && t.canMerge(c, ch) {
			t.merge(c, ch)
		}
		if p := t.parentOf(c); t.onlyChild(p) == c && t.canMerge(p, c) {
			t.merge(p, c)
		}
		return
	}
}

// canMerge reports whether child c can join its parent p's label: same
// holders, labels adjacent in one arena chunk, and for every holder c's
// entry just before p's in the LRU order (so the merged run is still one
// stretch of that pod's recency).
func (t *Tree) canMerge(p, c int32) bool {
	if p == root {
		return false
	}
	ps, cs := t.spanOf(p), t.spanOf(c)
	end := ps.start() + uint32(ps.len())
	if end != cs.start() || ps.start()>>poolBits != cs.start()>>poolBits {
		return false
	}
	hp, hc := t.holders(p), t.holders(c)
	for w := range hp {
		if hp[w] != hc[w] {
			return false
		}
	}
	for w, word := range hc {
		for ; word != 0; word &= word - 1 {
			pod := int32(w<<6 + bits.TrailingZeros64(word))
			if t.entries[t.pairs.get(pairKey(c, pod))].newer != t.pairs.get(pairKey(p, pod)) {
				return false
			}
		}
	}
	return true
}

// merge appends c's label to p's and frees c; see canMerge.
func (t *Tree) merge(p, c int32) {
	ps, cs := t.spanOf(p), t.spanOf(c)
	t.setSpan(p, mkSpan(ps.start(), ps.len()+cs.len(), ps.top()))
	t.setOwner(cs.start(), cs.len(), p)
	t.startDelete(t.keyAt(cs.start()), cs.start())
	t.nd(p).firstChild = t.nd(c).firstChild
	for w, word := range t.holders(c) {
		for ; word != 0; word &= word - 1 {
			pod := int32(w<<6 + bits.TrailingZeros64(word))
			t.deleteEntry(c, pod)
		}
	}
	t.releaseNode(c)
}

// removeLeaf removes leaf c, which no pod holds, from under p.
func (t *Tree) removeLeaf(p, c int32) {
	t.unlinkChild(p, c)
	s := t.spanOf(c)
	t.startDelete(t.keyAt(s.start()), s.start())
	// The keys' slots in the key index go stale (see keyIndex): no cache
	// miss each.
	t.releaseNode(c)
	t.releaseKeys(s.start(), s.len())
	t.compact()
}

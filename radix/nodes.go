package radix

import (
	"math/bits"
	"sync/atomic"
)

const (
	nodeBits = 10
	nodeLen  = 1 << nodeBits // nodes per chunk
	nodeMask = nodeLen - 1

	none int32 = -1
)

// node is one run of keys. Fields readers use are read and written with
// sync/atomic; the writer may read them plainly, since only it writes them.
type node struct {
	ver    uint32 // sequence number, odd while the writer changes the node
	parent int32  // the node this one hangs from (root for a prompt's first run)
	span   uint64 // the label, see span

	// Writer-only. Children form a doubly linked sibling list; a node on
	// the free list links through nextSib.
	firstChild, nextSib, prevSib int32
}

type nodeChunk struct {
	hdr     [nodeLen]node
	holders []uint64 // Tree.words per node: bit p set when pod p holds the whole run (atomic)
}

// span packs a label: its first position in the label arena (32 bits) and
// its length in keys (at most poolLen). A length of 0 marks a free node.
// One word, so readers load it at once.
type span uint64

func mkSpan(start uint32, n int) span { return span(start)<<32 | span(n) }

func (s span) start() uint32 { return uint32(s >> 32) }
func (s span) len() int      { return int(uint32(s)) }

func (t *Tree) nd(i int32) *node { return &t.nodes[i>>nodeBits].hdr[i&nodeMask] }

func (t *Tree) holders(i int32) []uint64 {
	o := int(i&nodeMask) * t.words
	return t.nodes[i>>nodeBits].holders[o : o+t.words : o+t.words]
}

func (t *Tree) spanOf(i int32) span { return span(t.nd(i).span) }

func (t *Tree) parentOf(i int32) int32 { return t.nd(i).parent }

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
func (t *Tree) newNode(s span, parent int32) int32 {
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
	atomic.StoreInt32(&n.parent, parent)
	h := t.holders(i)
	for w := range h {
		atomic.StoreUint64(&h[w], 0)
	}
	endWrite(n)
	return i
}

// releaseNode frees node i, ending the write its caller began: the caller
// keeps i odd from before the change that makes it unreachable, so a
// reader that passed i walks again.
func (t *Tree) releaseNode(i int32) {
	n := t.nd(i)
	atomic.StoreUint64(&n.span, 0)
	endWrite(n)
	n.nextSib = t.freeNode
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

// replaceChild puts d in c's place among parent's children.
func (t *Tree) replaceChild(parent, c, d int32) {
	cn, dn := t.nd(c), t.nd(d)
	dn.prevSib, dn.nextSib = cn.prevSib, cn.nextSib
	if cn.prevSib != none {
		t.nd(cn.prevSib).nextSib = d
	} else {
		t.nd(parent).firstChild = d
	}
	if cn.nextSib != none {
		t.nd(cn.nextSib).prevSib = d
	}
	cn.prevSib, cn.nextSib = none, none
}

func (t *Tree) onlyChild(i int32) int32 {
	c := t.nd(i).firstChild
	if c == none || t.nd(c).nextSib != none {
		return none
	}
	return c
}

// childAt returns parent's child whose label starts with key, or none.
func (t *Tree) childAt(parent int32, key uint64) int32 {
	if c, n, _, _ := t.childOf(parent, key); n != nil {
		return c
	}
	return none
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
		c := t.newNode(mkSpan(start, n), parent)
		t.addPod(c, pod)
		t.linkChild(parent, c)
		// Readers find the node once its start is indexed and it owns the
		// positions.
		t.setOwner(start, n, c)
		t.startPut(parent, keys[i], start)
		path = append(path, c)
		parent, i = c, i+n
	}
	return path
}

// split cuts c's label after m keys into a new node d holding the first m,
// and returns d. c keeps the rest, its children and holders, and hangs
// from d; d takes c's place under c's parent. (Keeping the children on c
// means none of them moves in the start index.) In every holder's LRU
// order d sits just after c (its blocks are shallower, so newer).
func (t *Tree) split(c int32, m int) int32 {
	cn := t.nd(c)
	s := span(cn.span)
	start, n := s.start(), s.len()
	cut := start + uint32(m)
	d := t.newNode(mkSpan(start, m), cn.parent)
	dn := t.nd(d)
	hc, hd := t.holders(c), t.holders(d)
	beginWrite(dn)
	for w := range hc {
		atomic.StoreUint64(&hd[w], hc[w])
	}
	endWrite(dn)
	t.replaceChild(cn.parent, c, d)
	dn.firstChild = c
	t.startPut(d, t.keyAt(cut), cut)
	// Order matters to readers: d is complete before it owns the first
	// positions (the start index slot of c's old start now leads to d),
	// and c is odd from before that until it starts at cut under d, so a
	// reader that found c through the old slot sees the owner change
	// (probeChild) and one that found c under d waits for it.
	beginWrite(cn)
	t.setOwner(start, m, d)
	atomic.StoreUint64(&cn.span, uint64(mkSpan(cut, n-m)))
	atomic.StoreInt32(&cn.parent, d)
	endWrite(cn)
	for w, word := range hc {
		for ; word != 0; word &= word - 1 {
			pod := int32(w<<6 + bits.TrailingZeros64(word))
			t.insertAfter(pod, t.newEntry(d, pod), t.pairs.get(pairKey(c, pod)))
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
			c = ch
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

// merge prepends p's label to its only child c's and frees p: c takes p's
// place under p's parent and keeps its children, entries and start (see
// canMerge).
func (t *Tree) merge(p, c int32) {
	pn, cn := t.nd(p), t.nd(c)
	ps, cs := span(pn.span), span(cn.span)
	// p is odd from before c changes until it is freed, so a reader that
	// passed p walks again; one that finds p's old start meets p odd, then
	// freed and no longer owning it (probeChild).
	beginWrite(pn)
	beginWrite(cn)
	atomic.StoreUint64(&cn.span, uint64(mkSpan(ps.start(), ps.len()+cs.len())))
	atomic.StoreInt32(&cn.parent, pn.parent)
	t.setOwner(ps.start(), ps.len(), c)
	endWrite(cn)
	t.startDelete(p, t.keyAt(cs.start()), cs.start())
	t.replaceChild(pn.parent, p, c)
	for w, word := range t.holders(p) {
		for ; word != 0; word &= word - 1 {
			pod := int32(w<<6 + bits.TrailingZeros64(word))
			t.deleteEntry(p, pod)
		}
	}
	t.releaseNode(p)
}

// removeLeaf removes leaf c, which no pod holds, from under p.
func (t *Tree) removeLeaf(p, c int32) {
	beginWrite(t.nd(c))
	t.unlinkChild(p, c)
	s := t.spanOf(c)
	t.startDelete(p, t.keyAt(s.start()), s.start())
	t.releaseNode(c)
	t.releaseKeys(s.start(), s.len())
	t.compact()
}

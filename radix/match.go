package radix

import (
	"math/bits"
	"runtime"
	"sync/atomic"
)

const (
	// matchAttempts bounds how often Match walks again after a writer
	// changed a node on its path; the last walk's answer stands.
	matchAttempts = 8
	// pathCheck is how many visited nodes Match remembers before checking
	// them; a longer path is checked in stretches of this many.
	pathCheck = 32
	// spinBeforeYield is how many times a reader rereads a node that is
	// mid-update before it yields its thread to the (maybe descheduled)
	// writer.
	spinBeforeYield = 16
)

type visit struct {
	n   *node
	ver uint32
}

// matchState is Match's scratch, on its stack.
type matchState struct {
	alive [maxWords]uint64 // pods that hold every block matched so far
	path  [pathCheck]visit
}

// Match sets out[p] to the number of leading keys pod p holds, for every
// p < len(out) (0 for pods at or beyond MaxPods). It walks the tree once,
// takes no lock and allocates nothing; see the package doc for what it
// sees of concurrent writes.
func (t *Tree) Match(keys []uint64, out []int32) {
	np := min(len(out), t.maxPods)
	clear(out[np:])
	if np == 0 {
		return
	}
	var st matchState
	for a := 1; !t.matchOnce(keys, out[:np], &st) && a < matchAttempts; a++ {
		t.retries.Add(1)
	}
}

// MatchChains is Match for the keys of a completion batch, prompt i's
// ending at chains[i] (AppendBatchKeys; none: one prompt): out[p] is the
// sum of the prompts' cached depths on p, as each is the engine's request
// of its own. scratch, as long as out, holds one prompt's.
func (t *Tree) MatchChains(keys []uint64, chains []int, out, scratch []int32) {
	if len(chains) == 0 {
		t.Match(keys, out)
		return
	}
	clear(out)
	from := 0
	for _, end := range chains {
		t.Match(keys[from:end], scratch)
		for p, d := range scratch {
			out[p] += d
		}
		from = end
	}
}

// InsertChains is Insert for the keys of a completion batch, prompt i's
// ending at chains[i] (none: one prompt): each prompt's chain from the
// root, as MatchChains reads them.
func (t *Tree) InsertChains(id int32, keys []uint64, chains []int) {
	from := 0
	for _, end := range chains {
		t.Insert(id, keys[from:end])
		from = end
	}
	t.Insert(id, keys[from:])
}

// matchOnce writes every out[p] and reports whether no node it read
// changed while it read; if one did, out may mix old and new states.
func (t *Tree) matchOnce(keys []uint64, out []int32, st *matchState) bool {
	nw := (len(out) + 63) >> 6
	alive := st.alive[:nw]
	for w := range alive {
		alive[w] = ^uint64(0)
	}
	if r := len(out) & 63; r != 0 {
		alive[nw-1] = 1<<r - 1
	}
	seen, valid := 0, true
	depth, c := 0, root
	for depth < len(keys) {
		next, n, v, s := t.childOf(c, keys[depth])
		if n == nil {
			break
		}
		c = next
		if seen == len(st.path) {
			if !checkPath(st.path[:]) {
				valid = false
			}
			seen = 0
		}
		st.path[seen] = visit{n, v}
		seen++

		dir := *t.poolDir.Load()
		start := s.start()
		label := dir[start>>poolBits].keys[start&poolMask:]
		lim := min(s.len(), len(keys)-depth)
		m := 0
		for m < lim && atomic.LoadUint64(&label[m]) == keys[depth+m] {
			m++
		}

		h := t.loadHolders(c)
		var any uint64
		for w := range alive {
			keep := alive[w] & atomic.LoadUint64(&h[w])
			for gone := alive[w] &^ keep; gone != 0; gone &= gone - 1 {
				out[w<<6+bits.TrailingZeros64(gone)] = int32(depth)
			}
			alive[w] = keep
			any |= keep
		}
		depth += m
		if any == 0 || m < s.len() {
			break
		}
	}
	for w, word := range alive {
		for ; word != 0; word &= word - 1 {
			out[w<<6+bits.TrailingZeros64(word)] = int32(depth)
		}
	}
	return valid && checkPath(st.path[:seen])
}

func checkPath(path []visit) bool {
	for _, x := range path {
		if atomic.LoadUint32(&x.n.ver) != x.ver {
			return false
		}
	}
	return true
}

// childOf finds parent's child whose label starts with key, with its
// sequence number and its label read at that sequence; n is nil when there
// is none. Readers and the writer alike look children up here.
func (t *Tree) childOf(parent int32, key uint64) (c int32, n *node, ver uint32, s span) {
	h := startHash(parent, key)
	for try := 0; ; try++ {
		if try > spinBeforeYield {
			runtime.Gosched()
		}
		moves := t.moves.Load()
		c, n, ver, s = t.probeChild(parent, key, h)
		switch {
		case c > 0:
			return c, n, ver, s
		case c < 0:
			continue // a node changed under the probe: look again
		case moves&1 != 0 || t.moves.Load() != moves:
			continue // the miss may come from slots or labels moving
		}
		return 0, nil, 0, 0
	}
}

// probeChild looks parent's child starting with key (hash h) up in the
// start index: c is the child, 0 when there is none, or -1 when a node it
// read changed meanwhile. A slot counts only when the arena holds key at
// its position, a node owns that position, and that node, read at an even
// sequence, starts there under parent; the owner is read again after the
// node, since a split or merge hands a label's first position to another
// node (before the node that had it changes). Other slots with the tag
// are other parents' children (or a node being freed or moved): the probe
// goes on past them.
func (t *Tree) probeChild(parent int32, key, h uint64) (c int32, n *node, ver uint32, s span) {
	ix := t.starts.Load()
	for i := ix.home(h); ; i = ix.next(i) {
		sl := atomic.LoadUint64(&ix.slots[i])
		if sl == slotEmpty {
			return 0, nil, 0, 0
		}
		if !sameTag(sl, h) {
			continue
		}
		p := slotPos(sl)
		// The directories are loaded after the slot and the owner were, so
		// they already hold the position's chunk and the node's.
		ch := (*t.poolDir.Load())[p>>poolBits]
		if atomic.LoadUint64(&ch.keys[p&poolMask]) != key {
			continue
		}
		owner := &ch.owner[p&poolMask]
		if c = atomic.LoadInt32(owner); c == 0 {
			continue
		}
		n = &(*t.nodeDir.Load())[c>>nodeBits].hdr[c&nodeMask]
		ver = waitEven(n)
		s = span(atomic.LoadUint64(&n.span))
		good := s.len() > 0 && s.start() == p && atomic.LoadInt32(&n.parent) == parent
		if atomic.LoadUint32(&n.ver) != ver || atomic.LoadInt32(owner) != c {
			return -1, nil, 0, 0
		}
		if good {
			return c, n, ver, s
		}
	}
}

func (t *Tree) loadHolders(c int32) []uint64 {
	ch := (*t.nodeDir.Load())[c>>nodeBits]
	o := int(c&nodeMask) * t.words
	return ch.holders[o : o+t.words : o+t.words]
}

// waitEven returns n's sequence number once no write to n is in progress.
func waitEven(n *node) uint32 {
	for i := 0; ; i++ {
		if v := atomic.LoadUint32(&n.ver); v&1 == 0 {
			return v
		}
		if i >= spinBeforeYield {
			runtime.Gosched()
		}
	}
}

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
	depth := 0
	for depth < len(keys) {
		c, n, v, s := t.childOf(keys, depth)
		if n == nil {
			break
		}
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

// childOf finds the node whose label starts with keys[depth] and continues
// keys[:depth], with its sequence number and label read at that sequence;
// n is nil when there is none.
func (t *Tree) childOf(keys []uint64, depth int) (c int32, n *node, ver uint32, s span) {
	key := keys[depth]
	for try := 0; ; try++ {
		if try > spinBeforeYield {
			runtime.Gosched()
		}
		moves := t.moves.Load()
		// moved reports whether a miss may come from keys being relocated
		// under the probe rather than from the tree.
		moved := func() bool { return moves&1 != 0 || t.moves.Load() != moves }
		pos, c, ok := t.findStart(key)
		if !ok {
			if moved() {
				continue
			}
			return 0, nil, 0, 0
		}
		n = &(*t.nodeDir.Load())[c>>nodeBits].hdr[c&nodeMask]
		ver = waitEven(n)
		s = span(atomic.LoadUint64(&n.span))
		good := s.len() > 0 && s.start() == pos
		if good {
			if depth == 0 {
				good = s.top()
			} else {
				good = !s.top() && atomic.LoadUint64(&n.prev) == keys[depth-1]
			}
		}
		if atomic.LoadUint32(&n.ver) != ver {
			continue // the node changed under us: look again
		}
		if !good {
			if moved() {
				continue
			}
			return 0, nil, 0, 0
		}
		return c, n, ver, s
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

package radix

import "sync/atomic"

const (
	poolBits = 12
	poolLen  = 1 << poolBits // keys per label chunk, and the longest label
	poolMask = poolLen - 1

	// The chunks in use, the fill chunk aside, are kept to at most one per
	// evacuateBelow keys in use: a removal that leaves more evacuates the
	// sparsest (its labels move to the fill chunk and it is reused whole),
	// which then holds fewer than evacuateBelow keys. So after a removal
	// the chunks in use hold at most about four times the keys, each key
	// freed pays for at most about one key moved, and nothing moves while
	// chunks empty in about the order they were filled (the usual LRU
	// eviction), since each then empties whole.
	// (Evacuating every chunk that fell below a quarter full instead moved
	// about 28 keys per BenchmarkInsert/new op and left chunks 75% full.)
	evacuateBelow = poolLen / 4
)

// poolChunk holds labels: every node's keys are contiguous in one chunk, so
// Match compares a label as a run of memory. A position is chunk<<poolBits
// | offset, and it does not change while its node keeps the key, except when
// a sparse chunk is evacuated.
type poolChunk struct {
	keys  [poolLen]uint64 // atomic: readers compare labels while the writer fills
	owner [poolLen]int32  // the node holding the key here, 0 (the root) when free; atomic
}

func (t *Tree) keyAt(pos uint32) uint64 { return t.pool[pos>>poolBits].keys[pos&poolMask] }

// label returns the keys of span s, for the writer.
func (t *Tree) label(s span) []uint64 {
	o := int(s.start() & poolMask)
	return t.pool[s.start()>>poolBits].keys[o : o+s.len()]
}

// allocKeys reserves n ≤ poolLen contiguous positions in the fill chunk,
// opening a new fill chunk when n do not fit (the old one's tail stays
// unused until the chunk is evacuated or emptied).
func (t *Tree) allocKeys(n int) uint32 {
	if t.fill == none || t.fillOff+n > poolLen {
		old := t.fill
		if k := len(t.freeChunks); k > 0 {
			t.fill = t.freeChunks[k-1]
			t.freeChunks = t.freeChunks[:k-1]
		} else {
			pool := append(t.pool[:len(t.pool):len(t.pool)], &poolChunk{})
			t.pool = pool
			t.poolDir.Store(&pool)
			t.live = append(t.live, 0)
			t.fill = int32(len(pool) - 1)
		}
		t.fillOff = 0
		if old != none && t.live[old] == 0 {
			t.freeChunks = append(t.freeChunks, old)
		}
	}
	pos := uint32(t.fill)<<poolBits | uint32(t.fillOff)
	t.fillOff += n
	t.live[t.fill] += n
	t.keysInUse += n
	return pos
}

func (t *Tree) writeKeys(start uint32, keys []uint64) {
	dst := t.pool[start>>poolBits].keys[start&poolMask:]
	for j, k := range keys {
		atomic.StoreUint64(&dst[j], k)
	}
}

func (t *Tree) setOwner(start uint32, n int, c int32) {
	dst := t.pool[start>>poolBits].owner[start&poolMask:]
	for j := range n {
		atomic.StoreInt32(&dst[j], c)
	}
}

// releaseKeys frees n positions from start. A chunk left empty is reused
// whole.
func (t *Tree) releaseKeys(start uint32, n int) {
	t.setOwner(start, n, 0)
	c := int32(start >> poolBits)
	t.live[c] -= n
	t.keysInUse -= n
	if c != t.fill && t.live[c] == 0 {
		t.freeChunks = append(t.freeChunks, c)
	}
}

// compact evacuates the sparsest chunks while more are in use than the
// keys need (see evacuateBelow). It must not run while an insert holds
// positions no node owns yet: evacuate moves owned labels only.
func (t *Tree) compact() {
	for len(t.pool)-len(t.freeChunks) > 1+(t.keysInUse+evacuateBelow-1)/evacuateBelow {
		t.evacuate(t.sparsest())
	}
}

// sparsest returns the chunk in use, the fill chunk aside, with the fewest
// keys. Only an evacuation asks, and there is at most about one per
// evacuateBelow keys freed or per chunk filled, so one step per chunk is
// cheap beside it.
func (t *Tree) sparsest() int32 {
	best := none
	for c, n := range t.live {
		if int32(c) != t.fill && n > 0 && (best == none || n < t.live[best]) {
			best = int32(c)
		}
	}
	return best
}

// evacuate moves every label out of chunk c into the fill chunk and frees c.
// Readers on a moved node see its sequence change and walk again.
func (t *Tree) evacuate(c int32) {
	ch := t.pool[c]
	for off := 0; off < poolLen; {
		i := ch.owner[off]
		if i == 0 {
			off++
			continue
		}
		s := t.spanOf(i)
		n := s.len()
		if s.start() != uint32(c)<<poolBits|uint32(off) {
			panic("BUG: radix: a label does not start at its first owned position")
		}
		to := t.allocKeys(n)
		keys := t.label(s)
		t.writeKeys(to, keys)
		t.setOwner(to, n, i)
		// While moves is odd the start index, the owners and the node
		// disagree about where the label is; readers that miss then look
		// again.
		t.moves.Add(1)
		t.startMove(t.parentOf(i), keys[0], s.start(), to)
		t.setSpan(i, mkSpan(to, n))
		t.setOwner(s.start(), n, 0)
		t.moves.Add(1)
		t.live[c] -= n
		t.keysInUse -= n
		off += n
	}
	t.freeChunks = append(t.freeChunks, c)
}

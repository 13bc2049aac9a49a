package radix

import "sync/atomic"

const (
	poolBits = 12
	poolLen  = 1 << poolBits // keys per label chunk, and the longest label
	poolMask = poolLen - 1

	// A chunk (other than the one being filled) whose keys in use fall
	// below this is evacuated: its labels move to the fill chunk and it is
	// reused whole. So chunks stay at least a quarter full, and each key
	// freed pays for at most a third of a key moved.
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

func (t *Tree) ownerOf(pos uint32) int32 { return t.pool[pos>>poolBits].owner[pos&poolMask] }

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
// whole; one left sparse is evacuated.
func (t *Tree) releaseKeys(start uint32, n int) {
	t.setOwner(start, n, 0)
	c := int32(start >> poolBits)
	t.live[c] -= n
	switch {
	case c == t.fill:
	case t.live[c] == 0:
		t.freeChunks = append(t.freeChunks, c)
	case t.live[c] < evacuateBelow:
		t.evacuate(c)
	}
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
		// While moves is odd the index, the owners and the node disagree
		// about where the label is; readers that miss then look again.
		t.moves.Add(1)
		t.prefetch(keys)
		for j, k := range keys {
			t.indexMove(k, to+uint32(j))
		}
		t.setSpan(i, mkSpan(to, n, s.top()))
		t.setOwner(s.start(), n, 0)
		t.moves.Add(1)
		t.live[c] -= n
		off += n
	}
	t.freeChunks = append(t.freeChunks, c)
}

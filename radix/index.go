package radix

import "sync/atomic"

// startIndex maps (parent node, first key) to the label position of the
// child of that parent whose label starts with that key: the tree's only
// index. Readers walk from the root child by child, and the writer finds
// where a chain goes the same way. Open addressing with linear probing over
// one word per slot: the top 28 bits of the pair's hash as a tag, and the
// position + 2; 0 is an empty slot. A tag match is confirmed against the
// arena and the node (see Tree.childOf), so the key is stored once, and
// since the tag alone chooses the home slot, slots move and tables are
// rebuilt without reading the arena.
//
// It holds a slot per node (a third to a fifth full) and deletes eagerly,
// by backward shift (later members of the probe run move back into the
// hole), so every slot names a node's start. Readers probe it with atomic
// loads: a put fills an empty slot, and while a deletion shifts slots back
// (which may move a slot behind a reader's probe) Tree.moves is odd, so a
// reader whose lookup missed meanwhile looks again. A grown or shrunk table
// is published whole (and moves bumped); readers still probing the old one
// see it consistent. Any table size works (home is a multiply-shift, not a
// mask).
type startIndex struct {
	slots []uint64
	used  int // slots in use; writer-only
}

const (
	slotEmpty = 0
	tagShift  = 36 // a slot's tag sits above bit tagShift, its position below bit 32
	// minIndexSlots keeps small trees cheap.
	minIndexSlots = 1 << 10
)

func newStartIndex(n int) *startIndex {
	return &startIndex{slots: make([]uint64, n)}
}

// startHash hashes a child's place: its parent node and its first key.
// Fibonacci hashing of the key mixed with the parent: keys are hashes
// already, but tests and byte mode may store keys that are not, and the
// same key may start children of many parents.
func startHash(parent int32, key uint64) uint64 {
	return (key ^ uint64(uint32(parent))*0xc2b2ae3d27d4eb4f) * 0x9e3779b97f4a7c15
}

// home maps the tag of a hash, or of a slot, onto the table: (tag × slots)
// / 2²⁸, which is monotone in the tag, so the table is in home order and
// rebuilds write it nearly sequentially. Tables of more than 2²⁸ slots (67
// million nodes) still work, with homes that many slots apart.
func (ix *startIndex) home(h uint64) uint64 {
	return h >> tagShift * uint64(len(ix.slots)) >> (64 - tagShift)
}

// next is the slot after i, wrapping at the end of the table.
func (ix *startIndex) next(i uint64) uint64 {
	if i++; i == uint64(len(ix.slots)) {
		return 0
	}
	return i
}

// dist is how many slots on from slot a slot b is, wrapping.
func (ix *startIndex) dist(a, b uint64) uint64 {
	if b < a {
		b += uint64(len(ix.slots))
	}
	return b - a
}

// free returns the first empty slot from the home of hash (or slot) h.
func (ix *startIndex) free(h uint64) uint64 {
	i := ix.home(h)
	for ix.slots[i] != slotEmpty {
		i = ix.next(i)
	}
	return i
}

// full reports whether ix is over five eighths full and due a resize.
func (ix *startIndex) full() bool { return ix.used*8 > len(ix.slots)*5 }

func sameTag(s, h uint64) bool { return s>>tagShift == h>>tagShift }

func slotPos(s uint64) uint32 { return uint32(s) - 2 }

// startSlot is the slot of a child with hash h starting at pos.
func startSlot(h uint64, pos uint32) uint64 { return h>>tagShift<<tagShift | uint64(pos+2) }

// startPut records that the child of parent starting with key starts at
// pos.
func (t *Tree) startPut(parent int32, key uint64, pos uint32) {
	ix := t.starts.Load()
	h := startHash(parent, key)
	atomic.StoreUint64(&ix.slots[ix.free(h)], startSlot(h, pos))
	if ix.used++; ix.full() {
		t.resizeStarts()
	}
}

// slotOf returns the slot of the child of parent starting with key at
// pos, which ix holds.
func (ix *startIndex) slotOf(parent int32, key uint64, pos uint32) uint64 {
	h := startHash(parent, key)
	s := startSlot(h, pos)
	for i := ix.home(h); ; i = ix.next(i) {
		switch ix.slots[i] {
		case s:
			return i
		case slotEmpty:
			panic("BUG: radix: a node's start is not in the start index")
		}
	}
}

// startDelete records that the child of parent starting with key at pos
// is gone.
func (t *Tree) startDelete(parent int32, key uint64, pos uint32) {
	ix := t.starts.Load()
	i := ix.slotOf(parent, key, pos)
	// Slot j may move back to hole i when its home is no further along the
	// probe run than i. While slots move, moves is odd: one may move back
	// past a reader's probe. Emptying the hole alone hides no slot, since
	// no probe that passes it finds anything after it; most deletions move
	// nothing, and leaving moves be spares readers the writer's cache line.
	shifted := false
	for j := ix.next(i); ix.slots[j] != slotEmpty; j = ix.next(j) {
		if s := ix.slots[j]; ix.dist(ix.home(s), j) >= ix.dist(i, j) {
			if !shifted {
				t.moves.Add(1)
				shifted = true
			}
			atomic.StoreUint64(&ix.slots[i], s)
			i = j
		}
	}
	atomic.StoreUint64(&ix.slots[i], slotEmpty)
	if shifted {
		t.moves.Add(1)
	}
	if ix.used--; ix.used*8 < len(ix.slots) && len(ix.slots) > minIndexSlots {
		t.resizeStarts()
	}
}

// startMove records that the child of parent starting with key moved from
// one position to another (evacuation). The slot stays: its home is the
// same.
func (t *Tree) startMove(parent int32, key uint64, from, to uint32) {
	ix := t.starts.Load()
	atomic.StoreUint64(&ix.slots[ix.slotOf(parent, key, from)], startSlot(startHash(parent, key), to))
}

// resizeStarts publishes a start index a fifth full.
func (t *Tree) resizeStarts() {
	old := t.starts.Load()
	ix := newStartIndex(max(minIndexSlots, 5*old.used))
	ix.used = old.used
	for _, s := range old.slots {
		if s != slotEmpty {
			ix.slots[ix.free(s)] = s
		}
	}
	t.starts.Store(ix)
	t.moves.Add(2) // even: the old table stays whole, it only goes stale
}

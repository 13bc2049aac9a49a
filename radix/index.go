package radix

import "sync/atomic"

// keyIndex maps every stored key to its position in the label arena. It is
// open addressing with linear probing over one word per slot: the key's low
// 32 bits as a tag, and the position + 2; 0 is an empty slot and 1 a
// deleted one. A tag match is confirmed against the arena, so the full key
// is stored once. Readers probe it with atomic loads while the writer
// changes single slots; deletes leave tombstones (never moving a live slot
// past a reader), and growing builds a new table that is then published, so
// a reader always probes a table in which every key it could find is where
// the probe sequence expects it.
type keyIndex struct {
	slots []uint64
	shift uint // 64 - log2(len(slots))
	live  int  // keys stored; writer-only
	used  int  // live + tombstones; writer-only
}

const (
	slotEmpty   = 0
	slotDeleted = 1
	// minIndexSlots keeps small trees cheap; the table doubles as needed
	// and is rebuilt at between a quarter and three quarters full.
	minIndexSlots = 1 << 10
)

func newKeyIndex(n int) *keyIndex {
	shift := uint(64)
	for 1<<(64-shift) < n {
		shift--
	}
	return &keyIndex{slots: make([]uint64, 1<<(64-shift)), shift: shift}
}

// home spreads keys over the table by Fibonacci hashing, so even keys that
// are not hashes (tests, byte mode) probe short runs.
func (ix *keyIndex) home(key uint64) uint64 { return (key * 0x9e3779b97f4a7c15) >> ix.shift }

func slotFor(key uint64, pos uint32) uint64 { return uint64(uint32(key))<<32 | uint64(pos+2) }

// find returns the position of key. It serves readers and the writer alike.
func (t *Tree) find(key uint64) (uint32, bool) {
	ix := t.index.Load()
	_, pos, ok := t.probe(ix, key)
	return pos, ok
}

// probe returns the slot and position of key, or ok false; the reader-safe
// core of every index operation.
func (t *Tree) probe(ix *keyIndex, key uint64) (slot uint64, pos uint32, ok bool) {
	mask := uint64(len(ix.slots) - 1)
	tag := uint64(uint32(key))
	for i := ix.home(key); ; i = (i + 1) & mask {
		s := atomic.LoadUint64(&ix.slots[i])
		if s == slotEmpty {
			return 0, 0, false
		}
		if s != slotDeleted && s>>32 == tag {
			p := uint32(s) - 2
			if t.loadKey(p) == key {
				return i, p, true
			}
		}
	}
}

// loadKey reads the arena for readers: the directory is loaded after the
// position was, so it already holds the position's chunk.
func (t *Tree) loadKey(pos uint32) uint64 {
	dir := *t.poolDir.Load()
	return atomic.LoadUint64(&dir[pos>>poolBits].keys[pos&poolMask])
}

// indexPut stores key at pos and reports true, or reports false when the
// key is already stored.
func (t *Tree) indexPut(key uint64, pos uint32) bool {
	ix := t.index.Load()
	mask := uint64(len(ix.slots) - 1)
	tag := uint64(uint32(key))
	free := -1
	i := ix.home(key)
	for ; ; i = (i + 1) & mask {
		s := ix.slots[i]
		if s == slotEmpty {
			break
		}
		if s == slotDeleted {
			if free < 0 {
				free = int(i)
			}
			continue
		}
		if s>>32 == tag && t.keyAt(uint32(s)-2) == key {
			return false
		}
	}
	if free >= 0 {
		i = uint64(free)
	} else {
		ix.used++
	}
	atomic.StoreUint64(&ix.slots[i], slotFor(key, pos))
	ix.live++
	if ix.used*4 > len(ix.slots)*3 {
		t.rebuildIndex()
	}
	return true
}

func (t *Tree) indexDelete(key uint64) {
	ix := t.index.Load()
	i, _, ok := t.probe(ix, key)
	if !ok {
		panic("BUG: radix: deleting a key that is not indexed")
	}
	atomic.StoreUint64(&ix.slots[i], slotDeleted)
	ix.live--
}

// indexMove records that key now sits at pos (evacuation).
func (t *Tree) indexMove(key uint64, pos uint32) {
	ix := t.index.Load()
	i, _, ok := t.probe(ix, key)
	if !ok {
		panic("BUG: radix: moving a key that is not indexed")
	}
	atomic.StoreUint64(&ix.slots[i], slotFor(key, pos))
}

// rebuildIndex copies the live slots into a table at most half full and
// publishes it; readers still probing the old one finish there, and since
// the writer no longer touches it they see a consistent (slightly stale)
// index.
func (t *Tree) rebuildIndex() {
	old := t.index.Load()
	ix := newKeyIndex(max(minIndexSlots, 2*old.live))
	mask := uint64(len(ix.slots) - 1)
	for _, s := range old.slots {
		if s == slotEmpty || s == slotDeleted {
			continue
		}
		i := ix.home(t.keyAt(uint32(s) - 2))
		for ix.slots[i] != slotEmpty {
			i = (i + 1) & mask
		}
		ix.slots[i] = s
	}
	ix.live, ix.used = old.live, old.live
	t.index.Store(ix)
	t.moves.Add(2) // even: the old table stays whole, it only goes stale
}

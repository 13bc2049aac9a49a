package radix

import "sync/atomic"

// keyIndex maps every stored key to its position in the label arena. It is
// open addressing with linear probing over one word per slot: the top 32
// bits of the key's hash as a tag, and the position + 2; 0 is an empty slot
// and 1 a deleted one. A tag match is confirmed against the arena, so the
// full key is stored once, and since the tag alone chooses the home slot, a
// rebuild never reads the arena.
//
// The table is kept sparse, a quarter to three quarters full, because every
// new key is a cache miss here and every removed one another: at that load
// nearly every probe ends in the home slot's line, and a delete usually
// finds the next slot empty and leaves no tombstone, so tombstones, and the
// rebuilds that clear them (each a new table), stay rare. Rebuilt half full
// instead, BenchmarkInsert/new took about a third longer. Any table size
// works (home is a multiply-shift, not a mask), so a rebuilt table is 32
// bytes per key, not up to twice that.
//
// Readers probe with atomic loads while the writer changes single slots.
// Live slots never move: a delete leaves a tombstone (or an empty slot when
// the next one is empty, which ends every probe there anyway), and growing
// or clearing out tombstones builds a new table that is then published.
type keyIndex struct {
	slots []uint64
	live  int // keys stored; writer-only
	used  int // live + tombstones; writer-only
}

const (
	slotEmpty   = 0
	slotDeleted = 1
	// minIndexSlots keeps small trees cheap. A rebuilt table is a quarter
	// full and is rebuilt again at three quarters full (live keys and
	// tombstones), so it is 11 to 32 bytes per stored key.
	minIndexSlots = 1 << 10
)

func newKeyIndex(n int) *keyIndex {
	return &keyIndex{slots: make([]uint64, n)}
}

// hashKey is Fibonacci hashing: keys are hashes already, but tests and byte
// mode may store keys that are not, and this spreads them too.
func hashKey(key uint64) uint64 { return key * 0x9e3779b97f4a7c15 }

// home maps the top 32 bits of a hash, or of a slot (its tag), onto the
// table: (tag × slots) / 2³², which is monotone in the tag, so the table is
// in home order and rebuilds write it nearly sequentially. It needs fewer
// than 2³² slots: a billion keys.
func (ix *keyIndex) home(h uint64) uint64 { return h >> 32 * uint64(len(ix.slots)) >> 32 }

// next is the slot after i, wrapping at the end of the table.
func (ix *keyIndex) next(i uint64) uint64 {
	if i++; i == uint64(len(ix.slots)) {
		return 0
	}
	return i
}

func slotFor(h uint64, pos uint32) uint64 { return h>>32<<32 | uint64(pos+2) }

// find returns the position of key. It serves readers and the writer alike.
func (t *Tree) find(key uint64) (uint32, bool) {
	_, pos, ok := t.probe(t.index.Load(), key)
	return pos, ok
}

// probe returns the slot and position of key, or ok false; the reader-safe
// core of every index operation.
func (t *Tree) probe(ix *keyIndex, key uint64) (slot uint64, pos uint32, ok bool) {
	h := hashKey(key)
	for i := ix.home(h); ; i = ix.next(i) {
		s := atomic.LoadUint64(&ix.slots[i])
		if s == slotEmpty {
			return 0, 0, false
		}
		if s != slotDeleted && s>>32 == h>>32 {
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

// prefetch loads the home slot of every key, so the cache misses of a
// batch overlap instead of each waiting on the last (the index is far
// larger than the cache, and writes are atomic exchanges, which the CPU
// does not run ahead of).
func (t *Tree) prefetch(keys []uint64) {
	ix := t.index.Load()
	var sink uint64
	for _, k := range keys {
		sink += ix.slots[ix.home(hashKey(k))]
	}
	t.sink = sink
}

// indexPut stores key at pos and reports true, or reports false when the
// key is already stored.
func (t *Tree) indexPut(key uint64, pos uint32) bool {
	ix := t.index.Load()
	h := hashKey(key)
	free := -1
	i := ix.home(h)
	for ; ; i = ix.next(i) {
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
		if s>>32 == h>>32 && t.keyAt(uint32(s)-2) == key {
			return false
		}
	}
	if free >= 0 {
		i = uint64(free)
	} else {
		ix.used++
	}
	atomic.StoreUint64(&ix.slots[i], slotFor(h, pos))
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
	ix.live--
	if ix.slots[ix.next(i)] != slotEmpty {
		atomic.StoreUint64(&ix.slots[i], slotDeleted)
		return
	}
	// Nothing is found past an empty slot, so this slot and the tombstones
	// before it can be empty too.
	for {
		atomic.StoreUint64(&ix.slots[i], slotEmpty)
		ix.used--
		if i == 0 {
			i = uint64(len(ix.slots))
		}
		i--
		if ix.slots[i] != slotDeleted {
			return
		}
	}
}

// indexMove records that key now sits at pos (evacuation).
func (t *Tree) indexMove(key uint64, pos uint32) {
	ix := t.index.Load()
	i, _, ok := t.probe(ix, key)
	if !ok {
		panic("BUG: radix: moving a key that is not indexed")
	}
	atomic.StoreUint64(&ix.slots[i], slotFor(hashKey(key), pos))
}

// rebuildIndex copies the live slots into a table a quarter full and
// publishes it; readers still probing the old one finish there, and since
// the writer no longer touches it they see a consistent (slightly stale)
// index.
func (t *Tree) rebuildIndex() {
	old := t.index.Load()
	ix := newKeyIndex(max(minIndexSlots, 4*old.live))
	for _, s := range old.slots {
		if s == slotEmpty || s == slotDeleted {
			continue
		}
		i := ix.home(s)
		for ix.slots[i] != slotEmpty {
			i = ix.next(i)
		}
		ix.slots[i] = s
	}
	ix.live, ix.used = old.live, old.live
	t.index.Store(ix)
	t.moves.Add(2) // even: the old table stays whole, it only goes stale
}

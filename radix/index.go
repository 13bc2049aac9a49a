package radix

import "sync/atomic"

// keyIndex maps every stored key to its position in the label arena. It is
// open addressing with linear probing over one word per slot: the top 28
// bits of the key's hash as a tag, the generation of the position's chunk
// (4 bits, see below), and the position + 2; 0 is an empty slot. A tag
// match is confirmed against the arena, so the full key is stored once, and
// since the tag alone chooses the home slot, a rebuild never reads the
// arena.
//
// Deletion is lazy: removing a key writes nothing here, because every
// removed key would be another cache miss (as every new key is). Its slot
// goes stale: readers and the writer confirm a tag match against the arena
// (that key at that position, and a node owning it), so a stale slot reads
// as a miss and probing goes on past it, as past a tombstone. The writer
// tells stale slots without reading the arena. Each chunk has a generation,
// bumped when the chunk is reused whole (the only way a position is
// reused), so a slot of an earlier generation is stale; and a slot of the
// chunk's generation is current exactly while its position is allocated
// (a bitmap per chunk). A generation that wraps around only makes a stale
// slot look current to the writer, which keeps it a while longer; the arena
// check keeps every lookup right.
//
// Insert reclaims the stale slots of earlier generations it probes: it puts
// its key in the first, and empties those just before the empty slot that
// ends its probe (no probe finds anything past them). A rebuild drops every
// stale slot. Evicted keys' chunks are soon emptied and reused (labels are
// evicted in about the order they were added), so most stale slots are
// reclaimed by later inserts and rebuilds stay rare.
//
// The table is kept sparse, a fifth to five eighths full (current and
// stale slots), because every new key is a cache miss here: at that load
// nearly every probe ends in the home slot's line. Any table size works
// (home is a multiply-shift, not a mask), so a rebuilt table is 40 bytes
// per key, not up to twice that. (Rebuilt a quarter full and rebuilt again
// at three quarters, BenchmarkInsert/new took about a fifth longer: longer
// probes and more rebuilds.)
//
// Readers probe with atomic loads while the writer changes single slots.
// Current slots never move; a stale slot is overwritten with a new key or
// emptied only where no probe finds anything past it; rebuilds build a new
// table that is then published.
type keyIndex struct {
	slots []uint64
	live  int // keys stored; writer-only
	used  int // slots not empty: current and stale; writer-only
}

const (
	slotEmpty = 0
	// tagShift places the tag in a slot; the generation sits between it
	// and the position.
	tagShift = 36
	genBits  = tagShift - 32
	genMask  = 1<<genBits - 1
	// minIndexSlots keeps small trees cheap. A rebuilt table is a fifth
	// full and is rebuilt again at five eighths full (current and stale
	// slots), so it is 13 to 40 bytes per stored key.
	minIndexSlots = 1 << 10
)

func newKeyIndex(n int) *keyIndex {
	return &keyIndex{slots: make([]uint64, n)}
}

// hashKey is Fibonacci hashing: keys are hashes already, but tests and byte
// mode may store keys that are not, and this spreads them too.
func hashKey(key uint64) uint64 { return key * 0x9e3779b97f4a7c15 }

// home maps the tag of a hash, or of a slot, onto the table: (tag × slots)
// / 2²⁸, which is monotone in the tag, so the table is in home order and
// rebuilds write it nearly sequentially. Tables of more than 2²⁸ slots (67
// million keys) still work, with homes that many slots apart.
func (ix *keyIndex) home(h uint64) uint64 {
	return h >> tagShift * uint64(len(ix.slots)) >> (64 - tagShift)
}

// next is the slot after i, wrapping at the end of the table.
func (ix *keyIndex) next(i uint64) uint64 {
	if i++; i == uint64(len(ix.slots)) {
		return 0
	}
	return i
}

func sameTag(s, h uint64) bool { return s>>tagShift == h>>tagShift }

func slotPos(s uint64) uint32 { return uint32(s) - 2 }

// slotFor is the slot of a key with hash h at pos, in pos's chunk's
// current generation.
func (t *Tree) slotFor(h uint64, pos uint32) uint64 {
	return h>>tagShift<<tagShift | uint64(t.gens[pos>>poolBits])<<32 | uint64(pos+2)
}

// oldGen reports whether slot s is from an earlier generation of its
// position's chunk, so stale (see keyIndex); writer-only. It reads only the
// small generation array, so probes may ask it of every slot they pass.
func (t *Tree) oldGen(s uint64) bool {
	return uint8(s>>32)&genMask != t.gens[slotPos(s)>>poolBits]
}

// current reports whether slot s is not stale (see keyIndex); writer-only.
func (t *Tree) current(s uint64) bool {
	p := slotPos(s)
	return !t.oldGen(s) && t.inUse[p>>6]&(1<<(p&63)) != 0
}

// find returns the position of key and the node that owns it. It serves
// readers and the writer alike.
func (t *Tree) find(key uint64) (pos uint32, owner int32, ok bool) {
	_, pos, owner, ok = t.probe(t.index.Load(), key)
	return pos, owner, ok
}

// probe returns the slot, position and owner of key, or ok false; the
// reader-safe core of every lookup. A slot counts only when the arena holds
// key at its position and a node owns that position: a stale slot does
// not, and neither does a key being added (owned from when its node is
// published) or freed.
func (t *Tree) probe(ix *keyIndex, key uint64) (slot uint64, pos uint32, owner int32, ok bool) {
	h := hashKey(key)
	for i := ix.home(h); ; i = ix.next(i) {
		s := atomic.LoadUint64(&ix.slots[i])
		if s == slotEmpty {
			return 0, 0, 0, false
		}
		if sameTag(s, h) {
			p := slotPos(s)
			// The directory is loaded after the slot was, so it already
			// holds the position's chunk.
			ch := (*t.poolDir.Load())[p>>poolBits]
			if atomic.LoadUint64(&ch.keys[p&poolMask]) == key {
				if c := atomic.LoadInt32(&ch.owner[p&poolMask]); c != 0 {
					return i, p, c, true
				}
			}
		}
	}
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

// indexPut stores key at pos, an allocated position no node owns yet, and
// reports true, or reports false when the key is already stored (at a
// position a node owns, or earlier in the batch being added).
func (t *Tree) indexPut(key uint64, pos uint32) bool {
	ix := t.index.Load()
	h := hashKey(key)
	home := ix.home(h)
	free := -1
	i := home
	for ; ; i = ix.next(i) {
		s := ix.slots[i]
		if s == slotEmpty {
			break
		}
		// A slot naming pos is stale however it looks: pos is being given
		// its key now. One naming key is current, or stale since its
		// position was freed (the arena keeps a freed key until the chunk
		// is reused).
		stale := t.oldGen(s) || slotPos(s) == pos
		if !stale && sameTag(s, h) && t.keyAt(slotPos(s)) == key {
			if t.current(s) {
				return false
			}
			stale = true
		}
		if stale && free < 0 {
			free = int(i)
		}
	}
	if free < 0 {
		free = int(i)
		ix.used++
	}
	atomic.StoreUint64(&ix.slots[free], t.slotFor(h, pos))
	ix.live++
	// Stale slots just before the empty one that ends this probe can be
	// empty too, as no probe finds anything past them; they are in the
	// lines just read, and every slot emptied delays the next rebuild.
	for j := i; j != home; {
		if j == 0 {
			j = uint64(len(ix.slots))
		}
		j--
		if !t.oldGen(ix.slots[j]) {
			break
		}
		atomic.StoreUint64(&ix.slots[j], slotEmpty)
		ix.used--
	}
	if ix.used*8 > len(ix.slots)*5 {
		t.rebuildIndex()
	}
	return true
}

// indexMove records that key now sits at pos (evacuation).
func (t *Tree) indexMove(key uint64, pos uint32) {
	ix := t.index.Load()
	i, _, _, ok := t.probe(ix, key)
	if !ok {
		panic("BUG: radix: moving a key that is not indexed")
	}
	atomic.StoreUint64(&ix.slots[i], t.slotFor(hashKey(key), pos))
}

// rebuildIndex copies the current slots into a table a fifth full and
// publishes it; readers still probing the old one finish there, and since
// the writer no longer touches it they see a consistent (slightly stale)
// index.
func (t *Tree) rebuildIndex() {
	old := t.index.Load()
	// Stale slots that look current (see keyIndex) are copied too; in the
	// rare case they overfill the table, it is built again twice as big.
	n := max(minIndexSlots, 5*old.live)
	ix := t.copyCurrent(old, n)
	for ix == nil {
		n *= 2
		ix = t.copyCurrent(old, n)
	}
	t.index.Store(ix)
	t.moves.Add(2) // even: the old table stays whole, it only goes stale
}

// copyCurrent returns a table of n slots holding old's current slots, or
// nil if they fill more than three quarters of it.
func (t *Tree) copyCurrent(old *keyIndex, n int) *keyIndex {
	ix := newKeyIndex(n)
	ix.live = old.live
	for _, s := range old.slots {
		if s == slotEmpty || !t.current(s) {
			continue
		}
		if ix.used++; ix.used*4 > n*3 {
			return nil
		}
		i := ix.home(s)
		for ix.slots[i] != slotEmpty {
			i = ix.next(i)
		}
		ix.slots[i] = s
	}
	return ix
}

package radix

import "sync/atomic"

// keyIndex maps keys to their positions in the label arena. The tree has
// two, in one slot format: open addressing with linear probing over one
// word per slot, the top 28 bits of the key's hash as a tag, a generation
// (4 bits, key index only, see below), and the position + 2; 0 is an empty
// slot. A tag match is confirmed against the arena, so the full key is
// stored once, and since the tag alone chooses the home slot, slots move
// and tables are rebuilt without reading the arena.
//
// The start index (Tree.starts) holds the first key of every node: readers
// walk from the root child by child, and that is all they look up. It is
// small (a slot or so per node) and deletes eagerly, by backward shift
// (later members of the probe run move back into the hole), so every slot
// names a node's start. Readers probe it with atomic loads: a put fills an
// empty slot, and while a deletion shifts slots back (which may move a key
// behind a reader's probe) Tree.moves is odd, so a reader whose lookup
// missed meanwhile looks again. A grown or shrunk table is published whole
// (and moves bumped); readers still probing the old one see it consistent.
//
// The key index (Tree.index) holds every stored key and is the writer's
// alone: Remove finds any block through it, even inside a run; parentOf
// finds a node's parent by the key before its label; extend refuses a key
// already stored elsewhere. Every new key is a cache miss there, so it is
// plain memory, not atomics: an atomic store is an exchange on amd64, which
// waits for every access before it, and the misses of a batch would not
// overlap. (With every key in one table that readers probed, the writer's
// stores had to be atomic.)
//
// The key index deletes lazily: removing a key writes nothing, because
// every removed key would be another cache miss. Its slot goes stale:
// lookups confirm a tag match against the arena (that key at that
// position, and a node owning it), so a stale slot reads as a miss and
// probing goes on past it, as past a tombstone. The writer tells stale
// slots without reading the arena. Each chunk has a generation, bumped when
// the chunk is reused whole (the only way a position is reused), so a slot
// of an earlier generation is stale; and a slot of the chunk's generation
// is current exactly while its position is allocated (a bitmap per chunk).
// A generation that wraps around only makes a stale slot look current to
// the writer, which keeps it a while longer; the arena check keeps every
// lookup right. indexPut reclaims the stale slots it probes: it puts its
// key in the first, and empties those just before the empty slot that ends
// its probe. At five eighths full (current and stale slots) the table is
// cleaned (clean) or rebuilt to a fifth full. (Deleting eagerly instead,
// by backward shift, in a table a third to five eighths full, made
// BenchmarkInsert/new a quarter slower: a cache miss per evicted key costs
// more than the cleaning.)
//
// Tables are kept sparse because every new key is a cache miss in the key
// index: at that load nearly every probe ends in the home slot's line. Any
// table size works (home is a multiply-shift, not a mask).
type keyIndex struct {
	slots []uint64
	used  int // slots not empty: current and stale (start index: keys held); writer-only
}

const (
	slotEmpty = 0
	// tagShift places the tag in a slot; the generation sits between it
	// and the position.
	tagShift = 36
	genBits  = tagShift - 32
	genMask  = 1<<genBits - 1
	// minIndexSlots keeps small trees cheap. A rebuilt table is a fifth
	// full and is cleaned or rebuilt at five eighths full, so it is 13 to
	// 40 bytes per key.
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

// dist is how many slots on from slot a slot b is, wrapping.
func (ix *keyIndex) dist(a, b uint64) uint64 {
	if b < a {
		b += uint64(len(ix.slots))
	}
	return b - a
}

// free returns the first empty slot from the home of hash (or slot) h.
func (ix *keyIndex) free(h uint64) uint64 {
	i := ix.home(h)
	for ix.slots[i] != slotEmpty {
		i = ix.next(i)
	}
	return i
}

// place puts slot s at the first empty slot from its home, with a plain
// store: in the key index, or a start index not yet published.
func (ix *keyIndex) place(s uint64) { ix.slots[ix.free(s)] = s }

// full reports whether ix is over five eighths full and due a rebuild.
func (ix *keyIndex) full() bool { return ix.used*8 > len(ix.slots)*5 }

func sameTag(s, h uint64) bool { return s>>tagShift == h>>tagShift }

func slotPos(s uint64) uint32 { return uint32(s) - 2 }

// startSlot is the start index's slot of a key with hash h at pos.
func startSlot(h uint64, pos uint32) uint64 { return h>>tagShift<<tagShift | uint64(pos+2) }

// slotFor is the key index's slot of a key with hash h at pos, in pos's
// chunk's current generation.
func (t *Tree) slotFor(h uint64, pos uint32) uint64 {
	return startSlot(h, pos) | uint64(t.gens[pos>>poolBits])<<32
}

// oldGen reports whether key index slot s is from an earlier generation of
// its position's chunk, so stale (see keyIndex); writer-only. It reads only
// the small generation array, so probes may ask it of every slot they pass.
func (t *Tree) oldGen(s uint64) bool {
	return uint8(s>>32)&genMask != t.gens[slotPos(s)>>poolBits]
}

// current reports whether key index slot s is not stale; writer-only.
func (t *Tree) current(s uint64) bool {
	p := slotPos(s)
	return !t.oldGen(s) && t.inUse[p>>6]&(1<<(p&63)) != 0
}

// find returns the position of a stored key and the node that owns it;
// writer-only.
func (t *Tree) find(key uint64) (pos uint32, owner int32, ok bool) {
	_, pos, owner, ok = t.probe(t.index, key)
	return pos, owner, ok
}

// findStart returns the position of key and the node that owns it, if key
// starts a node: readers and the writer alike. The node is read after the
// slot, so a reader checks it still starts there.
func (t *Tree) findStart(key uint64) (pos uint32, owner int32, ok bool) {
	_, pos, owner, ok = t.probe(t.starts.Load(), key)
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

// prefetch loads the key index's home slot of every key, and the cache line
// after it (8 slots a line; a large table starts on a page), so the cache
// misses of a batch overlap instead of each waiting on the branches of the
// last (the index is far larger than the cache); a probe that runs on past
// the home slot's line finds the next one loaded too (BenchmarkInsert/new
// about 7.5 -> 6.8 µs side by side).
func (t *Tree) prefetch(keys []uint64) {
	ix := t.index
	last := uint64(len(ix.slots) - 1)
	var sink uint64
	for _, k := range keys {
		i := ix.home(hashKey(k))
		sink += ix.slots[i] + ix.slots[min(i|7+1, last)]
	}
	t.sink = sink
}

// indexPut stores key at pos, an allocated position no node owns yet, in
// the key index and reports true, or reports false when the key is already
// stored (at a position a node owns, or earlier in the batch being added).
func (t *Tree) indexPut(key uint64, pos uint32) bool {
	ix := t.index
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
	ix.slots[free] = t.slotFor(h, pos)
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
		ix.slots[j] = slotEmpty
		ix.used--
	}
	if ix.full() {
		t.rebuildIndex()
	}
	return true
}

// indexMove records in the key index that key now sits at pos
// (evacuation).
func (t *Tree) indexMove(key uint64, pos uint32) {
	i, _, _, ok := t.probe(t.index, key)
	if !ok {
		panic("BUG: radix: moving a key that is not indexed")
	}
	t.index.slots[i] = t.slotFor(hashKey(key), pos)
}

// rebuildIndex drops the key index's stale slots, leaving it a fifth full:
// in place if it is about the size for that (no allocation: a new table
// is tens of megabytes of fresh memory to fault in), else in a new table.
func (t *Tree) rebuildIndex() {
	n := max(minIndexSlots, 5*t.keysInUse)
	if old := t.index; len(old.slots) >= n*4/5 && len(old.slots) <= n*5/4 {
		if t.clean(old); old.used*4 <= len(old.slots) {
			return
		}
	}
	// Stale slots that look current (see keyIndex) are copied too; in the
	// rare case they overfill the table, it is built again twice as big.
	ix := t.copyCurrent(n)
	for ix == nil {
		n *= 2
		ix = t.copyCurrent(n)
	}
	t.index = ix
}

// copyCurrent returns a table of n slots holding the key index's current
// slots, or nil if they fill more than three quarters of it.
func (t *Tree) copyCurrent(n int) *keyIndex {
	ix := newKeyIndex(n)
	for _, s := range t.index.slots {
		if s == slotEmpty || !t.current(s) {
			continue
		}
		if ix.used++; ix.used*4 > n*3 {
			return nil
		}
		ix.place(s)
	}
	return ix
}

// clean drops the key index's stale slots in place, one cluster (run of
// full slots) at a time: it empties the cluster and puts the current slots
// back in their order, each at the first empty slot from its home. Each
// lands no later than it was (fewer slots went before it), so within its
// cluster, and every slot from a key's home to its own is still full.
func (t *Tree) clean(ix *keyIndex) {
	// Start after an empty slot, so that no cluster wraps past the start
	// (a table is never full).
	e := uint64(0)
	for ix.slots[e] != slotEmpty {
		e++
	}
	keep := t.keep[:0]
	ix.used = 0
	for i, left := ix.next(e), len(ix.slots); left > 0; i, left = ix.next(i), left-1 {
		if ix.slots[i] == slotEmpty {
			continue
		}
		keep = keep[:0]
		for ; ix.slots[i] != slotEmpty; i, left = ix.next(i), left-1 {
			if s := ix.slots[i]; t.current(s) {
				keep = append(keep, s)
			}
			ix.slots[i] = slotEmpty
		}
		for _, s := range keep {
			ix.place(s)
		}
		ix.used += len(keep)
	}
	t.keep = keep
}

// startPut records in the start index that key starts a node at pos.
func (t *Tree) startPut(key uint64, pos uint32) {
	ix := t.starts.Load()
	h := hashKey(key)
	atomic.StoreUint64(&ix.slots[ix.free(h)], startSlot(h, pos))
	if ix.used++; ix.full() {
		t.resizeStarts()
	}
}

// startSlotOf returns the start index slot of key at pos, which it holds.
func (t *Tree) startSlotOf(ix *keyIndex, key uint64, pos uint32) uint64 {
	h := hashKey(key)
	s := startSlot(h, pos)
	for i := ix.home(h); ; i = ix.next(i) {
		switch ix.slots[i] {
		case s:
			return i
		case slotEmpty:
			panic("BUG: radix: a node's first key is not in the start index")
		}
	}
}

// startDelete records that key, at pos, no longer starts a node.
func (t *Tree) startDelete(key uint64, pos uint32) {
	ix := t.starts.Load()
	i := t.startSlotOf(ix, key, pos)
	// Slot j may move back to hole i when its home is no further along the
	// probe run than i. While keys move, moves is odd: one may move back
	// past a reader's probe. Emptying the hole alone hides no key, since no
	// probe that passes it finds anything after it; most deletions move
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

// startMove records that the node starting with key moved from one
// position to another (evacuation). The slot stays: its home is the same.
func (t *Tree) startMove(key uint64, from, to uint32) {
	ix := t.starts.Load()
	atomic.StoreUint64(&ix.slots[t.startSlotOf(ix, key, from)], startSlot(hashKey(key), to))
}

// resizeStarts publishes a start index a fifth full.
func (t *Tree) resizeStarts() {
	old := t.starts.Load()
	ix := newKeyIndex(max(minIndexSlots, 5*old.used))
	ix.used = old.used
	for _, s := range old.slots {
		if s == slotEmpty {
			continue
		}
		ix.place(s)
	}
	t.starts.Store(ix)
	t.moves.Add(2) // even: the old table stays whole, it only goes stale
}

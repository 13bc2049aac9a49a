package hf

import (
	"math"
	"unicode/utf8"
)

// bpe is HF's BPE model without dropout or subword affixes.
type bpe struct {
	// vocab maps a token to its id; a byte-level model's keys are the raw
	// bytes the token stands for, not its printable spelling.
	vocab      map[string]uint32
	merges     mergeTable
	byteID     [256]int32 // byte-level: the id of each single byte
	fallbackID [256]int32 // byte_fallback: the id of "<0xAB>", or -1
	// charID is the id of each one-character token below U+10000, -1 where
	// there is none (SentencePiece-style models start BPE from characters).
	charID       []int32
	unk          uint32
	hasUnk       bool
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteLevel    bool
	// metaChunks: no token has "▁" after another character, so no merge
	// crosses the start of a "▁" run and a word is encoded in chunks cut
	// there (the same ids, and chunks fit the word cache). Not with
	// ignore_merges, which looks up the whole word.
	metaChunks bool
}

// mergeTable maps a pair of ids to the merge's rank and result: open
// addressing over (left<<32 | right), key and value side by side so a
// lookup touches one cache line.
type mergeTable struct {
	slots []mergeSlot
	shift uint
}

type mergeSlot struct {
	key uint64
	val uint64 // (rank+1)<<32 | new id; 0 marks an empty slot
}

func newMergeTable(n int) mergeTable {
	size, shift := 1, uint(64)
	for size < 2*n+1 {
		size <<= 1
		shift--
	}
	return mergeTable{slots: make([]mergeSlot, size), shift: shift}
}

func (m *mergeTable) slot(key uint64) int {
	return int((key * 0x9e3779b97f4a7c15) >> m.shift)
}

func (m *mergeTable) put(left, right, rank, id uint32) {
	key := uint64(left)<<32 | uint64(right)
	mask := len(m.slots) - 1
	for i := m.slot(key); ; i = (i + 1) & mask {
		if s := &m.slots[i]; s.val == 0 || s.key == key {
			s.key, s.val = key, uint64(rank+1)<<32|uint64(id)
			return
		}
	}
}

// get returns the rank and result of merging left and right.
func (m *mergeTable) get(left, right uint32) (rank, id uint32, ok bool) {
	key := uint64(left)<<32 | uint64(right)
	mask := len(m.slots) - 1
	for i := m.slot(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.val == 0 {
			return 0, 0, false
		}
		if s.key == key {
			return uint32(s.val>>32) - 1, uint32(s.val), true
		}
	}
}

// symbols sets e.ids to the initial symbols of w as HF's merge_word does:
// one per byte (byte-level) or per character, a character missing from the
// vocabulary as its <0xAB> byte tokens (byte_fallback) or unk (fused
// when fuse_unk), or dropped when there is no unk.
func (e *encoder) symbols(b *bpe, w []byte) {
	ids := e.ids[:0]
	if b.byteLevel {
		for _, c := range w {
			ids = append(ids, uint32(b.byteID[c]))
		}
		e.ids = ids
		return
	}
	unk := false // an unk is pending, to be flushed before the next known character
	for i := 0; i < len(w); {
		r, n := utf8.DecodeRune(w[i:])
		ch := w[i : i+n]
		i += n
		id, ok := uint32(0), false
		if int(r) < len(b.charID) && (r != utf8.RuneError || n > 1) {
			id, ok = uint32(b.charID[r]), b.charID[r] >= 0
		} else {
			id, ok = b.vocab[string(ch)]
		}
		if ok {
			if unk {
				ids, unk = append(ids, b.unk), false
			}
			ids = append(ids, id)
			continue
		}
		if b.byteFallback && b.hasFallback(ch) {
			// HF adds these without flushing a pending unk first.
			for _, c := range ch {
				ids = append(ids, uint32(b.fallbackID[c]))
			}
			continue
		}
		if b.hasUnk {
			if unk && !b.fuseUnk {
				ids = append(ids, b.unk)
			}
			unk = true
		}
	}
	if unk {
		ids = append(ids, b.unk)
	}
	e.ids = ids
}

func (b *bpe) hasFallback(ch []byte) bool {
	for _, c := range ch {
		if b.fallbackID[c] < 0 {
			return false
		}
	}
	return true
}

// merge appends the BPE ids of w: the pair of lowest rank, leftmost first,
// is merged until no pair has a merge (HF's merge_all without dropout).
func (e *encoder) merge(b *bpe, dst []uint32, w []byte) []uint32 {
	e.symbols(b, w)
	ids := e.ids
	n := len(ids)
	if n < 2 {
		return append(dst, ids...)
	}
	if n <= smallWord {
		return e.mergeSmall(b, dst)
	}
	prev, next := e.prev[:0], e.next[:0]
	for i := range n {
		prev, next = append(prev, int32(i-1)), append(next, int32(i+1))
	}
	next[n-1] = -1
	e.prev, e.next = prev, next
	h := e.heap[:0]
	for i := 0; i+1 < n; i++ {
		if rank, _, ok := b.merges.get(ids[i], ids[i+1]); ok {
			h = append(h, uint64(rank)<<32|uint64(i))
		}
	}
	heapify(h)
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		pos, rank := int32(uint32(top)), uint32(top>>32)
		nx := next[pos]
		if nx < 0 || prev[pos] == -2 {
			continue
		}
		// Skip an entry made stale by an earlier merge of either symbol.
		r, id, ok := b.merges.get(ids[pos], ids[nx])
		if !ok || r != rank {
			continue
		}
		ids[pos] = id
		next[pos] = next[nx]
		if next[nx] >= 0 {
			prev[next[nx]] = pos
		}
		prev[nx] = -2 // removed
		if p := prev[pos]; p >= 0 {
			if r, _, ok := b.merges.get(ids[p], id); ok {
				h = heapPush(h, uint64(r)<<32|uint64(p))
			}
		}
		if q := next[pos]; q >= 0 {
			if r, _, ok := b.merges.get(id, ids[q]); ok {
				h = heapPush(h, uint64(r)<<32|uint64(pos))
			}
		}
	}
	e.heap = h
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, ids[i])
	}
	return dst
}

// smallWord is the most symbols mergeSmall takes: below it a linear scan
// for the best pair beats heap upkeep.
const smallWord = 24

// mergeSmall is merge for a few symbols: the (rank<<32 | new id) of each
// adjacent pair sits in an array scanned for the lowest, leftmost first.
func (e *encoder) mergeSmall(b *bpe, dst []uint32) []uint32 {
	ids := e.ids
	pairs := e.heap[:0]
	pair := func(i int) uint64 {
		if r, id, ok := b.merges.get(ids[i], ids[i+1]); ok {
			return uint64(r)<<32 | uint64(id)
		}
		return math.MaxUint64
	}
	for i := 0; i+1 < len(ids); i++ {
		pairs = append(pairs, pair(i))
	}
	for {
		best := -1
		low := uint64(math.MaxUint64)
		for i, p := range pairs {
			if p < low {
				best, low = i, p
			}
		}
		if best < 0 {
			break
		}
		ids[best] = uint32(low)
		ids = append(ids[:best+1], ids[best+2:]...)
		pairs = append(pairs[:best], pairs[best+1:]...)
		if best > 0 {
			pairs[best-1] = pair(best - 1)
		}
		if best < len(pairs) {
			pairs[best] = pair(best)
		}
	}
	e.heap = pairs
	return append(dst, ids...)
}

// heapPush, heapPop and heapify keep a 4-ary min-heap of
// (rank<<32 | position): half the depth of a binary heap.
func heapPush(h []uint64, v uint64) []uint64 {
	h = append(h, v)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if h[p] <= v {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = v
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	siftDown(h, 0)
	return top, h
}

func heapify(h []uint64) {
	for i := (len(h) - 2) / 4; i >= 0; i-- {
		siftDown(h, i)
	}
}

func siftDown(h []uint64, i int) {
	if i >= len(h) {
		return
	}
	x := h[i]
	for {
		c := 4*i + 1
		if c >= len(h) {
			break
		}
		small := c
		for k := c + 1; k < c+4 && k < len(h); k++ {
			if h[k] < h[small] {
				small = k
			}
		}
		if h[small] >= x {
			break
		}
		h[i] = h[small]
		i = small
	}
	h[i] = x
}

// runeByte inverts GPT-2's byte-level alphabet, the printable character
// spelling each byte: printable Latin-1 bytes stand for themselves, the
// others are shifted to U+0100 onwards in byte order. -1: not in the
// alphabet.
var runeByte = func() (rb [0x144]int16) {
	for i := range rb {
		rb[i] = -1
	}
	shifted := 0x100
	for b := range 256 {
		r := b
		if !('!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF) {
			r = shifted
			shifted++
		}
		rb[r] = int16(b)
	}
	return rb
}()

// byteLevelDecode turns a byte-level token into the bytes it stands for;
// false when it has a character outside the alphabet.
func byteLevelDecode(tok string) (string, bool) {
	var buf [64]byte
	out := buf[:0]
	for _, r := range tok {
		if int(r) >= len(runeByte) || runeByte[r] < 0 {
			return "", false
		}
		out = append(out, byte(runeByte[r]))
	}
	return string(out), true
}

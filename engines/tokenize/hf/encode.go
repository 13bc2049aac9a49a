package hf

import (
	"bytes"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/text/unicode/norm"
)

type normKind string

const (
	normNFC     normKind = "NFC"
	normPrepend normKind = "Prepend"
	normReplace normKind = "Replace"
)

// normStep is one normalizer: NFC, Prepend(to) or Replace(from -> to).
type normStep struct {
	kind     normKind
	from, to string
}

type preKind uint8

const (
	preSplit preKind = iota
	preByteLevel
	preMetaspace
)

// splitBehavior is HF's SplitDelimiterBehavior: what becomes of a match.
type splitBehavior uint8

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

type prependScheme uint8

const (
	prependAlways prependScheme = iota
	prependFirst                // only on a piece that starts the input
	prependNever
)

// preStep is one pre-tokenizer.
type preStep struct {
	kind     preKind
	behavior splitBehavior // Split
	scan     scanner       // Split regex; ByteLevel use_regex (GPT-2)
	literal  string        // Split string pattern; Metaspace replacement
	// ByteLevel
	prefixSpace, useRegex bool
	// Metaspace
	prepend   prependScheme
	metaSplit bool
}

// span is a piece of a pre-tokenizer's input: a match of its pattern or the
// text between two matches.
type span struct {
	start, end int
	match      bool
}

// encoder holds one encode call's scratch buffers; Tokenizer pools them so
// a steady-state encode allocates nothing.
type encoder struct {
	normBuf [2][]byte
	preBuf  [][]byte // per pre-tokenizer step
	spans   [][]span // per pre-tokenizer step
	ids     []uint32 // BPE symbols
	prev    []int32
	next    []int32
	heap    []uint64
	count   []uint32
	// recent holds the words this encoder looked up last, by their hash
	// (one slot each), in front of the tokenizer's word cache, whose
	// lookups take a lock: two atomic writes of a shared cache line per
	// word.
	recent [recentWords]cacheEntry
	// unseen is how many more bytes of segments the segment cache does
	// not hold this encode may take (< 0: any); over says it met one
	// larger, and encodes nothing more.
	unseen int
	over   bool
}

// recentWords is how many words an encoder holds (recent): 1,024 slots,
// 48 KB per encoder.
const recentWords = 1024

// encode appends the ids of text without post-processing.
func (e *encoder) encode(t *Tokenizer, dst []uint32, text []byte) []uint32 {
	return t.raw.split(dst, text, func(dst []uint32, seg []byte, first bool) []uint32 {
		return e.segment(t, dst, seg, first)
	})
}

// segmentSeed distinguishes, in the segment cache, a segment that starts
// the input (Metaspace's "first" scheme prepends only to that one).
const segmentSeed = 0x9e3779b97f4a7c15

// segment encodes text between two raw added tokens: normalise, split on
// the normalized added tokens, pre-tokenise, BPE.
func (e *encoder) segment(t *Tokenizer, dst []uint32, seg []byte, first bool) []uint32 {
	if e.over {
		return dst
	}
	var h uint64
	if t.segments != nil {
		h = xxhash.Sum64(seg)
		if first {
			h ^= segmentSeed
		}
		if out, ok := t.segments.get(dst, h, seg, first); ok {
			return out
		}
	}
	if e.unseen >= 0 {
		if e.unseen -= len(seg); e.unseen < 0 {
			e.over = true
			return dst
		}
	}
	n := len(dst)
	s := e.normalize(t, seg)
	dst = t.normalized.split(dst, s, func(dst []uint32, part []byte, start bool) []uint32 {
		return e.pre(t, dst, 0, part, first && start)
	})
	if t.segments != nil {
		t.segments.put(h, seg, first, dst[n:])
	}
	return dst
}

// normalize applies the normalizers to s, returning s itself when none
// changes it, else one of e's buffers.
func (e *encoder) normalize(t *Tokenizer, s []byte) []byte {
	cur := -1 // which normBuf s is, -1: neither
	for _, n := range t.norm {
		out := e.normBuf[(cur+1)%2][:0]
		switch n.kind {
		case normNFC:
			if norm.NFC.QuickSpan(s) == len(s) {
				continue
			}
			out = norm.NFC.Append(out, s...)
		case normPrepend:
			if len(s) == 0 {
				continue
			}
			out = append(append(out, n.to...), s...)
		case normReplace:
			if !bytes.Contains(s, []byte(n.from)) {
				continue
			}
			out = replace(out, s, n.from, n.to)
		}
		cur = (cur + 1) % 2
		e.normBuf[cur] = out
		s = out
	}
	return s
}

// replace appends s to dst with every from replaced by to.
func replace(dst, s []byte, from, to string) []byte {
	for {
		i := bytes.Index(s, []byte(from))
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(append(dst, s[:i]...), to...)
		s = s[i+len(from):]
	}
}

// buf returns pre-tokenizer step's scratch buffer, emptied.
func (e *encoder) buf(step int) []byte {
	for len(e.preBuf) <= step {
		e.preBuf = append(e.preBuf, nil)
		e.spans = append(e.spans, nil)
	}
	return e.preBuf[step][:0]
}

// pre runs pre-tokenizer step on piece and the later steps on what it
// yields, then the model on each final piece. first says piece starts the
// input.
func (e *encoder) pre(t *Tokenizer, dst []uint32, step int, piece []byte, first bool) []uint32 {
	if len(piece) == 0 {
		return dst
	}
	if step == len(t.pre) {
		return e.word(t, dst, piece)
	}
	s := &t.pre[step]
	switch s.kind {
	case preSplit:
		return e.split(t, dst, step, piece, first, s.behavior)
	case preByteLevel:
		if s.prefixSpace && piece[0] != ' ' {
			b := append(append(e.buf(step), ' '), piece...)
			e.preBuf[step] = b
			piece = b
		}
		if s.useRegex {
			return e.split(t, dst, step, piece, first, splitIsolated)
		}
	case preMetaspace:
		b := e.buf(step)
		if s.prepend == prependAlways || s.prepend == prependFirst && first {
			if !bytes.HasPrefix(piece, []byte(s.literal)) && piece[0] != ' ' {
				b = append(b, s.literal...)
			}
		}
		b = replace(b, piece, " ", s.literal)
		e.preBuf[step] = b
		if s.metaSplit {
			return e.split(t, dst, step, b, first, splitMergedWithNext)
		}
		piece = b
	}
	return e.pre(t, dst, step+1, piece, first)
}

// split cuts piece at the matches of step's pattern, applies behavior and
// hands each non-empty part to the next step.
func (e *encoder) split(t *Tokenizer, dst []uint32, step int, piece []byte, first bool, behavior splitBehavior) []uint32 {
	e.buf(step)
	sp := e.spans[step][:0]
	s := &t.pre[step]
	gap := 0 // start of the text before the next match
	for i := 0; i < len(piece); {
		end := -1
		switch {
		case s.scan != nil:
			end = s.scan(piece, i)
		case bytes.HasPrefix(piece[i:], []byte(s.literal)):
			end = i + len(s.literal)
		}
		if end < 0 {
			_, n := utf8.DecodeRune(piece[i:])
			i += n
			continue
		}
		if gap < i {
			sp = append(sp, span{gap, i, false})
		}
		sp = append(sp, span{i, end, true})
		i, gap = end, end
	}
	if gap < len(piece) {
		sp = append(sp, span{gap, len(piece), false})
	}
	sp = applyBehavior(sp, behavior)
	e.spans[step] = sp
	for _, p := range sp {
		dst = e.pre(t, dst, step+1, piece[p.start:p.end], first && p.start == 0)
	}
	return dst
}

// applyBehavior rewrites the spans in place as HF's NormalizedString.split
// does for behavior.
func applyBehavior(sp []span, behavior splitBehavior) []span {
	out := sp[:0]
	prevMatch := false
	switch behavior {
	case splitIsolated:
		return sp
	case splitRemoved:
		for _, p := range sp {
			if !p.match {
				out = append(out, p)
			}
		}
	case splitContiguous:
		for _, p := range sp {
			if p.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = p.end
			} else {
				out = append(out, p)
			}
			prevMatch = p.match
		}
	case splitMergedWithPrevious:
		for _, p := range sp {
			if p.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = p.end
			} else {
				out = append(out, p)
			}
			prevMatch = p.match
		}
	case splitMergedWithNext:
		// Right to left, written from the end of sp towards its start.
		w := len(sp)
		for i := len(sp) - 1; i >= 0; i-- {
			p := sp[i]
			if p.match && !prevMatch && w < len(sp) {
				sp[w].start = p.start
			} else {
				w--
				sp[w] = p
			}
			prevMatch = p.match
		}
		return sp[w:]
	}
	return out
}

// word appends the model's ids for one pre-tokenized piece.
func (e *encoder) word(t *Tokenizer, dst []uint32, w []byte) []uint32 {
	b := &t.bpe
	if b.ignoreMerges {
		if id, ok := b.vocab[string(w)]; ok {
			return append(dst, id)
		}
	}
	if !b.metaChunks {
		return e.chunk(t, dst, w)
	}
	for len(w) > 0 {
		n := metaBoundary(w)
		dst = e.chunk(t, dst, w[:n])
		w = w[n:]
	}
	return dst
}

// meta is SentencePiece's space, "▁".
const meta = "\u2581"

// metaBoundary is the end of w's first chunk: the first "▁" that follows
// another character.
func metaBoundary(w []byte) int {
	for i := 1; i < len(w); {
		j := bytes.Index(w[i:], []byte(meta))
		if j < 0 {
			break
		}
		i += j
		if r, _ := utf8.DecodeLastRune(w[:i]); r != '\u2581' {
			return i
		}
		i += len(meta)
	}
	return len(w)
}

// chunk appends the BPE ids of w through the word cache.
func (e *encoder) chunk(t *Tokenizer, dst []uint32, w []byte) []uint32 {
	cached := t.words != nil && len(w) <= maxCachedWord
	var h uint64
	var r *cacheEntry
	if cached {
		h = xxhash.Sum64(w)
		// A slot's key is never empty once set (words are not), so an
		// empty slot matches no word.
		if r = &e.recent[h%recentWords]; r.key == string(w) {
			return append(dst, r.ids...)
		}
		if ent, ok := t.words.lookup(h, w, false); ok {
			*r = ent
			return append(dst, ent.ids...)
		}
	}
	n := len(dst)
	dst = e.merge(&t.bpe, dst, w)
	if cached {
		if ent, ok := t.words.put(h, w, false, dst[n:]); ok {
			*r = ent
		}
	}
	return dst
}

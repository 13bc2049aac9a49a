package hf

import (
	"bytes"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one added token with the flags that shape its match.
type addedToken struct {
	id                         uint32
	singleWord, lstrip, rstrip bool
}

// addedSet finds added tokens in text: leftmost-longest, non-overlapping
// matches in a byte trie, which is what HF's Aho-Corasick automaton
// (MatchKind::LeftmostLongest) reports.
type addedSet struct {
	first [256]bool   // bytes a token can start with: the root's keys
	nodes []addedNode // the trie; nodes[0] is its root
	toks  []addedToken
}

// addedNode is a node of an addedSet's trie: the token ending there (an
// index in toks, or -1) and its children, found by IndexByte in keys (a
// node has a few, bar a root's or a numbered family's tens): a walk costs
// no hashing.
type addedNode struct {
	tok  int32
	keys string   // the bytes its edges take
	kids []uint32 // kids[i] is the node keys[i] leads to
}

// add inserts content; a content already present keeps its first token, as
// the automaton reports the lowest pattern index.
func (s *addedSet) add(content string, tok addedToken) {
	if content == "" {
		return
	}
	if s.nodes == nil {
		s.nodes = []addedNode{{tok: -1}}
	}
	s.first[content[0]] = true
	node := uint32(0)
	for i := 0; i < len(content); i++ {
		n := &s.nodes[node]
		if k := strings.IndexByte(n.keys, content[i]); k >= 0 {
			node = n.kids[k]
			continue
		}
		child := uint32(len(s.nodes))
		n.keys += content[i : i+1]
		n.kids = append(n.kids, child)
		s.nodes = append(s.nodes, addedNode{tok: -1})
		node = child
	}
	if n := &s.nodes[node]; n.tok < 0 {
		n.tok = int32(len(s.toks))
		s.toks = append(s.toks, tok)
	}
}

// longest returns the end of the longest token starting at text[i] and its
// index in toks, or -1.
func (s *addedSet) longest(text []byte, i int) (end int, tok int32) {
	tok = -1
	n := &s.nodes[0]
	for j := i; j < len(text); j++ {
		k := strings.IndexByte(n.keys, text[j])
		if k < 0 {
			break
		}
		n = &s.nodes[n.kids[k]]
		if n.tok >= 0 {
			end, tok = j+1, n.tok
		}
	}
	return end, tok
}

// split appends the ids of text: the added tokens' ids where next finds
// them, and what gap appends for the text between (first: it starts text).
// split keeps no reference to gap, so the encoder's closures stay on the
// stack.
func (s *addedSet) split(dst []uint32, text []byte, gap func(dst []uint32, part []byte, first bool) []uint32) []uint32 {
	from, pos := 0, 0
	for {
		start, stop, resume, id, ok := s.next(text, pos, from)
		if !ok {
			break
		}
		if from < start {
			dst = gap(dst, text[from:start], from == 0)
		}
		dst = append(dst, id)
		from, pos = stop, resume
	}
	if from < len(text) {
		dst = gap(dst, text[from:], from == 0)
	}
	return dst
}

// next finds the first token match at or after pos and applies HF's
// find_matches rules: a single_word token touching a word character is
// skipped, lstrip takes the spaces before it (not before from, the end of
// the previous split), rstrip those after it. [start, stop) is the token's
// split; resume is where the search goes on (the end of the raw match).
func (s *addedSet) next(text []byte, pos, from int) (start, stop, resume int, id uint32, found bool) {
	if len(s.toks) == 0 {
		return 0, 0, 0, 0, false
	}
	// When every token starts with one byte (the '<' of every added token
	// of Qwen, Llama and Mistral), jump between its occurrences rather
	// than look at every byte.
	firsts := s.nodes[0].keys
	for p := pos; p < len(text); p++ {
		if len(firsts) == 1 {
			i := bytes.IndexByte(text[p:], firsts[0])
			if i < 0 {
				break
			}
			p += i
		} else if !s.first[text[p]] {
			continue
		}
		end, k := s.longest(text, p)
		if k < 0 {
			continue
		}
		tok := &s.toks[k]
		start, stop = p, end
		if tok.singleWord {
			before := start > 0 && endsWithWord(text[:start])
			after := stop < len(text) && startsWithWord(text[stop:])
			if before || after {
				p = end - 1
				continue
			}
		}
		if tok.lstrip {
			start = max(trailingSpaceStart(text[:start]), from)
		}
		if tok.rstrip {
			stop += leadingSpaceLen(text[stop:])
		}
		return start, stop, end, tok.id, true
	}
	return 0, 0, 0, 0, false
}

// isWordChar is \w of Rust's regex crate: Alphabetic, marks, decimal digits,
// connector punctuation and the joiners.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Other_Alphabetic, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(b []byte) bool {
	r, _ := utf8.DecodeLastRune(b)
	return isWordChar(r)
}

func startsWithWord(b []byte) bool {
	r, _ := utf8.DecodeRune(b)
	return isWordChar(r)
}

// trailingSpaceStart is where the whitespace at the end of b begins.
func trailingSpaceStart(b []byte) int {
	for len(b) > 0 {
		r, n := utf8.DecodeLastRune(b)
		if !unicode.IsSpace(r) {
			break
		}
		b = b[:len(b)-n]
	}
	return len(b)
}

// leadingSpaceLen is the length of the whitespace b starts with.
func leadingSpaceLen(b []byte) int {
	n := 0
	for n < len(b) {
		r, w := utf8.DecodeRune(b[n:])
		if !unicode.IsSpace(r) {
			break
		}
		n += w
	}
	return n
}

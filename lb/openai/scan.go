package openai

import (
	"bytes"
	"slices"

	"github.com/bytedance/sonic/unquote"
)

// scanner walks a body that sonic.Valid has already accepted, so it trusts
// the grammar: it never checks for EOF or stray bytes and only tells values
// apart by their first byte. That keeps the walk a handful of compares per
// token plus SIMD searches (bytes.IndexByte) inside strings, which is where
// a prompt's bytes are.
//
// sonic.Valid checks structure and numbers but not what follows a backslash
// in a string, so str checks escapes itself as it steps over them, and
// records a bad one in bad for Parse to report as malformed JSON.
type scanner struct {
	b   []byte
	p   int  // offset of the next unread byte
	bad bool // an invalid escape was seen
}

// ws skips JSON whitespace.
func (s *scanner) ws() {
	for s.p < len(s.b) {
		switch s.b[s.p] {
		case ' ', '\t', '\n', '\r':
			s.p++
		default:
			return
		}
	}
}

// next skips whitespace and a ',' or ':' separator after a value or key, then
// whitespace again, leaving s.p on the next key, value or closing bracket.
func (s *scanner) next() {
	s.ws()
	if c := s.b[s.p]; c == ',' || c == ':' {
		s.p++
		s.ws()
	}
}

// str reads the string at s.p (on its opening quote) and returns its raw
// bytes between the quotes and whether they hold escapes. The search is
// linear however many escapes the string has: the closing-quote candidate is
// searched for again only once an escape has stepped past it.
func (s *scanner) str() (raw []byte, esc bool) {
	start := s.p + 1
	// Keys, roles and most values end within a few bytes, where a plain
	// loop finds the quote sooner than the two IndexByte calls below.
	for i := start; i < min(start+shortString, len(s.b)); i++ {
		if c := s.b[i]; c == '"' {
			s.p = i + 1
			return s.b[start:i], false
		} else if c == '\\' {
			break
		}
	}
	i, end := start, -1
	for {
		if i > end {
			end = i + bytes.IndexByte(s.b[i:], '"')
		}
		k := bytes.IndexByte(s.b[i:end], '\\')
		if k < 0 {
			s.p = end + 1
			return s.b[start:end], esc
		}
		esc = true
		i += k + 1 // the escaped byte, which may be the quote found above
		switch s.b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			s.bad = s.bad || !isHex4(s.b[i+1:])
		default:
			s.bad = true
		}
		i++
	}
}

// shortString is how many bytes str reads one by one before it searches
// with IndexByte (bytes).
const shortString = 16

// isHex4 says b starts with four hex digits.
func isHex4(b []byte) bool {
	if len(b) < 4 {
		return false
	}
	for _, c := range b[:4] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// skip steps over the value at s.p and returns where it started.
func (s *scanner) skip() int {
	start := s.p
	switch s.b[s.p] {
	case '"':
		s.str()
	case '{', '[':
		depth := 0
		for {
			switch s.b[s.p] {
			case '"':
				s.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.p++
			if depth == 0 {
				return start
			}
		}
	default: // number, true, false, null
		for s.p < len(s.b) {
			switch s.b[s.p] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return start
			}
			s.p++
		}
	}
	return start
}

// key reads an object key at s.p and the separator after it, unescaping
// into *scratch only when the key holds escapes (rare: no client escapes
// ASCII key names, but JSON allows it).
func (s *scanner) key(scratch *[]byte) []byte {
	raw, esc := s.str()
	s.next()
	if !esc {
		return raw
	}
	var ok bool
	if *scratch, ok = appendUnquoted((*scratch)[:0], raw, true); !ok {
		s.bad = true
	}
	return *scratch
}

// uint reads the number at s.p as an unsigned integer no larger than max.
// ok is false for negative, fractional, exponent or too large numbers; raw
// is the number's text either way, for error messages.
func (s *scanner) uint(max uint64) (v uint64, raw []byte, ok bool) {
	start := s.skip()
	raw = s.b[start:s.p]
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, raw, false
		}
		v = v*10 + uint64(c-'0')
		if v > max {
			return 0, raw, false
		}
	}
	return v, raw, true
}

// appendUnquoted appends the JSON string contents raw to dst, decoding
// escapes with sonic's native unquote when esc says there are any. Escapes
// only ever shrink text, so growing dst by len(raw) is enough and sonic
// writes straight into dst's spare capacity. Invalid \u surrogates become
// U+FFFD, as in encoding/json. ok is false only if sonic rejects an escape
// sonic.Valid accepted, which would be a sonic bug; callers report it as
// malformed JSON rather than panic on client input.
func appendUnquoted(dst, raw []byte, esc bool) (out []byte, ok bool) {
	if !esc {
		return append(dst, raw...), true
	}
	n := len(dst)
	dst = slices.Grow(dst, len(raw))
	tail := dst[n:n:cap(dst)]
	if unquote.IntoBytes(b2s(raw), &tail) != 0 {
		return dst[:n], false
	}
	return dst[:n+len(tail)], true
}

// field is a value read in a first pass over an object and used once the
// whole object has been read.
type field struct {
	// form is the value's first byte ('"', '[', '{', 't', '-', '0'...), or 0
	// when the key was absent or its value null.
	form byte
	// raw is a string's contents between the quotes (esc: with escapes), or
	// the raw text of any other value, for error messages.
	raw []byte
	esc bool
	// start is the value's offset in the body.
	start int
}

// field reads the value at s.p.
func (s *scanner) field() (f field) {
	f.form, f.start = s.b[s.p], s.p
	switch f.form {
	case '"':
		f.raw, f.esc = s.str()
	case 'n':
		s.skip()
		f.form = 0
	default:
		s.skip()
		f.raw = s.b[f.start:s.p]
	}
	return f
}

package openai

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/bytedance/sonic/unquote"
)

// scanner walks a body once, checking its JSON grammar as it goes: Parse
// reads the few fields it needs and steps over every other value, and the
// walk is the body's only validation (a separate validator would be a second
// pass over every prompt byte). Inside strings, which is where a prompt's
// bytes are, it searches a word at a time or with bytes.IndexByte (SIMD)
// for the closing quote and backslashes (see str); between them it compares
// a few bytes per token.
//
// It accepts what sonic.Valid accepts: RFC 8259 JSON nested at most maxDepth
// deep, with raw control bytes (below 0x20) let through inside strings,
// which strict JSON forbids: the engine rejects such a body itself, and
// checking every string byte here would cost another pass. Unlike
// sonic.Valid it checks what follows each backslash (sonic accepts "\0").
//
// A grammar fault sets bad and moves p to the end of the body, where c reads
// 0, so every loop over a container ends at once; an invalid escape sets bad
// and the walk goes on. The walk never reads past the body.
type scanner struct {
	b     []byte
	p     int  // offset of the next unread byte
	depth int  // objects and lists open around p
	bad   bool // the body is not valid JSON, or holds an invalid escape
}

// maxDepth is how deep objects and lists may nest, the outermost counting
// one, and an object's members one deeper than the object: sonic.Valid's
// limit (MAX_RECURSE, its state stack, where a member takes a state above
// its object's), so a body is accepted exactly when the validator that
// came before this walk accepted it.
const maxDepth = 4096

// c returns the byte at p, or 0 at the end of the body (0 starts no JSON
// token, so callers treat both as a fault).
func (s *scanner) c() byte {
	if s.p < len(s.b) {
		return s.b[s.p]
	}
	return 0
}

// fail records a grammar fault and ends the walk.
func (s *scanner) fail() {
	s.bad = true
	s.p = len(s.b)
}

// ws skips JSON whitespace.
func (s *scanner) ws() { s.p = len(s.b) - len(skipWS(s.b[s.p:])) }

// skipWS returns b after its leading JSON whitespace. A loop, not
// bytes.TrimLeft, which builds its cutset's table on every call: the SSE
// counter calls it for every key of every event.
func skipWS(b []byte) []byte {
	for len(b) > 0 {
		switch b[0] {
		case ' ', '\t', '\n', '\r':
			b = b[1:]
		default:
			return b
		}
	}
	return b
}

// open steps into the object or list at p (on its '{' or '[') and past the
// whitespace after the bracket; false means it is nested too deep.
func (s *scanner) open() bool {
	if s.depth++; s.depth > maxDepth {
		s.fail()
		return false
	}
	s.p++
	s.ws()
	return true
}

// more is the condition of a loop over the members of an object or the
// elements of a list just opened, closing with close; i counts the ones
// read. It steps over the ',' before each one after the first and reports
// whether one follows, or steps out of the container past close and reports
// false; anything else is a fault. The loop's body reads each member or
// element and checks its first byte.
func (s *scanner) more(close byte, i int) bool {
	if i > 0 {
		s.ws()
		if s.c() == ',' {
			s.p++
			s.ws()
			return true
		}
	}
	switch c := s.c(); {
	case c == close:
		s.p++
		s.depth--
		return false
	case i == 0 && c != 0:
		return true
	}
	s.fail()
	return false
}

// str reads the string at s.p (on its opening quote) and returns its raw
// bytes between the quotes and whether they hold escapes. It looks for the
// next quote or backslash, whichever comes first, a word at a time (see
// quoteOrBackslash), so an escape costs a few nanoseconds however densely a
// prompt (source code, JSON quoted in JSON) packs them. Past swarSpan bytes
// without either it switches to bytes.IndexByte (SIMD), once for the closing
// quote and once for a backslash before it, which is faster over long plain
// runs. The quote found there is kept until an escape steps past it, so the
// walk stays linear however many escapes follow.
func (s *scanner) str() (raw []byte, esc bool) {
	b := s.b
	start := s.p + 1
	quote := -1 // the first '"' at or after i once IndexByte has found it
	for i := start; ; {
		j := quoteOrBackslash(b, i)
		if j < 0 {
			if quote < i {
				q := bytes.IndexByte(b[i:], '"')
				if q < 0 {
					s.fail() // unterminated
					return nil, false
				}
				quote = i + q
			}
			j = quote
			if k := bytes.IndexByte(b[i:quote], '\\'); k >= 0 {
				j = i + k
			}
		}
		if b[j] == '"' {
			s.p = j + 1
			return b[start:j], esc
		}
		esc = true
		i = j + 1 // the escaped byte
		if i == len(b) {
			s.fail() // unterminated
			return nil, false
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			s.bad = s.bad || !isHex4(b[i+1:])
		default:
			s.bad = true
		}
		i++
	}
}

// swarSpan is how many bytes quoteOrBackslash reads before str searches
// with IndexByte instead (bytes): about where IndexByte's cost per call is
// repaid by its speed per byte.
const swarSpan = 32

// quoteOrBackslash returns the offset in b of the first '"' or '\\' in the
// swarSpan bytes from i (fewer at the end of b), or -1 if there is none. It
// tests eight bytes at once (SWAR): x^c has a zero byte where x holds c,
// and (v-0x01..)&^v&0x80.. sets the top bit of v's lowest zero byte (bytes
// above it may be set too, by the borrow, which is why only the lowest
// counts).
func quoteOrBackslash(b []byte, i int) int {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	end := min(i+swarSpan, len(b))
	for ; i+8 <= end; i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q, bs := w^('"'*ones), w^('\\'*ones)
		if m := ((q-ones)&^q | (bs-ones)&^bs) & tops; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < end; i++ {
		if c := b[i]; c == '"' || c == '\\' {
			return i
		}
	}
	return -1
}

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

// skip steps over the value at s.p, checking its grammar, and returns where
// it started.
func (s *scanner) skip() int {
	start := s.p
	if c := s.c(); c == '{' || c == '[' {
		s.skipNested()
	} else {
		s.scalar(c)
	}
	return start
}

// scalar steps over the string, literal or number at s.p, whose first byte
// is c.
func (s *scanner) scalar(c byte) {
	switch c {
	case '"':
		s.str()
	case 't':
		s.literal("true")
	case 'f':
		s.literal("false")
	case 'n':
		s.literal("null")
	default:
		s.number()
	}
}

// skipNested steps over the object or list at s.p and everything inside it
// in one loop, keeping which open containers are objects in a bit stack
// rather than recursing once per level.
func (s *scanner) skipNested() {
	var objects [maxDepth / 64]uint64 // bit d: the container d levels below the first is an object
	base := s.depth
	for {
		// s.p is on a value.
		switch c := s.c(); c {
		case '{', '[':
			d := s.depth - base
			if !s.open() {
				return
			}
			if c == '{' {
				objects[d/64] |= 1 << (d % 64)
				if s.c() != '}' {
					s.name()
					continue
				}
			} else {
				objects[d/64] &^= 1 << (d % 64)
				if s.c() != ']' {
					continue
				}
			}
		default:
			s.scalar(c)
		}
		// After a value, or on an empty container's closing bracket: close
		// containers until one has another member or element.
		for {
			if s.depth == base {
				return
			}
			d := s.depth - base - 1
			object := objects[d/64]>>(d%64)&1 == 1
			s.ws()
			c := s.c()
			if c == ',' {
				s.p++
				s.ws()
				if object {
					s.name()
				}
				break
			}
			if object && c == '}' || !object && c == ']' {
				s.p++
				s.depth--
				continue
			}
			s.fail()
			return
		}
	}
}

// literal steps over the literal w (true, false or null) at s.p.
func (s *scanner) literal(w string) {
	if string(s.b[s.p:min(s.p+len(w), len(s.b))]) != w {
		s.fail()
		return
	}
	s.p += len(w)
}

// number steps over the number at s.p, checking RFC 8259's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() {
	if s.c() == '-' {
		s.p++
	}
	switch c := s.c(); {
	case c == '0':
		s.p++
	case '1' <= c && c <= '9':
		s.digits()
	default:
		s.fail()
		return
	}
	if s.c() == '.' {
		s.p++
		if !s.digits() {
			return
		}
	}
	if c := s.c(); c == 'e' || c == 'E' {
		s.p++
		if c := s.c(); c == '+' || c == '-' {
			s.p++
		}
		s.digits()
	}
}

// digits steps over one or more decimal digits; none is a fault.
func (s *scanner) digits() bool {
	start := s.p
	for c := s.c(); '0' <= c && c <= '9'; c = s.c() {
		s.p++
	}
	if s.p == start {
		s.fail()
		return false
	}
	return true
}

// name reads an object key at s.p and the ':' after it, returning the key's
// bytes between the quotes and whether they hold escapes.
func (s *scanner) name() (raw []byte, esc bool) {
	if s.c() != '"' || s.depth >= maxDepth {
		s.fail()
		return nil, false
	}
	raw, esc = s.str()
	s.ws()
	if s.c() != ':' {
		s.fail()
		return nil, false
	}
	s.p++
	s.ws()
	return raw, esc
}

// key is name, unescaping into *scratch only when the key holds escapes
// (rare: no client escapes ASCII key names, but JSON allows it).
func (s *scanner) key(scratch *[]byte) []byte {
	raw, esc := s.name()
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
	f.form, f.start = s.c(), s.p
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

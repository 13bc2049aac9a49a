package chat

import (
	"encoding/binary"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner walks one JSON text without building a tree. Strings are
// unescaped into a caller's arena so that a pooled Conversation parses a
// body without allocating. Offsets in errors are byte offsets into data.
type scanner struct {
	data []byte
	pos  int
	err  error
}

type syntaxError struct{ off int }

func (e *syntaxError) Error() string {
	return "invalid JSON at offset " + strconv.Itoa(e.off)
}

func (s *scanner) reset(data []byte) {
	s.data, s.pos, s.err = data, 0, nil
}

// fail records the first error; later calls keep it.
func (s *scanner) fail() {
	if s.err == nil {
		s.err = &syntaxError{off: s.pos}
	}
	s.pos = len(s.data)
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *scanner) expect(c byte) {
	if s.peek() != c {
		s.fail()
		return
	}
	s.pos++
}

// more reports whether an object or array opened by open has another
// member; it consumes the separating comma or the closing bracket.
func (s *scanner) more(first *bool, closing byte) bool {
	c := s.peek()
	if c == closing {
		s.pos++
		return false
	}
	if !*first {
		if c != ',' {
			s.fail()
			return false
		}
		s.pos++
	}
	*first = false
	return s.err == nil
}

// key reads an object key and its colon, unescaped into arena.
func (s *scanner) key(arena []byte) ([]byte, span) {
	arena, sp := s.str(arena)
	s.expect(':')
	return arena, sp
}

// isNull consumes a null literal if one comes next.
func (s *scanner) isNull() bool {
	if s.peek() == 'n' && s.lit("null") {
		return true
	}
	return false
}

func (s *scanner) lit(word string) bool {
	if len(s.data)-s.pos >= len(word) && string(s.data[s.pos:s.pos+len(word)]) == word {
		s.pos += len(word)
		return true
	}
	return false
}

// boolean reads true or false; ok is false when the value is another kind
// (left unread).
func (s *scanner) boolean() (v, ok bool) {
	switch s.peek() {
	case 't':
		if s.lit("true") {
			return true, true
		}
	case 'f':
		if s.lit("false") {
			return false, true
		}
	default:
		return false, false
	}
	s.fail()
	return false, false
}

// str reads a JSON string, appending its unescaped bytes to arena.
func (s *scanner) str(arena []byte) ([]byte, span) {
	if s.peek() != '"' {
		s.fail()
		return arena, span{}
	}
	s.pos++
	start := len(arena)
	for s.pos < len(s.data) {
		// Copy the run of plain bytes at once.
		i, ascii := plainRun(s.data, s.pos)
		// Runs end at ASCII bytes, so each holds whole UTF-8 sequences;
		// Python refuses a body that is not UTF-8.
		if !ascii && !utf8.Valid(s.data[s.pos:i]) {
			s.fail()
			return arena, span{}
		}
		arena = append(arena, s.data[s.pos:i]...)
		s.pos = i
		if i == len(s.data) {
			break
		}
		switch c := s.data[i]; {
		case c == '"':
			s.pos++
			return arena, span{uint32(start), uint32(len(arena))}
		case c < 0x20:
			s.fail()
			return arena, span{}
		}
		// Backslash escape.
		if s.pos+1 >= len(s.data) {
			break
		}
		e := s.data[s.pos+1]
		s.pos += 2
		switch e {
		case '"', '\\', '/':
			arena = append(arena, e)
		case 'b':
			arena = append(arena, '\b')
		case 'f':
			arena = append(arena, '\f')
		case 'n':
			arena = append(arena, '\n')
		case 'r':
			arena = append(arena, '\r')
		case 't':
			arena = append(arena, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return arena, span{}
			}
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if s.lit(`\u`) {
					if lo, ok := s.hex4(); ok {
						r2 = utf16.DecodeRune(r, lo)
					}
				}
				r = r2
			}
			arena = utf8.AppendRune(arena, r)
		default:
			s.pos -= 2
			s.fail()
			return arena, span{}
		}
	}
	s.fail()
	return arena, span{}
}

// plainRun returns the end of the bytes from i on that a JSON string holds
// as they are (not '"', '\\' or a control byte), and whether they are all
// ASCII. It tests eight bytes a step: a byte b is < 0x20, or equal to c
// after xor, when (b - 0x20) or (b^c - 1) borrows into its top bit while
// b itself has it clear.
func plainRun(data []byte, i int) (int, bool) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	var high uint64
	for ; i+8 <= len(data); i += 8 {
		x := binary.LittleEndian.Uint64(data[i:])
		q, bs := x^(ones*'"'), x^(ones*'\\')
		stop := ((x - ones*0x20) | (q - ones) | (bs - ones)) &^ x & highs
		if stop != 0 {
			break
		}
		high |= x
	}
	for ; i < len(data); i++ {
		c := data[i]
		if c == '"' || c == '\\' || c < 0x20 {
			break
		}
		high |= uint64(c)
	}
	return i, high&highs == 0
}

func (s *scanner) hex4() (rune, bool) {
	if len(s.data)-s.pos < 4 {
		s.fail()
		return 0, false
	}
	var r rune
	for _, c := range s.data[s.pos : s.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			s.fail()
			return 0, false
		}
	}
	s.pos += 4
	return r, true
}

// skip validates and passes over one value of any kind.
func (s *scanner) skip() {
	switch c := s.peek(); {
	case c == '{':
		s.pos++
		first := true
		for s.more(&first, '}') {
			s.skipString()
			s.expect(':')
			s.skip()
		}
	case c == '[':
		s.pos++
		first := true
		for s.more(&first, ']') {
			s.skip()
		}
	case c == '"':
		s.skipString()
	case c == 't':
		s.boolean()
	case c == 'f':
		s.boolean()
	case c == 'n':
		if !s.lit("null") {
			s.fail()
		}
	case c == '-' || (c >= '0' && c <= '9'):
		s.number()
	default:
		s.fail()
	}
}

// skipString passes over a string, validating its escapes and its UTF-8,
// a run of plain bytes at a time (plainRun).
func (s *scanner) skipString() {
	if s.peek() != '"' {
		s.fail()
		return
	}
	s.pos++
	for s.pos < len(s.data) {
		i, ascii := plainRun(s.data, s.pos)
		if !ascii && !utf8.Valid(s.data[s.pos:i]) {
			s.fail()
			return
		}
		s.pos = i
		if i == len(s.data) {
			break
		}
		switch c := s.data[i]; {
		case c == '"':
			s.pos++
			return
		case c < 0x20:
			s.fail()
			return
		}
		// Backslash escape.
		if s.pos+1 >= len(s.data) {
			break
		}
		switch s.data[s.pos+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.pos += 2
		case 'u':
			s.pos += 2
			if _, ok := s.hex4(); !ok {
				return
			}
		default:
			s.fail()
			return
		}
	}
	s.fail()
}

// number passes over a JSON number and returns its text and whether it
// is an integer literal (no fraction, no exponent), which Python's
// json.loads keeps as int.
func (s *scanner) number() (text []byte, isInt bool) {
	start := s.pos
	isInt = true
	if s.pos < len(s.data) && s.data[s.pos] == '-' {
		s.pos++
	}
	digits := func() int {
		n := 0
		for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.pos < len(s.data) && s.data[s.pos] == '0' {
		s.pos++
	} else if digits() == 0 {
		s.fail()
		return nil, false
	}
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		isInt = false
		s.pos++
		if digits() == 0 {
			s.fail()
			return nil, false
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		isInt = false
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if digits() == 0 {
			s.fail()
			return nil, false
		}
	}
	return s.data[start:s.pos], isInt
}

// raw passes over one value and returns its bytes as they stand.
func (s *scanner) raw() []byte {
	s.ws()
	start := s.pos
	s.skip()
	return s.data[start:s.pos]
}

// span is a byte range in a Conversation's arena.
type span struct{ lo, hi uint32 }

func (sp span) empty() bool { return sp.hi == sp.lo }

package openai

import (
	"bytes"
	"math"
	"strconv"
	"unicode"
)

// vLLM, SGLang and TensorRT-LLM validate a request with pydantic v2 in lax
// mode, over what Python's json module decoded, so a field typed int or
// bool takes more than its JSON type: the readers here take what it takes,
// and read it as pydantic does, so the gateway refuses none of it.

// laxInt reads the value at s.p as pydantic's lax mode reads an int field:
// an integer; a float without a fraction (8.0, 1e3, as Python's float
// holds it); true or false (1, 0); or a string holding an integer (see
// intText). ok is false for anything else, or past int64; raw is the
// value's text, quotes included, for error messages.
func (r *Request) laxInt(s *scanner) (v int64, raw []byte, ok bool) {
	f := s.field()
	raw = s.b[f.start:s.p]
	switch f.form {
	case 't':
		return 1, raw, true
	case 'f':
		return 0, raw, true
	case '"':
		text, ok := r.text(f)
		if !ok {
			return 0, raw, false
		}
		v, ok = intText(text)
		return v, raw, ok
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		v, ok = numberInt(raw)
		return v, raw, ok
	}
	return 0, raw, false
}

// laxBool reads the value at s.p as pydantic's lax mode reads a bool
// field: true or false; a number equal to 0 or 1 (0.0 and 1e0 too); or one
// of the strings boolText takes. null is false, the API's default.
func (r *Request) laxBool(s *scanner) (v bool, raw []byte, ok bool) {
	f := s.field()
	raw = s.b[f.start:s.p]
	switch f.form {
	case 0, 'f':
		return false, raw, true
	case 't':
		return true, raw, true
	case '"':
		text, ok := r.text(f)
		if !ok {
			return false, raw, false
		}
		v, ok = boolText(text)
		return v, raw, ok
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		n, ok := numberInt(raw)
		return n == 1, raw, ok && (n == 0 || n == 1)
	}
	return false, raw, false
}

// numberInt is the integer a JSON number holds (grammar already checked):
// an integer as written, or a float (as Python's float rounds it) without
// a fraction and inside int64. Python's json keeps larger integers whole,
// which the callers' ranges refuse anyway.
func numberInt(raw []byte) (int64, bool) {
	if bytes.IndexAny(raw, ".eE") < 0 {
		v, err := strconv.ParseInt(b2s(raw), 10, 64)
		return v, err == nil
	}
	f, err := strconv.ParseFloat(b2s(raw), 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// intText is the integer a string holds as pydantic reads it
// (str_as_int): surrounding Unicode whitespace, then an optional sign,
// decimal digits with single underscores between them, leading zeros
// (underscores among them too), and an optional tail of a dot and zeros:
// " +1_000.00 " is 1000; "8.5", "1e3", "8." and "0x10" are not integers.
func intText(t []byte) (int64, bool) {
	t = bytes.TrimFunc(t, unicode.IsSpace)
	neg := len(t) > 0 && t[0] == '-'
	if len(t) > 0 && (t[0] == '+' || t[0] == '-') {
		t = t[1:]
	}
	if i := bytes.IndexByte(t, '.'); i >= 0 {
		if i+1 == len(t) || len(bytes.TrimLeft(t[i+1:], "0")) > 0 {
			return 0, false
		}
		t = t[:i]
	}
	// Leading zeros go with any underscores among and after them, but
	// what is left must end in a digit: "0_8" is 8, "0_" is not a number.
	if len(t) > 0 && t[0] == '0' {
		rest := bytes.TrimLeft(t, "0_")
		if len(rest) == 0 {
			return 0, t[len(t)-1] == '0'
		}
		t = rest
	}
	var v int64
	for i, c := range t {
		switch {
		case c >= '0' && c <= '9':
			if v > (math.MaxInt64-int64(c-'0'))/10 {
				return 0, false
			}
			v = v*10 + int64(c-'0')
		case c == '_' && i > 0 && i+1 < len(t) && t[i-1] != '_':
		default:
			return 0, false
		}
	}
	if len(t) == 0 {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

// boolText reads a string as pydantic's lax mode reads it for a bool
// field: "0" and "1", or, in any case, "f", "n", "no", "off", "false",
// "t", "y", "yes", "on", "true"; no surrounding whitespace.
func boolText(t []byte) (v, ok bool) {
	switch string(t) {
	case "0":
		return false, true
	case "1":
		return true, true
	}
	for _, w := range [...]string{"f", "n", "no", "off", "false"} {
		if asciiEqualFold(t, w) {
			return false, true
		}
	}
	for _, w := range [...]string{"t", "y", "yes", "on", "true"} {
		if asciiEqualFold(t, w) {
			return true, true
		}
	}
	return false, false
}

// asciiEqualFold says t is w, ASCII letters compared without case (as
// pydantic compares them: no Unicode folding).
func asciiEqualFold(t []byte, w string) bool {
	if len(t) != len(w) {
		return false
	}
	for i, c := range t {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}

package engines

import (
	"math"
	"strconv"
	"strings"
	"unicode"
)

// vLLM, SGLang and TensorRT-LLM validate a request with pydantic v2 in lax
// mode, over what Python's json module decoded, so a field typed int or
// bool takes more than its JSON type. The readers below take what it
// takes and read it as it does; each gets the text of one JSON value (a
// string's unescaped contents, a number as written), so a caller with its
// own scanner keeps its own decoding and allocations.

// LaxIntNumber is the int a JSON number (grammar already checked) gives
// where pydantic v2's lax mode reads an int field: an integer as written,
// or a float, as Python's float rounds it, without a fraction (8.0, 1e3)
// and inside int64. ok is false for anything else; Python's json keeps
// integers past int64 whole, which no field's range takes anyway.
func LaxIntNumber(num string) (v int64, ok bool) {
	digits := strings.TrimPrefix(num, "-")
	if v, ok := shortDecimal(digits); ok {
		if len(digits) < len(num) {
			v = -v
		}
		return v, true
	}
	if !strings.ContainsAny(num, ".eE") {
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, false
		}
		return v, true
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// shortDecimal is the value of d if it is 1 to 18 decimal digits (which
// cannot overflow): the usual int field, summed without strconv's checks.
func shortDecimal(d string) (v int64, ok bool) {
	if len(d) == 0 || len(d) > 18 {
		return 0, false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// LaxIntString is the int a JSON string's contents give where pydantic
// v2's lax mode reads an int field (str_as_int): surrounding Unicode
// whitespace, then an optional sign, decimal digits with single
// underscores between them, leading zeros (underscores among them too),
// and an optional tail of a dot and zeros: " +1_000.00 " is 1000; "8.5",
// "1e3", "8." and "0x10" are not ints, nor is anything past int64.
func LaxIntString(s string) (v int64, ok bool) {
	t := strings.TrimFunc(s, unicode.IsSpace)
	neg := len(t) > 0 && t[0] == '-'
	if len(t) > 0 && (t[0] == '+' || t[0] == '-') {
		t = t[1:]
	}
	if i := strings.IndexByte(t, '.'); i >= 0 {
		if i+1 == len(t) || len(strings.TrimLeft(t[i+1:], "0")) > 0 {
			return 0, false
		}
		t = t[:i]
	}
	// Leading zeros go with any underscores among and after them, but
	// what is left must end in a digit: "0_8" is 8, "0_" is not a number.
	if len(t) > 0 && t[0] == '0' {
		rest := strings.TrimLeft(t, "0_")
		if len(rest) == 0 {
			return 0, t[len(t)-1] == '0'
		}
		t = rest
	}
	for i := 0; i < len(t); i++ {
		switch c := t[i]; {
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

// LaxBoolNumber is the bool a JSON number (grammar already checked) gives
// where pydantic v2's lax mode reads a bool field: one equal to 0 or 1,
// as LaxIntNumber reads it (0.0, -0, 1e0 and 1.00 too); ok is false for
// any other.
func LaxBoolNumber(num string) (v, ok bool) {
	n, ok := LaxIntNumber(num)
	return n == 1, ok && (n == 0 || n == 1)
}

// LaxBoolString is the bool a JSON string's contents give where pydantic
// v2's lax mode reads a bool field: "0" and "1", or, in any ASCII case,
// "f", "n", "no", "off", "false", "t", "y", "yes", "on", "true"; no
// surrounding whitespace. ok is false for any other string.
func LaxBoolString(s string) (v, ok bool) {
	switch s {
	case "0":
		return false, true
	case "1":
		return true, true
	}
	for _, w := range [...]string{"f", "n", "no", "off", "false"} {
		if asciiEqualFold(s, w) {
			return false, true
		}
	}
	for _, w := range [...]string{"t", "y", "yes", "on", "true"} {
		if asciiEqualFold(s, w) {
			return true, true
		}
	}
	return false, false
}

// asciiEqualFold says s is w (lower case), ASCII letters compared without
// case, as pydantic compares them: no Unicode folding.
func asciiEqualFold(s, w string) bool {
	if len(s) != len(w) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}

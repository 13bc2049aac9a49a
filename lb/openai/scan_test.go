package openai

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// strByByte is what scanner.str must do, read one byte at a time: the raw
// bytes of the string opening at b[p], whether they hold escapes, whether an
// escape is invalid, and the offset past the closing quote; ok is false for
// an unterminated string.
func strByByte(b []byte, p int) (raw []byte, esc, bad bool, next int, ok bool) {
	for i := p + 1; i < len(b); i++ {
		switch b[i] {
		case '"':
			return b[p+1 : i], esc, bad, i + 1, true
		case '\\':
			esc = true
			if i++; i == len(b) {
				return nil, false, false, 0, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				bad = bad || !isHex4(b[i+1:])
			default:
				bad = true
			}
		}
	}
	return nil, false, false, 0, false
}

// checkStr runs scanner.str on the string opening at b[p] and compares it
// with strByByte.
func checkStr(t *testing.T, b []byte, p int) {
	t.Helper()
	s := scanner{b: b, p: p}
	raw, esc := s.str()
	wantRaw, wantEsc, wantBad, wantNext, ok := strByByte(b, p)
	if !ok {
		wantBad, wantNext = true, len(b) // a grammar fault ends the walk
	}
	if !bytes.Equal(raw, wantRaw) || esc != wantEsc || s.bad != wantBad || s.p != wantNext {
		t.Fatalf("str(%q at %d) = %q, esc %v, bad %v, p %d; want %q, esc %v, bad %v, p %d",
			b, p, raw, esc, s.bad, s.p, wantRaw, wantEsc, wantBad, wantNext)
	}
}

// TestStr checks str against strByByte on strings of random plain bytes,
// escapes valid and not, multi-byte UTF-8 and raw control bytes, of every
// length up to a few words, opening at every offset from 0 to 16 (so each
// byte falls at every place in an 8-byte word), closed, unterminated, or
// cut off inside an escape, followed by more JSON with quotes and
// backslashes that str must not read as its own.
func TestStr(t *testing.T) {
	pieces := []string{"a", "z", " ", "0", "\t", "\x01", "é", "日本", "🦊", "\x7f",
		`\"`, `\\`, `\/`, `\n`, `\t`, `\u00e9`, `\uD83E\uDD8A`, `\u12`, `\uzzzz`, `\x`, `\0`, `\'`, `\\\"`}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 400; n++ {
		var content []byte
		for len(content) < n%80 {
			content = append(content, pieces[rng.IntN(len(pieces))]...)
		}
		for _, tail := range []string{`"`, `", "b\"":"\\"}`, ``, `\`, `\u00`, `x\"`} {
			for p := 0; p <= 16; p++ {
				b := append(bytes.Repeat([]byte{'['}, p), '"')
				b = append(append(b, content...), tail...)
				checkStr(t, b, p)
			}
		}
	}
}

// FuzzStr checks str against strByByte on any bytes after an opening quote.
func FuzzStr(f *testing.F) {
	f.Add(uint8(0), []byte(`a\"b\\c\n\u00e9"`))
	f.Add(uint8(7), []byte(`\u12\x"`))
	f.Fuzz(func(t *testing.T, p uint8, tail []byte) {
		b := append(bytes.Repeat([]byte{' '}, int(p%17)), '"')
		checkStr(t, append(b, tail...), int(p%17))
	})
}

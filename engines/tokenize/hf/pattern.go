package hf

import (
	"unicode"
	"unicode/utf8"
)

// The Split regexes of the tokenizers this package supports, each matched by
// a hand-written scanner that follows Oniguruma's leftmost-first alternation
// and backtracking for that one pattern (Go's regexp has no lookahead).
const (
	// Qwen2, Qwen2.5, Qwen3: one digit per piece.
	patternQwen = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Llama 3.x: up to three digits per piece.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// GPT-2, the regex of the ByteLevel pre-tokenizer's use_regex.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// A scanner returns the end of the match starting at s[i], or -1 when the
// pattern does not match there.
type scanner func(s []byte, i int) int

var knownPatterns = map[string]scanner{
	patternQwen:   scanQwen,
	patternLlama3: scanLlama3,
	patternGPT2:   scanGPT2,
}

// Character classes of the patterns: \p{L}, \p{N}, \s and the rest.
const (
	classOther = iota
	classLetter
	classNumber
	classSpace
)

var asciiClass = func() (c [utf8.RuneSelf]uint8) {
	for r := range c {
		switch {
		case 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z':
			c[r] = classLetter
		case '0' <= r && r <= '9':
			c[r] = classNumber
		case r == ' ' || '\t' <= r && r <= '\r':
			c[r] = classSpace
		}
	}
	return c
}()

// classAt decodes the character at s[i]; an invalid byte is one character
// of class other.
func classAt(s []byte, i int) (class uint8, r rune, n int) {
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClass[b], rune(b), 1
	}
	r, n = utf8.DecodeRune(s[i:])
	switch {
	case unicode.IsLetter(r):
		return classLetter, r, n
	case unicode.IsNumber(r):
		return classNumber, r, n
	case unicode.IsSpace(r): // Unicode White_Space, as Oniguruma's \s
		return classSpace, r, n
	}
	return classOther, r, n
}

// run returns the end of the characters of class c starting at s[i], at most
// limit of them (limit < 0: no limit).
func run(s []byte, i int, c uint8, limit int) int {
	for ; i < len(s) && limit != 0; limit-- {
		ci, _, n := classAt(s, i)
		if ci != c {
			break
		}
		i += n
	}
	return i
}

// contraction matches 's 't 're 've 'm 'll 'd at s[i] (the apostrophe),
// ignoring case when fold is set. Under Unicode case folding only "ſ" (U+017F)
// besides "S" folds to one of these letters.
func contraction(s []byte, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return -1
	}
	lower := func(j int) (byte, int) {
		if j >= len(s) {
			return 0, 0
		}
		b := s[j]
		if fold {
			if 'A' <= b && b <= 'Z' {
				return b + 'a' - 'A', 1
			}
			if b == 0xC5 && j+1 < len(s) && s[j+1] == 0xBF {
				return 's', 2
			}
		}
		return b, 1
	}
	c, n := lower(i + 1)
	switch c {
	case 's', 't', 'm', 'd':
		return i + 1 + n
	case 'r', 'v', 'l':
		want := byte('e')
		if c == 'l' {
			want = 'l'
		}
		if c2, n2 := lower(i + 1 + n); c2 == want {
			return i + 1 + n + n2
		}
	}
	return -1
}

func scanQwen(s []byte, i int) int   { return scanLlamaLike(s, i, 1) }
func scanLlama3(s []byte, i int) int { return scanLlamaLike(s, i, 3) }

// scanLlamaLike is patternQwen (digits = 1) and patternLlama3 (digits = 3).
func scanLlamaLike(s []byte, i, digits int) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if e := contraction(s, i, true); e > 0 {
		return e
	}
	c, r, n := classAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == classLetter {
		return run(s, i+n, classLetter, -1)
	}
	if c != classNumber && r != '\r' && r != '\n' && i+n < len(s) {
		if c2, _, n2 := classAt(s, i+n); c2 == classLetter {
			return run(s, i+n+n2, classLetter, -1)
		}
	}
	// \p{N}{1,digits}
	if c == classNumber {
		return run(s, i, classNumber, digits)
	}
	// ' '?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r == ' ' && i+1 < len(s) {
		if c2, _, _ := classAt(s, i+1); c2 == classOther {
			j = i + 1
		}
	}
	if c2, _, _ := classAt(s, j); c2 == classOther {
		j = run(s, j, classOther, -1)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// c is classSpace here.
	return spaceRun(s, i, true)
}

// spaceRun matches, at the whitespace s[i], \s*[\r\n]+ (when newlines is
// set), then \s+(?!\S), then \s+: the run up to its last newline; else the
// run less its last character when a non-space follows it; else the run.
func spaceRun(s []byte, i int, newlines bool) int {
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		c, r, n := classAt(s, end)
		if c != classSpace {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = end + 1
		}
		lastStart = end
		end += n
	}
	switch {
	case newlines && lastNL > 0:
		return lastNL
	case end == len(s) || lastStart == i:
		return end
	}
	return lastStart
}

// scanGPT2 is patternGPT2.
func scanGPT2(s []byte, i int) int {
	if e := contraction(s, i, false); e > 0 {
		return e
	}
	c, r, n := classAt(s, i)
	if r == ' ' && i+1 < len(s) {
		if c2, _, n2 := classAt(s, i+1); c2 != classSpace {
			return run(s, i+1+n2, c2, -1)
		}
	}
	if c != classSpace {
		return run(s, i+n, c, -1)
	}
	return spaceRun(s, i, false)
}

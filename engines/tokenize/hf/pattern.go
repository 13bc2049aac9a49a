package hf

import (
	"strings"
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

// DeepSeek V3 (and R1) split with three Isolated regexes in sequence:
// digit runs, kana and CJK ideograph runs, then the rest. Their
// tokenizer.json writes CR, LF and U+3040 as JSON escapes, so the decoded
// patterns hold those characters; the regex-escape spellings (\r, \u3040)
// mean the same to Oniguruma and are accepted too.
const (
	patternDigits3  = `\p{N}{1,3}`
	patternKanaHan  = "[一-龥\u3040-ゟ゠-ヿ]+"
	patternDeepSeek = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// possessive spells a pattern with tiktoken's possessive "?+" on its
// optional first character, as converted tiktoken files do. The optional
// class and \p{L} share no character, so giving the character back never
// helps and both spellings match alike.
func possessive(pattern string) string {
	return strings.Replace(pattern, `\p{N}]?\p{L}+`, `\p{N}]?+\p{L}+`, 1)
}

var knownPatterns = map[string]scanner{
	patternQwen:               scanQwen,
	patternLlama3:             scanLlama3,
	possessive(patternQwen):   scanQwen,
	possessive(patternLlama3): scanLlama3,
	patternGPT2:               scanGPT2,

	patternDigits3: scanDigits3,
	patternKanaHan: scanKanaHan,
	strings.ReplaceAll(patternKanaHan, "\u3040", `\u3040`): scanKanaHan,
	patternDeepSeek: scanDeepSeek,
	strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(patternDeepSeek): scanDeepSeek,
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

// scanDigits3 is patternDigits3.
func scanDigits3(s []byte, i int) int {
	if c, _, _ := classAt(s, i); c != classNumber {
		return -1
	}
	return run(s, i, classNumber, 3)
}

func isKanaHan(r rune) bool {
	return 0x4e00 <= r && r <= 0x9fa5 || 0x3040 <= r && r <= 0x30ff
}

// scanKanaHan is patternKanaHan.
func scanKanaHan(s []byte, i int) int {
	j := i
	for j < len(s) {
		r, n := utf8.DecodeRune(s[j:])
		if !isKanaHan(r) {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}

// The classes of patternDeepSeek: \p{L}, \p{M}, [\p{P}\p{S}], \s, the rest.
const (
	dsOther = iota
	dsLetter
	dsMark
	dsPunct
	dsSpace
)

func dsClassAt(s []byte, i int) (class uint8, r rune, n int) {
	r, n = rune(s[i]), 1
	if r >= utf8.RuneSelf {
		r, n = utf8.DecodeRune(s[i:])
	}
	switch {
	case unicode.IsLetter(r):
		return dsLetter, r, n
	case unicode.IsMark(r):
		return dsMark, r, n
	case unicode.IsPunct(r) || unicode.IsSymbol(r):
		return dsPunct, r, n
	case unicode.IsSpace(r):
		return dsSpace, r, n
	}
	return dsOther, r, n
}

// dsRun returns the end of the characters starting at s[i] whose class is
// a or b.
func dsRun(s []byte, i int, a, b uint8) int {
	for i < len(s) {
		c, _, n := dsClassAt(s, i)
		if c != a && c != b {
			break
		}
		i += n
	}
	return i
}

func isASCIILetter(b byte) bool { return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' }

// scanDeepSeek is patternDeepSeek.
func scanDeepSeek(s []byte, i int) int {
	c, r, n := dsClassAt(s, i)
	// [ASCII punctuation][A-Za-z]+
	if r < utf8.RuneSelf && c == dsPunct && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 1
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c == dsLetter {
		return dsRun(s, i+n, dsLetter, dsMark)
	}
	if c != dsPunct && r != '\r' && r != '\n' && i+n < len(s) {
		if c2, _, _ := dsClassAt(s, i+n); c2 == dsLetter || c2 == dsMark {
			return dsRun(s, i+n, dsLetter, dsMark)
		}
	}
	if c == dsMark {
		return dsRun(s, i, dsLetter, dsMark)
	}
	// ' '?[\p{P}\p{S}]+[\r\n]*
	j := -1
	if c == dsPunct {
		j = i
	} else if r == ' ' && i+1 < len(s) {
		if c2, _, _ := dsClassAt(s, i+1); c2 == dsPunct {
			j = i + 1
		}
	}
	if j >= 0 {
		j = dsRun(s, j, dsPunct, dsPunct)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	if c == dsSpace {
		return spaceRun(s, i, true)
	}
	return -1
}

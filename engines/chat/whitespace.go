package chat

import (
	"regexp"
	"strings"
)

// The engine applies trim_blocks, lstrip_blocks and the "-" markers to the
// nearest text in that direction even when another tag stands between, so
// `{% for %}{{ x }}\n` loses the newline Python keeps. separateTags puts a
// "\n" between two adjacent tags where either trims toward the other, and
// gives the right-hand block tag a "-" marker: both sides then consume that
// "\n" and nothing beyond it, which is what Python does with no text there.
func separateTags(src string) string {
	if rawBlockRE.MatchString(src) {
		return src // raw text would be changed
	}
	tags, ok := scanTags(src)
	if !ok {
		return src
	}
	var b strings.Builder
	last := 0
	for k := 1; k < len(tags); k++ {
		a, t := tags[k-1], tags[k]
		if a.hi != t.lo {
			continue
		}
		aTrims := a.kind != '{' || a.trimRight
		tTrims := t.kind != '{' || t.trimLeft
		if !aTrims && !tTrims {
			continue
		}
		b.WriteString(src[last:t.lo])
		b.WriteByte('\n')
		last = t.lo
		if t.kind != '{' && !t.trimLeft {
			b.WriteString(src[t.lo : t.lo+2])
			b.WriteByte('-')
			last = t.lo + 2
		}
	}
	if last == 0 {
		return src
	}
	b.WriteString(src[last:])
	return b.String()
}

var rawBlockRE = regexp.MustCompile(`\{%-?\s*raw\b`)

type tagSpan struct {
	lo, hi              int
	kind                byte // '{', '%' or '#'
	trimLeft, trimRight bool
}

// scanTags finds the tags as the engine's scanner does: "{{", "{%" or "{#"
// up to the closer, quoted strings skipped outside comments. false when a
// tag is not closed.
func scanTags(src string) ([]tagSpan, bool) {
	var tags []tagSpan
	for i := 0; i+1 < len(src); i++ {
		if src[i] != '{' || !strings.ContainsRune("{%#", rune(src[i+1])) {
			continue
		}
		t := tagSpan{lo: i, kind: src[i+1]}
		closer := map[byte]string{'{': "}}", '%': "%}", '#': "#}"}[t.kind]
		j := i + 2
		if j < len(src) && src[j] == '-' {
			t.trimLeft = true
			j++
		}
		for ; j < len(src); j++ {
			c := src[j]
			if t.kind != '#' && (c == '\'' || c == '"') {
				for j++; j < len(src) && src[j] != c; j++ {
					if src[j] == '\\' {
						j++
					}
				}
				continue
			}
			if strings.HasPrefix(src[j:], "-"+closer) {
				t.trimRight = true
				t.hi = j + 3
				break
			}
			if strings.HasPrefix(src[j:], closer) {
				t.hi = j + 2
				break
			}
		}
		if t.hi == 0 {
			return nil, false
		}
		tags = append(tags, t)
		i = t.hi - 1
	}
	return tags, true
}

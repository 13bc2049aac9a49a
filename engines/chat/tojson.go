package chat

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The engine's tojson filter cannot be replaced and differs from
// transformers' (json.dumps with ensure_ascii=False) in float text, in
// U+2028/U+2029 and, with indent, in key order. Compile therefore rewrites
// each `X | tojson` and `X | tojson(args)` in the template into a call of
// jsonFunc, passed with the render data, which writes what Python writes.

const jsonFunc = "__pdlb_tojson"

var jsonCallable = jinja.NewCallable(jsonFunc, pyToJSON)

// rewriteToJSON returns src with its tojson filters turned into jsonFunc
// calls, and whether every one was (an operand it cannot delimit, such as
// a filter chain, keeps the engine's filter).
func rewriteToJSON(src string) (string, bool) {
	all := true
	out := tagRE.ReplaceAllStringFunc(src, func(tag string) string {
		for {
			next, ok, found := rewriteOne(tag)
			if !found {
				return tag
			}
			if !ok {
				all = false
				return tag
			}
			tag = next
		}
	})
	return out, all
}

// rewriteOne rewrites the first tojson filter in tag; found is false when
// there is none outside string literals.
func rewriteOne(tag string) (string, bool, bool) {
	lits := literalRE.FindAllStringIndex(tag, -1)
	inLiteral := func(i int) bool {
		for _, l := range lits {
			if i >= l[0] && i < l[1] {
				return true
			}
		}
		return false
	}
	for i := 0; i < len(tag); i++ {
		if tag[i] != '|' || inLiteral(i) {
			continue
		}
		j := i + 1
		for j < len(tag) && isSpaceByte(tag[j]) {
			j++
		}
		if !strings.HasPrefix(tag[j:], "tojson") || j+6 < len(tag) && isWordByte(tag[j+6]) {
			continue
		}
		lo := operandStart(tag, i)
		if lo < 0 {
			return tag, false, true
		}
		operand := strings.TrimSpace(tag[lo:i])
		end := j + 6
		args := ""
		k := end
		for k < len(tag) && isSpaceByte(tag[k]) {
			k++
		}
		if k < len(tag) && tag[k] == '(' {
			close := matchParen(tag, k, lits)
			if close < 0 {
				return tag, false, true
			}
			if inner := strings.TrimSpace(tag[k+1 : close]); inner != "" {
				args = ", " + inner
			}
			end = close + 1
		}
		return tag[:lo] + jsonFunc + "(" + operand + args + ")" + tag[end:], true, true
	}
	return tag, true, false
}

// operandStart finds where the operand of the filter at bar begins: a
// name with attribute, subscript and call suffixes, a literal, or a
// bracketed group. -1 when the operand is itself filtered (x | a | tojson)
// or cannot be delimited.
func operandStart(tag string, bar int) int {
	i := bar - 1
	for i >= 0 && isSpaceByte(tag[i]) {
		i--
	}
	end := i
	for i >= 0 {
		switch c := tag[i]; {
		case c == ')' || c == ']' || c == '}':
			open := matchBack(tag, i)
			if open < 0 {
				return -1
			}
			i = open - 1
		case c == '\'' || c == '"':
			q := strings.LastIndexByte(tag[:i], c)
			if q < 0 {
				return -1
			}
			i = q - 1
		case isWordByte(c) || c == '.':
			i--
		default:
			goto done
		}
	}
done:
	start := i + 1
	if start > end {
		return -1
	}
	// A filter chain before the operand changes what it is.
	j := i
	for j >= 0 && isSpaceByte(tag[j]) {
		j--
	}
	if j >= 0 && tag[j] == '|' {
		return -1
	}
	return start
}

// matchBack returns the index of the bracket opening the one at close.
func matchBack(tag string, close int) int {
	depth := 0
	for i := close; i >= 0; i-- {
		switch tag[i] {
		case ')', ']', '}':
			depth++
		case '(', '[', '{':
			depth--
			if depth == 0 {
				return i
			}
		case '\'', '"':
			q := strings.LastIndexByte(tag[:i], tag[i])
			if q < 0 {
				return -1
			}
			i = q
		}
	}
	return -1
}

// matchParen returns the index of the parenthesis closing the one at open,
// string literals skipped.
func matchParen(tag string, open int, lits [][]int) int {
	depth := 0
	for i := open; i < len(tag); i++ {
		for _, l := range lits {
			if i == l[0] {
				i = l[1] - 1
			}
		}
		switch tag[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

func isSpaceByte(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

var errNotJSON = errors.New("tojson: value is not JSON serializable")

// pyToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=indent, separators=separators, sort_keys=sort_keys).
func pyToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	o, err := jsonOptionsOf(args, kwargs)
	if err != nil {
		return jinja.Undefined(), err
	}
	out, err := o.append(nil, args[0], 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(string(out)), nil
}

// jsonOptionsOf reads tojson's arguments.
func jsonOptionsOf(args []jinja.Value, kwargs map[string]jinja.Value) (jsonOptions, error) {
	if len(args) == 0 {
		return jsonOptions{}, errors.New("tojson: no value")
	}
	o := jsonOptions{indent: -1}
	if v, ok := kwargs["indent"]; ok && v.IsInt() {
		o.indent = int(v.AsInt())
	}
	if len(args) > 1 && args[1].IsInt() {
		o.indent = int(args[1].AsInt())
	}
	o.item, o.key = ", ", ": "
	if o.indent >= 0 {
		o.item = ","
	}
	if v, ok := kwargs["separators"]; ok && v.IsList() && v.AsList().Len() == 2 {
		o.item, o.key = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := kwargs["sort_keys"]; ok && v.IsBool() {
		o.sortKeys = v.AsBool()
	}
	if v, ok := kwargs["ensure_ascii"]; ok && v.IsBool() {
		o.ascii = v.AsBool()
	}
	return o, nil
}

type jsonOptions struct {
	indent    int // -1: none
	item, key string
	sortKeys  bool
	ascii     bool
}

func (o *jsonOptions) newline(dst []byte, level int) []byte {
	dst = append(dst, '\n')
	for range level * o.indent {
		dst = append(dst, ' ')
	}
	return dst
}

func (o *jsonOptions) append(dst []byte, v jinja.Value, level int) ([]byte, error) {
	switch {
	case v.IsNone():
		return append(dst, "null"...), nil
	case v.IsBool():
		return strconv.AppendBool(dst, v.AsBool()), nil
	case v.IsInt():
		return strconv.AppendInt(dst, v.AsInt(), 10), nil
	case v.IsFloat():
		return append(dst, pyFloat(v.AsFloat())...), nil
	case v.IsString():
		return o.appendString(dst, v.AsString()), nil
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			return append(dst, "[]"...), nil
		}
		dst = append(dst, '[')
		for i, item := range items {
			dst = o.sep(dst, i, level+1)
			var err error
			if dst, err = o.append(dst, item, level+1); err != nil {
				return dst, err
			}
		}
		return o.close(dst, level, ']'), nil
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			return append(dst, "{}"...), nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		dst = append(dst, '{')
		for i, k := range keys {
			dst = o.sep(dst, i, level+1)
			dst = o.appendString(dst, k)
			dst = append(dst, o.key...)
			val, _ := d.Get(k)
			var err error
			if dst, err = o.append(dst, val, level+1); err != nil {
				return dst, err
			}
		}
		return o.close(dst, level, '}'), nil
	}
	return dst, errNotJSON
}

func (o *jsonOptions) sep(dst []byte, i, level int) []byte {
	if i > 0 {
		dst = append(dst, o.item...)
	}
	if o.indent >= 0 {
		dst = o.newline(dst, level)
	}
	return dst
}

func (o *jsonOptions) close(dst []byte, level int, c byte) []byte {
	if o.indent >= 0 {
		dst = o.newline(dst, level)
	}
	return append(dst, c)
}

// appendString writes s as json.dumps does: '"', '\\' and control
// characters escaped (\n, \r, \t, \b, \f by name), other characters as
// they are, or as \uXXXX (surrogate pairs beyond the BMP) when ascii. A
// run of printable ASCII, most of a tool schema, is copied at once.
func (o *jsonOptions) appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] >= 0x20 && s[j] < 0x7f && s[j] != '"' && s[j] != '\\' {
			j++
		}
		dst = append(dst, s[i:j]...)
		if j == len(s) {
			break
		}
		r, n := utf8.DecodeRuneInString(s[j:])
		i = j + n
		switch {
		case r == '"':
			dst = append(dst, `\"`...)
		case r == '\\':
			dst = append(dst, `\\`...)
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r == '\b':
			dst = append(dst, `\b`...)
		case r == '\f':
			dst = append(dst, `\f`...)
		case r < 0x20 || o.ascii && r > 0x7e:
			if r > 0xffff {
				hi, lo := utf16.EncodeRune(r)
				dst = append(dst, '\\', 'u', hex[hi>>12], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15])
				r = lo
			}
			dst = append(dst, '\\', 'u', hex[r>>12], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, '"')
}

// pyFloat is Python's repr of a float, as json.dumps writes it: shortest
// digits, fixed notation with ".0" for decimal exponents in [-4, 16),
// else d.ddde±XX; Infinity and NaN as json.dumps allows them.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}

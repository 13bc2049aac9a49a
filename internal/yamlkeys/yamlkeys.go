// Package yamlkeys names the keys of a YAML document by their paths in it
// ("pods[1].address"), walking the Go type it decodes into beside it, so
// that a loader's errors name what the file shows rather than Go's types.
// lb/config and engines/sim's fleet files share it.
package yamlkeys

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Walk calls visit for each key of each mapping in the document under
// n, walking t, the Go type n decodes into, beside it: the key's path in
// the file, its value, and the type of its field, nil when the mapping's
// struct has no such key (then known are the keys it has). Keys of a
// value decoded into no struct (a map's, an any's) are not visited.
func Walk(n *yaml.Node, t reflect.Type, path string, visit func(path string, key, value *yaml.Node, ft reflect.Type, known map[string]reflect.Type)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			Walk(c, t, path, visit)
		}
	case yaml.SequenceNode:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, c := range n.Content {
				Walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), visit)
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := Join(path, k.Value)
			switch t.Kind() {
			case reflect.Map:
				Walk(v, t.Elem(), p, visit)
			case reflect.Struct:
				fields := fields(t)
				ft := fields[k.Value]
				visit(p, k, v, ft, fields)
				if ft != nil {
					Walk(v, ft, p, visit)
				}
			}
		}
	}
}

// fields are the keys struct t takes in YAML, with their fields'
// types: a field's tag name, else its name in lower case, and the keys
// of inline structs.
func fields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || name == "-":
		case opts == "inline":
			maps.Copy(out, fields(f.Type))
		case name == "":
			out[strings.ToLower(f.Name)] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}

// nameUnknown rewrites yaml's "field adress not found in type
// config.Pod", about the key name on line, as "pods[0].adress: unknown
// field", with the closest key the mapping knows when one is close; ok
// is false unless exactly one key of doc, decoded into root, is that one.
func nameUnknown(doc *yaml.Node, root reflect.Type, line int, name string) (msg string, ok bool) {
	var found []string
	Walk(doc, root, "", func(path string, key, _ *yaml.Node, ft reflect.Type, known map[string]reflect.Type) {
		if ft == nil && key.Line == line && key.Value == name {
			msg = fmt.Sprintf("%s: unknown field (line %d)", path, line)
			if c := closest(name, slices.Sorted(maps.Keys(known))); c != "" {
				msg += "; did you mean " + c + "?"
			}
			found = append(found, msg)
		}
	})
	return msg, len(found) == 1
}

// closest is the word of words nearest to w, "" when none is within a
// third of w's length (at least one edit): a typo, not another word.
func closest(w string, words []string) string {
	best, bestD := "", max(1, len(w)/3)+1
	for _, c := range words {
		if d := editDistance(w, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b: the fewest
// bytes inserted, deleted or replaced to make one the other.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// NameErrors rewrites the errors of te, from decoding data into root, by
// the paths of their keys in data: yaml's "line 3: cannot unmarshal !!str
// `many` into int" as "upstream.retries: cannot unmarshal !!str `many` into
// int (line 3)", the field found by its line and value, with a hint for a
// duration given as a bare number, and an unknown key's "field X not found
// in type T" by its path (nameUnknown).
func NameErrors(data []byte, root reflect.Type, te *yaml.TypeError) string {
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc)
	out := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		out[i] = e
		var line int
		var rest string
		if n, _ := fmt.Sscanf(e, "line %d:", &line); n != 1 {
			continue
		}
		_, rest, _ = strings.Cut(e, ": ")
		if name, ok := strings.CutPrefix(rest, "field "); ok && strings.Contains(name, " not found in type ") {
			name, _, _ = strings.Cut(name, " ")
			if msg, ok := nameUnknown(&doc, root, line, name); ok {
				out[i] = msg
			}
			continue
		}
		value := ""
		if _, v, ok := strings.Cut(rest, "`"); ok {
			value, _, _ = strings.Cut(v, "`")
		}
		if paths := fieldsAt(&doc, "", line, value, nil); len(paths) == 1 {
			out[i] = fmt.Sprintf("%s: %s (line %d)", paths[0], rest, line)
		}
		if strings.HasSuffix(rest, "into time.Duration") {
			out[i] += "; a duration has a unit, e.g. 30s or 1m"
		}
	}
	return strings.Join(out, "; ")
}

// fieldsAt appends to paths the path of each scalar under n (at path) on
// line whose text is value, as yaml quotes it: a value over 10 bytes cut
// to its first 7 and "...". One is the field; more, and none can be named.
func fieldsAt(n *yaml.Node, path string, line int, value string, paths []string) []string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			paths = fieldsAt(c, path, line, value, paths)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := n.Content[i].Value
			if path != "" {
				p = path + "." + p
			}
			paths = fieldsAt(n.Content[i+1], p, line, value, paths)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			paths = fieldsAt(c, fmt.Sprintf("%s[%d]", path, i), line, value, paths)
		}
	case yaml.AliasNode:
		// yaml reports an alias's error at its anchor: the anchor's field
		// and every alias's match, and none is named.
		paths = fieldsAt(n.Alias, path, line, value, paths)
	case yaml.ScalarNode:
		cut, short := strings.CutSuffix(value, "...")
		if n.Line == line && (n.Value == value || short && len(n.Value) > 10 && strings.HasPrefix(n.Value, cut)) {
			paths = append(paths, path)
		}
	}
	return paths
}

var index = regexp.MustCompile(`\[[0-9]+\]`)

// WrittenZero finds the first key of doc, decoded into root, written as
// its field's zero value where why, given the key's path with [] for
// each index ("pods[].weight"), says why a 0 there is refused: a setting
// whose 0 a loader takes for unset and replaces with its default. It
// returns the key's path ("pods[2].weight"), the value as written and
// why; reason is "" when there is none.
func WrittenZero(doc *yaml.Node, root reflect.Type, why func(path string) string) (path string, value any, reason string) {
	Walk(doc, root, "", func(p string, _, v *yaml.Node, ft reflect.Type, _ map[string]reflect.Type) {
		if reason != "" || ft == nil {
			return
		}
		r := why(index.ReplaceAllString(p, "[]"))
		if r == "" {
			return
		}
		z := reflect.New(ft)
		if v.Decode(z.Interface()) != nil || !z.Elem().IsZero() {
			return
		}
		path, value, reason = p, z.Elem().Interface(), r
	})
	return path, value, reason
}

// Join is the path of key name in the mapping at path.
func Join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// Quote is v as an error naming its key shows it: what YAML writes as a
// string (a string, a duration: "30s") quoted, a number or list as %v.
func Quote(v any) string {
	if d, ok := v.(time.Duration); ok {
		return strconv.Quote(d.String())
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.String {
		return strconv.Quote(rv.String())
	}
	return fmt.Sprint(v)
}

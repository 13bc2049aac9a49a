package config

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"pdlb/lb/discovery/spec"
)

// walkKeys calls visit for each key of each mapping in the document under
// n, walking t, the Go type n decodes into, beside it: the key's path in
// the file, its value, and the type of its field, nil when the mapping's
// struct has no such key (then known are the keys it has). Keys of a
// value decoded into no struct (a map's, an any's) are not visited.
func walkKeys(n *yaml.Node, t reflect.Type, path string, visit func(path string, key, value *yaml.Node, ft reflect.Type, known map[string]reflect.Type)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			walkKeys(c, t, path, visit)
		}
	case yaml.SequenceNode:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, c := range n.Content {
				walkKeys(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), visit)
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			switch t.Kind() {
			case reflect.Map:
				walkKeys(v, t.Elem(), p, visit)
			case reflect.Struct:
				fields := yamlFields(t)
				ft := fields[k.Value]
				visit(p, k, v, ft, fields)
				if ft != nil {
					walkKeys(v, ft, p, visit)
				}
			}
		}
	}
}

// yamlFields are the keys struct t takes in YAML, with their fields'
// types: a field's tag name, else its name in lower case, and the keys
// of inline structs.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || name == "-":
		case opts == "inline":
			maps.Copy(out, yamlFields(f.Type))
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
// is false unless exactly one key of doc is that one.
func nameUnknown(doc *yaml.Node, line int, name string) (msg string, ok bool) {
	var found []string
	walkKeys(doc, reflect.TypeFor[Config](), "", func(path string, key, _ *yaml.Node, ft reflect.Type, known map[string]reflect.Type) {
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

// zeroIsUnset are the settings of list entries and of discovery.kubernetes,
// which have no Default to start from, whose 0 or "" Provision (or
// discovery's Validate) takes for unset and replaces with their default,
// by path with [] for any index. Written in the file, the value would
// silently change: it is refused, saying why.
var zeroIsUnset = map[string]string{
	"models[].block_size":                fmt.Sprintf("must be a positive number of tokens (leave it out for %d)", DefaultBlockSize),
	"models[].max_loras":                 fmt.Sprintf("must be a positive number of adapters (leave it out for %d)", DefaultMaxLoras),
	"models[].adapter_load_sec":          fmt.Sprintf("must be positive: a load takes time, and a pod that holds the adapter is charged nothing already (leave it out for %g)", DefaultAdapterLoadSec),
	"models[].adapter_load_timeout":      fmt.Sprintf("must be positive (leave it out for %v)", DefaultAdapterLoadTimeout),
	"pods[].weight":                      "must be positive; to send a pod nothing, remove it (leave weight out for 1)",
	"pods[].prefill_tokens_per_sec":      fmt.Sprintf("must be positive (leave it out for %d until measured)", DefaultPrefillSpeed),
	"pods[].data_parallel_size":          dataParallelUnset,
	"aliases[].targets[].weight":         "must be positive; to send a target nothing, remove it (leave weight out for 1)",
	"discovery.dns[].interval":           fmt.Sprintf("must be positive (leave it out for %v)", spec.DefaultDNSInterval),
	"discovery.dns[].data_parallel_size": dataParallelUnset,
	// Honoured, "" would watch every pod of the namespace, or of the
	// cluster, to leave out all but those with the model label.
	"discovery.kubernetes.selector": fmt.Sprintf("is empty, which in Kubernetes selects every pod, but only pods labelled %s are routed to (leave it out for %q)", spec.LabelModel, spec.DefaultSelector),
}

var dataParallelUnset = fmt.Sprintf("must be at least 1 (leave it out for %d)", DefaultDataParallelSize)

var index = regexp.MustCompile(`\[[0-9]+\]`)

// refuseUnsetZeros refuses the first setting of zeroIsUnset that doc
// writes 0.
func refuseUnsetZeros(doc *yaml.Node) error {
	var err error
	walkKeys(doc, reflect.TypeFor[Config](), "", func(path string, _, value *yaml.Node, ft reflect.Type, _ map[string]reflect.Type) {
		why := zeroIsUnset[index.ReplaceAllString(path, "[]")]
		if why == "" || err != nil {
			return
		}
		v := reflect.New(ft)
		if value.Decode(v.Interface()) != nil || !v.Elem().IsZero() {
			return
		}
		written := v.Elem().Interface()
		if d, ok := written.(time.Duration); ok {
			written = d.String()
		}
		err = invalid(path, written, why)
	})
	return err
}

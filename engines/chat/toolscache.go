package chat

import (
	"bytes"
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/ardanlabs/jinja"
)

// toolsCache keeps the dumped tools (toolsValue) of a template's last
// requests by their raw JSON, and what tojson wrote of them: an agent
// resends the same list with every request, and dumping it again, then
// writing it as JSON, was most of the render of such a request. The
// values are shared by concurrent renders, read only: a template that
// can change a value it is given (mutates) caches nothing.
// Renders look entries up without a lock (a list of another length
// differs at once); only storing one takes mu.
type toolsCache struct {
	entries [toolsCacheSize]atomic.Pointer[toolsEntry]
	mu      sync.Mutex
	next    int // the entry to replace next; under mu
}

// toolsCacheSize is how many distinct tool lists a template keeps: a
// fleet's clients (one agent's list per version) send few.
const toolsCacheSize = 4

type toolsEntry struct {
	raw   []byte // the request's tools, as sent
	v     jinja.Value
	flags decoder // the decode's inexactness flags alone
	// toJSON is the render's tojson (jsonFunc) with the list, each tool
	// and each of their dicts and lists (owned) dumped once per set of
	// options: the template dumps the same tools every request.
	toJSON jinja.Value
	owned  map[any]bool
	mu     sync.Mutex
	dumped map[dumpKey]string
}

type dumpKey struct {
	value any // a *jinja.Dict or *jinja.List of owned
	o     jsonOptions
}

// newToolsEntry keeps v, the tools dumped from raw.
func newToolsEntry(raw []byte, v jinja.Value, flags decoder) *toolsEntry {
	e := &toolsEntry{raw: bytes.Clone(raw), v: v, flags: flags, owned: map[any]bool{}, dumped: map[dumpKey]string{}}
	e.own(v)
	e.toJSON = jinja.NewCallable(jsonFunc, e.dump)
	return e
}

// own adds v's containers, and theirs, to owned.
func (e *toolsEntry) own(v jinja.Value) {
	switch {
	case v.IsList():
		e.owned[v.AsList()] = true
		for _, item := range v.AsList().Items {
			e.own(item)
		}
	case v.IsDict():
		e.owned[v.AsDict()] = true
		for _, k := range v.AsDict().Keys {
			item, _ := v.AsDict().Get(k)
			e.own(item)
		}
	}
}

// dump is pyToJSON, remembering what it wrote of owned values.
func (e *toolsEntry) dump(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	o, err := jsonOptionsOf(args, kwargs)
	if err != nil {
		return jinja.Undefined(), err
	}
	var key dumpKey
	switch v := args[0]; {
	case v.IsList():
		key = dumpKey{v.AsList(), o}
	case v.IsDict():
		key = dumpKey{v.AsDict(), o}
	}
	if key.value == nil || !e.owned[key.value] {
		return pyToJSON(args, kwargs)
	}
	e.mu.Lock()
	s, ok := e.dumped[key]
	e.mu.Unlock()
	if !ok {
		out, err := o.append(nil, args[0], 0)
		if err != nil {
			return jinja.Undefined(), err
		}
		s = string(out)
		e.mu.Lock()
		e.dumped[key] = s
		e.mu.Unlock()
	}
	return jinja.NewString(s), nil
}

// A template changes a value it is given in place (Python's sandbox
// refuses both; github.com/ardanlabs/jinja v1.8.0 does not) by a list or
// dict method that does, append, pop, insert or update, called or taken
// as a value (methodRE); or by setting a key of a dict with a dotted set
// (dottedSetRE), unless the name is bound to a namespace(), the
// template's own state (namespaceRE).
var (
	methodRE    = regexp.MustCompile(`\.\s*(append|pop|insert|update)\b`)
	dottedSetRE = regexp.MustCompile(`\bset\s+(\w+)\s*\.`)
	namespaceRE = regexp.MustCompile(`\bset\s+(\w+)\s*=\s*namespace\s*\(`)
)

// mutates reports whether a template with source src may change a value
// it is given.
func mutates(src string) bool {
	if methodRE.MatchString(src) {
		return true
	}
	namespaces := map[string]bool{}
	for _, m := range namespaceRE.FindAllStringSubmatch(src, -1) {
		namespaces[m[1]] = true
	}
	for _, m := range dottedSetRE.FindAllStringSubmatch(src, -1) {
		if !namespaces[m[1]] {
			return true
		}
	}
	return false
}

// tools returns c's tools as toolsValue dumps them, from the cache when
// the same list came before, and adds its decode's flags to d's; and the
// render's tojson, which remembers the dumps of a cached list.
func (t *Template) tools(c *Conversation, d *decoder) (jinja.Value, jinja.Value, error) {
	if !c.hasTools || t.mutates {
		v, err := toolsValue(c, d)
		return v, jsonCallable, err
	}
	raw := c.bytes(c.tools)
	tc := &t.toolsCache
	for i := range tc.entries {
		if e := tc.entries[i].Load(); e != nil && bytes.Equal(e.raw, raw) {
			d.merge(&e.flags)
			return e.v, e.toJSON, nil
		}
	}
	var own decoder
	v, err := toolsValue(c, &own)
	if err != nil {
		return v, jsonCallable, err
	}
	d.merge(&own)
	e := newToolsEntry(raw, v, decoder{floatText: own.floatText, jsonText: own.jsonText, lossy: own.lossy})
	tc.mu.Lock()
	tc.entries[tc.next].Store(e)
	tc.next = (tc.next + 1) % toolsCacheSize
	tc.mu.Unlock()
	return v, e.toJSON, nil
}

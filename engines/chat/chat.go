// Package chat renders a model's chat template the way vLLM does for an
// OpenAI chat request: vLLM's reshaping of messages (content parts joined
// or wrapped by the template's content format, tool-call arguments parsed,
// reasoning passed as reasoning_content), then transformers'
// apply_chat_template (trim_blocks and lstrip_blocks on, special tokens,
// chat_template_kwargs, continue_final_message cut). The prompt is then
// encoded without special tokens by the model's tokenizer.
//
// Templates are rendered by github.com/ardanlabs/jinja. A compiled template
// also learns a fast path: the bytes its Jinja code writes around each
// message's content, probed with sentinel conversations and checked
// against Jinja renders, so that plain text conversations render by
// copying instead of interpreting (see plan.go).
package chat

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ardanlabs/jinja"
)

// Template is a compiled chat template. Safe for concurrent use once
// TrustRequestTemplate is set.
type Template struct {
	// TrustRequestTemplate lets requests bring their own chat_template,
	// as vLLM's --trust-request-chat-template does (default false: such
	// requests get vLLM's 400).
	TrustRequestTemplate bool

	src          string
	eng          *jinja.Template
	special      map[string]jinja.Value
	specialSrc   map[string]string
	format       contentFormat
	indentedJSON bool // the engine's tojson(indent=...) left: it sorts keys
	jsonExact    bool // every tojson rewritten to Python's (tojson.go)
	timeBound    bool // strftime_now: output depends on the day
	noPlan       bool // a request's template: learning costs more than it saves
	mutates      bool // may change a value in place (mutates): no toolsCache
	triggers     []string
	toolsCache   toolsCache

	plans    atomic.Pointer[map[string]*plan] // by kwargs key; nil plan: none
	plansMu  sync.Mutex                       // guards learning and plan stores
	learning bool
	learners sync.WaitGroup // tests wait for plans
}

var (
	// vLLM's content-format detection: a template that loops over the
	// content of a message (a loop variable over messages, or over a
	// variable set from messages) gets "openai" format content.
	messagesLoopRE = regexp.MustCompile(`\{%-?\s*for\s+(\w+)\s+in\s+(\w+)`)
	messagesSetRE  = regexp.MustCompile(`\{%-?\s*set\s+(\w+)\s*=\s*messages\b`)
	contentLoopRE  = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(\w+)(?:\.content|\[\s*['"]content['"]\s*\])\s*-?%\}`)
	indentedJSONRE = regexp.MustCompile(`tojson\s*\(\s*indent`)
)

// Compile parses a chat template. special holds the tokenizer config's
// special tokens by name (bos_token, eos_token, ...), which the template
// sees as variables. The error says what the engine cannot parse.
func Compile(source string, special map[string]string) (*Template, error) {
	rewritten, jsonExact := rewriteToJSON(separateTags(source))
	eng, err := jinja.Compile(rewritten)
	if err != nil {
		// The rewrites must not cost a template the engine can parse.
		rewritten, jsonExact = source, false
		eng, err = jinja.Compile(source)
	}
	if err == nil {
		err = unsupported(source)
	}
	if err != nil {
		return nil, &CompileError{Err: err}
	}
	t := &Template{
		src:          source,
		eng:          eng,
		special:      make(map[string]jinja.Value, len(special)),
		specialSrc:   special,
		indentedJSON: indentedJSONRE.MatchString(rewritten),
		jsonExact:    jsonExact,
		timeBound:    strings.Contains(source, "strftime_now"),
		mutates:      mutates(source),
		triggers:     triggerLiterals(source),
		format:       detectFormat(source),
	}
	for k, v := range special {
		t.special[k] = jinja.NewString(v)
	}
	empty := map[string]*plan{}
	t.plans.Store(&empty)
	return t, nil
}

// detectFormat tells the content format vLLM gives the template.
func detectFormat(src string) contentFormat {
	lists := map[string]bool{"messages": true}
	for _, m := range messagesSetRE.FindAllStringSubmatch(src, -1) {
		lists[m[1]] = true
	}
	items := map[string]bool{}
	for _, m := range messagesLoopRE.FindAllStringSubmatch(src, -1) {
		if lists[m[2]] {
			items[m[1]] = true
		}
	}
	for _, m := range contentLoopRE.FindAllStringSubmatch(src, -1) {
		if items[m[1]] {
			return formatOpenAI
		}
	}
	return formatString
}

// CompileError is a template the engine cannot parse, or that uses a
// filter or test the engine lacks.
type CompileError struct{ Err error }

func (e *CompileError) Error() string {
	return "chat: the template engine cannot render this chat template: " + e.Err.Error()
}

// The filters and tests github.com/ardanlabs/jinja v1.8.0 implements; a
// template using another would fail at render, in whichever branch uses it.
var (
	engineFilters = wordSet("abs batch capitalize count d default dictsort e escape first float from_json fromjson indent int items join last length list lower map max min reject rejectattr replace reverse round safe select selectattr sort string sum title tojson trim unique upper wordcount")
	engineTests   = wordSet("boolean callable defined eq equalto even false float ge greaterthan gt in integer iterable le lessthan lower lt mapping ne none number odd sameas sequence string true undefined upper")
	filterUseRE   = regexp.MustCompile(`\|\s*([A-Za-z_]\w*)`)
	testUseRE     = regexp.MustCompile(`\bis\s+(?:not\s+)?([A-Za-z_]\w*)`)
)

func wordSet(words string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(words) {
		m[w] = true
	}
	return m
}

// unsupported names the first filter or test in the template's tags
// (string literals left out) that the engine does not implement.
func unsupported(src string) error {
	for _, tag := range tagRE.FindAllString(src, -1) {
		code := literalRE.ReplaceAllString(tag, "''")
		for _, m := range filterUseRE.FindAllStringSubmatch(code, -1) {
			if !engineFilters[m[1]] {
				return fmt.Errorf("filter %q is not implemented", m[1])
			}
		}
		for _, m := range testUseRE.FindAllStringSubmatch(code, -1) {
			if !engineTests[m[1]] {
				return fmt.Errorf("test %q is not implemented", m[1])
			}
		}
	}
	return nil
}

func (e *CompileError) Unwrap() error { return e.Err }

// Segment is where one message's content lies in a rendered prompt, in
// bytes from the start of the prompt.
type Segment struct{ Start, End int }

// Render appends the prompt for c to dst. defaults are the server's
// chat_template_kwargs, under the request's. A request's own
// chat_template replaces t. Errors: ErrInexact where the engine cannot
// match Python, *RequestError where vLLM answers 400 at rendering (the
// template raised), others for a broken template.
func (t *Template) Render(dst []byte, c *Conversation, defaults map[string]any) ([]byte, error) {
	dst, _, err := t.render(dst, c, defaults, false, false)
	return dst, err
}

// ErrJinja is RenderFast's for a conversation the template's fast path
// (its learnt plan) does not render, which the Jinja engine would, at
// some microseconds a message: a caller that must not wait for that may
// hand the request to another goroutine and Render it there.
var ErrJinja = errors.New("chat: the template renders this conversation with its Jinja engine")

// RenderFast is Render on the fast path only: ErrJinja, dst unchanged,
// where Render would run the Jinja engine.
func (t *Template) RenderFast(dst []byte, c *Conversation, defaults map[string]any) ([]byte, error) {
	dst, _, err := t.render(dst, c, defaults, false, true)
	return dst, err
}

// RenderSegments is Render that also reports where each message's content
// lies in the appended prompt, relative to len(dst) on entry. The segments
// are known on the fast path only; otherwise the slice is empty. It is
// reused from c and valid until c is reset.
func (t *Template) RenderSegments(dst []byte, c *Conversation, defaults map[string]any) ([]byte, []Segment, error) {
	return t.render(dst, c, defaults, true, false)
}

func (t *Template) render(dst []byte, c *Conversation, defaults map[string]any, segs, fastOnly bool) ([]byte, []Segment, error) {
	if fastOnly && c.hasChatTemplate {
		// A request's own template has no plan: not compiled here.
		return dst, nil, ErrJinja
	}
	t, err := t.effective(c)
	if err != nil {
		return dst, nil, err
	}
	c.seg = c.seg[:0]
	if p := t.planFor(c, defaults); p != nil {
		if out, ok := p.render(dst, c, segs); ok {
			return out, c.seg, nil
		}
		c.seg = c.seg[:0]
	}
	if fastOnly {
		return dst, nil, ErrJinja
	}
	out, err := t.renderJinja(c, defaults)
	if err != nil {
		return dst, nil, err
	}
	return append(dst, out...), c.seg, nil
}

// effective is the template that renders c: the request's own
// chat_template if it has one, through the bounded cache.
func (t *Template) effective(c *Conversation) (*Template, error) {
	if (c.hasChatTemplate || c.kwargsTemplate) && !t.TrustRequestTemplate {
		return nil, &RequestError{Param: "chat_template", Message: "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template."}
	}
	if !c.hasChatTemplate {
		return t, nil
	}
	o, err := overrides.get(c.str(c.chatTemplate), t.specialSrc)
	if err != nil {
		return nil, &RequestError{Param: "chat_template", Message: err.Error()}
	}
	return o, nil
}

// renderJinja is the reference path: the whole template interpreted.
func (t *Template) renderJinja(c *Conversation, defaults map[string]any) (string, error) {
	data, err := t.templateData(c, defaults)
	if err != nil {
		return "", err
	}
	out, err := t.eng.RenderValues(data)
	if err != nil {
		// A template's raise_exception, or an error evaluating it, is
		// the 400 vLLM answers for a failed apply_chat_template.
		return "", &RequestError{Param: "messages", Message: err.Error()}
	}
	if c.continueFinalMessage {
		return t.continueFinal(out, c)
	}
	return out, nil
}

// continueFinal cuts the prompt right after the final message's text, as
// apply_chat_template does for continue_final_message, so that the model
// continues that message: the last text part of a list content.
func (t *Template) continueFinal(out string, c *Conversation) (string, error) {
	m := &c.msgs[len(c.msgs)-1]
	texts, _ := c.texts(m)
	final := t.join(texts)
	if t.partsFor(m) {
		if len(texts) == 0 {
			return "", &RequestError{Param: "continue_final_message", Message: "continue_final_message is set but we could not find any text to continue in the final message!"}
		}
		final = texts[len(texts)-1]
	}
	stripped := strings.TrimFunc(final, isPySpace)
	at := strings.LastIndex(out, stripped)
	if at < 0 {
		return "", &RequestError{Param: "continue_final_message", Message: "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible."}
	}
	left := strings.TrimLeftFunc(final, isPySpace)
	if at+len(left) <= len(out) && out[at:at+len(left)] == final {
		return out[:at+len(left)], nil
	}
	return out[:at+len(stripped)], nil
}

// isPySpace is Python's str.isspace for one rune: Unicode White_Space
// plus the ASCII separators U+001C..U+001F.
func isPySpace(r rune) bool {
	switch {
	case r >= 0x1c && r <= 0x1f:
		return true
	case r == '\t' || r == '\n' || r == '\v' || r == '\f' || r == '\r' || r == ' ':
		return true
	case r < 0x80:
		return false
	}
	return r == 0x85 || r == 0xa0 || r == 0x1680 || (r >= 0x2000 && r <= 0x200a) ||
		r == 0x2028 || r == 0x2029 || r == 0x202f || r == 0x205f || r == 0x3000
}

// overrideCache holds templates that requests brought in chat_template,
// bounded: a full cache is emptied, as a request template that changes
// per request must not grow memory.
type overrideCache struct {
	mu sync.Mutex
	m  map[string]*Template
}

const overrideCacheSize = 16

var overrides = overrideCache{m: map[string]*Template{}}

func (oc *overrideCache) get(src string, special map[string]string) (*Template, error) {
	oc.mu.Lock()
	t, ok := oc.m[src]
	oc.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := Compile(src, special)
	if err != nil {
		return nil, err
	}
	t.noPlan = true
	oc.mu.Lock()
	if len(oc.m) >= overrideCacheSize {
		clear(oc.m)
	}
	oc.m[src] = t
	oc.mu.Unlock()
	return t, nil
}

// triggerLiterals lists the string literals in the template's tags that a
// message's content must not contain for the fast path: those a template
// can test content against (in, startswith, split, ...). Whitespace-only
// literals are left out: contents with whitespace are verified instead.
func triggerLiterals(src string) []string {
	var out []string
	seen := map[string]bool{}
	for _, tag := range tagRE.FindAllString(src, -1) {
		for _, m := range literalRE.FindAllStringSubmatchIndex(tag, -1) {
			lit := unquote(tag[m[0]+1 : m[1]-1])
			if strings.TrimSpace(lit) == "" || seen[lit] {
				continue
			}
			if len(lit) >= 2 && !isWord(lit) || usedAsArgument(tag, m[0], m[1]) {
				seen[lit] = true
				out = append(out, lit)
			}
		}
	}
	// A content holding a longer literal holds any literal inside it.
	var kept []string
	for _, lit := range out {
		inner := false
		for _, o := range out {
			if o != lit && strings.Contains(lit, o) {
				inner = true
				break
			}
		}
		if !inner {
			kept = append(kept, lit)
		}
	}
	return kept
}

var (
	tagRE     = regexp.MustCompile(`(?s)\{\{.*?\}\}|\{%.*?%\}`)
	literalRE = regexp.MustCompile(`'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"`)
)

func isWord(s string) bool {
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// usedAsArgument reports a literal passed to a call or tested with in.
func usedAsArgument(tag string, lo, hi int) bool {
	before := strings.TrimRight(tag[:lo], " \t\n")
	after := strings.TrimLeft(tag[hi:], " \t\n")
	return strings.HasSuffix(before, "(") || strings.HasPrefix(after, "in ") || strings.HasPrefix(after, "in\n")
}

func unquote(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

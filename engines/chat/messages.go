package chat

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// billingHeader starts the system text Claude Code sends with a hash that
// changes every request; vLLM drops that text so shared prefixes survive.
const billingHeader = "x-anthropic-billing-header"

// AppendMessages appends to dst the chat completion request vLLM makes of
// an Anthropic Messages API request body (POST /v1/messages), the fields
// that shape the prompt (messages, tools, reasoning_effort,
// chat_template_kwargs), for ParseRequest to read:
//   - the system field's text (its text blocks', Claude Code's billing
//     header left out) as the system message;
//   - a message's string content as it is; of its blocks, text as text
//     parts (one alone as the content string), thinking as its reasoning,
//     tool_use as tool_calls (arguments: the input as JSON), a user's
//     tool_result as a tool message before it, its text parts joined by
//     "\n", and an assistant's as "Tool result: ..." text; a user message
//     left with nothing is dropped;
//   - ctx and msg roles as user;
//   - tools as functions (input_schema as parameters, typed "object" when
//     untyped), output_config.effort as reasoning_effort.
//
// exact is false where vLLM's releases convert differently or the prompt
// is not the template's alone: system-role messages in messages (hoisted
// into the system message by older releases; newer ones keep them in
// place or fold them into a user turn, by a probe of the template),
// thinking disabled (a reasoning_effort chosen by a probe), a tool's
// strict, an empty tools list, a tool_use without id (vLLM makes one from
// the clock), images, tool references, and a result vLLM writes with
// Python's repr. dst then holds a close conversion (a newer release's,
// system messages kept in place) that the simulator serves. What vLLM
// refuses (a role, a block type, a field of the wrong type) is a
// *RequestError.
func AppendMessages(dst, body []byte, inline InlineSystem) (out []byte, exact bool, err error) {
	return appendMessages(dst, body, inline, false)
}

// AppendCountTokens is AppendMessages for a count_tokens request (POST
// /v1/messages/count_tokens), whose output_config and thinking vLLM's
// count request model does not have.
func AppendCountTokens(dst, body []byte, inline InlineSystem) (out []byte, exact bool, err error) {
	return appendMessages(dst, body, inline, true)
}

// InlineSystem is where the vLLM release serving a model puts the
// system-role messages inside a Messages request's messages, which newer
// Claude Code sends most turns.
type InlineSystem uint8

const (
	// InlineUnknown: not known, so a request with one is not exact. Its
	// conversion is InlinePreserve's.
	InlineUnknown InlineSystem = iota
	// InlineHoist: earlier releases join their text with the system
	// field's, nothing between, as the one system message leading the
	// chat (a string's as it is, billing header and all).
	InlineHoist
	// InlinePreserve: newer releases whose probe of the template keeps
	// them in place (vLLM logs "Anthropic inline system messages will be
	// kept in place"): those leading messages join the system field's
	// text, "\n\n" apart, the others stay where they are, moved past
	// the tool results answering a tool_use before them. (With no system
	// text at all such a release folds them into user turns instead,
	// which is not exact here.)
	InlinePreserve
)

// ParseInlineSystem reads an InlineSystem by its name in configuration:
// "" (unknown), "hoist" or "preserve".
func ParseInlineSystem(name string) (InlineSystem, bool) {
	switch name {
	case "":
		return InlineUnknown, true
	case "hoist":
		return InlineHoist, true
	case "preserve":
		return InlinePreserve, true
	}
	return InlineUnknown, false
}

func appendMessages(dst, body []byte, inline InlineSystem, count bool) ([]byte, bool, error) {
	v := messagesPool.Get().(*messagesConverter)
	defer messagesPool.Put(v)
	v.reset()
	v.count, v.inline = count, inline
	if err := v.convert(body); err != nil {
		return dst, false, err
	}
	return append(dst, v.out...), v.inexact == 0, nil
}

var messagesPool = sync.Pool{New: func() any { return new(messagesConverter) }}

// messagesConverter holds the buffers of one conversion, made in one pass
// over the body where the keys come in the usual order. JSON strings are
// copied as the body escapes them, unescaped only to be compared.
type messagesConverter struct {
	s       scanner
	out     []byte // the chat request
	msgs    []byte // the chat's messages after the system one, comma-joined
	system  []byte // the system field's text, escaped
	leading []byte // the text of the system-role messages leading messages
	tools   []byte // the chat's tools, comma-joined
	parts   []byte // the message being converted: its content parts
	calls   []byte // its tool calls
	reason  []byte // its reasoning, escaped
	images  []byte // a tool result's image parts
	text    []byte // a tool result's text, escaped
	scratch []byte // unescaped keys and values being compared
	path    []pathElem
	leads   bool // no message but system-role ones seen yet
	count   bool // a count_tokens request
	toolsN  int
	inline  InlineSystem
	// hoisted: InlineHoist found a system-role message's part (an empty
	// string is one); later: a system-role message with text came after
	// another; toolUse: the message converted last has a tool_use block;
	// awaiting: its tool results are awaited, and held are the texts of
	// the system-role messages that came since, escaped, ending at
	// heldEnds.
	hoisted, later, toolUse, awaiting bool
	held                              []byte
	heldEnds                          []int
	// inexact holds the fields (fieldSystem...) whose conversion is not
	// one every vLLM release makes; cur is the field being converted. A
	// repeated field's last value replaces its own.
	inexact, cur uint8
}

// The request's fields that AppendMessages converts, as bits of inexact.
const (
	fieldSystem uint8 = 1 << iota
	fieldMessages
	fieldTools
	fieldEffort
)

// notExact marks the field being converted as not converted as every
// vLLM release converts it.
func (v *messagesConverter) notExact() { v.inexact |= v.cur }

// start begins converting field f, a repeated one anew.
func (v *messagesConverter) start(f uint8) { v.inexact, v.cur = v.inexact&^f, f }

// keep runs fn on the value under the scanner. A *RequestError it returns
// is returned with the value skipped whole, for the caller to report
// unless a repeated key's later value, the one json.loads keeps,
// replaces it; a syntax error stops the scan.
func (v *messagesConverter) keep(fn func() error) error {
	from := v.s.pos
	err := fn()
	if _, ok := err.(*RequestError); ok && v.s.err == nil {
		v.s.pos = from
		v.s.skip()
	}
	return err
}

// pathElem is one step of the path to the value being read, for errors:
// a field, or an index when field is empty.
type pathElem struct {
	field string
	index int
}

func (v *messagesConverter) reset() {
	v.out, v.msgs, v.system, v.leading, v.tools, v.path = v.out[:0], v.msgs[:0], v.system[:0], v.leading[:0], v.tools[:0], v.path[:0]
	v.leads, v.toolsN, v.inexact, v.cur = true, 0, 0, 0
	v.hoisted, v.later, v.awaiting, v.held, v.heldEnds = false, false, false, v.held[:0], v.heldEnds[:0]
}

// fieldError is vLLM's 400 for field of the value being read ("" for the
// value itself).
func (v *messagesConverter) fieldError(field, msg string) error {
	var b strings.Builder
	for _, e := range v.path {
		if e.field == "" {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(e.index))
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.field)
	}
	if field != "" {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(field)
	}
	return fieldError(b.String(), msg)
}

// wrongType skips the value under the scanner and returns fieldError for
// it.
func (v *messagesConverter) wrongType(msg string) error {
	v.s.skip()
	return v.fieldError("", msg)
}

// in runs fn with field (or, when field is empty, index) added to the
// path.
func (v *messagesConverter) in(field string, index int, fn func() error) error {
	v.path = append(v.path, pathElem{field, index})
	err := fn()
	v.path = v.path[:len(v.path)-1]
	return err
}

// each runs fn with the scanner on each element of the array under it.
func (v *messagesConverter) each(fn func() error) error {
	s := &v.s
	s.pos++
	i := 0
	for first := true; s.more(&first, ']'); i++ {
		if err := v.in("", i, fn); err != nil {
			return err
		}
	}
	return nil
}

// at runs fn with the scanner on raw, a value read before.
func (v *messagesConverter) at(raw []byte, fn func() error) error {
	saved := v.s
	v.s.reset(raw)
	err := fn()
	v.s = saved
	return err
}

func (v *messagesConverter) convert(body []byte) error {
	s := &v.s
	s.reset(body)
	defer s.reset(nil)
	if s.peek() != '{' {
		return &RequestError{Param: "body", Message: "body: Input should be a valid dictionary or object to extract fields from"}
	}
	s.pos++
	var output, thinking, kwargs []byte
	// The fields' errors, the last value's of each, in the order vLLM's
	// request model declares them, which pydantic checks them in:
	// messages, output_config, system, tools.
	errs := [4]error{fieldError("messages", "Field required")}
	for first := true; s.err == nil && s.more(&first, '}'); {
		// A repeated key's last value wins, as in json.loads.
		switch k := v.key(); k {
		case "system":
			v.system = v.system[:0]
			v.start(fieldSystem)
			errs[2] = v.keep(func() error { return v.in(k, 0, v.systemField) })
		case "messages":
			v.msgs, v.leading, v.leads = v.msgs[:0], v.leading[:0], true
			v.hoisted, v.later, v.awaiting, v.held, v.heldEnds = false, false, false, v.held[:0], v.heldEnds[:0]
			v.start(fieldMessages)
			errs[0] = v.keep(func() error { return v.in(k, 0, v.messages) })
		case "tools":
			v.tools, v.toolsN = v.tools[:0], 0
			v.start(fieldTools)
			errs[3] = v.keep(func() error { return v.in(k, 0, v.toolList) })
		case "output_config", "thinking":
			if v.count {
				s.skip() // not fields of a count_tokens request
			} else if k == "thinking" {
				thinking = s.raw()
			} else {
				output = s.raw()
			}
		case "chat_template_kwargs":
			kwargs = s.raw()
		default:
			s.skip()
		}
	}
	if s.err == nil && s.peek() != 0 {
		s.fail()
	}
	if s.err != nil {
		// The body is decoded whole before any field is validated: a JSON
		// error anywhere is the one reported.
		s.reset(body)
		if s.skip(); s.peek() != 0 {
			s.fail()
		}
		return &RequestError{Param: "body", Message: "JSON decode error: " + s.err.Error()}
	}
	v.cur = fieldEffort
	effort, err := v.effort(output, thinking)
	errs[1] = err
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	v.out = append(v.out, `{"messages":[`...)
	hoisted := v.inline == InlineHoist && (v.hoisted || len(v.system) > 0)
	switch {
	case v.inline == InlineHoist:
		v.system = v.join(v.system, v.leading)
	case v.later && len(v.system) == 0 && len(v.leading) == 0:
		v.inexact |= fieldMessages // folded into user turns by a newer release
		fallthrough
	default:
		if len(v.system) > 0 && len(v.leading) > 0 {
			v.system = append(v.system, `\n\n`...)
		}
		v.system = append(v.system, v.leading...)
	}
	if len(v.system) > 0 || hoisted {
		v.out = append(v.out, `{"role":"system","content":"`...)
		v.out = append(v.out, v.system...)
		v.out = append(v.out, `"}`...)
		if len(v.msgs) > 0 {
			v.out = append(v.out, ',')
		}
	}
	v.out = append(v.out, v.msgs...)
	v.out = append(v.out, ']')
	if v.toolsN > 0 {
		v.out = append(v.out, `,"tools":[`...)
		v.out = append(v.out, v.tools...)
		v.out = append(v.out, ']')
	}
	if effort != nil {
		v.out = append(v.out, `,"reasoning_effort":`...)
		v.out = append(v.out, effort...)
	}
	if !isNull(kwargs) {
		if kwargs[0] != '{' {
			return fieldError("chat_template_kwargs", "Input should be a valid dictionary")
		}
		v.out = append(v.out, `,"chat_template_kwargs":`...)
		v.out = append(v.out, kwargs...)
	}
	v.out = append(v.out, '}')
	return nil
}

// key reads an object key into scratch; valid until the next key.
func (v *messagesConverter) key() string {
	var k span
	v.scratch, k = v.s.key(v.scratch[:0])
	return string(v.scratch[k.lo:k.hi])
}

// unescaped is a raw JSON string's text, in scratch until the next use.
func (v *messagesConverter) unescaped(raw []byte) []byte {
	var t scanner
	t.reset(raw)
	var sp span
	v.scratch, sp = t.str(v.scratch[:0])
	return v.scratch[sp.lo:sp.hi]
}

func isNull(raw []byte) bool { return len(raw) == 0 || string(raw) == "null" }

// inner is a raw JSON string's escaped text, without its quotes.
func inner(raw []byte) []byte { return raw[1 : len(raw)-1] }

// systemField gathers the system field's text: a string, or its text
// blocks' non-empty text but the billing header's, joined.
func (v *messagesConverter) systemField() error {
	s := &v.s
	switch s.peek() {
	case 'n':
		s.skip()
		return nil
	case '"':
		raw := s.raw()
		if s.err != nil {
			return s.err
		}
		v.system = append(v.system, inner(raw)...)
		return nil
	case '[':
	default:
		return v.wrongType("Input should be a valid string or a list of content blocks")
	}
	var b contentBlock
	return v.each(func() error {
		if err := v.block(&b); err != nil {
			return err
		}
		v.system = v.appendText(v.system, &b)
		return nil
	})
}

// appendText appends a text block's text, when not empty nor the billing
// header's, as a system message's text is gathered.
func (v *messagesConverter) appendText(dst []byte, b *contentBlock) []byte {
	if b.typ != "text" || len(b.text) <= 2 || bytes.HasPrefix(v.unescaped(b.text), []byte(billingHeader)) {
		return dst
	}
	return v.join(dst, inner(b.text))
}

// join appends piece, a JSON string's escaped text, to dst, as Python
// joins two strings with nothing between. A high surrogate's escape
// ending dst and a low one's starting piece stay two lone surrogates
// there, which the engine cannot encode, but would read as one character
// here.
func (v *messagesConverter) join(dst, piece []byte) []byte {
	if n := len(dst); n >= 6 && len(piece) >= 6 && oddEscape(dst[:n-5]) &&
		surrogate(dst[n-5:], 0xd800) && piece[0] == '\\' && surrogate(piece[1:], 0xdc00) {
		v.notExact()
	}
	return append(dst, piece...)
}

// oddEscape reports whether b ends in an odd run of backslashes: its last
// one starts an escape.
func oddEscape(b []byte) bool {
	n := 0
	for n < len(b) && b[len(b)-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// surrogate reports whether b starts "uXXXX" with XXXX a surrogate of
// the half starting at base (0xd800 high, 0xdc00 low).
func surrogate(b []byte, base uint64) bool {
	if len(b) < 5 || b[0] != 'u' {
		return false
	}
	r, err := strconv.ParseUint(string(b[1:5]), 16, 16)
	return err == nil && r&0xfc00 == base
}

// contentBlock is one content block's fields as raw JSON (nil when absent
// or null); typ is its type, one vLLM accepts.
type contentBlock struct {
	typ                                 string
	text, id, toolUseID, name, thinking []byte // strings
	input, source                       []byte // dictionaries
	content                             []byte // a string or a list
}

var blockTypes = map[string]string{"text": "text", "image": "image", "tool_use": "tool_use", "tool_result": "tool_result",
	"tool_reference": "tool_reference", "thinking": "thinking", "redacted_thinking": "redacted_thinking"}

// block reads the block under the scanner, checking the types vLLM's
// content block model declares for the fields the conversion reads.
func (v *messagesConverter) block(b *contentBlock) error {
	raws, err := v.fields(blockKeys, "Input should be a valid dictionary or object")
	if err != nil {
		return err
	}
	for i, raw := range raws[:len(blockKeys)] {
		switch want := blockKinds[i]; {
		case isNull(raw):
			raws[i] = nil
		case want == '"' && raw[0] != '"':
			return v.fieldError(blockKeys[i], "Input should be a valid string")
		case want == '{' && raw[0] != '{':
			return v.fieldError(blockKeys[i], "Input should be a valid dictionary")
		case want == 'c' && raw[0] != '"' && raw[0] != '[':
			return v.fieldError(blockKeys[i], "Input should be a valid string or a list of dictionaries")
		}
	}
	*b = contentBlock{text: raws[1], id: raws[2], toolUseID: raws[3], name: raws[4], thinking: raws[5],
		input: raws[6], source: raws[7], content: raws[8]}
	if raws[0] == nil {
		return v.fieldError("type", "Field required")
	}
	var ok bool
	if b.typ, ok = blockTypes[string(v.unescaped(raws[0]))]; !ok {
		return v.fieldError("type", "Input should be 'text', 'image', 'tool_use', 'tool_result', 'tool_reference', 'thinking' or 'redacted_thinking'")
	}
	return nil
}

// blockKeys are the content block fields the conversion reads, and
// blockKinds what each must hold when not null, as vLLM's content block
// model declares them: a string ("), a dictionary ({), or a string or a
// list (c).
var blockKeys = []string{"type", "text", "id", "tool_use_id", "name", "thinking", "input", "source", "content"}

const blockKinds = `""""""{{c`

// maxFields is the most keys fields reads of one object.
const maxFields = 9

// fields reads the object under the scanner: the raw value of each of
// keys (a repeated key's last) at its index in raws, nil when absent;
// other keys are skipped. notObject is the error for a value that is no
// object.
func (v *messagesConverter) fields(keys []string, notObject string) (raws [maxFields][]byte, err error) {
	s := &v.s
	if s.peek() != '{' {
		return raws, v.wrongType(notObject)
	}
	s.pos++
	for first := true; s.more(&first, '}'); {
		if i := slices.Index(keys, v.key()); i >= 0 {
			raws[i] = s.raw()
		} else {
			s.skip()
		}
	}
	return raws, s.err
}

// field is fields for one key of the object raw, read before; nil when
// raw is no object.
func (v *messagesConverter) field(raw []byte, key string) []byte {
	var raws [maxFields][]byte
	_ = v.at(raw, func() (err error) {
		raws, err = v.fields([]string{key}, "")
		return err
	})
	return raws[0]
}

// messages converts the messages list into v.msgs and v.leading.
func (v *messagesConverter) messages() error {
	if v.s.peek() != '[' {
		return v.wrongType("Input should be a valid list")
	}
	if err := v.each(v.message); err != nil {
		return err
	}
	v.flushHeld()
	return nil
}

// flushHeld writes the held system-role messages where they stand.
func (v *messagesConverter) flushHeld() {
	lo := 0
	for _, hi := range v.heldEnds {
		v.openMessage("system")
		v.msgs = append(v.msgs, `,"content":"`...)
		v.msgs = append(v.msgs, v.held[lo:hi]...)
		v.msgs = append(v.msgs, `"}`...)
		lo = hi
	}
	v.held, v.heldEnds = v.held[:0], v.heldEnds[:0]
}

// placed puts the system-role messages held while tool results were
// awaited after the message just converted (from mark in v.msgs), a
// user's, or before it, an assistant's, as a newer vLLM moves them; and
// notes whether that message awaits tool results in turn.
func (v *messagesConverter) placed(role string, mark int) {
	if len(v.heldEnds) > 0 {
		if role == "user" {
			v.flushHeld()
		} else {
			msg := append([]byte(nil), bytes.TrimPrefix(v.msgs[mark:], []byte(","))...)
			v.msgs = v.msgs[:mark]
			v.flushHeld()
			if len(v.msgs) > 0 {
				v.msgs = append(v.msgs, ',')
			}
			v.msgs = append(v.msgs, msg...)
		}
	}
	v.awaiting = role == "assistant" && v.toolUse
}

// message converts the message under the scanner: in place when its role
// comes first, as clients write it, else from its content read raw.
func (v *messagesConverter) message() error {
	s := &v.s
	if s.peek() != '{' {
		return v.wrongType("Input should be a valid dictionary or object")
	}
	s.pos++
	// A repeated content or role converts the message again: from what
	// was written and found before it.
	mark, was := len(v.msgs), v.inexact
	var rawRole, content []byte
	role, converted := "", ""
	for first := true; s.more(&first, '}'); {
		switch v.key() {
		case "role":
			rawRole = s.raw()
			role = roleOf(v.unescaped(rawRole))
		case "content":
			start := s.peek()
			from := s.pos
			if (role == "user" || role == "assistant") && (start == '"' || start == '[') {
				// Its error, if any, is made again from the raw content
				// below, unless a later content replaces it.
				v.msgs, v.inexact = v.msgs[:mark], was
				converted = role
				if v.keep(func() error { return v.in("content", 0, func() error { return v.convertMessage(role) }) }) != nil {
					converted = ""
				}
			} else {
				s.skip()
				converted = ""
			}
			content = s.data[from:s.pos]
		default:
			s.skip()
		}
	}
	if s.err != nil {
		return s.err
	}
	switch {
	case rawRole == nil:
		return v.fieldError("role", "Field required")
	case role == "":
		return v.fieldError("role", "Input should be 'user', 'assistant' or 'system'")
	case content == nil:
		return v.fieldError("content", "Field required")
	case content[0] != '"' && content[0] != '[':
		return v.fieldError("content", "Input should be a valid string or a list of content blocks")
	}
	if converted != role {
		v.msgs, v.inexact = v.msgs[:mark], was
	}
	if role == "system" {
		if v.inline == InlineUnknown {
			v.notExact()
		}
		return v.in("content", 0, func() error { return v.at(content, v.systemMessage) })
	}
	if string(v.unescaped(rawRole)) != role {
		v.notExact() // ctx and msg: newer releases refuse them
	}
	v.leads = false
	if converted != role {
		err := v.in("content", 0, func() error { return v.at(content, func() error { return v.convertMessage(role) }) })
		if err != nil {
			return err
		}
	}
	v.placed(role, mark)
	return nil
}

// roleOf is the role vLLM reads a message's as: ctx and msg as user; ""
// for one it refuses.
func roleOf(role []byte) string {
	switch string(role) {
	case "user", "ctx", "msg":
		return "user"
	case "assistant":
		return "assistant"
	case "system":
		return "system"
	}
	return ""
}

// systemMessage places the text of the system-role message whose
// content is under the scanner (its string unless the billing header's,
// or its text blocks' text) as v.inline says: with InlineHoist, after the
// system text before it; else into v.leading, "\n\n" after text before
// it, while no other message came first, held while tool results are
// awaited, or as a system message where it stands.
func (v *messagesConverter) systemMessage() error {
	hoist := v.inline == InlineHoist
	v.text = v.text[:0]
	if v.s.peek() == '"' {
		raw := v.s.raw()
		if hoist || !bytes.HasPrefix(v.unescaped(raw), []byte(billingHeader)) {
			v.text = append(v.text, inner(raw)...)
		}
		v.hoisted = true // earlier releases keep a string, even "", as a part
	} else {
		var b contentBlock
		err := v.each(func() error {
			if err := v.block(&b); err != nil {
				return err
			}
			v.text = v.appendText(v.text, &b)
			return nil
		})
		if err != nil {
			return err
		}
		v.hoisted = v.hoisted || len(v.text) > 0
	}
	switch {
	case hoist:
		v.leading = v.join(v.leading, v.text)
	case len(v.text) == 0:
	case v.leads:
		if len(v.leading) > 0 {
			v.leading = append(v.leading, `\n\n`...)
		}
		v.leading = append(v.leading, v.text...)
	case v.awaiting:
		v.later = true
		v.held = append(v.held, v.text...)
		v.heldEnds = append(v.heldEnds, len(v.held))
	default:
		v.later = true
		v.openMessage("system")
		v.msgs = append(v.msgs, `,"content":"`...)
		v.msgs = append(v.msgs, v.text...)
		v.msgs = append(v.msgs, `"}`...)
	}
	return nil
}

// openMessage starts a message of role in v.msgs, left open.
func (v *messagesConverter) openMessage(role string) {
	if len(v.msgs) > 0 {
		v.msgs = append(v.msgs, ',')
	}
	v.msgs = append(v.msgs, `{"role":"`...)
	v.msgs = append(v.msgs, role...)
	v.msgs = append(v.msgs, '"')
}

// convertMessage converts a user's or assistant's message whose content
// is under the scanner: the tool messages of a user's tool results first,
// then the message itself.
func (v *messagesConverter) convertMessage(role string) error {
	s := &v.s
	v.toolUse = false
	if s.peek() == '"' {
		v.openMessage(role)
		v.msgs = append(v.msgs, `,"content":`...)
		v.msgs = append(v.msgs, s.raw()...)
		v.msgs = append(v.msgs, '}')
		return nil
	}
	v.parts, v.calls, v.reason = v.parts[:0], v.calls[:0], v.reason[:0]
	nparts, hasReason := 0, false
	var text span // in v.parts, the escaped text of the last text part
	var b contentBlock
	part := func() {
		if nparts++; nparts > 1 {
			v.parts = append(v.parts, ',')
		}
	}
	textPart := func(prefix string, raw []byte) {
		part()
		v.parts = append(v.parts, `{"type":"text","text":"`...)
		text.lo = uint32(len(v.parts))
		v.parts = append(v.parts, prefix...)
		v.parts = append(v.parts, raw...)
		text.hi = uint32(len(v.parts))
		v.parts = append(v.parts, `"}`...)
	}
	err := v.each(func() error {
		if err := v.block(&b); err != nil {
			return err
		}
		switch b.typ {
		case "text":
			if len(b.text) > 2 {
				textPart("", inner(b.text))
			}
		case "image":
			if b.source != nil && !emptyObject(b.source) {
				v.notExact()
				part()
				v.parts = v.appendImage(v.parts, b.source)
			}
		case "thinking":
			if b.thinking != nil {
				hasReason = true
				v.reason = v.join(v.reason, inner(b.thinking))
			}
		case "tool_use":
			v.toolUse = true
			v.toolCall(&b)
		case "tool_result":
			if role == "user" {
				return v.toolResult(&b)
			}
			var result []byte
			switch {
			case b.content == nil:
			case b.content[0] == '"':
				result = inner(b.content)
			case !emptyArray(b.content):
				// vLLM writes the list's Python repr.
				v.notExact()
				v.text = appendEscaped(v.text[:0], b.content)
				result = inner(v.text)
			}
			textPart("Tool result: ", result)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if nparts == 0 && role == "user" {
		return nil // vLLM drops a user message left without content
	}
	v.openMessage(role)
	if hasReason {
		v.msgs = append(v.msgs, `,"reasoning":"`...)
		v.msgs = append(v.msgs, v.reason...)
		v.msgs = append(v.msgs, '"')
	}
	if len(v.calls) > 0 {
		v.msgs = append(v.msgs, `,"tool_calls":[`...)
		v.msgs = append(v.msgs, v.calls...)
		v.msgs = append(v.msgs, ']')
	}
	switch {
	case nparts == 1 && text.hi > 0:
		v.msgs = append(v.msgs, `,"content":"`...)
		v.msgs = append(v.msgs, v.parts[text.lo:text.hi]...)
		v.msgs = append(v.msgs, '"')
	case nparts > 0:
		v.msgs = append(v.msgs, `,"content":[`...)
		v.msgs = append(v.msgs, v.parts...)
		v.msgs = append(v.msgs, ']')
	}
	v.msgs = append(v.msgs, '}')
	return nil
}

// toolCall appends a tool_use block as an OpenAI tool call: its input
// dumped as the arguments string (vLLM's json.dumps, which the chat path
// loads again: the object is what the template sees).
func (v *messagesConverter) toolCall(b *contentBlock) {
	if len(v.calls) > 0 {
		v.calls = append(v.calls, ',')
	}
	v.calls = append(v.calls, `{"id":`...)
	if len(b.id) > 2 {
		v.calls = append(v.calls, b.id...)
	} else {
		v.notExact()
		v.calls = append(v.calls, `"call_`...)
		v.calls = strconv.AppendInt(v.calls, time.Now().Unix(), 10)
		v.calls = append(v.calls, '"')
	}
	v.calls = append(v.calls, `,"type":"function","function":{"name":`...)
	if b.name != nil {
		v.calls = append(v.calls, b.name...)
	} else {
		v.calls = append(v.calls, `""`...)
	}
	v.calls = append(v.calls, `,"arguments":`...)
	input := b.input
	if input == nil {
		input = []byte("{}")
	}
	v.calls = appendEscaped(v.calls, input)
	v.calls = append(v.calls, "}}"...)
}

// toolResult appends a user's tool_result block as a tool message: its
// string content, or its text items' text joined by "\n"; images in it
// follow as a user message of image parts.
func (v *messagesConverter) toolResult(b *contentBlock) error {
	v.text, v.images = v.text[:0], v.images[:0]
	switch {
	case b.content == nil:
	case b.content[0] == '"':
		v.text = append(v.text, inner(b.content)...)
	default:
		var item contentItem
		n := 0
		err := v.in("content", 0, func() error {
			return v.at(b.content, func() error {
				return v.each(func() error {
					if err := v.item(&item); err != nil {
						return err
					}
					switch item.typ {
					case "text":
						if n++; n > 1 {
							v.text = append(v.text, `\n`...)
						}
						switch {
						case item.text == nil && !item.textNull:
						case item.text != nil && item.text[0] == '"':
							v.text = append(v.text, inner(item.text)...)
						default:
							v.notExact() // vLLM's join fails on what is no string
						}
					case "image":
						v.notExact()
						if len(v.images) > 0 {
							v.images = append(v.images, ',')
						}
						v.images = v.appendImage(v.images, item.source)
					case "tool_reference":
						v.notExact() // a tool message of tool_reference parts
					}
					return nil
				})
			})
		})
		if err != nil {
			return err
		}
	}
	v.openMessage("tool")
	v.msgs = append(v.msgs, `,"tool_call_id":`...)
	if b.toolUseID != nil {
		v.msgs = append(v.msgs, b.toolUseID...)
	} else {
		v.msgs = append(v.msgs, `""`...)
	}
	v.msgs = append(v.msgs, `,"content":"`...)
	v.msgs = append(v.msgs, v.text...)
	v.msgs = append(v.msgs, `"}`...)
	if len(v.images) > 0 {
		v.openMessage("user")
		v.msgs = append(v.msgs, `,"content":[`...)
		v.msgs = append(v.msgs, v.images...)
		v.msgs = append(v.msgs, "]}"...)
	}
	return nil
}

// contentItem is one item of a tool result's content list, a dictionary
// vLLM reads by key.
type contentItem struct {
	typ          string
	text, source []byte
	textNull     bool
}

func (v *messagesConverter) item(it *contentItem) error {
	raws, err := v.fields(itemKeys, "Input should be a valid dictionary")
	if err != nil {
		return err
	}
	*it = contentItem{text: raws[1], source: raws[2], textNull: string(raws[1]) == "null"}
	if it.textNull {
		it.text = nil
	}
	if len(raws[0]) > 0 && raws[0][0] == '"' {
		it.typ = blockTypes[string(v.unescaped(raws[0]))]
	}
	return nil
}

var itemKeys = []string{"type", "text", "source"}

// appendImage appends an image part for an image source, its URL as vLLM
// makes it: a url source's url, else a data URL of media_type and data.
func (v *messagesConverter) appendImage(dst, source []byte) []byte {
	var raws [maxFields][]byte
	_ = v.at(source, func() (err error) {
		raws, err = v.fields(imageKeys, "")
		return err
	})
	str := func(raw []byte, def string) []byte {
		if len(raw) > 1 && raw[0] == '"' {
			return inner(raw)
		}
		return []byte(def)
	}
	dst = append(dst, `{"type":"image_url","image_url":{"url":"`...)
	if string(raws[0]) == `"url"` {
		dst = append(dst, str(raws[1], "")...)
	} else {
		dst = append(dst, "data:"...)
		dst = append(dst, str(raws[2], "image/jpeg")...)
		dst = append(dst, ";base64,"...)
		dst = append(dst, str(raws[3], "")...)
	}
	return append(dst, `"}}`...)
}

var imageKeys = []string{"type", "url", "media_type", "data"}

// toolList converts the tools list under the scanner into v.tools.
func (v *messagesConverter) toolList() error {
	switch v.s.peek() {
	case 'n':
		v.s.skip()
		return nil
	case '[':
	default:
		return v.wrongType("Input should be a valid list")
	}
	err := v.each(func() error {
		if v.toolsN++; v.toolsN > 1 {
			v.tools = append(v.tools, ',')
		}
		return v.tool()
	})
	if err == nil && v.toolsN == 0 {
		v.notExact() // passed on as [], which a chat request cannot say
	}
	return err
}

// tool appends one tool: name, description, input_schema as parameters
// (typed "object" when it names no type, as vLLM's tool model sets it),
// defer_loading, and strict, which older releases drop.
func (v *messagesConverter) tool() error {
	raws, err := v.fields(toolKeys, "Input should be a valid dictionary or object")
	if err != nil {
		return err
	}
	name, description, schema, strict, deferLoading := raws[0], raws[1], raws[2], raws[3], raws[4]
	switch {
	case name == nil:
		return v.fieldError("name", "Field required")
	case name[0] != '"':
		return v.fieldError("name", "Input should be a valid string")
	case !isNull(description) && description[0] != '"':
		return v.fieldError("description", "Input should be a valid string")
	case schema == nil:
		return v.fieldError("input_schema", "Field required")
	case schema[0] != '{':
		return v.fieldError("input_schema", "Input should be a valid dictionary")
	}
	v.tools = append(v.tools, `{"type":"function","function":{"name":`...)
	v.tools = append(v.tools, name...)
	v.tools = append(v.tools, `,"description":`...)
	if isNull(description) {
		v.tools = append(v.tools, "null"...)
	} else {
		v.tools = append(v.tools, description...)
	}
	v.tools = append(v.tools, `,"parameters":`...)
	v.tools = v.appendTyped(v.tools, schema)
	for _, f := range [...]struct {
		name string
		raw  []byte
	}{{"strict", strict}, {"defer_loading", deferLoading}} {
		if isNull(f.raw) {
			continue
		}
		b, ok := laxBool(f.raw)
		if !ok {
			return v.fieldError(f.name, "Input should be a valid boolean")
		}
		if f.name == "strict" {
			v.notExact()
		}
		v.tools = append(v.tools, `,"`...)
		v.tools = append(v.tools, f.name...)
		v.tools = append(v.tools, `":`...)
		v.tools = strconv.AppendBool(v.tools, b)
	}
	v.tools = append(v.tools, "}}"...)
	return nil
}

var toolKeys = []string{"name", "description", "input_schema", "strict", "defer_loading"}

// appendTyped appends the JSON object schema, with "type": "object" last
// when it has no type key.
func (v *messagesConverter) appendTyped(dst, schema []byte) []byte {
	if v.field(schema, "type") != nil {
		return append(dst, schema...)
	}
	dst = append(dst, bytes.TrimRight(schema[:len(schema)-1], " \t\r\n")...)
	if !emptyObject(schema) {
		dst = append(dst, ',')
	}
	return append(dst, `"type":"object"}`...)
}

// effort is the chat's reasoning_effort (nil for none):
// output_config.effort, or, with thinking disabled, the "none" a newer
// vLLM sets for templates that honour it (a probe of the template picks
// "low" for others).
func (v *messagesConverter) effort(output, thinking []byte) ([]byte, error) {
	var effort []byte
	if !isNull(output) {
		if output[0] != '{' {
			return nil, fieldError("output_config", "Input should be a valid dictionary or object")
		}
		if effort = v.field(output, "effort"); !isNull(effort) {
			switch string(v.unescaped(effort)) {
			case "low", "medium", "high", "xhigh", "max":
			default:
				return nil, fieldError("output_config.effort", "Input should be 'low', 'medium', 'high', 'xhigh' or 'max'")
			}
		} else {
			effort = nil
		}
	}
	if !isNull(thinking) && string(v.unescaped(v.field(thinking, "type"))) == "disabled" {
		v.notExact()
		effort = []byte(`"none"`)
	}
	return effort, nil
}

// appendEscaped appends raw JSON text as a JSON string holding it.
func appendEscaped(dst, raw []byte) []byte {
	var o jsonOptions
	return o.appendString(dst, string(raw))
}

func emptyObject(raw []byte) bool { return len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0 }
func emptyArray(raw []byte) bool  { return len(raw) > 0 && raw[0] == '[' && emptyObject(raw) }

package chat

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ErrInexact marks a request the engine would render differently from
// Python: a float in tools, tool-call arguments or kwargs whose Python repr
// differs from the engine's text ("1.0" and "1"), an integer beyond int64,
// media content parts, or, where a tojson could not be rewritten (tojson.go),
// a U+2028/U+2029 or an indent in the JSON it dumps. The caller
// routes such a request without exact tokens.
var ErrInexact = errors.New("chat: the template engine cannot render this request as vLLM would")

// decoder turns raw JSON from a request into template values, keeping key
// order (Python dicts do) and ints apart from floats (json.loads does).
type decoder struct {
	s   scanner
	buf []byte
	// floatText: a float the engine prints otherwise than Python's repr
	// ("1" for 1.0), in or out of tojson; jsonText: a string the engine's
	// own tojson escapes otherwise (U+2028); lossy: an int beyond int64.
	floatText bool
	jsonText  bool
	lossy     bool
}

// merge adds o's inexactness flags to d's.
func (d *decoder) merge(o *decoder) {
	d.floatText = d.floatText || o.floatText
	d.jsonText = d.jsonText || o.jsonText
	d.lossy = d.lossy || o.lossy
}

// inexact reports values the template may write otherwise than Python.
func (d *decoder) inexact(t *Template) bool {
	return d.lossy || d.floatText || d.jsonText && !t.jsonExact
}

func (d *decoder) decode(raw []byte) (jinja.Value, error) {
	d.s.reset(raw)
	v := d.value()
	if d.s.err != nil {
		return jinja.Undefined(), d.s.err
	}
	return v, nil
}

func (d *decoder) value() jinja.Value {
	s := &d.s
	switch c := s.peek(); {
	case c == '{':
		s.pos++
		out := jinja.NewDict()
		dict := out.AsDict()
		first := true
		for s.more(&first, '}') {
			k := d.string()
			s.expect(':')
			dict.Set(k, d.value())
		}
		return out
	case c == '[':
		s.pos++
		var items []jinja.Value
		first := true
		for s.more(&first, ']') {
			items = append(items, d.value())
		}
		return jinja.NewList(items)
	case c == '"':
		return jinja.NewString(d.string())
	case c == 't' || c == 'f':
		b, _ := s.boolean()
		return jinja.NewBool(b)
	case c == 'n':
		if !s.isNull() {
			s.fail()
		}
		return jinja.None()
	default:
		text, isInt := s.number()
		if s.err != nil {
			return jinja.Undefined()
		}
		if isInt {
			n, err := strconv.ParseInt(string(text), 10, 64)
			if err == nil {
				return jinja.NewInt(n)
			}
			d.lossy = true // Python keeps big ints exact.
		}
		f, _ := strconv.ParseFloat(string(text), 64)
		if !sameFloatText(f) {
			d.floatText = true
		}
		return jinja.NewFloat(f)
	}
}

func (d *decoder) string() string {
	var sp span
	d.buf, sp = d.s.str(d.buf[:0])
	v := string(d.buf[sp.lo:sp.hi])
	if strings.ContainsRune(v, '\u2028') || strings.ContainsRune(v, '\u2029') {
		d.jsonText = true // the engine's tojson escapes them; Python does not
	}
	return v
}

// sameFloatText reports whether the engine prints f as Python's repr
// (json.dumps) does: shortest digits, fixed notation with ".0" for
// exponents in [-4, 16), else d.ddde±XX.
func sameFloatText(f float64) bool {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return false
	}
	engine := strconv.FormatFloat(f, 'g', -1, 64)
	var py string
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp >= -4 && exp < 16 {
		py = strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsRune(py, '.') {
			py += ".0"
		}
	} else {
		py = e
	}
	return engine == py
}

// contentFormat is how vLLM hands message content to a template: "string"
// templates get text parts joined by "\n", "openai" templates (those that
// loop over a message's content) get a list of {"type": "text", ...}.
type contentFormat int

const (
	formatString contentFormat = iota
	formatOpenAI
)

// messagesValue builds the messages list as vLLM's chat_utils reshapes it.
func (t *Template) messagesValue(c *Conversation, d *decoder) (jinja.Value, error) {
	items := make([]jinja.Value, 0, len(c.msgs))
	for i := range c.msgs {
		m := &c.msgs[i]
		v := jinja.NewDict()
		dict := v.AsDict()
		dict.Set("role", jinja.NewString(c.roleName(m)))
		content, err := t.contentValue(c, m)
		if err != nil {
			return v, err
		}
		dict.Set("content", content)
		switch m.role {
		case roleAssistant:
			if !m.toolCalls.empty() {
				calls, err := toolCallsValue(c.bytes(m.toolCalls), d)
				if err != nil {
					return v, err
				}
				dict.Set("tool_calls", calls)
			}
			if m.hasReason {
				r := jinja.NewString(c.str(m.reasoning))
				dict.Set("reasoning", r)
				dict.Set("reasoning_content", r)
			}
		case roleTool:
			if m.hasCallID {
				dict.Set("tool_call_id", jinja.NewString(c.str(m.toolCallID)))
			}
		}
		if m.hasName {
			dict.Set("name", jinja.NewString(c.str(m.name)))
		}
		items = append(items, v)
	}
	return jinja.NewList(items), nil
}

// toolCallsValue rebuilds tool calls as vLLM holds them after validation:
// {"id", "function": {"arguments", "name"}, "type"} in the OpenAI type's
// field order, other keys dropped, and the arguments JSON string parsed
// ({} when it is not JSON).
func toolCallsValue(raw []byte, d *decoder) (jinja.Value, error) {
	calls, err := d.decode(raw)
	if err != nil {
		return calls, err
	}
	items := calls.AsList().Items
	out := make([]jinja.Value, len(items))
	for i, call := range items {
		cd := call.AsDict()
		fn, _ := cd.Get("function")
		args, _ := fn.AsDict().Get("arguments")
		var sub decoder
		parsed, err := sub.decode([]byte(args.AsString()))
		if err != nil || sub.s.peek() != 0 {
			parsed = jinja.NewDict()
		}
		d.merge(&sub)
		name, _ := fn.AsDict().Get("name")
		f := jinja.NewDict()
		f.AsDict().Set("arguments", parsed)
		f.AsDict().Set("name", name)
		id, _ := cd.Get("id")
		v := jinja.NewDict()
		v.AsDict().Set("id", id)
		v.AsDict().Set("function", f)
		v.AsDict().Set("type", jinja.NewString("function"))
		out[i] = v
	}
	return jinja.NewList(out), nil
}

// contentValue is a message's content as vLLM hands it to the template.
func (t *Template) contentValue(c *Conversation, m *message) (jinja.Value, error) {
	texts, media := c.texts(m)
	if media {
		return jinja.Undefined(), ErrInexact
	}
	if t.partsFor(m) {
		items := make([]jinja.Value, len(texts))
		for i, s := range texts {
			items[i] = textPart(s)
		}
		return jinja.NewList(items), nil
	}
	return jinja.NewString(t.join(texts)), nil
}

// join is a content's texts as vLLM joins them for t: in "openai" format
// (a tool result's) every part was wrapped as a dict, an empty one kept,
// then joined by "\n"; else joinTexts.
func (t *Template) join(texts []string) string {
	if t.format == formatOpenAI {
		return strings.Join(texts, "\n")
	}
	return joinTexts(texts)
}

// joinTexts is a content's texts as vLLM hands a string-format template
// one: joined by "\n", an empty text dropped first (it keeps a part's
// parse only when truthy; a part wrapped as a dict, in "openai" format,
// always is).
func joinTexts(texts []string) string {
	if len(texts) == 1 {
		return texts[0]
	}
	var b strings.Builder
	for _, s := range texts {
		if s == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(s)
	}
	return b.String()
}

// partsFor reports whether m's content reaches the template as a list of
// parts: in "openai" format, except tool results, which vLLM joins.
func (t *Template) partsFor(m *message) bool {
	return t.format == formatOpenAI && m.role != roleTool
}

// texts lists the texts of m's content: the string, or the text parts
// (vLLM skips those whose text is None); media reports other parts.
func (c *Conversation) texts(m *message) (texts []string, media bool) {
	switch m.contentKind {
	case contentString:
		return []string{c.str(m.content)}, false
	case contentParts:
		for _, p := range c.parts[m.partLo:m.partHi] {
			switch {
			case p.media:
				media = true
			case p.hasText:
				texts = append(texts, c.str(p.text))
			}
		}
	}
	return texts, media
}

func textPart(s string) jinja.Value {
	v := jinja.NewDict()
	v.AsDict().Set("type", jinja.NewString("text"))
	v.AsDict().Set("text", jinja.NewString(s))
	return v
}

// toolsValue dumps each tool as vLLM's ChatCompletionToolsParam does:
// {"type", "function": {"name", "description", "parameters", "strict",
// "defer_loading"}, "defer_loading"} in field order, description and
// parameters None when absent, strict and defer_loading only when set (a
// tool's defer_loading also fills its function's), other keys dropped.
func toolsValue(c *Conversation, d *decoder) (jinja.Value, error) {
	if !c.hasTools {
		return jinja.None(), nil
	}
	raw, err := d.decode(c.bytes(c.tools))
	if err != nil {
		return raw, err
	}
	items := raw.AsList().Items
	out := make([]jinja.Value, len(items))
	for i, tool := range items {
		fn, _ := tool.AsDict().Get("function")
		f := fn.AsDict()
		deferLoading, toolDefer := tool.AsDict().Get("defer_loading")
		toolDefer = toolDefer && !deferLoading.IsNone()
		dumped := jinja.NewDict()
		df := dumped.AsDict()
		for _, k := range []string{"name", "description", "parameters", "strict", "defer_loading"} {
			v, ok := f.Get(k)
			if k == "defer_loading" && (!ok || v.IsNone()) && toolDefer {
				v, ok = deferLoading, true
			}
			switch {
			case k == "description" || k == "parameters":
				if !ok {
					v = jinja.None()
				}
			case !ok || v.IsNone():
				continue
			}
			df.Set(k, v)
		}
		v := jinja.NewDict()
		v.AsDict().Set("type", jinja.NewString("function"))
		v.AsDict().Set("function", dumped)
		if toolDefer {
			v.AsDict().Set("defer_loading", deferLoading)
		}
		out[i] = v
	}
	return jinja.NewList(out), nil
}

// reservedKwargs are names apply_chat_template passes itself; vLLM keeps a
// request's chat_template_kwargs from replacing them.
var reservedKwargs = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true, "chat_template": true, "tokenize": true}

// templateData is what transformers' apply_chat_template hands the
// template: the special tokens, then the kwargs (server defaults under
// the request's), then messages, tools, documents, add_generation_prompt.
func (t *Template) templateData(c *Conversation, defaults map[string]any) (map[string]jinja.Value, error) {
	var d decoder
	data := make(map[string]jinja.Value, 8+len(t.special)+len(defaults))
	for k, v := range t.special {
		data[k] = v
	}
	if err := kwargsInto(data, c, defaults, &d); err != nil {
		return nil, err
	}
	msgs, err := t.messagesValue(c, &d)
	if err != nil {
		return nil, err
	}
	tools, toJSON, err := t.tools(c, &d)
	if err != nil {
		return nil, err
	}
	if d.inexact(t) || c.hasTools && t.indentedJSON {
		return nil, ErrInexact
	}
	data[jsonFunc] = toJSON
	data["messages"] = msgs
	data["tools"] = tools
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(c.addGenerationPrompt)
	return data, nil
}

// kwargsInto merges the server's default chat_template_kwargs, the
// request's, and the enable_thinking vLLM derives from reasoning_effort
// when the request's kwargs do not set it.
func kwargsInto(data map[string]jinja.Value, c *Conversation, defaults map[string]any, d *decoder) error {
	for k, v := range defaults {
		if !reservedKwargs[k] {
			data[k] = jinja.FromGoValue(v)
		}
	}
	userThinking := false
	if c.hasKwargs {
		kw, err := d.decode(c.bytes(c.kwargs))
		if err != nil {
			return err
		}
		dict := kw.AsDict()
		for _, k := range dict.Keys {
			if reservedKwargs[k] {
				continue
			}
			data[k], _ = dict.Get(k)
			userThinking = userThinking || k == "enable_thinking"
		}
	}
	if c.hasReasoningEffort {
		effort := c.str(c.reasoningEffort)
		data["reasoning_effort"] = jinja.NewString(effort)
		if !userThinking {
			data["enable_thinking"] = jinja.NewBool(effort != "none")
		}
	}
	return nil
}

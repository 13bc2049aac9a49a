package chat

import (
	"strconv"
	"sync"

	"pdlb/engines"
)

// RequestError is a request vLLM refuses before rendering: the HTTP 400 it
// answers, with vLLM's message and the field at fault in the request body
// (messages[1].content, tools[0].function.name).
type RequestError struct {
	Param   string
	Message string
}

func (e *RequestError) Error() string { return e.Message }

// AppendBody appends the OpenAI-style error body vLLM sends with the 400.
func (e *RequestError) AppendBody(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = strconv.AppendQuote(dst, e.Message)
	dst = append(dst, `,"type":"BadRequestError","param":`...)
	dst = strconv.AppendQuote(dst, e.Param)
	return append(dst, `,"code":400}}`...)
}

func fieldError(param, msg string) *RequestError {
	return &RequestError{Param: param, Message: param + ": " + msg}
}

// wrongType skips a value of the wrong JSON type and returns vLLM's 400
// for it, or the syntax error the skip ran into.
func (c *Conversation) wrongType(param, msg string) error {
	c.sc.skip()
	if err := c.syntax(); err != nil {
		return err
	}
	return fieldError(param, msg)
}

// wrongType skips a value of the wrong JSON type in a nested value (tools,
// tool calls), which the request's scan has already found well-formed.
func (s *scanner) wrongType(param, msg string) error {
	s.skip()
	return fieldError(param, msg)
}

// Roles. vLLM takes any role string (its custom message type); these are
// the OpenAI ones it treats apart, roleOther the rest.
const (
	roleSystem = iota
	roleUser
	roleAssistant
	roleTool
	roleDeveloper
	roleFunction
	numRoles
	roleOther = numRoles
)

var roleNames = [numRoles]string{"system", "user", "assistant", "tool", "developer", "function"}

const (
	contentAbsent = iota
	contentNull
	contentString
	contentParts
)

type message struct {
	role        int
	roleName    span // roleOther
	contentKind int
	content     span // contentString
	partLo      int  // contentParts: parts[partLo:partHi]
	partHi      int
	name        span
	hasName     bool
	toolCallID  span
	hasCallID   bool
	toolCalls   span // raw JSON array, when non-empty
	reasoning   span
	hasReason   bool
}

// part is one element of an array content. Text kinds keep their text;
// media kinds keep only their type.
type part struct {
	typ     span
	text    span
	hasText bool
	media   bool
}

// Conversation is one chat request as the template sees it. It is pooled:
// Reset keeps every buffer, so parsing plain string conversations
// allocates nothing once the buffers have grown. Not safe for concurrent
// use.
type Conversation struct {
	arena  []byte // unescaped strings and raw JSON of nested values
	msgs   []message
	parts  []part
	sc     scanner
	seg    []Segment
	kwKeys []kwPair // scratch for the kwargs plan key
	key    []byte

	addGenerationPrompt  bool
	addGenerationGiven   bool
	continueFinalMessage bool
	tools                span // raw JSON array
	hasTools             bool
	kwargs               span // raw JSON object
	hasKwargs            bool
	kwargsTemplate       bool // chat_template_kwargs holds a chat_template
	chatTemplate         span
	hasChatTemplate      bool
	reasoningEffort      span
	hasReasoningEffort   bool
}

var conversationPool = sync.Pool{New: func() any { return new(Conversation) }}

// AcquireConversation returns an empty Conversation from the pool.
func AcquireConversation() *Conversation {
	c := conversationPool.Get().(*Conversation)
	c.Reset()
	return c
}

// ReleaseConversation returns c to the pool; c must not be used after.
func ReleaseConversation(c *Conversation) { conversationPool.Put(c) }

// Reset empties c and keeps its buffers.
func (c *Conversation) Reset() {
	arena, msgs, parts, seg, kw, key := c.arena[:0], c.msgs[:0], c.parts[:0], c.seg[:0], c.kwKeys[:0], c.key[:0]
	*c = Conversation{arena: arena, msgs: msgs, parts: parts, seg: seg, kwKeys: kw, key: key}
	c.addGenerationPrompt = true
}

func (c *Conversation) roleName(m *message) string {
	if m.role == roleOther {
		return c.str(m.roleName)
	}
	return roleNames[m.role]
}

// Len is the number of messages.
func (c *Conversation) Len() int { return len(c.msgs) }

func (c *Conversation) str(sp span) string { return string(c.arena[sp.lo:sp.hi]) }
func (c *Conversation) bytes(sp span) []byte {
	return c.arena[sp.lo:sp.hi]
}

// ParseRequest reads the fields of an OpenAI chat completion request that
// shape the prompt: messages, tools, add_generation_prompt,
// continue_final_message, chat_template, chat_template_kwargs and
// reasoning_effort. Other fields are skipped. A request vLLM would refuse
// before rendering is a *RequestError; c holds no reference to body after.
func (c *Conversation) ParseRequest(body []byte) error {
	err := c.parse(body)
	if err != nil {
		// The body is decoded whole before any field is validated: a
		// JSON error anywhere is the one reported.
		s := &c.sc
		s.reset(body)
		s.skip()
		if s.peek() != 0 {
			s.fail()
		}
		if s.err != nil {
			err = c.syntax()
		}
	}
	c.sc.reset(nil)
	return err
}

func (c *Conversation) parse(body []byte) error {
	c.Reset()
	s := &c.sc
	sawMessages := false
	err := c.object(body, func(name []byte) (err error) {
		switch string(name) {
		case "messages":
			// Python's json.loads keeps the last of repeated keys.
			sawMessages = true
			c.msgs, c.parts = c.msgs[:0], c.parts[:0]
			err = c.parseMessages()
		case "tools":
			err = c.parseTools()
		case "add_generation_prompt":
			c.addGenerationPrompt, c.addGenerationGiven, err = c.optBool("add_generation_prompt", true)
		case "continue_final_message":
			c.continueFinalMessage, _, err = c.optBool("continue_final_message", false)
		case "chat_template":
			c.chatTemplate, c.hasChatTemplate, err = c.optString("chat_template")
		case "reasoning_effort":
			c.reasoningEffort, c.hasReasoningEffort, err = c.optString("reasoning_effort")
			if err == nil && c.hasReasoningEffort {
				err = checkEffort(c.bytes(c.reasoningEffort))
			}
		case "chat_template_kwargs":
			err = c.parseKwargs()
		default:
			s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	if !sawMessages {
		return fieldError("messages", "Field required")
	}
	if c.continueFinalMessage && c.addGenerationPrompt {
		if c.addGenerationGiven {
			return &RequestError{Param: "continue_final_message", Message: "Cannot set both `continue_final_message` and `add_generation_prompt` to True."}
		}
		// The request validator passes a default add_generation_prompt;
		// transformers' apply_chat_template refuses the pair.
		return &RequestError{Param: "continue_final_message", Message: "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to generate a new assistant message instead."}
	}
	return nil
}

// object walks the request object body: field gets each key (valid until
// it reads the value) with the scanner on its value, which it must read
// or skip, and stops the walk with an error. A body that is no object,
// or no JSON, is vLLM's 400 for it.
func (c *Conversation) object(body []byte, field func(name []byte) error) error {
	s := &c.sc
	s.reset(body)
	if s.peek() != '{' {
		return &RequestError{Param: "body", Message: "body: Input should be a valid dictionary or object to extract fields from"}
	}
	s.pos++
	first := true
	for s.more(&first, '}') {
		var k span
		c.arena, k = s.key(c.arena)
		name := c.bytes(k)
		c.arena = c.arena[:k.lo] // keys are not kept
		if err := field(name); err != nil {
			return err
		}
	}
	if s.peek() != 0 {
		s.fail()
	}
	return c.syntax()
}

// checkEffort refuses a reasoning_effort outside vLLM's Literal.
func checkEffort(e []byte) error {
	switch string(e) {
	case "none", "minimal", "low", "medium", "high", "xhigh", "max":
		return nil
	}
	return fieldError("reasoning_effort", "Input should be 'none', 'minimal', 'low', 'medium', 'high', 'xhigh' or 'max'")
}

// syntax reports a scanner failure as vLLM's JSON decode 400.
func (c *Conversation) syntax() error {
	if c.sc.err != nil {
		return &RequestError{Param: "body", Message: "JSON decode error: " + c.sc.err.Error()}
	}
	return nil
}

// optBool reads a bool field as pydantic v2's lax mode does (laxBool);
// null, like an absent field, gives def.
func (c *Conversation) optBool(field string, def bool) (v, given bool, err error) {
	raw := c.sc.raw()
	if err := c.syntax(); err != nil {
		return def, false, err
	}
	if isNull(raw) {
		return def, false, nil
	}
	if v, ok := laxBool(raw); ok {
		return v, true, nil
	}
	return def, false, fieldError(field, "Input should be a valid boolean")
}

// laxBool is the bool pydantic's lax mode reads from a JSON value: true
// or false, a string engines.LaxBoolString takes, a number
// engines.LaxBoolNumber takes.
func laxBool(raw []byte) (v, ok bool) {
	switch c := raw[0]; {
	case string(raw) == "true", string(raw) == "false":
		return raw[0] == 't', true
	case c == '"':
		var t scanner
		t.reset(raw)
		s, sp := t.str(nil)
		return engines.LaxBoolString(string(s[sp.lo:sp.hi]))
	case c == '-' || c >= '0' && c <= '9':
		return engines.LaxBoolNumber(string(raw))
	}
	return false, false
}

func (c *Conversation) optString(field string) (span, bool, error) {
	s := &c.sc
	if s.isNull() {
		return span{}, false, nil
	}
	if s.peek() != '"' {
		return span{}, false, c.wrongType(field, "Input should be a valid string")
	}
	var sp span
	c.arena, sp = s.str(c.arena)
	return sp, true, c.syntax()
}

// rawValue copies one JSON value as it stands into the arena.
func (c *Conversation) rawValue() span {
	lo := len(c.arena)
	c.arena = append(c.arena, c.sc.raw()...)
	return span{uint32(lo), uint32(len(c.arena))}
}

func (c *Conversation) parseKwargs() error {
	s := &c.sc
	// A repeated key's last value counts, as in json.loads: null drops
	// an earlier one.
	c.hasKwargs, c.kwargsTemplate = false, false
	if s.isNull() {
		return nil
	}
	if s.peek() != '{' {
		return c.wrongType("chat_template_kwargs", "Input should be a valid dictionary")
	}
	c.kwargs, c.hasKwargs = c.rawValue(), true
	if err := c.syntax(); err != nil {
		return err
	}
	var t scanner
	t.reset(c.bytes(c.kwargs))
	t.pos++
	first := true
	for t.more(&first, '}') {
		if t.keyIs("chat_template") && !t.isNull() {
			c.kwargsTemplate = true
		}
		t.skip()
	}
	return nil
}

// parseTools keeps the tools array raw after checking what vLLM's
// ChatCompletionToolsParam requires of each tool.
func (c *Conversation) parseTools() error {
	s := &c.sc
	c.hasTools = false // as parseKwargs: the last value counts
	if s.isNull() {
		return nil
	}
	if s.peek() != '[' {
		return c.wrongType("tools", "Input should be a valid list")
	}
	c.tools = c.rawValue()
	if err := c.syntax(); err != nil {
		return err
	}
	var t scanner
	t.reset(c.bytes(c.tools))
	t.pos++
	n := 0
	first := true
	for t.more(&first, ']') {
		if err := checkTool(&t, n); err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return &RequestError{Param: "tools", Message: "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."}
	}
	c.hasTools = true
	return nil
}

func checkTool(t *scanner, i int) error {
	at := func(f string) string { return "tools[" + strconv.Itoa(i) + "]" + f }
	if t.peek() != '{' {
		return t.wrongType(at(""), "Input should be a valid dictionary or instance of ChatCompletionToolsParam")
	}
	t.pos++
	sawFunction := false
	first := true
	for t.more(&first, '}') {
		k := t.keyString()
		switch k {
		case "type":
			if t.peek() != '"' || !t.lit(`"function"`) {
				return t.wrongType(at(".type"), "Input should be 'function'")
			}
		case "function":
			sawFunction = true
			if err := checkFunction(t, at(".function")); err != nil {
				return err
			}
		case "defer_loading":
			if _, ok := t.boolean(); !ok && !t.isNull() {
				return t.wrongType(at(".defer_loading"), "Input should be a valid boolean")
			}
		default:
			t.skip()
		}
	}
	if !sawFunction {
		return fieldError(at(".function"), "Field required")
	}
	return nil
}

func checkFunction(t *scanner, at string) error {
	if t.peek() != '{' {
		return t.wrongType(at, "Input should be a valid dictionary or instance of FunctionDefinition")
	}
	t.pos++
	sawName := false
	first := true
	for t.more(&first, '}') {
		switch k := t.keyString(); k {
		case "name":
			sawName = true
			if t.peek() != '"' {
				return t.wrongType(at+".name", "Input should be a valid string")
			}
			t.skipString()
		case "description":
			if !t.isNull() {
				if t.peek() != '"' {
					return t.wrongType(at+".description", "Input should be a valid string")
				}
				t.skipString()
			}
		case "parameters":
			if !t.isNull() {
				if t.peek() != '{' {
					return t.wrongType(at+".parameters", "Input should be a valid dictionary")
				}
				t.skip()
			}
		case "strict", "defer_loading":
			if _, ok := t.boolean(); !ok && !t.isNull() {
				return t.wrongType(at+"."+k, "Input should be a valid boolean")
			}
		default:
			t.skip()
		}
	}
	if !sawName {
		return fieldError(at+".name", "Field required")
	}
	return nil
}

// keyIs reads an object key and reports whether it is name, without
// allocating for keys of up to 32 bytes.
func (s *scanner) keyIs(name string) bool {
	var buf [32]byte
	b, sp := s.key(buf[:0])
	return string(b[sp.lo:sp.hi]) == name
}

// keyString reads an object key of a nested value (tools, tool calls).
func (s *scanner) keyString() string {
	var buf [32]byte
	b, sp := s.key(buf[:0])
	return string(b[sp.lo:sp.hi])
}

func (c *Conversation) parseMessages() error {
	s := &c.sc
	if s.peek() != '[' {
		return c.wrongType("messages", "Input should be a valid list")
	}
	s.pos++
	first := true
	for s.more(&first, ']') {
		if err := c.parseMessage(len(c.msgs)); err != nil {
			return err
		}
	}
	if err := c.syntax(); err != nil {
		return err
	}
	if len(c.msgs) == 0 {
		return fieldError("messages", "List should have at least 1 item after validation, not 0")
	}
	return nil
}

func msgField(i int, f string) string { return "messages[" + strconv.Itoa(i) + "]" + f }

func (c *Conversation) parseMessage(i int) error {
	s := &c.sc
	if s.peek() != '{' {
		return c.wrongType(msgField(i, ""), "Input should be a valid dictionary")
	}
	s.pos++
	m := message{role: -1}
	first := true
	for s.more(&first, '}') {
		var k span
		c.arena, k = s.key(c.arena)
		name := c.bytes(k)
		c.arena = c.arena[:k.lo]
		switch string(name) {
		case "role":
			if s.peek() != '"' {
				return c.wrongType(msgField(i, ".role"), "Input should be a valid string")
			}
			var r span
			c.arena, r = s.str(c.arena)
			m.role, m.roleName = roleOther, r
			for id, n := range roleNames {
				if string(c.bytes(r)) == n {
					m.role = id
				}
			}
		case "content":
			if err := c.parseContent(&m, i); err != nil {
				return err
			}
		case "name":
			sp, ok, err := c.optString(msgField(i, ".name"))
			if err != nil {
				return err
			}
			m.name, m.hasName = sp, ok
		case "tool_call_id":
			sp, ok, err := c.optString(msgField(i, ".tool_call_id"))
			if err != nil {
				return err
			}
			m.toolCallID, m.hasCallID = sp, ok
		case "reasoning", "reasoning_content":
			sp, ok, err := c.optString(msgField(i, "."+string(name)))
			if err != nil {
				return err
			}
			if ok {
				m.reasoning, m.hasReason = sp, true
			}
		case "tool_calls":
			if err := c.parseToolCalls(&m, i); err != nil {
				return err
			}
		default:
			s.skip()
		}
		if err := c.syntax(); err != nil {
			return err
		}
	}
	if err := c.syntax(); err != nil {
		return err
	}
	if m.role < 0 {
		return fieldError(msgField(i, ".role"), "Field required")
	}
	// The message must fit one of vLLM's message types. Its custom type
	// takes any role, without content or tool_call_id, but not a null
	// content, which only the assistant and function types take.
	if m.contentKind == contentNull && m.role != roleAssistant && m.role != roleFunction {
		return fieldError(msgField(i, ".content"), "Input should be a valid string or a list of content parts")
	}
	c.msgs = append(c.msgs, m)
	return nil
}

func (c *Conversation) parseContent(m *message, i int) error {
	s := &c.sc
	switch s.peek() {
	case 'n':
		if s.isNull() {
			m.contentKind = contentNull
			return nil
		}
	case '"':
		m.contentKind = contentString
		c.arena, m.content = s.str(c.arena)
		return c.syntax()
	case '[':
		m.contentKind = contentParts
		m.partLo = len(c.parts)
		s.pos++
		first := true
		for s.more(&first, ']') {
			if err := c.parsePart(i, len(c.parts)-m.partLo); err != nil {
				return err
			}
		}
		m.partHi = len(c.parts)
		return c.syntax()
	}
	return c.wrongType(msgField(i, ".content"), "Input should be a valid string or a list of content parts")
}

// textPartTypes are the part types whose text vLLM keeps in the prompt;
// mediaPartTypes are the others it accepts (vLLM's MM_PARSER_MAP).
var (
	textPartTypes  = []string{"text", "input_text", "output_text", "refusal", "thinking"}
	mediaPartTypes = []string{"audio_embeds", "audio_url", "image_embeds", "image_pil", "image_url", "input_audio", "input_image", "prompt_embeds", "tool_reference", "video_url"}
)

const supportedPartTypes = "audio_embeds, audio_url, image_embeds, image_pil, image_url, input_audio, input_image, input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, video_url"

func (c *Conversation) parsePart(i, j int) error {
	s := &c.sc
	at := msgField(i, ".content["+strconv.Itoa(j)+"]")
	if s.peek() == '"' {
		p := part{hasText: true}
		c.arena, p.text = s.str(c.arena)
		c.parts = append(c.parts, p)
		return c.syntax()
	}
	if s.peek() != '{' {
		return c.wrongType(at, "Input should be a valid dictionary")
	}
	s.pos++
	var p part
	// A part's text is its "text" field, a thinking part's "thinking", a
	// refusal's "refusal"; the type may come after them.
	var texts [3]span
	var hasText [3]bool
	typeGiven, typeIsString, mediaKey := false, false, false
	first := true
	for s.more(&first, '}') {
		var k span
		c.arena, k = s.key(c.arena)
		name := string(c.bytes(k))
		c.arena = c.arena[:k.lo]
		switch name {
		case "type":
			if s.isNull() {
				break
			}
			typeGiven = true
			if s.peek() != '"' {
				s.skip()
				break
			}
			typeIsString = true
			c.arena, p.typ = s.str(c.arena)
		case "text", "thinking", "refusal":
			if s.isNull() {
				break
			}
			if s.peek() != '"' {
				return c.wrongType(at+"."+name, "Input should be a valid string")
			}
			f := textFieldIndex(name)
			c.arena, texts[f] = s.str(c.arena)
			hasText[f] = true
		default:
			switch name {
			case "image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url", "tool_reference":
				mediaKey = true
			}
			s.skip()
		}
		if err := c.syntax(); err != nil {
			return err
		}
	}
	if err := c.syntax(); err != nil {
		return err
	}
	if !typeGiven {
		if !mediaKey {
			return &RequestError{Param: at + ".type", Message: "Missing 'type' field in multimodal part."}
		}
		p.media = true
		c.parts = append(c.parts, p)
		return nil
	}
	if !typeIsString {
		return &RequestError{Param: at + ".type", Message: "Invalid 'type' field in multimodal part."}
	}
	typ := string(c.bytes(p.typ))
	for _, t := range textPartTypes {
		if typ == t {
			f := textFieldIndex(typ)
			p.text, p.hasText = texts[f], hasText[f]
			c.parts = append(c.parts, p)
			return nil
		}
	}
	for _, t := range mediaPartTypes {
		if typ == t {
			p.media = true
			c.parts = append(c.parts, p)
			return nil
		}
	}
	return &RequestError{Param: at + ".type", Message: "Unsupported chat content part type: " + pyRepr(typ) + ". Supported types: " + supportedPartTypes + "."}
}

func textFieldIndex(typ string) int {
	switch typ {
	case "thinking":
		return 1
	case "refusal":
		return 2
	}
	return 0
}

func (c *Conversation) parseToolCalls(m *message, i int) error {
	s := &c.sc
	if s.isNull() {
		return nil
	}
	if s.peek() != '[' {
		return c.wrongType(msgField(i, ".tool_calls"), "Input should be a valid list")
	}
	raw := c.rawValue()
	if err := c.syntax(); err != nil {
		return err
	}
	var t scanner
	t.reset(c.bytes(raw))
	t.pos++
	n := 0
	first := true
	for t.more(&first, ']') {
		if err := checkToolCall(&t, msgField(i, ".tool_calls["+strconv.Itoa(n)+"]")); err != nil {
			return err
		}
		n++
	}
	if n > 0 {
		// vLLM drops an empty tool_calls list before rendering.
		m.toolCalls = raw
	}
	return nil
}

// checkToolCall checks one tool call against the OpenAI type vLLM
// validates it with: id, type "function", function.name and
// function.arguments as strings.
func checkToolCall(t *scanner, at string) error {
	if t.peek() != '{' {
		return t.wrongType(at, "Input should be a valid dictionary")
	}
	t.pos++
	var sawID, sawType, sawFunction bool
	first := true
	for t.more(&first, '}') {
		switch t.keyString() {
		case "id":
			sawID = true
			if t.peek() != '"' {
				return t.wrongType(at+".id", "Input should be a valid string")
			}
			t.skipString()
		case "type":
			sawType = true
			if t.peek() != '"' || !t.lit(`"function"`) {
				return t.wrongType(at+".type", "Input should be 'function'")
			}
		case "function":
			sawFunction = true
			if err := checkCalledFunction(t, at+".function"); err != nil {
				return err
			}
		default:
			t.skip()
		}
	}
	switch {
	case !sawID:
		return fieldError(at+".id", "Field required")
	case !sawType:
		return fieldError(at+".type", "Field required")
	case !sawFunction:
		return fieldError(at+".function", "Field required")
	}
	return nil
}

func checkCalledFunction(t *scanner, at string) error {
	if t.peek() != '{' {
		return t.wrongType(at, "Input should be a valid dictionary")
	}
	t.pos++
	var sawName, sawArgs bool
	first := true
	for t.more(&first, '}') {
		k := t.keyString()
		switch k {
		case "name", "arguments":
			if t.peek() != '"' {
				return t.wrongType(at+"."+k, "Input should be a valid string")
			}
			sawName = sawName || k == "name"
			sawArgs = sawArgs || k == "arguments"
		}
		t.skip()
	}
	switch {
	case !sawName:
		return fieldError(at+".name", "Field required")
	case !sawArgs:
		return fieldError(at+".arguments", "Field required")
	}
	return nil
}

// pyRepr quotes s the way Python's repr quotes a str that has no quote
// characters or escapes in it, which is all a part type in an error is
// likely to hold; others fall back to Go quoting.
func pyRepr(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == '\'' || s[i] == '\\' || s[i] >= 0x7f {
			return strconv.Quote(s)
		}
	}
	return "'" + s + "'"
}

package chat

import "slices"

// ParseResponses reads an OpenAI Responses API request body (POST
// /v1/responses) as the conversation vLLM renders for it: the
// instructions, when not empty, as a system message, then the input (a
// string is the user's message; a list holds message items, a user's,
// system's or developer's kept as the chat API reads a message, an
// assistant's content its string or its first part's text).
//
// What vLLM renders in ways this does not follow is ErrInexact: a
// previous_response_id, previous_response or previous_input_messages
// (a history this does not rebuild), tools, reasoning
// settings, items other than messages (function calls and their output,
// reasoning), a partial final message vLLM continues, and any item the
// chat API would refuse. The engine validates the request itself; a body
// that is no JSON object is a *RequestError as for ParseRequest.
func (c *Conversation) ParseResponses(body []byte) error {
	c.Reset()
	s := &c.sc
	defer s.reset(nil)
	var system span // empty: no system message
	err := c.object(body, func(name []byte) (err error) {
		switch string(name) {
		case "instructions":
			// A repeated key's last value wins, as in json.loads.
			if system, _, err = c.optString("instructions"); err != nil {
				return ErrInexact
			}
		case "input":
			c.msgs, c.parts = c.msgs[:0], c.parts[:0]
			err = c.parseInput()
		case "previous_response_id", "previous_response", "previous_input_messages", "tools", "reasoning", "chat_template_kwargs":
			if !s.isNull() {
				s.skip()
				err = ErrInexact
			}
		default:
			s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	if len(c.msgs) == 0 {
		return ErrInexact // no input
	}
	if !system.empty() {
		c.msgs = slices.Insert(c.msgs, 0, message{role: roleSystem, contentKind: contentString, content: system})
	}
	return nil
}

// parseInput reads a Responses request's input: a string, or a list of
// items.
func (c *Conversation) parseInput() error {
	s := &c.sc
	switch s.peek() {
	case '"':
		m := message{role: roleUser, contentKind: contentString}
		c.arena, m.content = s.str(c.arena)
		c.msgs = append(c.msgs, m)
		return c.syntax()
	case '[':
	default:
		s.skip()
		return ErrInexact
	}
	s.pos++
	first := true
	for s.more(&first, ']') {
		if err := c.parseItem(); err != nil {
			return err
		}
	}
	if err := c.syntax(); err != nil {
		return err
	}
	if len(c.msgs) == 0 {
		return ErrInexact
	}
	return nil
}

// parseItem reads one input item as a chat message, or says ErrInexact.
func (c *Conversation) parseItem() error {
	s := &c.sc
	if s.peek() != '{' {
		s.skip()
		return ErrInexact
	}
	// The item's type and status may follow its content: look first.
	if !plainMessage(s.data[s.pos:]) {
		s.skip()
		return ErrInexact
	}
	i := len(c.msgs)
	switch err := c.parseMessage(i); {
	case err == nil:
	case c.sc.err != nil:
		return err
	default:
		// The chat API's refusal is not the Responses API's.
		return ErrInexact
	}
	m := &c.msgs[i]
	switch m.role {
	case roleUser, roleSystem, roleDeveloper:
		return nil
	case roleAssistant:
	default:
		return ErrInexact
	}
	// vLLM makes an assistant item's message of its content alone: its
	// name, tool calls and reasoning never reach the template.
	m.hasName, m.hasCallID, m.toolCalls, m.hasReason = false, false, span{}, false
	switch m.contentKind {
	case contentString:
		return nil
	case contentParts:
	default:
		return ErrInexact
	}
	// vLLM keeps an assistant item's first part's text alone, a string.
	if m.partHi == m.partLo {
		m.contentKind, m.content = contentString, span{}
		return nil
	}
	p := c.parts[m.partLo]
	switch string(c.bytes(p.typ)) {
	case "output_text", "input_text", "text":
	default:
		return ErrInexact
	}
	if !p.hasText {
		return ErrInexact
	}
	c.parts = c.parts[:m.partLo]
	m.contentKind, m.content, m.partLo, m.partHi = contentString, p.text, 0, 0
	return nil
}

// plainMessage reports whether the item object at the start of b is a
// message vLLM renders as it stands: its type absent, null or "message",
// and its status not one (in_progress, incomplete) that has vLLM continue
// it. b holds a whole valid JSON document from the object on.
func plainMessage(b []byte) bool {
	var t scanner
	t.reset(b)
	t.pos++
	first := true
	for t.more(&first, '}') {
		switch t.keyString() {
		case "type":
			if !t.isNull() && (t.peek() != '"' || !t.lit(`"message"`)) {
				return false
			}
		case "status":
			if t.peek() == '"' && (t.lit(`"in_progress"`) || t.lit(`"incomplete"`)) {
				return false
			}
			t.skip()
		default:
			t.skip()
		}
	}
	return t.err == nil
}

package openai

import (
	"bytes"

	"github.com/cespare/xxhash/v2"

	"pdlb/engines/tokenize"
	"pdlb/radix"
)

// messagesField reads the field key of a KindMessages body (Anthropic's
// Messages API), or steps over it.
func (r *Request) messagesField(s *scanner, key []byte, system, messages *field) (err error) {
	switch b2s(key) {
	case "system":
		*system = s.field()
	case "messages":
		*messages = s.field()
	case "max_tokens":
		r.MaxTokens, err = r.parseCount(s, "max_tokens")
	case "model":
		err = r.parseModel(s)
	case "stream":
		r.Stream, err = r.parseBool(s, "stream")
	case "cache_salt":
		// Newer vLLM releases pass it to the chat they make; older ones
		// drop it.
		err = r.parseCacheSalt(s)
	default:
		s.skip()
	}
	return err
}

// userRole is the role ctx and msg messages render as.
var userRole = []byte("user")

// billingHeader starts the system text block Claude Code adds to every
// request, a hash of its own in it; vLLM drops it, since it would end
// every prompt's shared prefix there.
var billingHeader = []byte("x-anthropic-billing-header")

// renderMessages renders Prompt in the stand-in's chat format from a
// Messages request, as the chat vLLM makes of it: the system field's text
// and the system-role messages' joined as one system turn (Claude Code's
// billing header dropped), then each other message as a turn of its role,
// its content a string or its text blocks joined as a chat's text parts.
// A message with any other block (a tool call or result, thinking)
// renders as its blocks' JSON without their cache_control marks, which
// clients move to the newest turn: it keys alike at every turn that
// resends it; images and documents are media, as a chat's. A request the
// engine would refuse leaves Prompt empty.
func (r *Request) renderMessages(body []byte, system, messages field) {
	r.Prompt = r.Prompt[:0]
	if messages.form != '[' || !r.renderSystem(body, system, messages) {
		r.Prompt = r.Prompt[:0]
		return
	}
	s := &scanner{b: body, p: messages.start}
	s.open()
	n := 0
	for ok := true; s.more(']', n); n++ {
		if ok = r.renderMessage(s, n); !ok {
			r.Prompt, r.MediaBytes, r.media = r.Prompt[:0], 0, 0
			return
		}
	}
	if n == 0 {
		r.Prompt = r.Prompt[:0]
		return
	}
	r.Prompt = append(r.Prompt, tokenize.GenerationPrompt...)
}

// renderSystem renders the system turn: the system field's text (a string
// or text blocks) and the system-role messages', joined.
func (r *Request) renderSystem(body []byte, system, messages field) bool {
	mark := len(r.Prompt)
	r.Prompt = tokenize.AppendTurnOpen(r.Prompt, []byte("system"))
	open := len(r.Prompt)
	ok := r.appendSystemText(body, system)
	s := &scanner{b: body, p: messages.start}
	s.open()
	for i := 0; ok && s.more(']', i); i++ {
		if s.c() != '{' {
			return false
		}
		role, content := r.objectFields(s, "role", "content")
		if role.form == '"' && string(role.raw) == "system" {
			ok = r.appendSystemText(body, content)
		}
	}
	if !ok {
		return false
	}
	if len(r.Prompt) == open {
		r.Prompt = r.Prompt[:mark] // no system text: no system turn
		return true
	}
	r.Prompt = tokenize.AppendTurnClose(r.Prompt)
	return true
}

// appendSystemText appends the text of a system value: a string, or the
// non-empty text of its text blocks, the billing header's left out.
func (r *Request) appendSystemText(body []byte, v field) bool {
	switch v.form {
	case 0:
		return true
	case '"':
		var ok bool
		r.Prompt, ok = appendUnquoted(r.Prompt, v.raw, v.esc)
		return ok
	case '[':
	default:
		return false
	}
	s := &scanner{b: body, p: v.start}
	s.open()
	for j := 0; s.more(']', j); j++ {
		if s.c() != '{' {
			return false
		}
		typ, text := r.objectFields(s, "type", "text")
		if typ.form != '"' || string(typ.raw) != "text" || text.form != '"' || len(text.raw) == 0 {
			continue
		}
		at := len(r.Prompt)
		var ok bool
		if r.Prompt, ok = appendUnquoted(r.Prompt, text.raw, text.esc); !ok {
			return false
		}
		if bytes.HasPrefix(r.Prompt[at:], billingHeader) {
			r.Prompt = r.Prompt[:at]
		}
	}
	return true
}

// objectFields reads the object at s.p, '{' checked, for the values of
// its keys a and b (a repeated key's last value), stepping over the rest.
func (r *Request) objectFields(s *scanner, a, b string) (fa, fb field) {
	s.open()
	for k := 0; s.more('}', k); k++ {
		switch b2s(s.key(&r.scratch)) {
		case a:
			fa = s.field()
		case b:
			fb = s.field()
		default:
			s.skip()
		}
	}
	return fa, fb
}

// renderMessage renders message i (s on it) as a turn; a system-role
// message, in the system turn already, renders none. False when the
// engine would refuse it.
func (r *Request) renderMessage(s *scanner, i int) bool {
	if s.c() != '{' {
		return false
	}
	role, content := r.objectFields(s, "role", "content")
	if role.form != '"' || role.esc {
		return false
	}
	switch string(role.raw) {
	case "system":
		return true
	case "ctx", "msg":
		// Roles newer Claude Code sends, which vLLM reads as the user's.
		role.raw = userRole
	case "user", "assistant":
	default:
		return false
	}
	switch content.form {
	case '"':
		r.Prompt = tokenize.AppendTurnOpen(r.Prompt, role.raw)
		var ok bool
		r.Prompt, ok = appendUnquoted(r.Prompt, content.raw, content.esc)
		r.Prompt = tokenize.AppendTurnClose(r.Prompt)
		return ok
	case '[':
	default:
		return false
	}
	mark := len(r.Prompt)
	r.Prompt = tokenize.AppendTurnOpen(r.Prompt, role.raw)
	open := len(r.Prompt)
	if textBlocks(s.b[content.start:]) {
		if err := r.renderParts(&scanner{b: s.b, p: content.start}, i); err != nil {
			return false
		}
		if len(r.Prompt) == open && string(role.raw) == "user" {
			// No text: vLLM leaves such a user message out of the chat
			// (an assistant's stays, without content).
			r.Prompt = r.Prompt[:mark]
			return true
		}
		r.Prompt = tokenize.AppendTurnClose(r.Prompt)
		return true
	}
	var ok bool
	r.Prompt, ok = r.appendBlocks(r.Prompt, &scanner{b: s.b, p: content.start})
	r.Prompt = tokenize.AppendTurnClose(r.Prompt)
	return ok
}

// textBlocks reports whether the content list at the start of b holds
// text blocks alone.
func textBlocks(b []byte) bool {
	s := &scanner{b: b}
	s.open()
	for j := 0; s.more(']', j); j++ {
		if s.c() != '{' {
			return false
		}
		s.open()
		text := false
		for k := 0; s.more('}', k); k++ {
			var scratch []byte
			if b2s(s.key(&scratch)) != "type" {
				s.skip()
				continue
			}
			t := s.field()
			text = t.form == '"' && string(t.raw) == "text"
		}
		if !text {
			return false
		}
	}
	return !s.bad
}

// appendBlocks appends the JSON value at s.p, as it came but for every
// object's "cache_control" member, which it leaves out, and for image and
// document blocks, at any depth (a tool result's screenshot), which are
// the request's media (MediaBytes, and the key seed's digest) rather than
// prompt text; false for a value that is no JSON. One pass: a block is
// rendered, then taken back once its type says it is media.
func (r *Request) appendBlocks(dst []byte, s *scanner) ([]byte, bool) {
	switch s.c() {
	case '{':
		start, mark := s.p, len(dst)
		mediaBytes, media := r.MediaBytes, r.media
		s.open()
		dst = append(dst, '{')
		n, isMedia := 0, false
		for k := 0; s.more('}', k); k++ {
			var scratch []byte
			key := s.key(&scratch)
			if string(key) == "cache_control" {
				s.skip()
				continue
			}
			if n > 0 {
				dst = append(dst, ',')
			}
			n++
			dst = AppendJSONString(dst, b2s(key))
			dst = append(dst, ':')
			if string(key) == "type" && s.c() == '"' {
				v := s.field()
				if isMedia = !v.esc && (string(v.raw) == "image" || string(v.raw) == "document"); isMedia {
					// The rest (an image's base64) is stepped over, not
					// copied.
					for k++; s.more('}', k); k++ {
						s.key(&scratch)
						s.skip()
					}
					break
				}
				dst = append(dst, s.b[v.start:s.p]...)
				continue
			}
			var ok bool
			if dst, ok = r.appendBlocks(dst, s); !ok {
				return dst, false
			}
		}
		if isMedia {
			// Its bytes once, not again for media nested in it.
			r.MediaBytes = mediaBytes + s.p - start
			r.media = radix.Extend(media, xxhash.Sum64(s.b[start:s.p]))
			return dst[:mark], !s.bad
		}
		return append(dst, '}'), !s.bad
	case '[':
		s.open()
		dst = append(dst, '[')
		n := 0
		for j := 0; s.more(']', j); j++ {
			at := len(dst)
			if n > 0 {
				dst = append(dst, ',')
			}
			var ok bool
			if dst, ok = r.appendBlocks(dst, s); !ok {
				return dst, false
			}
			if len(dst) == at+min(n, 1) {
				// A media block renders nothing, its comma neither.
				dst = dst[:at]
				continue
			}
			n++
		}
		return append(dst, ']'), !s.bad
	}
	start := s.skip()
	return append(dst, s.b[start:s.p]...), !s.bad
}

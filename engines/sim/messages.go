package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"
)

// Anthropic's Messages API as vLLM serves it (POST /v1/messages): the
// request runs as the chat vLLM makes of it (the system field's text and
// the system-role messages' joined as the system message, Claude Code's
// billing header dropped; each other message's content a string, one
// text block's text, or several text blocks as text parts), through the
// pod's own generation, and its answer is rewritten in the Messages
// shape: whole, or as vLLM's named events (message_start, a text block's
// start, deltas and stop, message_delta with the stop reason and usage,
// message_stop). The sim serves text blocks only; vLLM also converts
// tool calls and results, thinking and images.

// messagesRequest is what the sim reads of a Messages API request.
type messagesRequest struct {
	Model     string           `json:"model"`
	System    json.RawMessage  `json:"system"`
	Messages  []messagesTurn   `json:"messages"`
	MaxTokens *int             `json:"max_tokens"`
	Stream    bool             `json:"stream"`
	Stop      *json.RawMessage `json:"stop_sequences"`
}

type messagesTurn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// stopReasons maps a chat's finish reason to the Messages API's, as vLLM
// maps it.
var stopReasons = map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

// createMessage serves POST /v1/messages.
func (p *Pod) createMessage(ctx *fasthttp.RequestCtx) {
	var req messagesRequest
	if !p.parseBody(ctx, &req) || !p.checkModel(ctx, req.Model) {
		return
	}
	if req.MaxTokens == nil {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		writeJSON(ctx, []byte(`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}`))
		return
	}
	turns, err := messagesChat(req)
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": "invalid_request_error", "message": err.Error()}})
		writeJSON(ctx, b)
		return
	}
	chat := map[string]any{"model": req.Model, "messages": turns, "stream": req.Stream, "max_tokens": *req.MaxTokens}
	if req.Stream {
		// As vLLM asks: the first chunk's usage is message_start's.
		chat["stream_options"] = map[string]bool{"include_usage": true, "continuous_usage_stats": true}
	}
	inner, ok := p.runInner(ctx, chat, true)
	if !ok {
		return
	}
	model := cmp.Or(req.Model, p.cfg.Model)
	if !req.Stream {
		var out struct {
			ID string `json:"id"`
			chatAnswer
		}
		if json.Unmarshal(inner.Response.Body(), &out) != nil || out.Usage == nil {
			return // the client left, and generate cancelled it
		}
		b, _ := json.Marshal(map[string]any{
			"id": out.ID, "type": "message", "role": "assistant", "model": model,
			"content":     []any{map[string]string{"type": "text", "text": out.text()}},
			"stop_reason": stopReasons[out.finish()], "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": out.Usage.PromptTokens, "output_tokens": out.Usage.CompletionTokens},
		})
		writeJSON(ctx, b)
		return
	}
	relayInner(ctx, inner, func(w *bufio.Writer, events *bufio.Reader) { relayMessages(w, events, model) })
}

// messagesChat is the chat of a Messages request, as vLLM makes it.
func messagesChat(req messagesRequest) ([]chatMessage, error) {
	var system strings.Builder
	if err := appendSystem(&system, req.System); err != nil {
		return nil, fmt.Errorf("system: %w", err)
	}
	for i, m := range req.Messages {
		if m.Role == "system" {
			if err := appendSystem(&system, m.Content); err != nil {
				return nil, fmt.Errorf("messages.%d.content: %w", i, err)
			}
		}
	}
	var turns []chatMessage
	if system.Len() > 0 {
		turns = append(turns, textMessage("system", system.String()))
	}
	for i, m := range req.Messages {
		switch m.Role {
		case "system":
			continue
		case "ctx", "msg":
			// Roles newer Claude Code sends, which vLLM reads as the
			// user's.
			m.Role = "user"
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			turns = append(turns, textMessage(m.Role, s))
			continue
		}
		var blocks []contentPart
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, fmt.Errorf("messages.%d.content: a string or a list of blocks", i)
		}
		var parts []contentPart
		for j, b := range blocks {
			if b.Type != "text" {
				return nil, fmt.Errorf("messages.%d.content.%d: the sim serves text blocks only, not %q", i, j, b.Type)
			}
			if b.Text != "" {
				parts = append(parts, b)
			}
		}
		switch {
		case len(parts) == 1:
			turns = append(turns, textMessage(m.Role, parts[0].Text))
		case len(parts) > 1:
			content, _ := json.Marshal(parts)
			turns = append(turns, chatMessage{Role: m.Role, Content: content})
		case m.Role != "user":
			// vLLM keeps an assistant's message without text, without
			// content; a user's it leaves out.
			turns = append(turns, chatMessage{Role: m.Role})
		}
	}
	return turns, nil
}

// appendSystem appends the text of a system value: a string, or its text
// blocks' non-empty text, Claude Code's billing header left out.
func appendSystem(b *strings.Builder, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b.WriteString(s)
		return nil
	}
	var blocks []contentPart
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return fmt.Errorf("a string or a list of text blocks")
	}
	for _, bl := range blocks {
		if bl.Type == "text" && bl.Text != "" && !strings.HasPrefix(bl.Text, "x-anthropic-billing-header") {
			b.WriteString(bl.Text)
		}
	}
	return nil
}

// relayMessages rewrites a chat stream as vLLM's Messages stream.
func relayMessages(w *bufio.Writer, events *bufio.Reader, model string) {
	event := func(name string, v any) bool {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		return w.Flush() == nil
	}
	started, open, finish := false, false, ""
	for {
		line, err := events.ReadBytes('\n')
		if err != nil {
			return // cut short, as a stream that broke
		}
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			event("message_stop", map[string]string{"type": "message_stop"})
			return
		}
		var c struct {
			ID string `json:"id"`
			chatAnswer
		}
		if json.Unmarshal(data, &c) != nil {
			continue
		}
		switch {
		case !started:
			// vLLM's first chunk (the role's) starts the message; its
			// text, none, is not relayed.
			started = true
			input := 0
			if c.Usage != nil {
				input = c.Usage.PromptTokens
			}
			if !event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
				"id": c.ID, "type": "message", "role": "assistant", "model": model, "content": []any{},
				"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": input, "output_tokens": 0}}}) {
				return
			}
		case len(c.Choices) == 0 && c.Usage != nil:
			if open && !event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}) {
				return
			}
			open = false
			if !event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]string{"stop_reason": stopReasons[cmp.Or(finish, "stop")]},
				"usage": map[string]int{"input_tokens": c.Usage.PromptTokens, "output_tokens": c.Usage.CompletionTokens}}) {
				return
			}
		case len(c.Choices) > 0:
			finish = cmp.Or(c.finish(), finish)
			text := c.text()
			if text == "" {
				continue
			}
			if !open {
				open = true
				if !event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}}) {
					return
				}
			}
			if !event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": text}}) {
				return
			}
		}
	}
}

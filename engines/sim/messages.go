package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	chatpkg "pdlb/engines/chat"
)

// Anthropic's Messages API as vLLM serves it (POST /v1/messages): the
// request runs as the chat vLLM makes of it (chat.AppendMessages: text,
// thinking, tool_use and tool_result blocks, tools and effort converted),
// through the pod's own generation, and its answer is rewritten in the
// Messages shape: whole, or as vLLM's named events (message_start, a text
// block's start, deltas and stop, message_delta with the stop reason and
// usage, message_stop). The sim answers in text alone, never with
// thinking or tool_use blocks.

// messagesRequest is what the sim reads of a Messages API request besides
// the chat it makes.
type messagesRequest struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	CacheSalt json.RawMessage `json:"cache_salt"` // newer vLLM passes it to the chat
	// KVTransferParams, vLLM's prefill/decode exchange, goes to the chat
	// and comes back in the answer, as vLLM passes it.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Thinking         *struct {
		Type         string `json:"type"`
		BudgetTokens *int   `json:"budget_tokens"`
	} `json:"thinking"`
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
	// vLLM's AnthropicMessagesRequest: max_tokens is a required int
	// (null is not one) that its validator wants positive.
	switch v, ok, _ := engines.Field(ctx.PostBody(), "max_tokens"); {
	case !ok:
		refuseMessage(ctx, "max_tokens: Field required")
		return
	case v[0] == 'n':
		refuseMessage(ctx, "max_tokens: Input should be a valid integer")
		return
	case *req.MaxTokens < 1:
		refuseMessage(ctx, "max_tokens: Value error, max_tokens must be positive")
		return
	}
	if th := req.Thinking; th != nil && th.Type == "enabled" {
		// Newer vLLM's request model: a budget of at least 1,024 tokens,
		// under max_tokens.
		switch {
		case th.BudgetTokens == nil:
			refuseMessage(ctx, "thinking.enabled.budget_tokens: Field required")
			return
		case *th.BudgetTokens < 1024:
			refuseMessage(ctx, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
			return
		case *th.BudgetTokens >= *req.MaxTokens:
			refuseMessage(ctx, "thinking.budget_tokens must be less than max_tokens")
			return
		}
	}
	converted, _, err := chatpkg.AppendMessages(nil, ctx.PostBody(), chatpkg.InlinePreserve)
	var fields map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(converted, &fields)
	}
	if err != nil {
		refuseMessage(ctx, err.Error())
		return
	}
	chat := map[string]any{"model": req.Model, "stream": req.Stream, "max_tokens": *req.MaxTokens}
	for k, v := range fields {
		chat[k] = v
	}
	if req.CacheSalt != nil {
		chat["cache_salt"] = req.CacheSalt
	}
	if req.KVTransferParams != nil {
		chat["kv_transfer_params"] = req.KVTransferParams
	}
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
			ID string          `json:"id"`
			KV json.RawMessage `json:"kv_transfer_params"`
			chatAnswer
		}
		if json.Unmarshal(inner.Response.Body(), &out) != nil || out.Usage == nil {
			return // the client left, and generate cancelled it
		}
		answer := map[string]any{
			"id": out.ID, "type": "message", "role": "assistant", "model": model,
			"content":     []any{map[string]string{"type": "text", "text": out.text()}},
			"stop_reason": stopReasons[out.finish()], "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": out.Usage.PromptTokens, "output_tokens": out.Usage.CompletionTokens},
		}
		if len(out.KV) > 0 && string(out.KV) != "null" {
			answer["kv_transfer_params"] = out.KV
		}
		b, _ := json.Marshal(answer)
		writeJSON(ctx, b)
		return
	}
	relayInner(ctx, inner, func(w *bufio.Writer, events *bufio.Reader) { relayMessages(w, events, model) })
}

// refuseMessage answers a Messages request vLLM refuses: a 400 in
// Anthropic's error shape.
func refuseMessage(ctx *fasthttp.RequestCtx, msg string) {
	ctx.SetStatusCode(fasthttp.StatusBadRequest)
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": "invalid_request_error", "message": msg}})
	writeJSON(ctx, b)
}

// countTokens serves vLLM's POST /v1/messages/count_tokens: the prompt
// tokens of the chat vLLM makes of the request, as {"input_tokens"}.
func (p *Pod) countTokens(ctx *fasthttp.RequestCtx) {
	var req messagesRequest
	if !p.parseBody(ctx, &req) || !p.checkModel(ctx, req.Model) {
		return
	}
	converted, _, err := chatpkg.AppendCountTokens(nil, ctx.PostBody(), chatpkg.InlinePreserve)
	var chat genRequest
	if err == nil {
		err = json.Unmarshal(converted, &chat)
	}
	var tokens []uint32
	if err == nil {
		tokens, _, _, err = p.chatTokens(converted, &chat)
	}
	if err != nil {
		refuseMessage(ctx, err.Error())
		return
	}
	b, _ := json.Marshal(map[string]int{"input_tokens": len(tokens)})
	writeJSON(ctx, b)
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

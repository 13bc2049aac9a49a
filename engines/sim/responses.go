package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// OpenAI's Responses API as vLLM serves it (POST /v1/responses, GET
// /v1/responses/{id}, POST /v1/responses/{id}/cancel). A request runs as
// the chat completion its input makes (instructions as the system
// message, a previous response's conversation, then the input's
// messages), through the pod's own generation, and its answer is
// rewritten in the Responses shape: whole, or as vLLM's named stream
// events, one output_text.delta per chat chunk. With ResponsesStore (vLLM's
// VLLM_ENABLE_RESPONSES_API_STORE) a response is kept in this pod's
// memory under its id (the request's request_id, else resp_ and a random
// UUID's hex), for follow-ups naming it and retrievals; without it
// nothing is kept, and both get 404.

// responsesRequest is what the sim reads of a Responses API request.
type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    *string         `json:"instructions"`
	Previous        *string         `json:"previous_response_id"`
	RequestID       *string         `json:"request_id"`
	Store           *bool           `json:"store"`
	Stream          bool            `json:"stream"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	CacheSalt       json.RawMessage `json:"cache_salt"`
}

// responseItem is an input item the sim serves: a message, its content a
// string or text parts.
type responseItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// storedResponse is a response kept for follow-ups and retrievals: the
// conversation through its output, and its answer.
type storedResponse struct {
	messages []chatMessage
	answer   []byte
}

// chatTurn is a chat answer's message, or a stream chunk's delta.
type chatTurn struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// textMessage is a chat message whose content is text.
func textMessage(role, text string) chatMessage {
	content, _ := json.Marshal(text)
	return chatMessage{Role: role, Content: content}
}

// responseStore is a pod's stored responses.
type responseStore struct {
	mu   sync.Mutex
	byID map[string]*storedResponse
}

func (s *responseStore) get(id string) *storedResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

func (s *responseStore) put(id string, r *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]*storedResponse{}
	}
	s.byID[id] = r
}

// responseNotFound answers vLLM's 404 for a response it does not hold.
func (p *Pod) responseNotFound(ctx *fasthttp.RequestCtx, id string) {
	p.writeError(ctx, fasthttp.StatusNotFound, "invalid_request_error", "response_id", fmt.Sprintf("Response with id '%s' not found.", id))
}

// serveStoredResponse serves GET /v1/responses/{id} and POST
// .../cancel; rest is the path after /v1/responses/.
func (p *Pod) serveStoredResponse(ctx *fasthttp.RequestCtx, rest string) {
	id, sub, _ := strings.Cut(rest, "/")
	get := sub == "" && (ctx.IsGet() || ctx.IsHead())
	if !get && !(sub == "cancel" && ctx.IsPost()) {
		ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
		writeJSON(ctx, []byte(`{"detail":"Method Not Allowed"}`))
		return
	}
	r := p.responses.get(id)
	switch {
	case r == nil:
		p.responseNotFound(ctx, id)
	case get:
		writeJSON(ctx, r.answer)
	default:
		// Every sim response is synchronous, as vLLM's are but those
		// with background: true.
		p.writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "response_id", "Cannot cancel a synchronous response.")
	}
}

// createResponse serves POST /v1/responses.
func (p *Pod) createResponse(ctx *fasthttp.RequestCtx) {
	var req responsesRequest
	if !p.parseBody(ctx, &req) || !p.checkModel(ctx, req.Model) {
		return
	}
	// As vLLM's construct_input_messages: empty instructions make no
	// system message, and a previous conversation's system message
	// (its instructions) does not carry over.
	var turns []chatMessage
	if req.Instructions != nil && *req.Instructions != "" {
		turns = append(turns, textMessage("system", *req.Instructions))
	}
	if req.Previous != nil {
		prev := p.responses.get(*req.Previous)
		if prev == nil || !p.cfg.ResponsesStore {
			p.responseNotFound(ctx, *req.Previous)
			return
		}
		for _, m := range prev.messages {
			if m.Role != "system" {
				turns = append(turns, m)
			}
		}
	}
	input, err := inputTurns(req.Input)
	if err != nil {
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "input", err.Error())
		return
	}
	turns = append(turns, input...)
	id := fmt.Sprintf("resp_%016x%016x", rand.Uint64(), rand.Uint64())
	if req.RequestID != nil {
		id = *req.RequestID
	}
	chat := map[string]any{"model": req.Model, "messages": turns, "stream": req.Stream}
	if req.MaxOutputTokens != nil {
		chat["max_tokens"] = *req.MaxOutputTokens
	}
	if req.Stream {
		chat["stream_options"] = map[string]bool{"include_usage": true}
	}
	if req.CacheSalt != nil {
		chat["cache_salt"] = req.CacheSalt
	}
	inner, ok := p.runInner(ctx, chat, true)
	if !ok {
		return
	}
	r := &response{id: id, model: cmp.Or(req.Model, p.cfg.Model), created: time.Now().Unix(), req: &req, turns: turns,
		store: p.cfg.ResponsesStore && (req.Store == nil || *req.Store), pod: p}
	if !req.Stream {
		var out chatAnswer
		if json.Unmarshal(inner.Response.Body(), &out) != nil || out.Usage == nil {
			return // the client left, and generate cancelled it: nothing to keep
		}
		r.text, r.finish, r.usage = out.text(), out.finish(), out.Usage
		writeJSON(ctx, r.finished())
		return
	}
	relayInner(ctx, inner, r.relay)
}

// runInner runs req (a JSON object) as the chat completion (isChat) or
// completion another API's request makes, on ctx's connection, with
// ctx's headers but a JSON Content-Type. ok is false when it failed; ctx
// then has its answer, the error as generate gave it.
func (p *Pod) runInner(ctx *fasthttp.RequestCtx, req any, isChat bool) (*fasthttp.RequestCtx, bool) {
	body, _ := json.Marshal(req)
	inner := new(fasthttp.RequestCtx)
	inner.Init2(ctx.Conn(), nil, false)
	ctx.Request.Header.CopyTo(&inner.Request.Header)
	inner.Request.Header.SetContentType("application/json")
	inner.Request.SetBody(body)
	p.generate(inner, isChat)
	if inner.Response.StatusCode() != fasthttp.StatusOK {
		ctx.SetStatusCode(inner.Response.StatusCode())
		writeJSON(ctx, inner.Response.Body())
		return nil, false
	}
	return inner, true
}

// relayInner answers ctx with a stream that relay rewrites from inner's,
// the stream runInner started.
func relayInner(ctx, inner *fasthttp.RequestCtx, relay func(w *bufio.Writer, events *bufio.Reader)) {
	stream := inner.Response.BodyStream()
	ctx.SetContentType(sseContentType)
	ctx.Response.ImmediateHeaderFlush = true // as generate's own stream
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer inner.Response.CloseBodyStream() //nolint:errcheck // the inner stream's end
		relay(w, bufio.NewReader(stream))
	})
}

// inputTurns are the chat messages of a Responses input, as vLLM makes
// them: a string is the user's message; a list holds message items, a
// user's, system's or developer's content kept as it came (a string or
// parts, read as a chat's), an assistant's its string or its first
// part's text alone.
func inputTurns(raw json.RawMessage) ([]chatMessage, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []chatMessage{textMessage("user", s)}, nil
	}
	var items []responseItem
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, fmt.Errorf("input must be a string or a list of message items")
	}
	turns := make([]chatMessage, 0, len(items))
	for i, it := range items {
		if it.Role == "" || it.Type != "" && it.Type != "message" {
			return nil, fmt.Errorf("input[%d]: the sim serves message items only, not %q", i, it.Type)
		}
		if it.Role != "assistant" {
			turns = append(turns, chatMessage{Role: it.Role, Content: it.Content})
			continue
		}
		var text string
		if json.Unmarshal(it.Content, &text) != nil {
			var parts []json.RawMessage
			if err := json.Unmarshal(it.Content, &parts); err != nil {
				return nil, fmt.Errorf("input[%d].content must be a string or a list of parts", i)
			}
			if len(parts) > 0 && json.Unmarshal(parts[0], &text) != nil {
				var part contentPart
				if err := json.Unmarshal(parts[0], &part); err != nil {
					return nil, fmt.Errorf("input[%d].content[0] must be a string or a part", i)
				}
				text = part.Text
			}
		}
		turns = append(turns, textMessage("assistant", text))
	}
	return turns, nil
}

// chatAnswer is what a Responses answer takes of the chat completion it
// ran as, whole or one stream chunk.
type chatAnswer struct {
	Choices []struct {
		Message      *chatTurn `json:"message"`
		Delta        *chatTurn `json:"delta"`
		FinishReason *string   `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

func (a *chatAnswer) text() string {
	if len(a.Choices) == 0 {
		return ""
	}
	if m := a.Choices[0].Message; m != nil {
		return m.Content
	}
	if d := a.Choices[0].Delta; d != nil {
		return d.Content
	}
	return ""
}

func (a *chatAnswer) finish() string {
	if len(a.Choices) == 0 || a.Choices[0].FinishReason == nil {
		return ""
	}
	return *a.Choices[0].FinishReason
}

// response is one Responses answer being made.
type response struct {
	id, model string
	created   int64
	req       *responsesRequest
	turns     []chatMessage
	store     bool
	pod       *Pod
	// What the chat completion gave: its text, finish reason and usage.
	text, finish string
	usage        *chatUsage
	seq          int
}

// object renders the response object in status, with its output so far.
func (r *response) object(status string) map[string]any {
	output := []any{}
	if status != "in_progress" {
		output = append(output, r.message("completed"))
	}
	o := map[string]any{
		"id": r.id, "object": "response", "created_at": r.created, "model": r.model, "status": status,
		"output": output, "instructions": r.req.Instructions, "previous_response_id": r.req.Previous,
		"max_output_tokens": r.req.MaxOutputTokens, "store": r.store, "parallel_tool_calls": true,
		"tool_choice": "auto", "tools": []any{}, "truncation": "disabled", "background": false,
		"incomplete_details": nil, "usage": nil,
	}
	if r.finish == "length" && status != "in_progress" {
		o["status"], o["incomplete_details"] = "incomplete", map[string]string{"reason": "max_output_tokens"}
	}
	if r.usage != nil && status != "in_progress" {
		o["usage"] = map[string]any{
			"input_tokens": r.usage.PromptTokens, "input_tokens_details": map[string]int{"cached_tokens": 0},
			"output_tokens": r.usage.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens": r.usage.PromptTokens + r.usage.CompletionTokens,
		}
	}
	return o
}

// message is the output message item.
func (r *response) message(status string) map[string]any {
	return map[string]any{"id": "msg_" + strings.TrimPrefix(r.id, "resp_"), "type": "message", "role": "assistant", "status": status,
		"content": []any{map[string]any{"type": "output_text", "text": r.text, "annotations": []any{}}}}
}

// finished renders the whole answer and keeps it when it is stored and
// ran to its end (not aborted, as on the pod's shutdown).
func (r *response) finished() []byte {
	answer, _ := json.Marshal(r.object("completed"))
	if r.store && r.finish != "abort" {
		r.pod.responses.put(r.id, &storedResponse{messages: append(r.turns, textMessage("assistant", r.text)), answer: answer})
	}
	return answer
}

// event writes one named stream event with the next sequence number.
func (r *response) event(w *bufio.Writer, typ string, fields map[string]any) error {
	fields["type"], fields["sequence_number"] = typ, r.seq
	r.seq++
	data, _ := json.Marshal(fields)
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data); err != nil {
		return err
	}
	return w.Flush()
}

// relay turns the chat stream in into the Responses stream on w: created,
// in_progress, the message's item and part opened, a text delta per
// chunk, then their ends and response.completed (no [DONE], as vLLM).
func (r *response) relay(w *bufio.Writer, in *bufio.Reader) {
	item := r.message("in_progress")
	item["content"] = []any{}
	part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
	where := func(m map[string]any) map[string]any {
		m["item_id"], m["output_index"], m["content_index"] = item["id"], 0, 0
		return m
	}
	if r.event(w, "response.created", map[string]any{"response": r.object("in_progress")}) != nil ||
		r.event(w, "response.in_progress", map[string]any{"response": r.object("in_progress")}) != nil ||
		r.event(w, "response.output_item.added", map[string]any{"output_index": 0, "item": item}) != nil ||
		r.event(w, "response.content_part.added", where(map[string]any{"part": part})) != nil {
		return
	}
	var text strings.Builder
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return // the chat stream broke: so does this one, unended
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			break
		}
		var chunk chatAnswer
		if json.Unmarshal(data, &chunk) != nil {
			continue
		}
		if chunk.Usage != nil {
			r.usage = chunk.Usage
		}
		if f := chunk.finish(); f != "" {
			r.finish = f
		}
		if d := chunk.text(); d != "" {
			text.WriteString(d)
			if r.event(w, "response.output_text.delta", where(map[string]any{"delta": d, "logprobs": []any{}})) != nil {
				return
			}
		}
	}
	r.text = text.String()
	part["text"] = r.text
	done := r.message("completed")
	_ = r.event(w, "response.output_text.done", where(map[string]any{"text": r.text, "logprobs": []any{}}))
	_ = r.event(w, "response.content_part.done", where(map[string]any{"part": part}))
	_ = r.event(w, "response.output_item.done", map[string]any{"output_index": 0, "item": done})
	var obj map[string]any
	_ = json.Unmarshal(r.finished(), &obj)
	_ = r.event(w, "response.completed", map[string]any{"response": obj})
}

// responsesRoute reports whether path is one of the Responses API's by
// id, and the part after /v1/responses/.
func responsesRoute(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	return rest, ok && rest != ""
}

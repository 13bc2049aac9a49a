package load

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"strconv"
)

// BodyOptions are the parts of a request body that come from the run, not
// the workload.
type BodyOptions struct {
	// Model is the body's "model".
	Model string
	// Stream asks for an SSE stream with a final usage chunk
	// (stream_options.include_usage), so the token count is exact.
	Stream bool
	// IgnoreEOS sends vLLM's and SGLang's ignore_eos, so a real engine
	// generates exactly max_tokens and runs compare; OpenAI-compatible
	// servers that do not know it ignore it.
	IgnoreEOS bool
	// API is the API the requests go to: APIChat (the default, "") sends
	// a chat as a chat completion and a prompt as a completion;
	// APIResponses sends either to OpenAI's Responses API, APIMessages to
	// Anthropic's Messages API.
	API string
}

// APIs of BodyOptions.API.
const (
	APIChat      = "chat"
	APIResponses = "responses"
	APIMessages  = "messages"
)

// responses says o sends the Responses API's requests.
func (o BodyOptions) responses() bool { return o.API == APIResponses }

// named says o's streams are of named events (the Responses and Messages
// APIs'), which end and fail by name.
func (o BodyOptions) named() bool { return o.API == APIResponses || o.API == APIMessages }

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// body is the JSON sent; field order is stable, so equal requests give
// equal bytes.
type body struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        *string        `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

// responsesBody is a Responses API request: a chat's system prompt as
// its instructions and its turns as input messages, or a prompt as its
// input string; stored nowhere, as a client keeping its own history
// sends it.
type responsesBody struct {
	Model           string `json:"model"`
	Instructions    string `json:"instructions,omitempty"`
	Input           any    `json:"input"`
	MaxOutputTokens int    `json:"max_output_tokens,omitempty"`
	IgnoreEOS       bool   `json:"ignore_eos,omitempty"`
	Store           bool   `json:"store"`
	Stream          bool   `json:"stream"`
}

// messagesBody is a Messages API request as Claude Code sends its agent
// loop: the chat's system prompt as the system field's text, after the
// billing header block whose hash changes every request; the first turn
// as the user's text and each later one as the result of a tool call the
// assistant made before it; the tools it may call; a cache_control mark
// on the system prompt and on the newest turn. A prompt is the one user
// message. max_tokens is required: messagesDefaultMaxTokens when the
// workload sets none.
type messagesBody struct {
	Model     string         `json:"model"`
	System    []messageBlock `json:"system,omitempty"`
	Tools     []messagesTool `json:"tools,omitempty"`
	Messages  []messageTurn  `json:"messages"`
	MaxTokens int            `json:"max_tokens"`
	Stream    bool           `json:"stream"`
}

type messageTurn struct {
	Role    string `json:"role"`
	Content any    `json:"content"` // a string or []messageBlock
}

// messageBlock is a content block: text, tool_use or tool_result.
type messageBlock struct {
	Type         string         `json:"type"`
	Text         string         `json:"text,omitempty"`
	ID           string         `json:"id,omitempty"`
	Name         string         `json:"name,omitempty"`
	Input        map[string]any `json:"input,omitempty"`
	ToolUseID    string         `json:"tool_use_id,omitempty"`
	Content      string         `json:"content,omitempty"`
	CacheControl *cacheControl  `json:"cache_control,omitempty"`
}

type cacheControl struct {
	Type string `json:"type"`
}

type messagesTool struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	InputSchema map[string]any `json:"input_schema"`
}

// agentTools are the tools of a Messages agent loop.
var agentTools = []messagesTool{
	{Name: "Read", Description: "Reads a file from the local filesystem. The file_path must be absolute.", InputSchema: map[string]any{
		"type": "object", "required": []string{"file_path"}, "properties": map[string]any{
			"file_path": map[string]string{"type": "string", "description": "The absolute path of the file to read"},
			"offset":    map[string]string{"type": "number", "description": "The line to start reading from"}}}},
	{Name: "Bash", Description: "Runs a bash command and returns its output.", InputSchema: map[string]any{
		"type": "object", "required": []string{"command"}, "properties": map[string]any{
			"command": map[string]string{"type": "string", "description": "The command to run"},
			"timeout": map[string]string{"type": "number", "description": "A timeout in milliseconds"}}}},
}

// messagesDefaultMaxTokens is a Messages request's max_tokens when the
// workload sets no output length (the API has no default).
const messagesDefaultMaxTokens = 4096

// Path returns the API path r goes to with o.
func (r *Request) Path(o BodyOptions) string {
	switch {
	case o.responses():
		return "/v1/responses"
	case o.API == APIMessages:
		return "/v1/messages"
	case r.Chat():
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// AppendBody appends r's JSON body to dst. A zero OutputTokens sends no
// max_tokens: the engine's default length.
func (r *Request) AppendBody(dst []byte, o BodyOptions) []byte {
	var v any
	switch {
	case o.responses():
		v = r.responsesBody(o)
	case o.API == APIMessages:
		v = r.messagesBody(o)
	default:
		v = r.body(o)
	}
	buf := bytes.NewBuffer(dst)
	enc := json.NewEncoder(buf)
	// Trace prompts carry chat templates ("<|user|>"); sent unescaped they
	// stay readable in a vegeta file and byte-identical to the trace.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("BUG: load: encoding a request body: " + err.Error())
	}
	out := buf.Bytes()
	return out[:len(out)-1] // Encode's newline
}

// body is r's chat or completion request.
func (r *Request) body(o BodyOptions) *body {
	b := &body{Model: o.Model, MaxTokens: r.OutputTokens, IgnoreEOS: o.IgnoreEOS && r.OutputTokens > 0, Stream: o.Stream}
	if o.Stream {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if !r.Chat() {
		b.Prompt = &r.Prompt
		return b
	}
	b.Messages = make([]chatMessage, 0, 1+len(r.Turns))
	if r.System != "" {
		b.Messages = append(b.Messages, chatMessage{"system", r.System})
	}
	for _, t := range r.Turns {
		b.Messages = append(b.Messages, chatMessage{"user", t})
	}
	return b
}

// responsesBody is r's Responses API request.
func (r *Request) responsesBody(o BodyOptions) *responsesBody {
	b := &responsesBody{Model: o.Model, Instructions: r.System, MaxOutputTokens: r.OutputTokens,
		IgnoreEOS: o.IgnoreEOS && r.OutputTokens > 0, Stream: o.Stream, Input: r.Prompt}
	if r.Chat() {
		turns := make([]chatMessage, 0, len(r.Turns))
		for _, t := range r.Turns {
			turns = append(turns, chatMessage{"user", t})
		}
		b.Input = turns
	}
	return b
}

// messagesBody is r's Messages API request.
func (r *Request) messagesBody(o BodyOptions) *messagesBody {
	b := &messagesBody{Model: o.Model, MaxTokens: r.OutputTokens, Stream: o.Stream}
	if b.MaxTokens == 0 {
		b.MaxTokens = messagesDefaultMaxTokens
	}
	if !r.Chat() {
		b.Messages = []messageTurn{{"user", r.Prompt}}
		return b
	}
	ephemeral := &cacheControl{"ephemeral"}
	if r.System != "" {
		b.System = []messageBlock{
			{Type: "text", Text: fmt.Sprintf("x-anthropic-billing-header: cc_version=2.1.3; cch=%05x;", crc32.ChecksumIEEE([]byte(r.Turns[len(r.Turns)-1]))&0xfffff)},
			{Type: "text", Text: r.System, CacheControl: ephemeral},
		}
	}
	b.Tools = agentTools
	b.Messages = make([]messageTurn, 0, 2*len(r.Turns))
	for i, t := range r.Turns {
		var last *cacheControl
		if i == len(r.Turns)-1 {
			last = ephemeral
		}
		if i == 0 {
			b.Messages = append(b.Messages, messageTurn{"user", []messageBlock{{Type: "text", Text: t, CacheControl: last}}})
			continue
		}
		id := "toolu_" + strconv.Itoa(i)
		b.Messages = append(b.Messages,
			messageTurn{"assistant", []messageBlock{{Type: "tool_use", ID: id, Name: "Read",
				Input: map[string]any{"file_path": "/src/notes/" + strconv.Itoa(i) + ".md"}}}},
			messageTurn{"user", []messageBlock{{Type: "tool_result", ToolUseID: id, Content: t, CacheControl: last}}})
	}
	return b
}

package load

import (
	"bytes"
	"encoding/json"
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
}

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

// Path returns the API path r goes to.
func (r *Request) Path() string {
	if r.Chat() {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// AppendBody appends r's JSON body to dst. A zero OutputTokens sends no
// max_tokens: the engine's default length.
func (r *Request) AppendBody(dst []byte, o BodyOptions) []byte {
	b := body{Model: o.Model, MaxTokens: r.OutputTokens, IgnoreEOS: o.IgnoreEOS && r.OutputTokens > 0, Stream: o.Stream}
	if o.Stream {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if r.Chat() {
		b.Messages = make([]chatMessage, 0, 1+len(r.Turns))
		if r.System != "" {
			b.Messages = append(b.Messages, chatMessage{"system", r.System})
		}
		for _, t := range r.Turns {
			b.Messages = append(b.Messages, chatMessage{"user", t})
		}
	} else {
		b.Prompt = &r.Prompt
	}
	buf := bytes.NewBuffer(dst)
	enc := json.NewEncoder(buf)
	// Trace prompts carry chat templates ("<|user|>"); sent unescaped they
	// stay readable in a vegeta file and byte-identical to the trace.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&b); err != nil {
		panic("BUG: load: encoding a request body: " + err.Error())
	}
	out := buf.Bytes()
	return out[:len(out)-1] // Encode's newline
}

package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
)

// vLLM's speech-to-text APIs (POST /v1/audio/transcriptions and
// /v1/audio/translations), as it serves a Whisper model. The form's audio
// runs as a completion of a prompt made from its bytes, through the pod's
// own generation, and the answer takes vLLM's shape: {"text", "usage":
// {"type": "duration", "seconds"}} (a translation's without usage), or a
// stream of transcription.chunk (translation.chunk) events, the usage
// chunk when stream_include_usage asks for it, and [DONE]. The sim cannot
// decode audio: a WAV file's duration is read from its header, any other
// file's is its size at 16,000 bytes a second (128 kbit/s); it transcribes
// about speechTokensPerSecond tokens of it a second.

// speechTokensPerSecond is how many tokens the sim transcribes per second
// of audio when the request sets no max_completion_tokens.
const speechTokensPerSecond = 3

// speechRequest is what the sim reads of a speech-to-text form.
type speechRequest struct {
	model, format         string
	stream, includeUsage  bool
	maxTokens             int // 0: from the audio's duration
	audio                 []byte
	duration              float64 // seconds
	chunkObject, idPrefix string
}

// speechToText serves one of the two APIs: task "transcribe" or
// "translate".
func (p *Pod) speechToText(task string) func(*fasthttp.RequestCtx) {
	return func(ctx *fasthttp.RequestCtx) {
		req, ok := p.speechForm(ctx, task)
		if !ok || !p.checkModel(ctx, req.model) {
			return
		}
		sum := fnv.New64a()
		sum.Write(req.audio)
		completion := map[string]any{"model": req.model, "prompt": fmt.Sprintf("<|startoftranscript|> audio %x", sum.Sum64()), "stream": req.stream}
		natural := req.maxTokens == 0
		if natural {
			req.maxTokens = int(math.Ceil(req.duration*speechTokensPerSecond)) + 1
		}
		completion["max_tokens"] = req.maxTokens
		if req.stream {
			completion["stream_options"] = map[string]bool{"include_usage": true}
		}
		inner, ok := p.runInner(ctx, completion, false)
		if !ok {
			return
		}
		if !req.stream {
			var out completionAnswer
			if json.Unmarshal(inner.Response.Body(), &out) != nil || len(out.Choices) == 0 {
				return // the client left, and generate cancelled it
			}
			answer := map[string]any{"text": out.Choices[0].Text}
			if task == "transcribe" {
				answer["usage"] = map[string]any{"type": "duration", "seconds": int(math.Ceil(req.duration))}
			}
			b, _ := json.Marshal(answer)
			writeJSON(ctx, b)
			return
		}
		relayInner(ctx, inner, func(w *bufio.Writer, events *bufio.Reader) { req.relay(w, events, natural) })
	}
}

// speechForm reads the form, answering as vLLM (FastAPI's validation, its
// serving's checks) when it cannot be served.
func (p *Pod) speechForm(ctx *fasthttp.RequestCtx, task string) (*speechRequest, bool) {
	form, err := ctx.MultipartForm()
	if err != nil || len(form.File["file"]) == 0 {
		ctx.SetStatusCode(fasthttp.StatusUnprocessableEntity)
		writeJSON(ctx, []byte(`{"detail":[{"type":"missing","loc":["body","file"],"msg":"Field required","input":null}]}`))
		return nil, false
	}
	last := func(name string) string {
		if v := form.Value[name]; len(v) > 0 {
			return v[len(v)-1]
		}
		return ""
	}
	req := &speechRequest{model: last("model"), format: cmp.Or(last("response_format"), "json"), chunkObject: "transcription.chunk", idPrefix: "trsc-"}
	if task == "translate" {
		req.chunkObject, req.idPrefix = "translation.chunk", "trsl-"
	}
	var bad string
	for name, dst := range map[string]*bool{"stream": &req.stream, "stream_include_usage": &req.includeUsage} {
		if v := last(name); v != "" {
			var ok bool
			if *dst, ok = engines.LaxBoolString(v); !ok {
				bad = name
			}
		}
	}
	if v := last("max_completion_tokens"); v != "" {
		if _, err := fmt.Sscan(v, &req.maxTokens); err != nil || req.maxTokens < 1 {
			bad = "max_completion_tokens"
		}
	}
	switch {
	case bad != "":
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", bad, fmt.Sprintf("%s: invalid value", bad))
		return nil, false
	case req.includeUsage && !req.stream:
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "stream_include_usage", "Stream options can only be defined when `stream=True`.")
		return nil, false
	case req.format != "json" && req.format != "text":
		// The sim's model has no segment timestamps (verbose_json).
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", "Currently only support response_format: `text`, `json` or `verbose_json`")
		return nil, false
	}
	f, err := form.File["file"][0].Open()
	if err == nil {
		var b bytes.Buffer
		_, err = b.ReadFrom(f)
		_ = f.Close()
		req.audio = b.Bytes()
	}
	if err != nil {
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "file", err.Error())
		return nil, false
	}
	req.duration = audioSeconds(req.audio)
	return req, true
}

// audioSeconds is a WAV file's duration by its header (the data chunk's
// size over the byte rate), any other file's by its size at 128 kbit/s.
func audioSeconds(b []byte) float64 {
	if len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WAVE" {
		var rate uint32
		for i := 12; i+8 <= len(b); {
			id, size := string(b[i:i+4]), binary.LittleEndian.Uint32(b[i+4:i+8])
			switch {
			case id == "fmt " && i+20 <= len(b):
				rate = binary.LittleEndian.Uint32(b[i+16 : i+20])
			case id == "data" && rate > 0:
				// A WAV written to a pipe declares 0xFFFFFFFF: its
				// samples run to the file's end.
				return float64(min(int(size), len(b)-i-8)) / float64(rate)
			}
			i += 8 + int(size) + int(size&1)
		}
	}
	return float64(len(b)) / 16000
}

// completionAnswer is what a speech answer takes of the completion it ran
// as, whole or one stream chunk.
type completionAnswer struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// relay rewrites the completion's stream as vLLM's speech stream: a chunk
// per completion chunk, its delta the text, the last with its finish
// reason ("stop" when the sim chose the length, natural), the usage
// chunk if asked for, then [DONE].
func (r *speechRequest) relay(w *bufio.Writer, events *bufio.Reader, natural bool) {
	id, created := fmt.Sprintf("%s%016x", r.idPrefix, time.Now().UnixNano()), time.Now().Unix()
	write := func(v any) bool {
		b, _ := json.Marshal(v)
		_, _ = w.WriteString("data: ")
		_, _ = w.Write(b)
		_, _ = w.WriteString("\n\n")
		return w.Flush() == nil
	}
	chunk := func(choices []any) map[string]any {
		return map[string]any{"id": id, "object": r.chunkObject, "created": created, "model": r.model, "choices": choices}
	}
	for {
		line, err := events.ReadBytes('\n')
		if err != nil {
			return // cut short: no [DONE], as a stream that broke
		}
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			_, _ = w.WriteString("data: [DONE]\n\n")
			_ = w.Flush()
			return
		}
		var c completionAnswer
		if json.Unmarshal(data, &c) != nil {
			continue
		}
		if c.Usage != nil && len(c.Choices) == 0 {
			if r.includeUsage {
				u := chunk([]any{})
				u["usage"] = map[string]int{"prompt_tokens": c.Usage.PromptTokens, "completion_tokens": c.Usage.CompletionTokens,
					"total_tokens": c.Usage.PromptTokens + c.Usage.CompletionTokens}
				if !write(u) {
					return
				}
			}
			continue
		}
		if len(c.Choices) == 0 {
			continue
		}
		choice := map[string]any{"delta": map[string]string{"content": c.Choices[0].Text}}
		if f := c.Choices[0].FinishReason; f != nil {
			reason := *f
			if natural && reason == "length" {
				reason = "stop"
			}
			choice["finish_reason"], choice["stop_reason"] = reason, nil
		}
		if !write(chunk([]any{choice})) {
			return
		}
	}
}

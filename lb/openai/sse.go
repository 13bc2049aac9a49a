package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"strconv"
)

// SSE framing for relaying a pod's streamed response (text/event-stream).
//
// An event ends at a blank line. The SSE spec lets a line end in "\n",
// "\r\n" or a lone "\r"; engines (vLLM, SGLang, TensorRT-LLM) and OpenAI end
// lines in "\n", some proxies in "\r\n", and no one in a lone "\r", so a
// blank line here is "\n" or "\r\n" after a line end: the delimiter is
// "\n\n", "\n\r\n", "\r\n\r\n" or "\r\n\n". Events keep their delimiter, so
// the events of a stream concatenated are the stream byte for byte.

// DefaultMaxEventBytes is the default bound on one event's size (bytes);
// chat chunks are a few hundred bytes, a final usage chunk about a
// kilobyte.
const DefaultMaxEventBytes = 1 << 20

// ErrEventTooLarge stops a Splitter whose pod sent more than MaxEventBytes
// without ending an event.
var ErrEventTooLarge = errors.New("openai: SSE event exceeds the size limit")

// Splitter cuts a stream fed in chunks of any size into whole events.
// An event that lies within one chunk is returned as a slice of that chunk,
// not copied; an event that spans chunks is gathered in one buffer the
// Splitter reuses, so splitting allocates nothing once that buffer has grown
// to the largest spanning event.
//
// Use: Feed a chunk, call Next until it returns false, then read the next
// chunk. An event is valid until the next call to Next or Feed, or until
// the caller reuses the chunk it came from, whichever is first. Not safe for
// concurrent use. The zero value is ready to use.
type Splitter struct {
	// MaxEventBytes bounds one event (bytes, default DefaultMaxEventBytes),
	// so a pod that never ends an event cannot make the gateway buffer
	// without bound.
	MaxEventBytes int

	chunk []byte // unread rest of the chunk last fed
	pend  []byte // the start of an event that spans chunks
	err   error
}

// Feed hands the splitter the next chunk of the stream, once Next has
// returned false for the previous one. The splitter refers to chunk until
// Next returns false, which copies any incomplete event at its end.
func (s *Splitter) Feed(chunk []byte) {
	if len(s.chunk) > 0 {
		panic("BUG: openai: Splitter.Feed before Next returned false")
	}
	s.chunk = chunk
}

// Next returns the next whole event. It returns false when the chunks fed so
// far hold no further whole event (the incomplete rest is kept for the next
// Feed) or when the splitter has stopped on an error (see Err).
func (s *Splitter) Next() (Event, bool) {
	if s.err != nil {
		s.chunk = nil // dropped: the stream is broken
		return nil, false
	}
	if len(s.pend) > 0 {
		n := delimEnd(s.pend, s.chunk)
		if n < 0 {
			s.hold(s.chunk)
			s.chunk = nil
			return nil, false
		}
		ev := append(s.pend, s.chunk[:n]...)
		s.pend, s.chunk = ev[:0], s.chunk[n:]
		return Event(ev), true
	}
	if len(s.chunk) == 0 {
		return nil, false
	}
	n := delimEnd(nil, s.chunk)
	if n < 0 {
		s.hold(s.chunk)
		s.chunk = nil
		return nil, false
	}
	ev := s.chunk[:n]
	s.chunk = s.chunk[n:]
	return Event(ev), true
}

// hold appends b to the pending event, or stops the splitter when that
// would take the event past MaxEventBytes.
func (s *Splitter) hold(b []byte) {
	limit := s.MaxEventBytes
	if limit <= 0 {
		limit = DefaultMaxEventBytes
	}
	if len(s.pend)+len(b) > limit {
		s.err = ErrEventTooLarge
		s.pend = s.pend[:0]
		return
	}
	s.pend = append(s.pend, b...)
}

// Err returns ErrEventTooLarge once the splitter has stopped, else nil.
func (s *Splitter) Err() error { return s.err }

// Pending returns the bytes of an event begun and not yet ended (see Cut).
func (s *Splitter) Pending() []byte { return s.pend }

// Cut says a stream that ends here ends midway through an event: Pending
// holds more than line ends (a stray blank line after the last event
// begins none).
func (s *Splitter) Cut() bool { return len(bytes.Trim(s.pend, "\r\n")) > 0 }

// Reset empties s for another stream and keeps its buffer.
func (s *Splitter) Reset() {
	*s = Splitter{MaxEventBytes: s.MaxEventBytes, pend: s.pend[:0]}
}

// EventLen returns the length of the first whole event in b, delimiter
// included, or -1 if b holds none: the stateless form of Splitter, for a
// caller that keeps a stream's unread bytes in one buffer of its own.
func EventLen(b []byte) int { return delimEnd(nil, b) }

// delimEnd returns the offset in b just past the first blank line of the
// stream ...prev + b, where prev (the pending start of the event) holds no
// blank line itself, or -1 if there is none yet. A blank line that began in
// prev can only show as prev ending in "\n" or "\n\r".
func delimEnd(prev, b []byte) int {
	if n := len(prev); n > 0 && len(b) > 0 {
		switch {
		case prev[n-1] == '\n' && b[0] == '\n':
			return 1
		case prev[n-1] == '\n' && b[0] == '\r' && len(b) > 1 && b[1] == '\n':
			return 2
		case prev[n-1] == '\r' && n > 1 && prev[n-2] == '\n' && b[0] == '\n':
			return 1
		}
	}
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1 // just past a line end
		if i < len(b) && b[i] == '\n' {
			return i + 1
		}
		if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			return i + 2
		}
	}
}

// Event is one SSE event as sent, its delimiter included.
type Event []byte

// Data returns the value of the event's first data field: what follows
// "data:" and one optional space, to the end of that line; nil if the event
// has no data field (a comment or keep-alive). OpenAI-compatible engines
// send one data line per event; the spec joins several with "\n", which
// would need a copy, so only the first is returned.
func (e Event) Data() []byte {
	for rest := []byte(e); len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		line = bytes.TrimSuffix(line, cr)
		if v, ok := bytes.CutPrefix(line, dataField); ok {
			if len(v) == 0 {
				return line[len(line):] // "data" with no colon: empty, not nil
			}
			if v[0] == ':' {
				v = v[1:]
				if len(v) > 0 && v[0] == ' ' {
					v = v[1:]
				}
				return v
			}
		}
	}
	return nil
}

var (
	cr         = []byte("\r")
	dataField  = []byte("data")
	eventField = []byte("event:")
	space      = []byte(" ")
	doneData   = []byte("[DONE]")
	errorKey   = []byte(`"error"`)
)

// Name returns the value of the event's "event" field when that is its
// first line, as engines write it ("event: response.completed"); nil
// otherwise. A Responses API event's data has its "type" last (vLLM's,
// fields in the order OpenAI's types declare them), so the name is where
// its kind shows without a scan of the data.
func (e Event) Name() []byte {
	v, ok := bytes.CutPrefix(e, eventField)
	if !ok {
		return nil
	}
	if i := bytes.IndexByte(v, '\n'); i >= 0 {
		v = v[:i]
	}
	return bytes.TrimPrefix(bytes.TrimSuffix(v, cr), space)
}

// SequenceNumber returns the "sequence_number" of a Responses API event,
// which numbers a stream's events from 0; false if it has none.
func (e Event) SequenceNumber() (int, bool) { return lastNumber(e.Data(), sequenceKey, 'q') }

var sequenceKey = []byte(`"sequence_number"`)

// Done says the event is the stream's end marker, "data: [DONE]".
func (e Event) Done() bool { return bytes.Equal(e.Data(), doneData) }

// IsError says the event's data is a JSON object whose first key is "error":
// what vLLM and SGLang send when generation fails midway (and what
// AppendErrorEvent writes).
func (e Event) IsError() bool {
	d := skipWS(e.Data())
	if len(d) == 0 || d[0] != '{' {
		return false
	}
	return bytes.HasPrefix(skipWS(d[1:]), errorKey)
}

// AppendErrorEvent appends the end of a broken stream: e in OpenAI's
// shape as one data event, `data: {"error":{...}}`, then "data: [DONE]",
// as vLLM and SGLang end a stream whose generation failed. OpenAI's
// Python and Node clients raise an API error with e's message on the
// event; clients that read to [DONE] (async-openai, a curl user) stop
// there rather than report, or wait out, a stream without its end.
func AppendErrorEvent(dst []byte, e *Error) []byte {
	dst = append(dst, "data: "...)
	dst = e.AppendJSON(dst)
	return append(dst, "\n\ndata: [DONE]\n\n"...)
}

// AppendResponsesErrorEvent appends e as the error event of a Responses
// API stream, numbered seq, in the shape OpenAI's streaming reference
// gives it and its SDKs type it (ResponseErrorEvent): named "error", its
// data {"type": "error", "code", "message", "param", "sequence_number"}.
// The code is e's, else its type (server_error, the code OpenAI gives a
// failed response's error).
func AppendResponsesErrorEvent(dst []byte, e *Error, seq int) []byte {
	dst = append(dst, `event: error`+"\n"+`data: {"type":"error","code":`...)
	dst = AppendJSONString(dst, cmp.Or(e.Code, e.Type))
	dst = append(dst, `,"message":`...)
	dst = AppendJSONString(dst, e.Message)
	dst = append(dst, `,"param":`...)
	dst = appendJSONStringOrNull(dst, e.Param)
	dst = append(dst, `,"sequence_number":`...)
	dst = strconv.AppendInt(dst, int64(seq), 10)
	return append(dst, "}\n\n"...)
}

// AppendMessagesErrorEvent appends e as the error event of an Anthropic
// Messages stream, which its SDKs raise on: named "error", its data
// AppendMessagesError's body.
func AppendMessagesErrorEvent(dst []byte, e *Error) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = AppendMessagesError(dst, e)
	return append(dst, "\n\n"...)
}

// AppendMessagesError appends e in the shape of Anthropic's errors, as
// vLLM answers on its Messages API: {"type": "error", "error": {"type",
// "message"}}, typed as Anthropic types an error of e's status.
func AppendMessagesError(dst []byte, e *Error) []byte {
	typ := "api_error"
	if e.Status >= 400 && e.Status < 500 {
		typ = "invalid_request_error"
	}
	for _, a := range anthropicErrors {
		if a.status == e.Status || e.Status == 529 && a.status == 503 {
			typ = a.typ
			break
		}
	}
	dst = append(dst, `{"type":"error","error":{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","message":`...)
	dst = AppendJSONString(dst, e.Message)
	return append(dst, "}}"...)
}

// MessagesPath reports whether path is one of Anthropic's Messages API's,
// whose clients read errors in Anthropic's shape.
func MessagesPath(path []byte) bool {
	return string(path) == "/v1/messages" || string(path) == "/v1/messages/count_tokens"
}

// TokenCounter counts a stream's completion tokens from its events, for
// the decode ledger and TPOT metrics, scanning each event's bytes in place
// (no JSON decoding, no allocation).
//
// Exact when the stream carries usage (stream_options.include_usage, which
// the gateway adds where the client did not ask for it: UsageHidden, or
// continuous usage stats): the last "completion_tokens" seen, or,
// once usage chunks without choices came, their sum: one sums the whole
// stream on vLLM and SGLang, while TensorRT-LLM sends one per prompt of a
// batch as that prompt finishes.
// Otherwise an estimate: one token per event that carries generated output
// (a non-empty "content", "reasoning_content", "reasoning" or "text" string,
// or non-empty "tool_calls"), which is exact for engines that stream one
// token per chunk, as vLLM and SGLang do by default, and low when they batch
// tokens (stream intervals, speculative decoding). Events that only open the
// assistant turn (empty content), carry a finish_reason, [DONE] or an error
// count nothing. The zero value is ready to use.
//
// It also notes the engine's own error event: vLLM and SGLang end a
// stream that fails after its 200 with {"error": {..., "code": N}} (older
// engines with a top-level "object": "error"), then [DONE]; a Responses
// API stream ends with an event named "error" or response.failed.
type TokenCounter struct {
	deltas int
	usage  int
	exact  bool
	// sinceUsage is deltas when the last usage figure came: the output
	// events after it add to it (Anthropic's message_start gives one, 0
	// or 1, before the text deltas).
	sinceUsage int
	// final sums the usage of the chunks without choices; finals says
	// there were some.
	final  int
	finals bool
	// usageOnly says the last event was such a usage chunk.
	usageOnly bool
	// errCode is the first error event's code, -1 when it had none that
	// reads as a number; 0: no error event.
	errCode int
	// done says the stream's end marker, [DONE], came.
	done bool
}

// ObserveBody counts a whole (non-streamed) completion body: its usage
// figure when it has one, as OpenAI-compatible engines always send
// ("completion_tokens"; a Responses API answer's "output_tokens"), else
// one output. Only the usage key is looked for, from the end, where
// engines put it: a body's content is never scanned key by key.
func (c *TokenCounter) ObserveBody(body []byte) {
	for _, key := range usageKeys {
		if n, ok := lastNumber(body, key, 'k'); ok {
			c.usage, c.exact = n, true
			return
		}
	}
	c.deltas++
}

// usageKeys are the output token counts of a completion's usage and of a
// Responses API answer's.
var usageKeys = [...][]byte{[]byte(`"completion_tokens"`), []byte(`"output_tokens"`)}

// lastNumber returns the number the last key in body (a key, not a
// string's text) holds; pivot is a letter of key's, found as lastKey's.
func lastNumber(body, key []byte, pivot byte) (int, bool) {
	for end := len(body); ; {
		q := lastKey(body[:end], key, pivot)
		if q < 0 {
			return 0, false
		}
		end = q
		if escaped(body, q) {
			continue // inside a string
		}
		v := skipWS(body[q+len(key):])
		if len(v) == 0 || v[0] != ':' {
			continue // a string's text, not a key
		}
		if n, ok := leadingInt(skipWS(v[1:])); ok {
			return n, true
		}
	}
}

// lastKey returns where the last key in d begins, -1 if none. It steps
// back from one pivot letter to the next (one rare in JSON and prose that
// key holds once: 'k' for each usage key) and compares there, where
// bytes.LastIndex would hash every byte on the way.
func lastKey(d, key []byte, pivot byte) int {
	k := bytes.IndexByte(key, pivot)
	for end := len(d); ; {
		i := bytes.LastIndexByte(d[:end], pivot)
		if i < 0 {
			return -1
		}
		if q := i - k; q >= 0 && q+len(key) <= len(d) && bytes.Equal(d[q:q+len(key)], key) {
			return q
		}
		end = i
	}
}

// leadingInt parses the decimal digits v starts with (at most 10).
func leadingInt(v []byte) (n int, ok bool) {
	k := 0
	for k < len(v) && k < 10 && v[k] >= '0' && v[k] <= '9' {
		n = n*10 + int(v[k]-'0')
		k++
	}
	return n, k > 0
}

// Observe counts ev, and notes what ObserveEnd notes.
func (c *TokenCounter) Observe(ev Event) {
	d := ev.Data()
	output, noChoices, usage := false, false, false
	// Every key ends in `":`, and inside a string a quote is escaped, so an
	// unescaped quote followed by ':' always ends a key. The search is for
	// the colon: JSON has a quote at both ends of every string, a colon
	// only after each key (and in some text).
	for i := 0; ; {
		j := bytes.IndexByte(d[i:], ':')
		if j < 0 {
			break
		}
		q := i + j - 1 // the key's closing quote, if the colon ends a key
		i = q + 2
		if q < 1 || d[q] != '"' || escaped(d, q) {
			continue
		}
		v := skipWS(d[i:])
		switch eventKeyAt(d, q) {
		case keyText:
			output = output || len(v) > 1 && v[0] == '"' && v[1] != '"'
		case keyToolCalls:
			if len(v) > 0 && v[0] == '[' {
				inner := skipWS(v[1:])
				output = output || len(inner) > 0 && inner[0] != ']'
			}
		case keyChoices:
			// Engines write "choices" before "usage".
			if len(v) > 0 && v[0] == '[' {
				inner := skipWS(v[1:])
				noChoices = len(inner) > 0 && inner[0] == ']'
			}
		case keyTokens:
			if n, ok := leadingInt(v); ok {
				c.usage, c.exact, usage = n, true, true
				if noChoices {
					c.final, c.finals = c.final+n, true
				}
			}
		}
	}
	if output {
		c.deltas++
	}
	c.usageOnly = usage && noChoices
	if usage {
		// The figure counts its own event's output.
		c.sinceUsage = c.deltas
	}
	c.ObserveEnd(ev)
}

// ObserveEnd notes whether ev is the engine's error event or its stream's
// end marker, and counts nothing: Observe for a stream whose output is
// not counted.
func (c *TokenCounter) ObserveEnd(ev Event) {
	d := ev.Data()
	// An error event whose data has its "type" last (the Responses API's,
	// from vLLM) shows by its name, as does response.failed, whose error
	// is in its response.
	name := ev.Name()
	if c.errCode == 0 && (errorEvent(d) || string(name) == "error" || string(name) == "response.failed") {
		c.errCode = errorCode(d)
	}
	c.done = c.done || bytes.Equal(d, doneData) || streamEnd(name) || bytes.HasPrefix(headValue(d, `"type"`), []byte(`"message_stop"`))
}

// streamEnd says name is that of the event that ends a Messages stream
// (message_stop) or a Responses API stream (response.completed, or
// .incomplete, .failed): what [DONE] is to a completion's.
func streamEnd(name []byte) bool {
	switch string(name) {
	case "message_stop", "response.completed", "response.incomplete", "response.failed":
		return true
	}
	return false
}

// eventKey is what Observe makes of a key.
type eventKey uint8

const (
	keyOther eventKey = iota
	// keyText: output when its value is a non-empty string. A chunk's
	// content, text or reasoning; a Messages stream's thinking or
	// partial_json; a Responses API stream's delta (a completion
	// chunk's delta is an object).
	keyText
	keyToolCalls
	keyChoices
	keyTokens // completion_tokens, output_tokens: usage
)

// eventKeyAt names the key of d whose closing quote is at q (q >= 1): by
// its last letter, which rules out most of a chunk's dozen keys without a
// comparison, then in place, with no search back for its opening quote.
func eventKeyAt(d []byte, q int) eventKey {
	is := func(k string) bool {
		s := q - len(k)
		return s >= 1 && d[s-1] == '"' && string(d[s:q]) == k
	}
	switch d[q-1] {
	case 't':
		if is("content") || is("text") || is("reasoning_content") {
			return keyText
		}
	case 'g':
		if is("reasoning") || is("thinking") {
			return keyText
		}
	case 'n':
		if is("partial_json") {
			return keyText
		}
	case 'a':
		if is("delta") {
			return keyText
		}
	case 's':
		switch {
		case is("choices"):
			return keyChoices
		case is("tool_calls"):
			return keyToolCalls
		case is("completion_tokens") || is("output_tokens"):
			return keyTokens
		}
	}
	return keyOther
}

// headValue returns what follows the object d's first key when that key
// is name (quoted), nil otherwise; spaces between the tokens are skipped.
// Engines write an event's kind first.
func headValue(d []byte, name string) []byte {
	d = skipWS(d)
	if len(d) == 0 || d[0] != '{' {
		return nil
	}
	d = skipWS(d[1:])
	if !bytes.HasPrefix(d, []byte(name)) {
		return nil
	}
	v := skipWS(d[len(name):])
	if len(v) == 0 || v[0] != ':' {
		return nil
	}
	return skipWS(v[1:])
}

// errorEvent says data is an engine's error event: an object whose first
// key is "error" holding an object, "object" saying "error", or "type"
// saying "error" (Anthropic's Messages API, the Responses API).
func errorEvent(d []byte) bool {
	if v := headValue(d, `"error"`); len(v) > 0 && v[0] == '{' {
		return true
	}
	return bytes.HasPrefix(headValue(d, `"object"`), []byte(`"error"`)) || bytes.HasPrefix(headValue(d, `"type"`), []byte(`"error"`))
}

// errorFields are an engine's error: under "error" (vLLM, and SGLang's
// stream), under "response" then "error" (the Responses API's
// response.failed) or at the top level (the older shape).
type errorFields struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

// decodeError decodes the error event d, any shape. Decoded whole:
// error events are rare.
func decodeError(d []byte) errorFields {
	var v struct {
		Error    *errorFields `json:"error"`
		Response struct {
			Error *errorFields `json:"error"`
		} `json:"response"`
		errorFields
	}
	_ = json.Unmarshal(d, &v)
	switch {
	case v.Error != nil:
		return *v.Error
	case v.Response.Error != nil:
		return *v.Response.Error
	}
	return v.errorFields
}

// errorCode is the status of the error event d: its code when that reads
// as a positive integer, else the status its Anthropic error type or its
// Responses API error code stands for; -1 when neither says.
func errorCode(d []byte) int {
	e := decodeError(d)
	if n, err := strconv.Atoi(string(e.Code)); err == nil && n > 0 {
		return n
	}
	var code string
	_ = json.Unmarshal(e.Code, &code)
	for _, a := range anthropicErrors {
		if a.typ == e.Type {
			return a.status
		}
	}
	switch code {
	case "rate_limit_exceeded":
		return 429
	case "invalid_prompt":
		return 400
	case "server_error":
		return 500
	}
	return -1
}

// EngineErrorEvent is the error the engine's error event ev reports (see
// TokenCounter.EngineError), with the status it stands for: the engine's
// message and type when ev gives them.
func EngineErrorEvent(ev Event, status int) *Error {
	f := decodeError(ev.Data())
	e := &Error{Status: status, Type: TypeServer, Message: "the engine ended the stream with an error event"}
	if f.Message != "" {
		e.Message += ": " + f.Message
	}
	if f.Type != "" {
		e.Type = f.Type
	}
	return e
}

// EngineError says whether the stream carried the engine's error event,
// and the HTTP status it stands for: its code when that is a 4xx or 5xx,
// else 500.
func (c *TokenCounter) EngineError() (status int, ok bool) {
	if c.errCode == 0 {
		return 0, false
	}
	if c.errCode >= 400 && c.errCode <= 599 {
		return c.errCode, true
	}
	return 500, true
}

// escaped says the byte at q is preceded by an odd run of backslashes.
func escaped(d []byte, q int) bool {
	n := 0
	for k := q - 1; k >= 0 && d[k] == '\\'; k-- {
		n++
	}
	return n%2 == 1
}

// Tokens returns the completion tokens seen so far: the usage figures if
// the stream sent some (see TokenCounter), else the count of output
// events.
func (c *TokenCounter) Tokens() int {
	switch {
	case c.finals:
		return c.final
	case c.exact:
		return c.usage + c.deltas - c.sinceUsage
	}
	return c.deltas
}

// Done says the stream's end marker came: "data: [DONE]", with which
// vLLM, SGLang and TensorRT-LLM end every completion's stream, after an
// error event too; an Anthropic Messages stream's message_stop; or a
// Responses API stream's response.completed (.incomplete, .failed).
func (c *TokenCounter) Done() bool { return c.done }

// UsageOnly says the event observed last was a usage chunk without
// choices: what stream_options.include_usage adds to a stream.
func (c *TokenCounter) UsageOnly() bool { return c.usageOnly }

// Exact says Tokens comes from the engine's usage figure.
func (c *TokenCounter) Exact() bool { return c.exact }

// Reset empties c for another stream.
func (c *TokenCounter) Reset() { *c = TokenCounter{} }

// anthropicErrors are Anthropic's error types and the statuses they stand
// for, read both ways: an engine's error event's status, and the type of
// the gateway's own error in a Messages stream. Anthropic answers
// overload 529; here it is the 503 a pod sheds load with, no fault of
// the pod's.
var anthropicErrors = [...]struct {
	typ    string
	status int
}{
	{"invalid_request_error", 400}, {"authentication_error", 401}, {"permission_error", 403},
	{"not_found_error", 404}, {"request_too_large", 413}, {"rate_limit_error", 429},
	{"api_error", 500}, {"overloaded_error", 503}, {"timeout_error", 504},
}

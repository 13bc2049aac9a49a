package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"strings"
	"testing"
)

// split feeds chunks to a fresh Splitter and returns the events (copied)
// and what is left pending.
func split(chunks []string) (events []string, pending string) {
	var s Splitter
	for _, c := range chunks {
		s.Feed([]byte(c))
		for ev, ok := s.Next(); ok; ev, ok = s.Next() {
			events = append(events, string(ev))
		}
	}
	return events, string(s.Pending())
}

func TestSplitter(t *testing.T) {
	f := func(chunks []string, want []string, wantPending string) {
		t.Helper()
		got, pending := split(chunks)
		if strings.Join(got, "|") != strings.Join(want, "|") || pending != wantPending {
			t.Fatalf("split(%q)\n got %q pending %q\nwant %q pending %q", chunks, got, pending, want, wantPending)
		}
	}
	f([]string{"data: a\n\ndata: b\n\n"}, []string{"data: a\n\n", "data: b\n\n"}, "")
	f([]string{"data: a\r\n\r\ndata: b\r\n\r\n"}, []string{"data: a\r\n\r\n", "data: b\r\n\r\n"}, "")
	f([]string{"data: a\r\n\ndata: b\n\r\n"}, []string{"data: a\r\n\n", "data: b\n\r\n"}, "")
	f([]string{"event: x\ndata: a\n\n: ping\n\n"}, []string{"event: x\ndata: a\n\n", ": ping\n\n"}, "")
	// a lone \r is not a line end here, and one line end is not a blank line
	f([]string{"data: a\r\rdata: b\n", "x"}, nil, "data: a\r\rdata: b\nx")
	// an event spanning chunks, and the delimiter cut at every point
	f([]string{"da", "ta: ", "a\n", "\ndata: b", "\n\n"}, []string{"data: a\n\n", "data: b\n\n"}, "")
	f([]string{"data: a\r", "\n", "\r", "\ndata: b\r\n\r", "\n"}, []string{"data: a\r\n\r\n", "data: b\r\n\r\n"}, "")
	f([]string{"data: a\n", "\r\n"}, []string{"data: a\n\r\n"}, "")
	f([]string{"data: a\n\r", "\n"}, []string{"data: a\n\r\n"}, "")
	f([]string{"data: a\n", "\rx\n\n"}, []string{"data: a\n\rx\n\n"}, "")
	// a cut stream leaves its incomplete event pending
	f([]string{"data: a\n\ndata: {\"cho"}, []string{"data: a\n\n"}, "data: {\"cho")
	f([]string{"", "data: a\n\n", ""}, []string{"data: a\n\n"}, "")

	// every way of cutting a stream in two gives the same events
	stream := "data: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n"
	whole, _ := split([]string{stream})
	for i := 0; i <= len(stream); i++ {
		f([]string{stream[:i], stream[i:]}, whole, "")
	}
	bytewise := make([]string, len(stream))
	for i := range stream {
		bytewise[i] = stream[i : i+1]
	}
	f(bytewise, whole, "")
}

// TestSplitterCut: a stream that ends with part of an event pending was
// cut; one that ends after a stray blank line was not.
func TestSplitterCut(t *testing.T) {
	f := func(chunks []string, want bool) {
		t.Helper()
		var s Splitter
		for _, c := range chunks {
			s.Feed([]byte(c))
			for _, ok := s.Next(); ok; _, ok = s.Next() {
			}
		}
		if s.Cut() != want {
			t.Errorf("%q: Cut %v, want %v", chunks, s.Cut(), want)
		}
	}
	f([]string{"data: a\n\ndata: [DONE]\n\n"}, false)
	f([]string{"data: a\n\n", "\n"}, false)
	f([]string{"data: a\n\n\r\n"}, false)
	f([]string{"data: a\n\ndata: {\"cho"}, true)
	f([]string{"data: a\n\n", "data: [DONE]\n"}, true)
	f([]string{"data: a\n\n", ": ping"}, true)
}

// TestSplitterNoCopy checks that an event within one chunk is a slice of it.
func TestSplitterNoCopy(t *testing.T) {
	chunk := []byte("data: a\n\ndata: b\n\n")
	var s Splitter
	s.Feed(chunk)
	ev, _ := s.Next()
	ev2, _ := s.Next()
	if &ev[0] != &chunk[0] || &ev2[0] != &chunk[9] {
		t.Fatal("events within one chunk were copied")
	}
}

// TestSplitterFeedEarly checks that feeding before Next has drained a chunk
// is caught: the unread events would otherwise be lost or misframed.
func TestSplitterFeedEarly(t *testing.T) {
	var s Splitter
	s.Feed([]byte("data: a\n\ndata: b\n\n"))
	s.Next()
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("Feed with an undrained chunk did not panic")
		}
	}()
	s.Feed([]byte("data: c\n\n"))
}

func TestSplitterLimit(t *testing.T) {
	s := Splitter{MaxEventBytes: 16}
	s.Feed([]byte("data: 0123456"))
	if _, ok := s.Next(); ok || s.Err() != nil {
		t.Fatalf("Next on 13 bytes: ok %v err %v", ok, s.Err())
	}
	s.Feed([]byte("7890"))
	if _, ok := s.Next(); ok || s.Err() != ErrEventTooLarge {
		t.Fatalf("Next past the limit: ok %v err %v, want ErrEventTooLarge", ok, s.Err())
	}
	s.Feed([]byte("\n\ndata: x\n\n"))
	for range 2 {
		if _, ok := s.Next(); ok {
			t.Fatal("a stopped splitter returned an event")
		}
		s.Feed([]byte("data: y\n\n")) // feeding a stopped splitter is allowed
	}
	s.Reset()
	s.Feed([]byte("data: x\n\n"))
	if ev, ok := s.Next(); !ok || string(ev) != "data: x\n\n" || s.MaxEventBytes != 16 {
		t.Fatalf("after Reset: %q %v limit %d", ev, ok, s.MaxEventBytes)
	}
	if EventLen([]byte("data: x\n\nrest")) != 9 || EventLen([]byte("data: x\n")) != -1 {
		t.Fatal("EventLen")
	}
}

func TestEventFields(t *testing.T) {
	f := func(ev string, wantData string, hasData, done, isErr bool) {
		t.Helper()
		e := Event(ev)
		d := e.Data()
		if string(d) != wantData || (d != nil) != hasData || e.Done() != done || e.IsError() != isErr {
			t.Fatalf("Event(%q): data %q (nil %v) done %v error %v", ev, d, d == nil, e.Done(), e.IsError())
		}
	}
	f("data: {\"a\":1}\n\n", `{"a":1}`, true, false, false)
	f("data:{\"a\":1}\r\n\r\n", `{"a":1}`, true, false, false)
	f("data:  x\n\n", " x", true, false, false)
	f("event: message\nid: 7\ndata: y\n\n", "y", true, false, false)
	f("data\n\n", "", true, false, false)
	f("dataset: z\n\n", "", false, false, false)
	f(": keep-alive\n\n", "", false, false, false)
	f("data: [DONE]\n\n", "[DONE]", true, true, false)
	f("data: [DONE]\r\n\r\n", "[DONE]", true, true, false)
	f("data: [DONE] \n\n", "[DONE] ", true, false, false)
	f("data: {\"error\": {\"message\": \"boom\"}}\n\n", `{"error": {"message": "boom"}}`, true, false, true)
	f("data: { \"error\":{}}\n\n", `{ "error":{}}`, true, false, true)
	f("data: {\"id\":\"x\",\"error\":null}\n\n", `{"id":"x","error":null}`, true, false, false)
}

func TestAppendErrorEvent(t *testing.T) {
	e := UpstreamError("pod \"p1\" reset the connection\n")
	out := AppendErrorEvent([]byte("data: x\n\n"), e)
	events, pending := split([]string{string(out)})
	if len(events) != 3 || pending != "" || !Event(events[2]).Done() {
		t.Fatalf("AppendErrorEvent gave events %q pending %q; want the error event, then [DONE]", events, pending)
	}
	ev := Event(events[1])
	if !ev.IsError() || ev.Done() {
		t.Fatalf("error event %q: IsError %v Done %v", ev, ev.IsError(), ev.Done())
	}
	var got struct {
		Error struct{ Message, Type string }
	}
	if err := json.Unmarshal(ev.Data(), &got); err != nil || got.Error.Message != e.Message || got.Error.Type != TypeServer {
		t.Fatalf("error event data %s: %+v %v", ev.Data(), got, err)
	}
}

// A vLLM chat stream with include_usage, as it appears on the wire.
var chatStream = []string{
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" \"content\":\"x\""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"completion_tokens_details":null}}` + "\n\n",
	"data: [DONE]\n\n",
}

func TestTokenCounter(t *testing.T) {
	f := func(events []string, want int, exact bool) {
		t.Helper()
		var c TokenCounter
		for _, ev := range events {
			c.Observe(Event(ev))
		}
		if c.Tokens() != want || c.Exact() != exact {
			t.Fatalf("TokenCounter over %q: %d exact %v, want %d exact %v", events, c.Tokens(), c.Exact(), want, exact)
		}
		c.Reset()
		if c.Tokens() != 0 || c.Exact() {
			t.Fatal("Reset left counts")
		}
	}
	n := len(chatStream)
	f(chatStream, 5, true)                                                        // usage wins
	f(append(append([]string{}, chatStream[:n-2]...), chatStream[n-1]), 3, false) // no usage: 3 output events
	f([]string{
		`data: {"choices":[{"index":0,"text":"Once","logprobs":null,"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"reasoning": "so"}}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[ ]}}]}` + "\n\n",
		`data: {"error": {"message": "boom", "type": "server_error", "code": 500}}` + "\n\n",
		": keep-alive\n\n",
		"data: [DONE]\n\n",
	}, 4, false)
	// vLLM's continuous usage stats: usage in every chunk, the last one counts
	f([]string{
		`data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}` + "\n\n",
		`data: {"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}` + "\n\n",
	}, 2, true)
	// TensorRT-LLM streams a batch's prompts merged, each prompt's usage
	// chunk (empty choices) as that prompt finishes: they add up
	f([]string{
		`data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":1,"text":" a","finish_reason":"length"}]}` + "\n\n",
		`data: {"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":9,"total_tokens":16,"completion_tokens":7}}` + "\n\n",
		`data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" b","finish_reason":"length"}]}` + "\n\n",
		`data: {"id":"cmpl-1","object":"text_completion","choices": [ ],"usage":{"prompt_tokens":5,"total_tokens":12,"completion_tokens":7}}` + "\n\n",
		"data: [DONE]\n\n",
	}, 14, true)
	// continuous usage, then the final chunk summing the stream: it counts
	f([]string{
		`data: {"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}` + "\n\n",
		`data: {"choices":[{"index":1,"text":"b"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}` + "\n\n",
		`data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}` + "\n\n",
	}, 2, true)
	// Anthropic's Messages stream: message_start's usage (0 output) comes
	// before the deltas, which count until message_delta's usage; text,
	// thinking and tool input are output, a signature is not.
	anthropic := []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"ab\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}\n\n",
	}
	f(anthropic, 3, true)
	// Anthropic's own API starts at output_tokens 1: the deltas add to it
	// until the next figure.
	f(append([]string{strings.Replace(anthropic[0], `"output_tokens":0`, `"output_tokens":1`, 1)}, anthropic[1:]...), 4, true)
	// A Responses stream's done events repeat the text: its usage counts.
	f([]string{
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
		"event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"Hi\"}\n\n",
		"event: response.content_part.done\ndata: {\"type\":\"response.content_part.done\",\"part\":{\"type\":\"output_text\",\"text\":\"Hi\"}}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
	}, 1, true)
	f(append(anthropic, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":9,\"output_tokens\":5}}\n\n"), 5, true)
	// an escaped quote before a key-like text is not a key
	f([]string{`data: {"choices":[{"delta":{"content":"\\\"text\":\"x"}}]}` + "\n\n"}, 1, false)
	// colons in text, and a data line that starts with one, are no keys
	f([]string{`data: {"choices":[{"delta":{"content":"1:2 \"completion_tokens\": 9 http://x"}}]}` + "\n\n", "data::\n\n"}, 1, false)
}

// The engine's own error event, after a 200 and some tokens, says the
// stream failed, with the status its code gives: vLLM's and SGLang's shape
// ({"error": {...}}), the older top-level "object": "error", a code that is
// no HTTP status; tokens, text that mentions errors and codes, and tool
// arguments that hold an "error" key are no error event.
func TestTokenCounterEngineError(t *testing.T) {
	token := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	for _, c := range []struct {
		event  string
		status int
		ok     bool
		tokens int // the event's own
	}{
		{`data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n", 500, true, 0},
		{`data: {"error": {"object": "error", "message": "bad tool call", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\n", 400, true, 0},
		{`data: {"object": "error", "message": "x", "type": "BadRequestError", "code": 400}` + "\n\n", 400, true, 0},
		{`data: {"error": {"message": "blocked", "type": "content_policy_violation", "code": "content_blocked"}}` + "\n\n", 500, true, 0},
		{`data: {"error": {"message": "x", "code": 0}}` + "\n\n", 500, true, 0},
		{`data: {"choices":[{"delta":{"content":"\"error\": {\"code\": 500}"}}]}` + "\n\n", 0, false, 1},
		{`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"error\":{}}"}}]}}]}` + "\n\n", 0, false, 1},
		{`data: {"id":"c","object":"chat.completion.chunk","choices":[]}` + "\n\n", 0, false, 0},
		// Anthropic's Messages stream's, and the Responses API's.
		{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"boom\"}}\n\n", 500, true, 0},
		{"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\"}\n\n", 500, true, 0},
		// vLLM's Responses API events have their "type" last: the name
		// says it.
		{"event: error\r\ndata: {\"code\":\"server_error\",\"message\":\"boom\",\"param\":null,\"sequence_number\":3,\"type\":\"error\"}\r\n\r\n", 500, true, 0},
		{"event:error\ndata: {\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"type\":\"error\"}\n\n", 429, true, 0},
		// Their error's type, or code, is its status: a client's fault is
		// none of the pod's.
		{"event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"invalid_request_error\", \"message\": \"bad\"}}\n\n", 400, true, 0},
		{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n", 503, true, 0},
		{"event: error\ndata: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\"}\n\n", 429, true, 0},
		// A Responses API stream the engine failed ends with
		// response.failed, its error in the response.
		{"event: response.failed\ndata: {\"response\":{\"id\":\"resp_1\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"status\":\"failed\"},\"sequence_number\":3,\"type\":\"response.failed\"}\n\n", 500, true, 0},
		{"event: response.failed\ndata: {\"response\":{\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\"},\"status\":\"failed\"},\"type\":\"response.failed\"}\n\n", 429, true, 0},
		{"event: response.failed\ndata: {\"response\":{\"error\":null,\"status\":\"failed\"},\"type\":\"response.failed\"}\n\n", 500, true, 0},
		// One that ran out of output tokens is whole.
		{"event: response.incomplete\ndata: {\"response\":{\"error\":null,\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"status\":\"incomplete\"},\"type\":\"response.incomplete\"}\n\n", 0, false, 0},
	} {
		var tc, end TokenCounter
		for _, ev := range []string{token, c.event, "data: [DONE]\n\n"} {
			tc.Observe(Event(ev))
			end.ObserveEnd(Event(ev))
		}
		if status, ok := tc.EngineError(); status != c.status || ok != c.ok {
			t.Errorf("EngineError after %q: %d %v, want %d %v", c.event, status, ok, c.status, c.ok)
		}
		if tc.Tokens() != 1+c.tokens {
			t.Errorf("%d tokens counted with %q; want %d", tc.Tokens(), c.event, 1+c.tokens)
		}
		// ObserveEnd, for streams whose output is not counted, sees the
		// same error and end, and counts nothing.
		if status, ok := end.EngineError(); status != c.status || ok != c.ok || !end.Done() || end.Tokens() != 0 {
			t.Errorf("ObserveEnd with %q: error %d %v, done %v, %d tokens; want %d %v, done, none", c.event, status, ok, end.Done(), end.Tokens(), c.status, c.ok)
		}
	}
}

// A non-streamed answer counts its usage figure, as its API key's token
// bucket is charged from it.
func TestTokenCounterBody(t *testing.T) {
	f := func(body string, want int, exact bool) {
		t.Helper()
		var c TokenCounter
		c.ObserveBody([]byte(body))
		if c.Tokens() != want || c.Exact() != exact {
			t.Fatalf("ObserveBody(%s): %d exact %v, want %d exact %v", body, c.Tokens(), c.Exact(), want, exact)
		}
	}
	f(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`, 12, true)
	f(`{"id":"c1","object":"text_completion","choices":[{"index":0,"text":"Once upon","finish_reason":"length"}]}`, 1, false) // no usage: one output
	// A Responses API answer's, as vLLM writes it.
	f(`{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"output_tokens: 3"}]}],`+
		`"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":16},"user":null}`, 7, true)
	f(`{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}],"usage":{"completion_tokens":0}}`, 0, true)
	// the key's text inside a string is not the key
	f(`{"choices":[{"message":{"content":"say \"completion_tokens\": 7"}}],"usage": {"completion_tokens" : 3}}`, 3, true)
	f(`{"choices":[{"message":{"content":"\"completion_tokens\":9"}}]}`, 1, false)
}

// TestTokenCounterResponses: a Responses API stream counts one output per
// event with a text delta, and its usage once response.completed brings
// it; a completion chunk's delta object is not such an event.
func TestTokenCounterResponses(t *testing.T) {
	var c TokenCounter
	for _, d := range []string{
		`{"type":"response.created","response":{"id":"resp_1","output":[],"usage":null},"sequence_number":0}`,
		`{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hel","sequence_number":4}`,
		`{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"lo","sequence_number":5}`,
		`{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"","sequence_number":6}`,
	} {
		c.Observe(Event("event: x\ndata: " + d + "\n\n"))
	}
	if c.Tokens() != 2 || c.Exact() {
		t.Fatalf("after the deltas: %d tokens, exact %v", c.Tokens(), c.Exact())
	}
	c.Observe(Event(`event: response.completed` + "\n" + `data: {"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":3,"output_tokens":5,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":8}},"sequence_number":9}` + "\n\n"))
	if c.Tokens() != 5 || !c.Exact() {
		t.Fatalf("after response.completed: %d tokens, exact %v", c.Tokens(), c.Exact())
	}
	var chat TokenCounter
	chat.Observe(Event("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"))
	if chat.Tokens() != 0 {
		t.Errorf("a chat chunk opening the turn counted %d", chat.Tokens())
	}
}

// TestSplitAllocs checks that splitting and counting allocate nothing per
// event once the splitter's buffer has grown.
func TestSplitAllocs(t *testing.T) {
	stream := []byte(strings.Join(chatStream, ""))
	var s Splitter
	var c TokenCounter
	run := func() {
		s.Reset()
		c.Reset()
		// 61-byte reads: most events span chunks, some lie within one
		for off := 0; off < len(stream); off += 61 {
			s.Feed(stream[off:min(off+61, len(stream))])
			for ev, ok := s.Next(); ok; ev, ok = s.Next() {
				c.Observe(ev)
			}
		}
	}
	run()
	if c.Tokens() != 5 {
		t.Fatalf("counted %d tokens, want 5", c.Tokens())
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("splitting a stream allocates %.1f times, want 0", n)
	}
}

// FuzzSSE feeds a stream cut at fuzzer-chosen points and checks that the
// events, concatenated with what is pending, are the stream; that the cuts
// do not change the events; and that each event ends at its first blank
// line.
func FuzzSSE(f *testing.F) {
	f.Add([]byte(strings.Join(chatStream, "")), []byte{3, 50, 7})
	f.Add([]byte("data: a\r\n\r\ndata: b\n\r\n: c\n\ndata"), []byte{8, 1, 1, 1})
	f.Add([]byte("data: {\"error\":{\"message\":\"x\"}}\n\n"), []byte{0})
	f.Add([]byte(`{"usage":{"completion_tokens":3},"k":"completion_tokens"k"}`), []byte{0})
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		var chunks []string
		rest := string(stream)
		for _, c := range cuts {
			n := min(int(c), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		chunks = append(chunks, rest)
		events, pending := split(chunks)
		whole, wholePending := split([]string{string(stream)})
		if got := strings.Join(events, "") + pending; got != string(stream) {
			t.Fatalf("events + pending = %q, stream %q", got, stream)
		}
		if strings.Join(events, "|") != strings.Join(whole, "|") || pending != wholePending {
			t.Fatalf("cuts changed the events: %q vs %q", events, whole)
		}
		var c TokenCounter
		for _, ev := range events {
			if EventLen([]byte(ev)) != len(ev) {
				t.Fatalf("event %q does not end at its first blank line", ev)
			}
			c.Observe(Event(ev))
			Event(ev).Done()
			Event(ev).IsError()
			Event(ev).Name()
			Event(ev).SequenceNumber()
		}
		if EventLen([]byte(pending)) != -1 || bytes.Contains([]byte(pending), []byte("\n\n")) {
			t.Fatalf("pending %q holds a whole event", pending)
		}
		if c.Tokens() < 0 {
			t.Fatalf("negative token count %d", c.Tokens())
		}
		// The stream's bytes read as a whole answer's body.
		for _, k := range []struct {
			key   []byte
			pivot byte
		}{{usageKeys[0], 'k'}, {usageKeys[1], 'k'}, {sequenceKey, 'q'}} {
			if got, want := lastKey(stream, k.key, k.pivot), bytes.LastIndex(stream, k.key); got != want {
				t.Fatalf("lastKey(%s) = %d, bytes.LastIndex %d", k.key, got, want)
			}
		}
		var body TokenCounter
		body.ObserveBody(stream)
		if body.Tokens() < 0 || !body.Exact() && body.Tokens() != 1 {
			t.Fatalf("ObserveBody: %d tokens, exact %v", body.Tokens(), body.Exact())
		}
	})
}

// A Messages stream's error, as the gateway writes it, is the named
// event Anthropic's SDKs raise on, typed by its status, and an error
// event to the gateway's own counter.
func TestAppendMessagesErrorEvent(t *testing.T) {
	for status, typ := range map[int]string{503: "overloaded_error", 429: "rate_limit_error", 400: "invalid_request_error", 502: "api_error",
		504: "timeout_error", 401: "authentication_error", 404: "not_found_error", 413: "request_too_large"} {
		ev := string(AppendMessagesErrorEvent(nil, &Error{Status: status, Message: `pod "p" failed`}))
		name, data, _ := strings.Cut(ev, "\n")
		var v struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if name != "event: error" || !strings.HasSuffix(data, "\n\n") || json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &v) != nil ||
			v.Type != "error" || v.Error.Type != typ || v.Error.Message != `pod "p" failed` {
			t.Errorf("%d: %q", status, ev)
		}
		var tc TokenCounter
		tc.Observe(Event(ev))
		if _, ok := tc.EngineError(); !ok {
			t.Errorf("%d: the counter took %q for no error", status, ev)
		}
	}
}

// A Responses stream's error, as the gateway writes it, is the event
// OpenAI's streaming reference defines, numbered as told, and an error
// event to the gateway's own counter.
func TestAppendResponsesErrorEvent(t *testing.T) {
	for _, e := range []*Error{UpstreamError("unexpected EOF"), UpstreamTimeout(2e9), RateLimited("10 per minute"), InvalidValue("input", "must not be empty")} {
		ev := string(AppendResponsesErrorEvent(nil, e, 7))
		name, data, _ := strings.Cut(ev, "\n")
		var v struct {
			Type, Code, Message string
			Param               *string
			Seq                 int `json:"sequence_number"`
		}
		if name != "event: error" || !strings.HasSuffix(data, "\n\n") || json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &v) != nil ||
			v.Type != "error" || v.Code != cmp.Or(e.Code, e.Type) || v.Message != e.Message || (v.Param == nil) != (e.Param == "") || v.Seq != 7 {
			t.Errorf("%d: %q", e.Status, ev)
		}
		if n, ok := Event(ev).SequenceNumber(); n != 7 || !ok {
			t.Errorf("%d: %q numbered %d %v", e.Status, ev, n, ok)
		}
		var tc TokenCounter
		tc.Observe(Event(ev))
		if _, ok := tc.EngineError(); !ok {
			t.Errorf("%d: the counter took %q for no error", e.Status, ev)
		}
	}
}

// A Responses API event's sequence number is its own key's, not a
// string's text, wherever the engine writes it.
func TestSequenceNumber(t *testing.T) {
	f := func(ev string, want int, ok bool) {
		t.Helper()
		if n, got := Event(ev).SequenceNumber(); n != want || got != ok {
			t.Errorf("SequenceNumber(%q) = %d %v, want %d %v", ev, n, got, want, ok)
		}
	}
	f("event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\"Hi\",\"item_id\":\"msg_1\",\"output_index\":0,\"sequence_number\":12,\"type\":\"response.output_text.delta\"}\n\n", 12, true)
	f("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\": 0,\"response\":{\"id\":\"r\"}}\n\n", 0, true)
	f("event: response.output_text.delta\ndata: {\"delta\":\"\\\"sequence_number\\\":9\",\"sequence_number\":3}\n\n", 3, true)
	f("event: response.output_text.delta\ndata: {\"sequence_number\":4,\"delta\":\"\\\"sequence_number\\\":9\"}\n\n", 4, true)
	f("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", 0, false)
}

// A Messages stream ends at its message_stop however its JSON is spaced;
// a Responses API stream at its response.completed (or .incomplete,
// .failed), whose "type" vLLM writes last.
func TestMessageStopDone(t *testing.T) {
	for _, ev := range []string{
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		"event: message_stop\ndata: { \"type\" : \"message_stop\" }\n\n",
		"event: response.completed\ndata: {\"response\":{\"id\":\"r\",\"usage\":{\"output_tokens\":1}},\"sequence_number\":4,\"type\":\"response.completed\"}\n\n",
		"event: response.incomplete\r\ndata: {\"response\":{\"id\":\"r\"},\"type\":\"response.incomplete\"}\r\n\r\n",
		"event:response.failed\ndata: {\"response\":{\"id\":\"r\"},\"type\":\"response.failed\"}\n\n",
	} {
		var tc TokenCounter
		if tc.Observe(Event(ev)); !tc.Done() {
			t.Errorf("%q did not end the stream", ev)
		}
	}
	var tc TokenCounter
	if tc.Observe(Event("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"text\":\"message_stop\"}}\n\n")); tc.Done() {
		t.Error("a message_delta ended the stream")
	}
	if tc.Observe(Event("event: response.output_text.done\ndata: {\"text\":\"response.completed\",\"type\":\"response.output_text.done\"}\n\n")); tc.Done() {
		t.Error("a response.output_text.done ended the stream")
	}
}

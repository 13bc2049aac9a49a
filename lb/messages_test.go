package lb_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/engines/sim"
	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

// TestMessagesConversation: Anthropic's Messages API through the gateway
// to vLLM sim pods: a conversation resent whole at each turn, as Claude
// Code sends it (a billing header with a hash of its own in the system
// blocks, the cache_control mark on the newest turn), stays on the pod
// its first turn went to, where its earlier turns are cached; the
// gateway counts the prompt the pod prefilled; a stream's events reach
// the client through message_stop, its first text times the TTFT and its
// usage counts the output.
func TestMessagesConversation(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 4, 1000)...), nil)
	system := strings.Repeat("You are a careful coding agent. ", 40)
	var msgs []string
	var home string
	prompted := 0.0
	for turn := range 8 {
		for i, m := range msgs {
			msgs[i] = strings.Replace(m, `,"cache_control":{"type":"ephemeral"}`, "", 1)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"step %d: read file %d","cache_control":{"type":"ephemeral"}}]}`, turn, turn))
		body := fmt.Sprintf(`{"model":"m","max_tokens":4,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=%05d;"},{"type":"text","text":%q}],"messages":[%s]}`,
			turn*7919, system, strings.Join(msgs, ","))
		resp, b := post(t, s, "/v1/messages", body)
		var a struct {
			Content []struct{ Text string }
			Usage   struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &a) != nil || len(a.Content) != 1 {
			t.Fatalf("turn %d: %d %s", turn, resp.StatusCode, b)
		}
		if pod := resp.Header.Get("x-pdlb-pod"); home == "" {
			home = pod
		} else if pod != home {
			t.Errorf("turn %d went to %s, the conversation's pod is %s", turn, pod, home)
		}
		prompted += float64(a.Usage.InputTokens)
		if n := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`); n != prompted {
			t.Errorf("turn %d: the gateway counted %v prompt tokens, the pod prefilled %v", turn, n, prompted)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":%q}]}`, a.Content[0].Text))
	}
	// A stream whose tokens come apart: the sim pod's own answer, replayed
	// by a pod that holds what follows the first text until the client
	// read it (the sim's later tokens may reach a lagging relay in one
	// read with the first, which times them all at once).
	streamBody := `{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := client.Post("http://"+testFleet(t, "m", 1, 1000)[0].Addr()+"/v1/messages", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	direct, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	const firstText = `"text_delta"`
	cut := bytes.Index(direct, []byte(firstText))
	if cut < 0 {
		t.Fatalf("the sim pod's stream has no text: %s", direct)
	}
	cut += bytes.Index(direct[cut:], []byte("\n\n")) + 2
	firstRead := make(chan struct{})
	replay := fakePod(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nConnection: close\r\n\r\n%s", direct[:cut])
		select {
		case <-firstRead:
		case <-time.After(testwait.Timeout):
		}
		_, _ = c.Write(direct[cut:])
	})
	s = testGateway(t, []config.Pod{{Name: "replay", Model: "m", Address: replay}}, nil)
	before := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`)
	resp, err = client.Post("http://"+s.Addr()+"/v1/messages", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	seen := false
	for br := bufio.NewReader(resp.Body); ; {
		line, err := br.ReadBytes('\n')
		got.Write(line)
		if !seen && bytes.Contains(line, []byte(firstText)) {
			seen = true
			close(firstRead)
		}
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	b := got.String()
	if resp.StatusCode != 200 || !strings.HasPrefix(b, "event: message_start\n") || !strings.HasSuffix(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	if n := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`) - before; n != 4 {
		t.Errorf("the stream's output counted %v tokens, want 4", n)
	}
	if n := metricValue(t, s, `pdlb_time_to_first_token_seconds_count{model="m"}`); n != 1 {
		t.Errorf("%v first tokens timed, want the stream's", n)
	}
	// Its first text_delta is its first token, not message_delta's usage
	// at the end: the tokens after it took time.
	if tpot := metricValue(t, s, `pdlb_time_per_output_token_seconds_sum{model="m"}`); tpot <= 0 {
		t.Errorf("the stream's TPOT %v: its first token was timed at its end", tpot)
	}
}

// TestMessagesStandInTokens: the gateway's prompt tokens equal the sim
// pod's prefill for the requests whose chat vLLM makes in ways a chat
// client would not write: empty messages (a user's left out, an
// assistant's kept empty), newer Claude Code's ctx and msg roles, system
// blocks that are no text, a billing header in a string system field
// (which vLLM keeps).
func TestMessagesStandInTokens(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1000)...), nil)
	for _, messages := range []string{
		`"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":""}]},{"role":"user","content":"b"}]`,
		`"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[]},{"role":"user","content":"b"}]`,
		`"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":""}]},{"role":"user","content":"b"}]`,
		`"messages":[{"role":"ctx","content":"a"},{"role":"msg","content":[{"type":"text","text":"b"}]}]`,
		`"system":[{"type":"text","text":"S"},{"type":"image","source":{}}],"messages":[{"role":"user","content":"a"}]`,
		`"system":"x-anthropic-billing-header: cch=1; S","messages":[{"role":"user","content":"a"}]`,
	} {
		before := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`)
		resp, b := post(t, s, "/v1/messages", `{"model":"m","max_tokens":1,`+messages+`}`)
		var a struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &a) != nil {
			t.Fatalf("%s: %d %s", messages, resp.StatusCode, b)
		}
		if n := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`) - before; n != float64(a.Usage.InputTokens) {
			t.Errorf("%s: the gateway counted %v prompt tokens, the pod prefilled %d", messages, n, a.Usage.InputTokens)
		}
	}
}

// TestMessagesStreamErrors: the engine's error event in a Messages stream
// (vLLM's, which no message_stop follows) reaches the client alone and
// counts as the pod's failure; a stream cut before its message_stop ends
// with the gateway's own error event, named as Anthropic's SDKs look for.
func TestMessagesStreamErrors(t *testing.T) {
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
	engineError := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"CUDA error\"}}\n\n"
	for _, c := range []struct {
		what, stream, want string
		code               string
	}{
		{"the engine's error", start + engineError, start + engineError, "500"},
		{"cut short", start, start + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"", "502"},
	} {
		pod := fakePod(t, func(conn net.Conn, _ *http.Request) {
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n%s", c.stream)
		})
		s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Upstream.Retries = 0 })
		resp, b := post(t, s, "/v1/messages", `{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 200 || !strings.HasPrefix(b, c.want) || strings.Count(b, "event: error") != 1 {
			t.Errorf("%s: %d %q", c.what, resp.StatusCode, b)
		}
		if n := metricValue(t, s, `pdlb_requests_total{model="m",code="`+c.code+`"}`); n != 1 {
			t.Errorf("%s: counted %v as %s", c.what, n, c.code)
		}
	}
}

// TestChatStreamEngineErrorEnds: a chat stream the engine ends with its
// error event and no [DONE] reaches the client as the engine sent it,
// without the gateway's own error event after it, and counts the
// engine's status.
func TestChatStreamEngineErrorEnds(t *testing.T) {
	stream := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
		"data: {\"error\":{\"message\":\"CUDA error\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n"
	pod := fakePod(t, func(conn net.Conn, _ *http.Request) {
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n%s", stream)
	})
	s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Upstream.Retries = 0 })
	resp, b := post(t, s, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || b != stream {
		t.Errorf("%d %q", resp.StatusCode, b)
	}
	if n := metricValue(t, s, `pdlb_requests_total{model="m",code="500"}`); n != 1 {
		t.Errorf("counted %v as 500", n)
	}
}

// TestMessagesGatewayErrors: the gateway's own errors on the Messages
// API's paths come in Anthropic's shape, as vLLM answers there, typed by
// status; a chat's stay OpenAI's.
func TestMessagesGatewayErrors(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1000)...), nil)
	for _, c := range []struct{ path, body, want string }{
		{"/v1/messages", `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, `{"type":"error","error":{"type":"not_found_error","message":`},
		{"/v1/messages/count_tokens", `{"model":"nope","messages":[]}`, `{"type":"error","error":{"type":"not_found_error","message":`},
		{"/v1/messages", `{"model":`, `{"type":"error","error":{"type":"invalid_request_error","message":`},
		{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, `{"error":{"message":`},
	} {
		resp, b := post(t, s, c.path, c.body)
		if resp.StatusCode/100 != 4 || !strings.HasPrefix(b, c.want) {
			t.Errorf("%s %s: %d %s, want %s...", c.path, c.body, resp.StatusCode, b, c.want)
		}
	}
}

// TestMessagesPD: on a model of vLLM prefill and decode pods only, a
// Messages request takes the prefill/decode exchange as a chat does (vLLM
// carries kv_transfer_params on its Messages API), whole and streamed:
// the decode pod pulls the KV the prefill pod made, and nothing is left
// held. It was a 400 ("goes to a combined pod") before.
func TestMessagesPD(t *testing.T) {
	pre := startSim(t, pdEngines[0], "pre", sim.RolePrefill, nil)
	dec := startSim(t, pdEngines[0], "dec", sim.RoleDecode, nil)
	s := testGateway(t, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, nil)
	prompt := strings.Repeat("a prompt long enough to fill blocks of the cache ", 8)
	for i, stream := range []string{"false", "true"} {
		// Thinking with a budget, which newer vLLM refuses at or over
		// max_tokens: the prefill leg's 1 must not carry it.
		resp, b := post(t, s, "/v1/messages", `{"model":"m","max_tokens":1025,"stream":`+stream+`,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"`+prompt+`"}]}`)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-prefill-pod") != "pre" || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
			t.Fatalf("stream %s: %d via %q→%q: %.300s", stream, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), b)
		}
		if stream == "true" && !strings.HasSuffix(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") || stream == "false" && !strings.Contains(b, `"output_tokens":1025`) {
			t.Errorf("stream %s: %s", stream, b)
		}
		if st := dec.Stats(); st.KVPulls != int64(i+1) || pre.Stats().HeldKVBlocks != 0 {
			t.Errorf("stream %s: the decode pod pulled %d times, the prefill pod holds %d blocks", stream, st.KVPulls, pre.Stats().HeldKVBlocks)
		}
	}
}

// TestHeaderListTooLargeOverH2: an HTTP/2 request whose header list is
// over max_header_bytes gets the gateway's JSON 431, as over HTTP/1.1, in
// Anthropic's shape on the Messages API's path, with the CORS fields a
// browser needs to read it, and counted; it was a plain-text body before.
func TestHeaderListTooLargeOverH2(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1000)...), func(c *config.Config) { c.Frontend = fe })
			for _, c := range []struct{ path, want string }{
				{"/v1/chat/completions", `{"error":{"message":"The request's headers exceed the limit of`},
				{"/v1/messages", `{"type":"error","error":{"type":"invalid_request_error","message":"The request's headers exceed the limit of`},
			} {
				status, header, body := h2cOversized(t, s.Addr(), c.path)
				if status != "431" || !strings.HasPrefix(body, c.want) || header["access-control-allow-origin"] != "*" {
					t.Errorf("%s: %s %v %s, want 431 %s...", c.path, status, header, body, c.want)
				}
			}
			// Counted before a model is read, under none.
			if n := metricValue(t, s, `pdlb_requests_total{model="",code="431"}`); n != 2 {
				t.Errorf("counted %v requests under no model as 431, want 2", n)
			}
		})
	}
}

// h2cOversized sends one h2c POST to path on addr with 16 KB of header
// fields and an Origin, and returns the answer's status, fields and body.
func h2cOversized(t *testing.T, addr, path string) (string, map[string]string, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "x"}, {Name: "origin", Value: "https://app.example.com"}}
	for i := range 16 {
		fields = append(fields, hpack.HeaderField{Name: fmt.Sprintf("x-big-%d", i), Value: strings.Repeat("b", 1000)})
	}
	for _, f := range fields {
		_ = enc.WriteField(f)
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: true})
	dec := hpack.NewDecoder(4096, nil)
	header := map[string]string{}
	var body []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("%s: the answer broke off: %v", path, err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamID == 1 {
				hf, _ := dec.DecodeFull(f.HeaderBlockFragment())
				for _, h := range hf {
					header[h.Name] = h.Value
				}
			}
			if f.StreamEnded() {
				return header[":status"], header, string(body)
			}
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			if f.StreamEnded() {
				return header[":status"], header, string(body)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		}
	}
}

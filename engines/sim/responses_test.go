package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"pdlb/internal/testwait"
)

// respAnswer is what the tests read of a Responses answer.
type respAnswer struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	Previous *string `json:"previous_response_id"`
}

func (a respAnswer) text() string {
	if len(a.Output) == 0 || len(a.Output[0].Content) == 0 {
		return ""
	}
	return a.Output[0].Content[0].Text
}

// TestResponses: the Responses API as vLLM serves it with its store on:
// a response runs as its chat, is kept under its id for retrieval and
// follow-ups (whose conversation it carries), streams as named events
// whose deltas make its text; without the store, follow-ups get 404.
func TestResponses(t *testing.T) {
	p := testPod(t, Config{Model: "m", Speedup: 100, DefaultMaxTokens: 8, ResponsesStore: true})
	c := testClient(t)
	base := "http://" + p.Addr()
	read := func(code int, b []byte) respAnswer {
		t.Helper()
		var a respAnswer
		if code != 200 || json.Unmarshal(b, &a) != nil {
			t.Fatalf("%d %s", code, b)
		}
		return a
	}
	first := read(post(t, c, base+"/v1/responses", map[string]any{"model": "m", "input": "hello there", "instructions": "be brief", "max_output_tokens": 5}))
	if !strings.HasPrefix(first.ID, "resp_") || first.Object != "response" || first.Status != "incomplete" || first.Usage.OutputTokens != 5 || first.text() == "" {
		t.Fatalf("first: %+v", first)
	}
	if got := read(get(t, c, base+"/v1/responses/"+first.ID)); got.ID != first.ID || got.text() != first.text() {
		t.Errorf("retrieved %+v", got)
	}
	next := read(post(t, c, base+"/v1/responses", map[string]any{"model": "m", "request_id": "resp_mine", "previous_response_id": first.ID,
		"input": []any{map[string]any{"role": "user", "content": []any{map[string]string{"type": "input_text", "text": "and more"}}}}}))
	if next.ID != "resp_mine" || next.Status != "completed" || next.Usage.InputTokens <= first.Usage.InputTokens || next.Previous == nil || *next.Previous != first.ID {
		t.Errorf("follow-up: %+v (first %+v)", next, first)
	}
	// Streamed: named events, no [DONE]; the deltas make the text.
	b, _ := json.Marshal(map[string]any{"model": "m", "input": "stream it", "stream": true, "previous_response_id": "resp_mine"})
	resp, err := c.Post(base+"/v1/responses", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	var deltas strings.Builder
	var done respAnswer
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string     `json:"type"`
			Delta    string     `json:"delta"`
			Response respAnswer `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		types = append(types, ev.Type)
		deltas.WriteString(ev.Delta)
		done = ev.Response
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added"
	if got := strings.Join(types, " "); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "response.output_text.done response.content_part.done response.output_item.done response.completed") {
		t.Fatalf("events: %s", got)
	}
	if done.Status != "completed" || done.text() == "" || done.text() != deltas.String() || done.Usage.OutputTokens != 8 {
		t.Errorf("completed: %+v, deltas %q", done, deltas.String())
	}
	if code, b := get(t, c, base+"/v1/responses/"+done.ID); code != 200 || !strings.Contains(string(b), done.text()) {
		t.Errorf("the streamed response retrieved: %d %s", code, b)
	}
	// vLLM's answers to what it does not hold, or cannot do.
	if code, b := get(t, c, base+"/v1/responses/resp_none"); code != 404 || !strings.Contains(string(b), `"message":"Response with id 'resp_none' not found."`) {
		t.Errorf("unknown: %d %s", code, b)
	}
	if code, b := post(t, c, base+"/v1/responses/"+first.ID+"/cancel", nil); code != 400 || !strings.Contains(string(b), "Cannot cancel a synchronous response.") {
		t.Errorf("cancel: %d %s", code, b)
	}
	if code, b := post(t, c, base+"/v1/responses", map[string]any{"model": "m", "input": 5}); code != 400 {
		t.Errorf("input 5: %d %s", code, b)
	}
	if code, _ := post(t, c, base+"/v1/responses", map[string]any{"model": "other", "input": "x"}); code != 404 {
		t.Errorf("another model: %d", code)
	}
	off := testPod(t, Config{Model: "m", Speedup: 100, DefaultMaxTokens: 8})
	a := read(post(t, c, "http://"+off.Addr()+"/v1/responses", map[string]any{"model": "m", "input": "x"}))
	if code, b := post(t, c, "http://"+off.Addr()+"/v1/responses", map[string]any{"model": "m", "input": "x", "previous_response_id": a.ID}); code != 404 {
		t.Errorf("a follow-up without the store: %d %s", code, b)
	}
	if req, _ := http.NewRequest(http.MethodDelete, base+"/v1/responses/"+first.ID, nil); req != nil {
		if resp, err := c.Do(req); err != nil || resp.StatusCode != 405 {
			t.Errorf("DELETE: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
	}
}

// TestResponsesClientLeft: a response whose client left before its answer
// is not kept (vLLM cancels the request), streamed or not; it kept an
// empty "completed" one when not streamed.
func TestResponsesClientLeft(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			p := testPod(t, Config{Model: "m", Speedup: 1, DefaultMaxTokens: 2000, ResponsesStore: true})
			c := testClient(t)
			conn, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf(`{"model":"m","input":"hello","request_id":"resp_gone","stream":%v}`, stream)
			fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			if stream {
				if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			testwait.For(t, "in flight", func() bool { return p.RoleStatus().InFlight == 1 })
			conn.Close()
			testwait.For(t, "gone", func() bool { return p.RoleStatus().InFlight == 0 })
			time.Sleep(50 * time.Millisecond) // the handler's last steps
			if code, b := get(t, c, "http://"+p.Addr()+"/v1/responses/resp_gone"); code != 404 {
				t.Errorf("a response whose client left was kept: %d %s", code, b)
			}
		})
	}
}

// TestResponsesPromptParts: a stand-in pod prefills a message's text
// parts as vLLM joins them ("\n" between their texts; input_text and
// output_text are text), as the gateway's stand-in counts them: the
// Responses API's input_text parts, which the OpenAI SDKs send, and a
// chat's parts give the tokens of the same text sent as a string.
func TestResponsesPromptParts(t *testing.T) {
	p := testPod(t, Config{Model: "m", Speedup: 100, DefaultMaxTokens: 1})
	c := testClient(t)
	base := "http://" + p.Addr()
	text := strings.Repeat("where is the capital of china ", 20)
	input := func(content any) int {
		t.Helper()
		code, b := post(t, c, base+"/v1/responses", map[string]any{"model": "m", "max_output_tokens": 1, "store": false,
			"input": []any{map[string]any{"type": "message", "role": "user", "content": content}}})
		var a respAnswer
		if code != 200 || json.Unmarshal(b, &a) != nil {
			t.Fatalf("%d %s", code, b)
		}
		return a.Usage.InputTokens
	}
	empty := map[string]any{"type": "input_text", "text": ""} // dropped, as vLLM drops it
	parts := []any{map[string]any{"type": "input_text", "text": text}, empty, empty, empty, empty, map[string]any{"type": "output_text", "text": "again"},
		map[string]any{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}, map[string]any{"type": "input_text", "text": nil}}
	if s, l := input(text+"\nagain"), input(parts); s != l || s < 100 {
		t.Errorf("input_text parts prefilled %d tokens, the same text as a string %d", l, s)
	}
	chat := func(content any) int {
		t.Helper()
		code, b := post(t, c, base+"/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 1,
			"messages": []any{map[string]any{"role": "user", "content": content}}})
		var a struct{ Usage usageJSON }
		if code != 200 || json.Unmarshal(b, &a) != nil {
			t.Fatalf("%d %s", code, b)
		}
		return a.Usage.PromptTokens
	}
	if s, l := chat(text+"\nagain"), chat([]any{map[string]any{"type": "text", "text": text}, "again"}); s != l {
		t.Errorf("a chat's text parts prefilled %d tokens, the same text as a string %d", l, s)
	}
}

package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package on any goroutine left running, except
// fasthttp's process-wide Date-header clock, which it starts once for all
// servers and never stops, and zmq4's PUB writer, which its socket's Close
// never stops (one per KV-event publisher of a fleet).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// testPod starts a pod on a free loopback port and closes it at cleanup.
func testPod(t *testing.T, cfg Config) *Pod {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// testClient is a real HTTP client whose idle connections are closed at
// cleanup, so goleak sees no transport goroutines.
func testClient(t *testing.T) *http.Client {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// post sends a JSON body and returns the status and response body.
func post(t *testing.T, c *http.Client, url string, body any) (int, []byte) {
	t.Helper()
	return postWith(t, c, url, body, nil)
}

// postWith is post with the header fields of hdr.
func postWith(t *testing.T, c *http.Client, url string, body any, hdr http.Header) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(req.Header, hdr)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func get(t *testing.T, c *http.Client, url string) (int, []byte) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// sseEvent is one `data:` payload and when it arrived.
type sseEvent struct {
	data []byte
	at   time.Duration // since the request was sent
}

// stream posts a streaming request and reads its events to the end.
func stream(t *testing.T, c *http.Client, ctx context.Context, url string, body any) (*http.Response, []sseEvent) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, readSSE(t, resp.Body, start)
}

func readSSE(t *testing.T, r io.Reader, start time.Time) []sseEvent {
	t.Helper()
	var events []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if blank {
				t.Fatalf("SSE: two blank lines in a row after %d events", len(events))
			}
			blank = true
		case strings.HasPrefix(line, "data: "):
			if !blank {
				t.Fatalf("SSE: event %q not preceded by a blank line", line)
			}
			blank = false
			events = append(events, sseEvent{data: []byte(line[len("data: "):]), at: time.Since(start)})
		default:
			t.Fatalf("SSE: unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil && !strings.Contains(err.Error(), "context canceled") {
		t.Fatal(err)
	}
	return events
}

// chunk is the union of vLLM's chat and completion chunk fields.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// parseChunks decodes every event but the final [DONE], which it checks.
func parseChunks(t *testing.T, events []sseEvent) []chunk {
	t.Helper()
	if len(events) == 0 || string(events[len(events)-1].data) != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %d events", len(events))
	}
	out := make([]chunk, 0, len(events)-1)
	for _, e := range events[:len(events)-1] {
		var c chunk
		dec := json.NewDecoder(bytes.NewReader(e.data))
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("chunk %s: %v", e.data, err)
		}
		out = append(out, c)
	}
	return out
}

// streamedText joins the content (chat) or text (completions) of chunks and
// returns the last finish reason seen.
func streamedText(chunks []chunk) (text, finish string) {
	var b strings.Builder
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.Delta != nil && ch.Delta.Content != nil {
				b.WriteString(*ch.Delta.Content)
			}
			if ch.Text != nil {
				b.WriteString(*ch.Text)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return b.String(), finish
}

// chatBody is a chat request with one user message.
func chatBody(content string, extra map[string]any) map[string]any {
	b := map[string]any{"messages": []map[string]any{{"role": "user", "content": content}}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

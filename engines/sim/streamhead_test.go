package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

// TestStreamHeadBeforeGeneration: a stream's head goes out at once, as
// the engines' OpenAI servers send it (Starlette's StreamingResponse
// starts the response before its body generator runs): while the request
// waits for a place in the batch on a combined pod, and for its KV on a
// decode pod. Its events follow once it runs.
func TestStreamHeadBeforeGeneration(t *testing.T) {
	headWhileWaiting := func(t *testing.T, p *Pod, body map[string]any, unblock func()) {
		t.Helper()
		c := testClient(t)
		b, _ := json.Marshal(body)
		// Bounded only so that a head that never comes fails the test.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr()+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("no head while the request waits: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("head %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		// The scheduler may take the request in after its head went: it
		// still waits, the head before it.
		testwait.For(t, "the request waiting after its head", func() bool { return p.Stats().Waiting == 1 })
		unblock()
		if rest, err := io.ReadAll(resp.Body); err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("the stream after its head: %v %q", err, rest)
		}
	}
	t.Run("combined", func(t *testing.T) {
		phys := DefaultPhysics()
		phys.MaxBatch = 1
		p := testPod(t, Config{Model: "m", Physics: phys})
		// The one place in the batch, held until the test lets it go.
		hold, release := context.WithCancel(context.Background())
		held := make(chan struct{})
		go func() {
			defer close(held)
			b, _ := json.Marshal(chatBody("hold the batch", map[string]any{"max_tokens": 30000}))
			req, _ := http.NewRequestWithContext(hold, http.MethodPost, "http://"+p.Addr()+"/v1/chat/completions", bytes.NewReader(b))
			if resp, err := testClient(t).Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		defer func() { release(); <-held }()
		testwait.For(t, "the batch's one place taken", func() bool { return p.Stats().Running == 1 })
		headWhileWaiting(t, p, chatBody("wait for a place", map[string]any{"max_tokens": 2, "stream": true}), func() { release(); <-held })
	})
	t.Run("decode", func(t *testing.T) {
		p := startTrio(t, engines.SGLang, nil)
		host, port, _ := net.SplitHostPort(p.pre.KVXferAddr())
		portN, _ := strconv.Atoi(port)
		// The decode leg alone: its room's KV never comes, until it is
		// aborted.
		body := chatBody("a room nobody fills", map[string]any{
			"bootstrap_host": host, "bootstrap_port": portN, "bootstrap_room": 4242, "rid": "req-head-1", "stream": true,
		})
		headWhileWaiting(t, p.dec, body, func() {
			if status, b := post(t, testClient(t), "http://"+p.dec.Addr()+"/abort_request", map[string]any{"rid": "req-head-1"}); status != http.StatusOK {
				t.Fatalf("abort: %d %s", status, b)
			}
		})
	})
}

// TestStreamKVFailureAfterHead: a streamed decode leg whose KV pull fails
// has sent its head already, so it fails as vLLM's stream generator does:
// an error event, then [DONE].
func TestStreamKVFailureAfterHead(t *testing.T) {
	p := startTrio(t, engines.VLLM, func(c *Config) { c.KVTimeout = 50 * time.Millisecond })
	c := testClient(t)
	kv := expiredKV(t, p, c, "nobody comes for this KV in time")
	dec := chatBody("nobody comes for this KV in time", map[string]any{"kv_transfer_params": kv, "stream": true})
	status, body := post(t, c, "http://"+p.dec.Addr()+"/v1/chat/completions", dec)
	if status != http.StatusOK || !strings.HasPrefix(string(body), `data: {"error":{"message":"KV transfer from`) ||
		!strings.Contains(string(body), "not held") || !strings.HasSuffix(string(body), "\n\ndata: [DONE]\n\n") {
		t.Fatalf("late streamed decode leg: %d %s", status, body)
	}
}

package lb_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"pdlb/internal/testwait"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

func TestAPIKeysAndTheirLimits(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good"), RequestsPerMinute: 2}}
	})
	f := func(key string, status int, inBody string) {
		t.Helper()
		resp, b := postWith(t, s, chatBody, "Authorization", key)
		if resp.StatusCode != status || !strings.Contains(b, inBody) {
			t.Fatalf("key %q: %d %s, want %d with %q", key, resp.StatusCode, b, status, inBody)
		}
		if status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
		if challenge := resp.Header.Get("WWW-Authenticate"); (status == 401) != strings.HasPrefix(challenge, "Bearer ") {
			t.Fatalf("key %q: %d with WWW-Authenticate %q", key, resp.StatusCode, challenge)
		}
	}
	f("", 401, "API key")
	f("Bearer sk-bad", 401, "API key")
	f("Bearer sk-good", 200, "chat.completion")
	f("bearer sk-good", 200, "chat.completion")
	f("Bearer sk-good", 429, "team-a")
	if strings.Contains(get(t, "http://"+s.AdminAddr()+"/metrics"), "sk-good") {
		t.Fatal("a key leaked into /metrics")
	}
	// Refused keys are counted as such, not among other statuses, before
	// the body, and so the model, is read.
	if n := metricValue(t, s, `pdlb_requests_total{model="",code="401"}`); n != 2 {
		t.Errorf("%v requests counted 401, want 2", n)
	}
}

// TestAPIKeysGuardModels: with api_keys set, /v1/models is an API request
// like any other: it needs a key, as OpenAI's does.
func TestAPIKeysGuardModels(t *testing.T) {
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
				c.Frontend = frontend
				c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good")}}
			})
			f := func(key string, status int, inBody string) {
				t.Helper()
				req, err := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/v1/models", nil)
				if err != nil {
					t.Fatal(err)
				}
				if key != "" {
					req.Header.Set("Authorization", key)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != status || !strings.Contains(string(b), inBody) {
					t.Fatalf("key %q: %d %s, want %d with %q", key, resp.StatusCode, b, status, inBody)
				}
				if challenge := resp.Header.Get("WWW-Authenticate"); (status == 401) != strings.HasPrefix(challenge, "Bearer ") {
					t.Fatalf("key %q: %d with WWW-Authenticate %q", key, resp.StatusCode, challenge)
				}
			}
			f("", 401, "API key")
			f("Bearer sk-bad", 401, "API key")
			f("Bearer sk-good", 200, `"id":"m"`)
		})
	}
}

// TestAPIKeysFromXAPIKey: a key in x-api-key, where Anthropic's SDKs (and
// Claude Code with ANTHROPIC_API_KEY) send it, is read as one in
// Authorization; neither reaches the pod, whose business the client's key
// is not.
func TestAPIKeysFromXAPIKey(t *testing.T) {
	var seen atomic.Value
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		seen.Store(r.Header.Get("X-Api-Key") + "|" + r.Header.Get("Authorization"))
		answerJSON(c, 200, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":3,"output_tokens":1}}`)
	})
	s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good")}}
	})
	const body = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	// A Basic Authorization (a proxy's, say) holds no API key: it does
	// not hide the x-api-key beside it.
	for _, c := range []struct {
		key, authorization string
		status             int
	}{{"sk-good", "", 200}, {"sk-bad", "", 401}, {"", "", 401}, {"sk-good", "Basic dXNlcjpwYXNz", 200}} {
		resp, b := send(t, client, s, "POST", "/v1/messages", body, "X-Api-Key", c.key, "Authorization", c.authorization, "Anthropic-Version", "2023-06-01")
		if resp.StatusCode != c.status {
			t.Errorf("x-api-key %q, authorization %q: %d %s, want %d", c.key, c.authorization, resp.StatusCode, b, c.status)
		}
	}
	if got, _ := seen.Load().(string); got != "|" {
		t.Errorf("the pod got x-api-key|authorization %q, want neither", got)
	}
	if resp, b := send(t, client, s, "GET", "/v1/models", "", "X-Api-Key", "sk-good"); resp.StatusCode != 200 {
		t.Errorf("/v1/models with x-api-key: %d %s", resp.StatusCode, b)
	}
}

// TestAccessLogNamesRefusedKey: the line of a request its key's limit
// refused, or that failed after its key was found, names the key, as an
// admitted request's does: a throttled tenant shows in the log.
func TestAccessLogNamesRefusedKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
		c.AccessLog = path
		c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good"), RequestsPerMinute: 1}}
	})
	for _, c := range []struct {
		id, body string
		status   int
	}{
		{"admitted", chatBody, 200},
		{"limited", chatBody, 429},
		{"unknown-model", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404},
	} {
		if resp, b := postWith(t, s, c.body, "Authorization", "Bearer sk-good", "X-Request-Id", c.id); resp.StatusCode != c.status {
			t.Fatalf("%s: %d %s, want %d", c.id, resp.StatusCode, b, c.status)
		}
	}
	for _, l := range readAccessLog(t, s, path) {
		if l.str("api_key") != "team-a" {
			t.Errorf("%s (%v): api_key %q, want team-a: %v", l.str("request_id"), l.num("status"), l.str("api_key"), l)
		}
	}
}

// TestReloadChangesAPIKeys: a reload takes api_keys as it takes pods, so
// a leaked key is revoked without a restart: a removed key is refused at
// once while its stream in flight ends whole, a kept key keeps what it
// used of its limits (raised, the new room is there at once), and an
// added key is admitted.
func TestReloadChangesAPIKeys(t *testing.T) {
	keyA := limits.APIKey{Name: "a", SHA256: limits.HashKey("sk-a"), RequestsPerMinute: 2}
	keyB := limits.APIKey{Name: "b", SHA256: limits.HashKey("sk-b"), MaxConcurrent: 1}
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1)...), func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{keyA, keyB}
	})
	f := func(key string, status int) {
		t.Helper()
		if resp, b := postWith(t, s, chatBody, "Authorization", "Bearer "+key); resp.StatusCode != status {
			t.Fatalf("%s: %d %s, want %d", key, resp.StatusCode, b, status)
		}
	}
	f("sk-a", 200)
	f("sk-a", 200)
	f("sk-a", 429)
	req, err := newPost(s, `{"model":"m","messages":[{"role":"user","content":"stream"}],"max_tokens":40,"stream":true}`)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-b")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil || resp.StatusCode != 200 {
		t.Fatalf("b's stream: %d %v", resp.StatusCode, err)
	}

	cfg := s.Gateway.Config()
	cfg.Access.APIKeys = []limits.APIKey{keyA, {Name: "c", SHA256: limits.HashKey("sk-c")}}
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	f("sk-b", 401)
	f("sk-c", 200)
	f("sk-a", 429) // its two requests of this minute are still spent
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("b's stream in flight did not end whole: %v %q", err, rest)
	}

	keyA.RequestsPerMinute = 3
	cfg.Access.APIKeys = []limits.APIKey{keyA}
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	f("sk-a", 200)
	f("sk-a", 429)
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	if strings.Contains(metrics, `key="b"`) || !strings.Contains(metrics, `pdlb_api_key_refused_total{key="a",limit="requests_per_minute"} 3`) {
		t.Fatalf("the keys' series do not follow the reload, or a kept key's counts were lost:\n%s", metrics)
	}
}

// TestAPIKeySlotsComeBack ends a key's requests every way at once (run
// it with -race): answered whole or streamed, the client gone mid-stream
// over HTTP/1.1 or resetting its HTTP/2 stream (mid-stream, or while the
// pod has yet to answer), the pod resetting; each gives its
// max_concurrent slot back exactly once, so the key ends with none in
// flight and takes its whole max_concurrent again.
func TestAPIKeySlotsComeBack(t *testing.T) {
	const maxConcurrent, rounds = 64, 3
	sims := testFleet(t, "m", 1, 1)
	reset := fakePod(t, func(c net.Conn, _ *http.Request) {
		c.(*net.TCPConn).SetLinger(0)
	})
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			reached := make(chan struct{}, rounds)
			hang := fakePod(t, func(c net.Conn, _ *http.Request) {
				reached <- struct{}{}
				_, _ = io.Copy(io.Discard, c) // until the gateway closes it
			})
			s := testGateway(t, append(podsOf("m", sims...), config.Pod{Name: "h", Model: "h", Address: hang}, config.Pod{Name: "r", Model: "r", Address: reset}), func(c *config.Config) {
				c.Frontend = fe
				c.Upstream.Retries = 0
				c.Access.APIKeys = []limits.APIKey{{Name: "k", SHA256: limits.HashKey("sk-k"), MaxConcurrent: maxConcurrent}}
			})
			h2 := h2cClient()
			do := func(c *http.Client, ctx context.Context, body string) (*http.Response, error) {
				req, err := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					return nil, err
				}
				req.Header.Set("Authorization", "Bearer sk-k")
				return c.Do(req)
			}
			stream := `{"model":"m","messages":[{"role":"user","content":"go on"}],"max_tokens":500,"stream":true}`
			// leave reads a stream's first line, then cuts it.
			leave := func(c *http.Client) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp, err := do(c, ctx, stream)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
					t.Error(err)
				}
				cancel()
				resp.Body.Close()
			}
			whole := func(c *http.Client, body string, status int) {
				resp, err := do(c, context.Background(), body)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != status {
					t.Errorf("%s: %d, want %d", body, resp.StatusCode, status)
				}
			}
			// The requests to h are reset once all of them reached it.
			hung, resetHung := context.WithCancel(context.Background())
			endings := []func(){
				func() { whole(client, chatBody, 200) },
				func() {
					whole(h2, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`, 200)
				},
				func() { leave(client) },
				func() { leave(h2) },
				func() {
					if resp, err := do(h2, hung, `{"model":"h","messages":[{"role":"user","content":"hi"}]}`); err == nil {
						resp.Body.Close()
						t.Error("a request its client reset was answered")
					}
				},
				func() { whole(client, `{"model":"r","messages":[{"role":"user","content":"hi"}]}`, 502) },
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				for range rounds {
					<-reached
				}
				resetHung()
			})
			for range rounds {
				for _, end := range endings {
					wg.Go(end)
				}
			}
			wg.Wait()
			testwait.For(t, "the key's slots back", func() bool {
				return metricValue(t, s, `pdlb_api_key_in_flight{key="k"}`) == 0 && metricValue(t, s, "pdlb_requests_in_flight") == 0
			})
			// All of max_concurrent at once: none was given back twice
			// (the key would then admit more) nor kept.
			var held []*http.Response
			for range maxConcurrent {
				resp, err := do(client, context.Background(), stream)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("a slot of max_concurrent: %v %v", resp, err)
				}
				held = append(held, resp)
			}
			resp, err := do(client, context.Background(), chatBody)
			if err != nil || resp.StatusCode != 429 {
				t.Fatalf("over max_concurrent: %v %v", resp, err)
			}
			resp.Body.Close()
			for _, r := range held {
				r.Body.Close()
			}
			h2.CloseIdleConnections()
		})
	}
}

package lb_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/limits"
	"pdlb/lb/pool"
)

// answerJSON answers a fake pod's request with status and body, and
// closes.
func answerJSON(c net.Conn, status int, body string) {
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

// allOK posts body to path on s n times at once, and fails for each
// answer but 200, saying what it was.
func allOK(t *testing.T, s *lb.Server, n int, path, body, what string) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if resp, b := post(t, s, path, body); resp.StatusCode != 200 {
				t.Errorf("%s: %d %s", what, resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
}

const embedding = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"emb","usage":{"prompt_tokens":1,"total_tokens":1}}`

// TestOtherAPIs: the engines' other model-bearing JSON APIs (embeddings,
// tokenize, scores, reranking...) reach a combined pod of the model the
// body names, on either front end and either kind of client connection:
// the body byte for byte, the pod's answer whole, with x-pdlb-pod, as a
// completion's; a GET gets 405 and an unknown model 404 from the gateway.
func TestOtherAPIs(t *testing.T) {
	type got struct {
		Path, Body, Forwarded string
	}
	// The fake pod echoes what it got, as JSON.
	echo := fakePod(t, func(c net.Conn, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		out, _ := json.Marshal(got{r.URL.Path, string(b), r.Header.Get("X-Forwarded-For")})
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nX-Pod-Own: 1\r\nContent-Length: %d\r\n\r\n%s", len(out), out)
	})
	vllm := testFleet(t, "tok", 1, 1000)
	pods := append(podsOf("tok", vllm...), config.Pod{Name: "echo", Model: "emb", Address: echo})
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, pods, func(c *config.Config) { c.Frontend = fe })
			bothClients(t, func(t *testing.T, via *http.Client) {
				for _, path := range []string{"/v1/embeddings", "/v1/rerank", "/score", "/pooling"} {
					body := `{"input":["a","b"],"model":"emb","encoding_format":"float","extra":{"x":[1,2]}}`
					resp, b := postVia(t, via, s, path, body)
					var g got
					if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &g) != nil {
						t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
					}
					if g != (got{path, body, "127.0.0.1"}) {
						t.Errorf("%s: the pod got %+v", path, g)
					}
					if resp.Header.Get("x-pdlb-pod") != "echo" || resp.Header.Get("X-Pod-Own") != "1" || resp.Header.Get("X-Request-Id") == "" {
						t.Errorf("%s: answer's header %v", path, resp.Header)
					}
				}
				// A vLLM pod's /tokenize counts the prompt.
				resp, b := postVia(t, via, s, "/tokenize", `{"model":"tok","prompt":"hello there"}`)
				var tok struct{ Count int }
				if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &tok) != nil || tok.Count == 0 {
					t.Errorf("/tokenize: %d %s", resp.StatusCode, b)
				}
			})
			resp, err := client.Get("http://" + s.Addr() + "/v1/embeddings")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
				t.Errorf("GET /v1/embeddings: %d, Allow %q; want 405, POST", resp.StatusCode, resp.Header.Get("Allow"))
			}
			for _, tc := range []struct {
				body string
				code int
				says string
			}{
				{`{"model":"nope","input":"x"}`, 404, "The model `nope` does not exist."},
				{`{"model":"emb","input":`, 400, "JSON"},
				{`{"input":"x"}`, 400, "this gateway serves emb, tok"},
			} {
				resp, b := post(t, s, "/v1/embeddings", tc.body)
				if resp.StatusCode != tc.code || !strings.Contains(b, tc.says) {
					t.Errorf("%s: %d %s, want %d saying %q", tc.body, resp.StatusCode, b, tc.code, tc.says)
				}
			}
		})
	}
}

// TestOtherAPIsSkipPD: a model served by prefill/decode pods and combined
// pods sends the other APIs to the combined ones, whatever its routing
// strategy: there is nothing to prefill. A model with prefill/decode pods
// alone answers 400 naming why, not a 503 that SDKs retry. Nor do they
// fall back to another model: its token ids or embeddings would pass for
// the asked model's.
func TestOtherAPIsSkipPD(t *testing.T) {
	e := pdEngines[0]
	pre, dec, comb := startTrio(t, e)
	s := testGateway(t, []config.Pod{pdPod(pre, pre.Addr(), "rs"), pdPod(dec, dec.Addr(), "rs"), pdPod(comb, comb.Addr(), ""),
		{Name: "a-0", Model: "a", Address: testnet.Refusing(t)}}, func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", RoutingStrategy: "pd"}, {Name: "a", LoRA: config.LoRA{Fallback: []string{"m"}}}}
	})
	for range 4 {
		resp, b := post(t, s, "/tokenize", `{"model":"m","prompt":"hello there"}`)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != comb.Config().Name {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
		}
	}
	if resp, b := post(t, s, "/tokenize", `{"model":"a","prompt":"hello there"}`); resp.StatusCode == 200 || resp.Header.Get("x-pdlb-model") != "a" {
		t.Errorf("model a, whose pod refuses, with a fallback: %d as %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-model"), b)
	}
	pdOnly := testGateway(t, []config.Pod{pdPod(pre, pre.Addr(), "rs"), pdPod(dec, dec.Addr(), "rs")}, nil)
	resp, b := post(t, pdOnly, "/tokenize", `{"model":"m","prompt":"hello there"}`)
	if resp.StatusCode != 400 || !strings.Contains(b, "served by prefill and decode pods only; /tokenize goes to a combined pod") {
		t.Errorf("a model of prefill/decode pods: %d %s", resp.StatusCode, b)
	}
}

// TestOtherAPIsByLoad: the other APIs go to the pod with the fewest
// requests in flight; under slo_cache, which weighs queued prompt tokens
// they add none of, they went to either pod at random.
func TestOtherAPIsByLoad(t *testing.T) {
	var slowGot atomic.Int32
	slow := fakePod(t, func(c net.Conn, _ *http.Request) {
		slowGot.Add(1)
		time.Sleep(time.Second)
		answerJSON(c, 200, embedding)
	})
	fast := fakePod(t, func(c net.Conn, _ *http.Request) { answerJSON(c, 200, embedding) })
	s := testGateway(t, []config.Pod{{Name: "slow", Model: "emb", Address: slow}, {Name: "fast", Model: "emb", Address: fast}}, nil)
	var wg sync.WaitGroup
	const n = 20
	for range n {
		wg.Go(func() { post(t, s, "/v1/embeddings", `{"model":"emb","input":"x"}`) })
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	if got := slowGot.Load(); got > 3 {
		t.Errorf("the pod holding a request for a second got %d of %d more", got, n)
	}
}

// TestOtherAPIsAccounting: the other APIs are charged to an API key's
// token budget by their body's size (a completion's prompt as large is
// refused, so must an embedding be) but to no pod's queue or prompt
// counts, and count no output tokens. An embedding's answer is evidence
// of the pod's health as a completion's is; an answer the API server
// gives without the engine (a /tokenize, a 404 for an API the pod does not
// serve) is none: it neither clears the failures in a row of the
// completions around it, nor ends the probe of a pod ejected, nor shows a
// pod whose checks hang busy. A pod is not failed for an answer over the
// gateway's max_response_bytes (a big batch of embeddings).
func TestOtherAPIsAccounting(t *testing.T) {
	key := "sk-other-0123456789abcdef0123456789"
	t.Run("budget", func(t *testing.T) {
		pod := fakePod(t, func(c net.Conn, _ *http.Request) { answerJSON(c, 200, embedding) })
		s := testGateway(t, []config.Pod{{Name: "e0", Model: "emb", Address: pod}}, func(c *config.Config) {
			c.Access.APIKeys = []limits.APIKey{{Name: "k", SHA256: limits.HashKey(key), TokensPerMinute: 1000}}
		})
		input := strings.Repeat("word ", 5000)
		for _, path := range []string{"/v1/completions", "/v1/embeddings"} {
			resp, b := send(t, client, s, "POST", path, `{"model":"emb","prompt":"`+input+`","input":"`+input+`","max_tokens":1}`, "Authorization", "Bearer "+key)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("%s of ~6250 tokens on a key of 1000 a minute: %d %.200s", path, resp.StatusCode, b)
			}
		}
		if resp, b := send(t, client, s, "POST", "/v1/embeddings", `{"model":"emb","input":"x"}`, "Authorization", "Bearer "+key); resp.StatusCode != 200 {
			t.Errorf("a small embedding: %d %s", resp.StatusCode, b)
		}
		if n := metricValue(t, s, `pdlb_completion_tokens_total{model="emb"}`); n != 0 {
			t.Errorf("pdlb_completion_tokens_total after an embedding: %v, want 0", n)
		}
	})
	// brokenEngine's API server answers; its engine fails.
	brokenEngine := func(c net.Conn, r *http.Request) {
		switch r.URL.Path {
		case "/tokenize":
			answerJSON(c, 200, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
		case "/v1/embeddings":
			answerJSON(c, 404, `{"detail":"Not Found"}`)
		default:
			answerJSON(c, 500, `{"error":{"message":"CUDA error","type":"InternalServerError","code":500}}`)
		}
	}
	const completion = `{"model":"m","prompt":"hi","max_tokens":2}`
	t.Run("ejection", func(t *testing.T) {
		s := testGateway(t, []config.Pod{{Name: "p0", Model: "m", Address: fakePod(t, brokenEngine)}}, func(c *config.Config) {
			c.Health.EjectAfterFailures, c.Health.EjectionTime, c.Upstream.Retries = 3, 200*time.Millisecond, 0
		})
		for range 3 {
			post(t, s, "/v1/completions", completion)
			post(t, s, "/tokenize", `{"model":"m","prompt":"hi"}`)
			post(t, s, "/v1/embeddings", `{"model":"m","input":"hi"}`)
		}
		if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="p0"}`); n != 1 {
			t.Fatalf("a pod that failed 3 completions in a row, answering /tokenize and 404 between them, was ejected %v times", n)
		}
		time.Sleep(250 * time.Millisecond) // half-open now
		if resp, b := post(t, s, "/tokenize", `{"model":"m","prompt":"hi"}`); resp.StatusCode != 200 {
			t.Fatalf("/tokenize: %d %s", resp.StatusCode, b)
		}
		// Still half-open: the next completion is its probe, whose failure
		// ejects it again.
		if n := metricValue(t, s, `pdlb_pod_circuit_state{pod="p0"}`); n != pool.CircuitHalfOpen {
			t.Fatalf("circuit state %v after a /tokenize; want half-open (%d): a /tokenize ended the probe of a pod whose engine fails", n, pool.CircuitHalfOpen)
		}
		if resp, _ := post(t, s, "/v1/completions", completion); resp.StatusCode != 500 {
			t.Fatalf("the probe: %d, want the engine's 500", resp.StatusCode)
		}
		if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="p0"}`); n != 2 {
			t.Fatalf("ejected %v times after its probe failed, want 2", n)
		}
	})
	t.Run("tokenize drops", func(t *testing.T) {
		// Every third connection drops, never two in a row.
		var n atomic.Int32
		pod := fakePod(t, func(c net.Conn, r *http.Request) {
			if n.Add(1)%3 != 0 {
				answerJSON(c, 200, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
			}
		})
		s := testGateway(t, []config.Pod{{Name: "p0", Model: "m", Address: pod}}, func(c *config.Config) {
			c.Health.EjectAfterFailures, c.Upstream.Retries = 3, 0
		})
		for range 9 {
			post(t, s, "/tokenize", `{"model":"m","prompt":"hi"}`)
		}
		if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="p0"}`); n != 0 {
			t.Errorf("3 dropped /tokenize calls, none in a row, ejected the pod (%v)", n)
		}
	})
	t.Run("tokenize beside a probe", func(t *testing.T) {
		// Three completions fail and eject the pod; then its engine
		// works, slowly.
		var failing atomic.Int32
		failing.Store(3)
		probing := make(chan struct{})
		pod := fakePod(t, func(c net.Conn, r *http.Request) {
			switch {
			case r.URL.Path == "/tokenize":
				answerJSON(c, 200, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
			case failing.Add(-1) >= 0:
				answerJSON(c, 500, `{"error":{"message":"CUDA error","type":"InternalServerError","code":500}}`)
			default:
				close(probing)
				time.Sleep(300 * time.Millisecond)
				answerJSON(c, 200, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
			}
		})
		s := testGateway(t, []config.Pod{{Name: "p0", Model: "m", Address: pod}}, func(c *config.Config) {
			c.Health.EjectAfterFailures, c.Health.EjectionTime, c.Upstream.Retries = 3, 100*time.Millisecond, 0
		})
		for range 3 {
			post(t, s, "/v1/completions", completion)
		}
		testwait.For(t, "the pod half-open", func() bool { return metricValue(t, s, `pdlb_pod_circuit_state{pod="p0"}`) == 2 })
		// Tokenizations pass a half-open pod before, and beside, the
		// completion that probes it, which closes it.
		tokenize := func() { allOK(t, s, 4, "/tokenize", `{"model":"m","prompt":"hi"}`, "a /tokenize on a half-open pod") }
		tokenize()
		done := make(chan int)
		go func() {
			resp, _ := post(t, s, "/v1/completions", completion)
			done <- resp.StatusCode
		}()
		<-probing
		tokenize()
		if code := <-done; code != 200 {
			t.Errorf("the probe: %d", code)
		}
		if v := metricValue(t, s, `pdlb_pod_circuit_state{pod="p0"}`); v != 0 {
			t.Errorf("circuit state %v after the probe succeeded, want 0", v)
		}
	})
	t.Run("hung checks", func(t *testing.T) {
		var hung atomic.Bool
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		pod := scriptedPod(t, ln, podScript{checks: func() bool { return !hung.Load() }, serve: brokenEngine})
		s := testGateway(t, []config.Pod{{Name: "p0", Model: "m", Address: pod}}, func(c *config.Config) {
			c.Health.Interval, c.Health.Timeout, c.Health.UnhealthyAfter = 50*time.Millisecond, 50*time.Millisecond, 2
		})
		hung.Store(true)
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			post(t, s, "/tokenize", `{"model":"m","prompt":"hi"}`)
		}
		if h := metricValue(t, s, `pdlb_pod_healthy{pod="p0"}`); h != 0 {
			t.Error("a pod whose checks hung for a second, answering /tokenize, is still healthy")
		}
	})
	t.Run("engine faults", func(t *testing.T) {
		bad := fakePod(t, func(c net.Conn, _ *http.Request) {
			answerJSON(c, 500, `{"error":{"message":"CUDA error","type":"InternalServerError","code":500}}`)
		})
		good := fakePod(t, func(c net.Conn, _ *http.Request) { answerJSON(c, 200, embedding) })
		s := testGateway(t, []config.Pod{{Name: "bad", Model: "emb", Address: bad}, {Name: "good", Model: "emb", Address: good}},
			func(c *config.Config) { c.Health.EjectAfterFailures = 3 })
		for range 20 {
			post(t, s, "/v1/embeddings", `{"model":"emb","input":"x"}`)
		}
		if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="bad"}`); n == 0 {
			t.Error("a pod answering 500 to every embedding was not ejected")
		}
	})
	t.Run("half-open", func(t *testing.T) {
		// Its first three connections drop; then it answers, slowly.
		var n atomic.Int32
		pod := fakePod(t, func(c net.Conn, _ *http.Request) {
			if n.Add(1) <= 3 {
				return
			}
			time.Sleep(200 * time.Millisecond)
			answerJSON(c, 200, embedding)
		})
		s := testGateway(t, []config.Pod{{Name: "e0", Model: "emb", Address: pod}}, func(c *config.Config) {
			c.Health.EjectAfterFailures, c.Health.EjectionTime, c.Upstream.Retries = 3, 100*time.Millisecond, 0
		})
		for range 3 {
			post(t, s, "/v1/embeddings", `{"model":"emb","input":"x"}`)
		}
		testwait.For(t, "the pod half-open", func() bool { return metricValue(t, s, `pdlb_pod_circuit_state{pod="e0"}`) == 2 })
		if resp, b := post(t, s, "/v1/embeddings", `{"model":"emb","input":"x"}`); resp.StatusCode != 200 {
			t.Fatalf("after the ejection: %d %s", resp.StatusCode, b)
		}
		// Closed again: it takes more than one request at a time.
		allOK(t, s, 3, "/v1/embeddings", `{"model":"emb","input":"x"}`, "concurrent embeddings on a pod that answered its probe")
	})
	t.Run("tokenize is no prefill", func(t *testing.T) {
		arrived, release := make(chan struct{}), make(chan struct{})
		pod := fakePod(t, func(c net.Conn, r *http.Request) {
			if r.URL.Path == "/tokenize" {
				close(arrived)
				<-release
				answerJSON(c, 200, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
				return
			}
			answerJSON(c, 200, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		})
		s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod, PrefillTokensPerSec: 2000}}, func(c *config.Config) {
			c.Admission.Enabled = true
			c.Admission.Interactive.TTFTSLO = 0.5
		})
		var wg sync.WaitGroup
		wg.Go(func() { post(t, s, "/tokenize", `{"model":"m","prompt":"`+strings.Repeat("x", 8000)+`"}`) })
		<-arrived
		resp, b := post(t, s, "/v1/chat/completions", chatBody)
		close(release)
		wg.Wait()
		if resp.StatusCode != 200 {
			t.Errorf("a short chat while a /tokenize of 8,000 bytes waits on an idle engine: %d %s", resp.StatusCode, b)
		}
		if n := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`); n > 100 {
			t.Errorf("pdlb_prompt_tokens_total %v counts the /tokenize's body", n)
		}
	})
	t.Run("max_response_bytes", func(t *testing.T) {
		pod := fakePod(t, func(c net.Conn, _ *http.Request) {
			answerJSON(c, 200, `{"object":"list","data":[{"embedding":[`+strings.Repeat("0.0123456789,", 1000)+`0]}]}`)
		})
		s := testGateway(t, []config.Pod{{Name: "e0", Model: "emb", Address: pod}}, func(c *config.Config) {
			c.Upstream.MaxResponseBytes = 4096
			c.Health.EjectAfterFailures = 3
		})
		for range 4 {
			if resp, b := post(t, s, "/v1/embeddings", `{"model":"emb","input":"x"}`); resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("an answer over max_response_bytes: %d %s, want 502", resp.StatusCode, b)
			}
		}
		if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="e0"}`); n != 0 {
			t.Errorf("a pod was ejected for answers over the gateway's max_response_bytes (%v)", n)
		}
	})
}

// TestOtherAPIsAdapterSlot: a /tokenize naming a LoRA adapter takes no
// GPU slot in the gateway's books (vLLM's API server tokenizes for it
// without the engine): with one slot a pod, the adapter a pod runs stays
// its own, and its completions stay there.
func TestOtherAPIsAdapterSlot(t *testing.T) {
	var block atomic.Value // the pod whose /pooling waits for release
	block.Store("")
	release := make(chan struct{})
	serve := func(name string) func(c net.Conn, r *http.Request) {
		return func(c net.Conn, r *http.Request) {
			switch r.URL.Path {
			case "/tokenize":
				answerJSON(c, 200, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
			case "/pooling":
				if block.Load() == name {
					<-release
				}
				answerJSON(c, 200, embedding)
			default:
				answerJSON(c, 200, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
			}
		}
	}
	s := testGateway(t, []config.Pod{{Name: "p0", Model: "m", Address: fakePod(t, serve("p0"))}, {Name: "p1", Model: "m", Address: fakePod(t, serve("p1"))}},
		func(c *config.Config) {
			c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{MaxLoras: 1, AdapterLoadSec: 1, Adapters: []config.Adapter{{Name: "sql"}, {Name: "fin"}}}}}
		})
	const sql = `{"model":"sql","prompt":"hi","max_tokens":2}`
	resp, b := post(t, s, "/v1/completions", sql)
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	holder := resp.Header.Get("x-pdlb-pod")
	// A request held on the other pod sends the /tokenize to the holder.
	block.Store(map[string]string{"p0": "p1", "p1": "p0"}[holder])
	var wg sync.WaitGroup
	for held := false; !held; {
		done := make(chan struct{})
		wg.Go(func() { post(t, s, "/pooling", `{"model":"m","input":"x"}`); close(done) })
		select {
		case <-done: // the holder answered it
		case <-time.After(100 * time.Millisecond):
			held = true
		}
	}
	if resp, _ := post(t, s, "/tokenize", `{"model":"fin","prompt":"hi"}`); resp.Header.Get("x-pdlb-pod") != holder {
		t.Fatalf("/tokenize went to %s, want %s", resp.Header.Get("x-pdlb-pod"), holder)
	}
	close(release)
	wg.Wait()
	for range 4 {
		if resp, _ := post(t, s, "/v1/completions", sql); resp.Header.Get("x-pdlb-pod") != holder {
			t.Fatalf("a completion of sql went to %s after a /tokenize of fin on %s, which still runs sql", resp.Header.Get("x-pdlb-pod"), holder)
		}
	}
}

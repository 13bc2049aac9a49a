package lb_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// Pods that fail a request before the first byte of their answer, as
// fakePod serves them.
var (
	// resetPod reads the request and resets the connection.
	resetPod = func(c net.Conn, _ *http.Request) { _ = c.(*net.TCPConn).SetLinger(0) }
	// hungPod reads the request and answers nothing until the gateway
	// closes the connection.
	hungPod = func(c net.Conn, _ *http.Request) { _, _ = io.Copy(io.Discard, c) }
	// prefillingPod sends a stream's head at once, as vLLM's and
	// TensorRT-LLM's OpenAI servers do before the prefill, then nothing,
	// as a prefill that hangs; a whole answer gets nothing.
	prefillingPod = func(c net.Conn, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), `"stream":true`) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n")
		}
		hungPod(c, r)
	}
	// busyPod sheds the request with SGLang's 503.
	busyPod = func(c net.Conn, _ *http.Request) {
		body := `{"error":{"message":"The request queue is full.","type":"ServiceUnavailable"}}`
		fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
)

// TestRetryBeforeFirstByte: a request whose pod resets the connection
// after reading it, never answers it (or only a stream's head: a stream's
// first byte is its first event's), or sheds it with 503 is answered by
// the other pod, on both front ends, streamed or not; the retry is
// counted by its reason.
func TestRetryBeforeFirstByte(t *testing.T) {
	type fault struct {
		name, reason string
		serve        func(net.Conn, *http.Request)
		edit         func(*config.Config)
	}
	hedged := func(c *config.Config) {
		// Past the client's patience: only the hedge answers in time.
		c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
		c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 2, Floor: 200 * time.Millisecond}
	}
	faults := []fault{
		{"reset", "reset", resetPod, nil},
		{"hung", "hung", hungPod, hedged},
		{"head then hung", "hung", prefillingPod, hedged},
		{"503", "503", busyPod, func(c *config.Config) { c.Upstream.Retry.On = append(c.Upstream.Retry.On, config.RetryOn503) }},
	}
	patient := &http.Client{Timeout: 10 * time.Second}
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, fl := range faults {
			t.Run(fe+"/"+fl.name, func(t *testing.T) {
				good := testFleet(t, "m", 1, 100)[0]
				bad := fakePod(t, fl.serve)
				path := filepath.Join(t.TempDir(), "access.log")
				s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: bad}, {Name: "good", Model: "m", Address: good.Addr()}},
					func(c *config.Config) {
						c.Frontend = fe
						c.AccessLog = path
						c.Health.Interval = time.Hour
						c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
						if fl.edit != nil {
							fl.edit(c)
						}
					})
				for i, stream := range []bool{false, false, true, true} {
					body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}],"max_tokens":8,"stream":%v}`, i, stream)
					resp, b := postVia(t, patient, s, "/v1/chat/completions", body)
					if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "good" || (stream && !streamWhole(b)) {
						t.Fatalf("request %d (stream %v): %d from %q: %s", i, stream, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
					}
				}
				if n := metricValue(t, s, fmt.Sprintf(`pdlb_upstream_retries_total{reason=%q}`, fl.reason)); n < 2 {
					t.Fatalf("%v retries for %s, want one per request round robin sent to the bad pod", n, fl.reason)
				}
				waitIdle(t, s)
				// Each retried request's line lists the attempt that failed.
				retried := 0
				for _, l := range readAccessLog(t, s, path) {
					r, _ := l["retried"].([]any)
					if len(r) != int(l.num("attempts"))-1 {
						t.Fatalf("%v attempts, retried %v", l["attempts"], l["retried"])
					}
					if len(r) == 1 {
						a, _ := r[0].(map[string]any)
						if a["pod"] != "bad" || a["reason"] != fl.reason || a["error"] == "" || a["error"] == nil {
							t.Fatalf("retried %v, want the bad pod's %s and its error", r, fl.reason)
						}
						retried++
					}
				}
				if retried < 2 {
					t.Fatalf("%d lines name a retried attempt, want one per request sent to the bad pod first", retried)
				}
			})
		}
	}
}

// TestRetryNowhereToGo: a failure a retry would follow, with no other
// pod to go to, is the request's answer, not a retry: the access log
// lists no retried attempt beside it, and pdlb_upstream_retries_total
// counts none.
func TestRetryNowhereToGo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	s := testGateway(t, []config.Pod{{Name: "only", Model: "m", Address: fakePod(t, resetPod)}}, func(c *config.Config) {
		c.AccessLog = path
		c.Health.Interval = time.Hour
	})
	if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d from the only pod, which resets: %s", resp.StatusCode, b)
	}
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="reset"}`); n != 0 {
		t.Errorf("%v retries counted, want none", n)
	}
	l := readAccessLog(t, s, path)[0]
	if r, _ := l["retried"].([]any); l.num("attempts") != 1 || l.str("pod") != "only" || len(r) != 0 {
		t.Fatalf("%v attempts, retried %v, then %v: want the one attempt, answered, not retried", l["attempts"], l["retried"], l["pod"])
	}
}

// TestFirstByteNoRetryLeft: the first-byte deadline gives up on a pod
// only where a retry can follow. The only pod of a model, answering in
// 0.8 s, well within the response timeout, is waited for on both front
// ends; it was cut at the hedge's 200 ms floor and answered 504.
func TestFirstByteNoRetryLeft(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			slow := slowPod(t, 800*time.Millisecond)
			s := testGateway(t, []config.Pod{{Name: "only", Model: "m", Address: slow}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
				c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 2, Floor: 200 * time.Millisecond}
			})
			// Twice: gnet's loop sweeps deadlines from the first exchange on.
			for i := range 2 {
				if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
					t.Fatalf("request %d: %d from the only pod, which answers in 0.8 s: %s", i, resp.StatusCode, b)
				}
			}
		})
	}
}

// TestFirstByteWholeBatch: a whole answer of n choices to each prompt of
// a batch is max_tokens decode steps of all n x prompts sequences, in
// rounds of a full batch: its first-byte deadline counts them, or the
// hedge gives up a pod working as fast as its line says. Here 4 prompts
// times 32 choices are 128 sequences, two rounds of 64 at 22.8 ms a step
// on pods at their real speed (the gateway's default line): 0.9 s, where
// one sequence's 20 steps were predicted at 0.2 s and the hedge fired at
// 2 x 0.2 s + 0.2 s.
func TestFirstByteWholeBatch(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 2, 1)...), func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
				c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 2, Floor: 200 * time.Millisecond}
			})
			// The first answer one sequence's: gnet's loop sweeps
			// deadlines from the first exchange on.
			for _, body := range []string{`{"model":"m","prompt":"one","max_tokens":20}`,
				`{"model":"m","prompt":["one","two","three","four"],"n":32,"max_tokens":20}`} {
				if resp, b := post(t, s, "/v1/completions", body); resp.StatusCode != 200 {
					t.Fatalf("%d: %s", resp.StatusCode, b)
				}
			}
			if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="hung"}`); n != 0 {
				t.Fatalf("%v attempts given up as hung", n)
			}
		})
	}
}

// TestFirstByteCompletionDefault: a whole completion that leaves
// max_tokens out, or sends it null, generates at most 16 tokens a
// sequence on vLLM (its CompletionRequest's default, which its
// normalize_null_max_tokens gives null too), so its first-byte deadline
// is predicted from them and a hung pod's attempt is given up for the
// other pod, as one with max_tokens is; the gateway once took either
// budget for unknown and waited out the minute's response timeout.
func TestFirstByteCompletionDefault(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			good := testFleet(t, "m", 1, 100)[0]
			s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: fakePod(t, hungPod)}, {Name: "good", Model: "m", Address: good.Addr()}},
				func(c *config.Config) {
					c.Frontend = fe
					c.Health.Interval = time.Hour
					c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
					c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
					c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 2, Floor: 200 * time.Millisecond}
				})
			patient := &http.Client{Timeout: 10 * time.Second}
			const hung = `pdlb_upstream_retries_total{reason="hung"}`
			for _, budget := range []string{"", `,"max_tokens":null`} {
				before := metricValue(t, s, hung)
				for i := range 2 {
					body := fmt.Sprintf(`{"model":"m","prompt":"hello %d"%s}`, i, budget)
					resp, b := postVia(t, patient, s, "/v1/completions", body)
					if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "good" {
						t.Fatalf("%s: %d from %q: %s", body, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
					}
				}
				if metricValue(t, s, hung) == before {
					t.Fatalf("max_tokens %q: no attempt given up as hung: round robin sent none to the hung pod", budget)
				}
			}
		})
	}
}

// TestFirstByteKeepsTheOnlyAvailablePod: a slow pod is not given up at
// the first-byte deadline when every other pod of its model is down: the
// retry would go to a dead pod (a panic pick, which comes before any
// fallback model) and the client get its error, while the slow pod's
// answer, 0.8 s away, was on its way.
func TestFirstByteKeepsTheOnlyAvailablePod(t *testing.T) {
	dead := testnet.Refusing(t)
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, fallback := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fallback=%v", fe, fallback), func(t *testing.T) {
				slow := slowPod(t, 800*time.Millisecond)
				pods := []config.Pod{{Name: "slow", Model: "m", Address: slow}, {Name: "dead", Model: "m", Address: dead}}
				if fallback {
					pods = append(pods, config.Pod{Name: "other", Model: "n", Address: testFleet(t, "n", 1, 100)[0].Addr()})
				}
				s := testGateway(t, pods, func(c *config.Config) {
					c.Frontend = fe
					if fallback {
						c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n"}}
					}
					c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
					c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 2, Floor: 200 * time.Millisecond}
				})
				testwait.For(t, "the dead pod found dead", func() bool { return metricValue(t, s, `pdlb_pod_healthy{pod="dead"}`) == 0 })
				// Twice: gnet's loop sweeps deadlines from the first exchange on.
				for i := range 2 {
					if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
						t.Fatalf("request %d: %d (x-pdlb-pod %q) while the slow pod, the only one of m up, answers in 0.8 s: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
					}
				}
				if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="hung"}`); n != 0 {
					t.Fatalf("%v requests given up as hung", n)
				}
			})
		}
	}
}

// TestFirstByteWithinTheRetryBudget: the first-byte deadline gives up a
// slow pod only when the retry budget has room for the retry; a budget
// that refuses it turns the answer on its way into a 504.
func TestFirstByteWithinTheRetryBudget(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			slow := slowPod(t, 800*time.Millisecond)
			good := testFleet(t, "m", 1, 100)[0]
			s := testGateway(t, []config.Pod{{Name: "slow", Model: "m", Address: slow}, {Name: "good", Model: "m", Address: good.Addr()}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
				c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
				c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 2, Floor: 200 * time.Millisecond}
				// No place for a retry with fewer than 100 requests in flight.
				c.Upstream.Retry.Budget = config.RetryBudget{Percent: 1}
			})
			// Round robin sends two of the four to the slow pod; gnet's
			// loop sweeps deadlines from the first exchange on.
			for i := range 4 {
				if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
					t.Fatalf("request %d: %d (x-pdlb-pod %q) while the slow pod answers in 0.8 s and the budget has no room for a retry: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
				}
			}
			if n := metricValue(t, s, "pdlb_upstream_retry_budget_exhausted_total"); n != 0 {
				t.Fatalf("%v retries refused by the budget", n)
			}
		})
	}
}

// TestFirstByteBudgetAtTheDeadline: the retry budget is asked again as
// the first-byte deadline passes. Two requests sent at once to two slow
// pods each find room for a retry as they go out; with a budget of one
// retry, only the first deadline to pass gives its pod up, and the other
// request waits on for its pod's answer, as it would without the
// deadline, rather than getting a 504 for a retry it had no place for.
func TestFirstByteBudgetAtTheDeadline(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			slow := func(name string) config.Pod {
				return config.Pod{Name: name, Model: "m", Address: slowPod(t, 1200*time.Millisecond)}
			}
			s := testGateway(t, []config.Pod{slow("a"), slow("b")}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
				c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
				c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 1, Floor: 300 * time.Millisecond}
				c.Upstream.Retry.Budget = config.RetryBudget{Percent: 1, MinRetries: 1}
			})
			// gnet's loop sweeps deadlines from the first exchange on.
			if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
				t.Fatalf("%d: %s", resp.StatusCode, b)
			}
			const hung = `pdlb_upstream_retries_total{reason="hung"}`
			before := metricValue(t, s, hung)
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Go(func() {
					if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
						t.Errorf("request %d: %d from %q: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
					}
				})
			}
			wg.Wait()
			if n := metricValue(t, s, hung) - before; n != 1 {
				t.Errorf("%v attempts given up as hung, want the one the budget had room for", n)
			}
			if n := metricValue(t, s, "pdlb_upstream_retry_budget_exhausted_total"); n != 0 {
				t.Errorf("%v retries refused by the budget after their pods were given up", n)
			}
			waitIdle(t, s)
		})
	}
}

// TestRetryBudgetBurst: a pod that fails a burst of requests at once
// sends their retries together, more than a small budget holds, and every
// client still gets its answer from the other pod. The retries over the
// budget wait for the first ones to work there, or, when those are slow
// to begin, for a check to find the failed pod gone (killed: its
// listener closed, every connection reset), then go on over the budget.
func TestRetryBudgetBurst(t *testing.T) {
	resetting := func(t *testing.T, held *atomic.Int32) string {
		return fakePod(t, func(c net.Conn, r *http.Request) {
			held.Add(1)
			// Held a moment, so that the burst fails together.
			time.Sleep(100 * time.Millisecond)
			resetPod(c, r)
		})
	}
	slow := func(t *testing.T) string {
		return fakePod(t, func(c net.Conn, _ *http.Request) {
			time.Sleep(500 * time.Millisecond)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(okAnswer), okAnswer)
		})
	}
	quick := func(t *testing.T) string { return testFleet(t, "m", 1, 100)[0].Addr() }
	f := func(name string, failing func(*testing.T, *atomic.Int32) string, other func(*testing.T) string, checks time.Duration) {
		t.Run(name, func(t *testing.T) {
			var held atomic.Int32
			s := testGateway(t, []config.Pod{{Name: "failing", Model: "m", Address: failing(t, &held)}, {Name: "other", Model: "m", Address: other(t)}},
				func(c *config.Config) {
					c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
					c.Health.Interval = checks
					c.Health.EjectAfterFailures = 1000
					c.Upstream.Retry.Budget = config.RetryBudget{Percent: 1, MinRetries: 1}
				})
			const clients = 12
			if statuses := burst(s, clients); statuses[200] != clients || held.Load() < 2 {
				t.Fatalf("clients got %v with %d held by the failing pod; want %d × 200 and a burst of at least 2", statuses, held.Load(), clients)
			}
			waitIdle(t, s)
		})
	}
	f("a retry works", resetting, quick, time.Hour)
	f("the pod is found gone", killablePod, slow, 50*time.Millisecond)
}

// killablePod answers health checks; it holds each request a moment,
// counting it in held, then dies as a killed process does: its listener
// closes and every connection, checks' included, is reset.
func killablePod(t *testing.T, held *atomic.Int32) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	kill := sync.OnceFunc(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	})
	t.Cleanup(kill)
	return scriptedPod(t, ln, podScript{
		accepted: func(c net.Conn) {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		},
		serve: func(net.Conn, *http.Request) {
			held.Add(1)
			time.Sleep(100 * time.Millisecond)
			kill()
		},
	})
}

// burst sends n requests to s at once and counts their statuses (0: no
// answer).
func burst(s *lb.Server, n int) map[int]int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}],"max_tokens":4}`, i)
			resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			code := 0
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			statuses[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return statuses
}

// okAnswer is a whole chat completion, as a fake pod answers it.
const okAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`

// TestRetryWhenPodFoundDown: requests waiting on a pod that then stops
// answering everything, health checks included, move to another pod as
// soon as the checks find it dead, not after the response timeout,
// whatever the retry budget, and spending none of upstream.retries; on
// both front ends.
func TestRetryWhenPodFoundDown(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			good := testFleet(t, "m", 1, 100)[0]
			var down atomic.Bool
			var waiting atomic.Int32
			bad := wedgingPod(t, &down, &waiting)
			s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: bad}, {Name: "good", Model: "m", Address: good.Addr()}},
				func(c *config.Config) {
					c.Frontend = fe
					c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
					c.Health.Interval, c.Health.Timeout = 50*time.Millisecond, 100*time.Millisecond
					// Past the client's patience, with no hedge: only the
					// checks' finding moves the requests in time.
					c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
					c.Upstream.Retry.FirstByte = config.FirstByte{}
					// A budget that refuses every other retry, and no
					// retries: moving off a pod found dead is never
					// refused, and spends none.
					c.Upstream.Retry.Budget = config.RetryBudget{Percent: 1}
					c.Upstream.Retries = 0
				})
			patient := &http.Client{Timeout: 20 * time.Second}
			type answer struct {
				code int
				pod  string
				err  error
			}
			const n = 4
			answers := make(chan answer, n)
			for i := range n {
				go func() {
					body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}],"max_tokens":8,"stream":%v}`, i, i%2 == 1)
					resp, err := patient.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						answers <- answer{err: err}
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					answers <- answer{code: resp.StatusCode, pod: resp.Header.Get("x-pdlb-pod")}
				}()
			}
			testwait.For(t, "requests waiting on the pod about to wedge", func() bool { return waiting.Load() > 0 })
			down.Store(true)
			for range n {
				if a := <-answers; a.err != nil || a.code != http.StatusOK || a.pod != "good" {
					t.Fatalf("answer %+v, want 200 from good", a)
				}
			}
			if got := metricValue(t, s, `pdlb_upstream_retries_total{reason="down"}`); got < float64(waiting.Load()) {
				t.Fatalf("%v retries for down, want one per request the pod held (%d)", got, waiting.Load())
			}
			waitIdle(t, s)
		})
	}
}

// TestDrainingPodKeepsItsRequests: a pod that stops accepting connections
// (an engine shutting down gracefully) is taken out, but the requests it
// holds are its to finish: they are not moved as a hung pod's are.
func TestDrainingPodKeepsItsRequests(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			held, finish := make(chan struct{}, 1), make(chan struct{})
			// Each check on a connection of its own, which the closed
			// listener refuses once it closed.
			addr := scriptedPod(t, ln, podScript{closeChecks: true, serve: func(c net.Conn, _ *http.Request) {
				held <- struct{}{}
				<-finish
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(okAnswer), okAnswer)
			}})
			s := testGateway(t, []config.Pod{{Name: "draining", Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval, c.Health.Timeout = 20*time.Millisecond, 100*time.Millisecond
				// The event loop sweeps every 10 ms (a tenth of the
				// shortest timeout) from its next tick (1 s at most),
				// so the wait below sees many sweeps.
				c.Upstream.KeepaliveTimeout = 100 * time.Millisecond
			})
			answer := make(chan string, 1)
			go func() {
				resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
				if err != nil {
					answer <- err.Error()
					return
				}
				resp.Body.Close()
				answer <- fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("x-pdlb-pod"))
			}()
			<-held
			ln.Close()
			testwait.For(t, "the checks to take the draining pod out", func() bool { return !podCounts(t, s, "draining").Healthy })
			time.Sleep(1500 * time.Millisecond) // what would move a hung pod's request has run by now
			close(finish)
			if got := <-answer; got != "200 draining" {
				t.Fatalf("the request the draining pod held got %q, want its answer", got)
			}
		})
	}
}

// wedgingPod answers health checks until down is set, then nothing at
// all; it never answers a request, counting them in waiting.
func wedgingPod(t *testing.T, down *atomic.Bool, waiting *atomic.Int32) string {
	return wedgeFirst(t, down, waiting, math.MaxInt32)
}

// wedgeFirst is wedgingPod for its first n requests; it answers the
// later ones with okAnswer, counting them in waiting too.
func wedgeFirst(t *testing.T, down *atomic.Bool, waiting *atomic.Int32, n int32) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return scriptedPod(t, ln, podScript{
		checks: func() bool { return !down.Load() },
		serve: func(c net.Conn, _ *http.Request) {
			if waiting.Add(1) > n {
				answerJSON(c, http.StatusOK, okAnswer)
				return
			}
			_, _ = io.Copy(io.Discard, c)
		},
	})
}

// TestRetryReturnsToPodBackUp: a request every pod of its model failed
// without taking any of it (two found dead while they held it, one that
// refused its connection) goes back to a pod it tried once the checks
// find that pod healthy again, while its retries last: the pod that
// wedged first is back before the last one is found dead. A pod it went
// back to that is found dead again spends a retry, so a fleet that keeps
// failing ends the request: with no retries, 502 rather than a third
// move to the other pod, back up by then.
func TestRetryReturnsToPodBackUp(t *testing.T) {
	f := func(name string, wedged int32, retries, want int) {
		t.Run(name, func(t *testing.T) {
			down := make([]atomic.Bool, 2)
			held := make([]atomic.Int32, 2)
			pods := []config.Pod{{Name: "refusing", Model: "m", Address: testnet.Refusing(t)}}
			for i := range down {
				pods = append(pods, config.Pod{Name: fmt.Sprintf("w%d", i), Model: "m", Address: wedgeFirst(t, &down[i], &held[i], wedged)})
			}
			path := filepath.Join(t.TempDir(), "access.log")
			s := testGateway(t, pods, func(c *config.Config) {
				c.AccessLog = path
				c.Tracing.Explain = true
				c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
				c.Health.Interval, c.Health.Timeout, c.Health.UnhealthyAfter = 20*time.Millisecond, 50*time.Millisecond, 2
				c.Health.EjectAfterFailures = 1000
				// No hedge and no response timeout in the test's time:
				// only the checks' findings move the request.
				c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
				c.Upstream.Retry.FirstByte = config.FirstByte{}
				c.Upstream.Retries = retries
			})
			testwait.For(t, "the checks to find the refusing pod out", func() bool { return !podCounts(t, s, "refusing").Healthy })
			answer := postLater(s, chatBody, "x-pdlb-debug", "explain")
			testwait.For(t, "a wedging pod to hold the request", func() bool { return held[0].Load()+held[1].Load() == 1 })
			first := 0
			if held[1].Load() == 1 {
				first = 1
			}
			other := 1 - first
			down[first].Store(true)
			testwait.For(t, "the request to move to the other wedging pod", func() bool { return held[other].Load() == 1 })
			down[first].Store(false)
			testwait.For(t, "the first wedging pod to be healthy again", func() bool { return podCounts(t, s, pods[1+first].Name).Healthy })
			down[other].Store(true)
			if wedged > 1 {
				testwait.For(t, "the request to go back to the first wedging pod, or its answer", func() bool { return held[first].Load() == 2 || len(answer) > 0 })
				down[other].Store(false)
				testwait.For(t, "the other wedging pod to be healthy again", func() bool { return podCounts(t, s, pods[1+other].Name).Healthy })
				down[first].Store(true)
			}
			a := <-answer
			if a.code != want {
				t.Fatalf("%d from %q, want %d: %s", a.code, a.pod, want, a.body)
			}
			waitIdle(t, s)
			lines := readAccessLog(t, s, path)
			l := lines[len(lines)-1]
			r, _ := l["retried"].([]any)
			if want == http.StatusOK {
				if a.pod != pods[1+first].Name {
					t.Fatalf("answered by %q, want %s, the pod back up", a.pod, pods[1+first].Name)
				}
				var e explained
				if err := json.Unmarshal([]byte(a.explain), &e); err != nil {
					t.Fatalf("x-pdlb-explain %q: %v", a.explain, err)
				}
				skipped := map[string]string{}
				for _, c := range e.Candidates {
					skipped[c.Pod] = c.Skipped + c.Chosen
				}
				if skipped[pods[1+first].Name] != "pod" || skipped[pods[1+other].Name] != "tried already" {
					t.Fatalf("explained %+v: want the pod back up chosen, the other tried already", e)
				}
				if l.num("attempts") != 3 || len(r) != 2 {
					t.Fatalf("%v attempts, retried %v; want 3, the two found down", l["attempts"], l["retried"])
				}
			}
			for _, a := range r {
				if a.(map[string]any)["reason"] != "down" {
					t.Fatalf("retried %v, want only moves off pods found down", r)
				}
			}
		})
	}
	f("back up", 1, 1, http.StatusOK)
	f("down again", 2, 0, http.StatusBadGateway)
}

// TestHedgeGoesBackToPodBackUp: an attempt whose model has no pod left
// untried still gets the first-byte deadline when a pod the request left
// (found dead while it held it) is healthy again: the hung attempt is
// given up there and the request goes back to that pod. Pod a holds the
// request and is found dead, so is b after it; a is back, and c, up by
// then, takes the request and hangs.
func TestHedgeGoesBackToPodBackUp(t *testing.T) {
	names := []string{"a", "b", "c"}
	down := make([]atomic.Bool, 3)
	held := make([]atomic.Int32, 3)
	var pods []config.Pod
	for i, name := range names {
		wedged := int32(1)
		if name == "c" {
			wedged = 1000 // hangs whatever it gets
		}
		pods = append(pods, config.Pod{Name: name, Model: "m", Address: wedgeFirst(t, &down[i], &held[i], wedged)})
	}
	down[1].Store(true)
	down[2].Store(true)
	s := testGateway(t, pods, func(c *config.Config) {
		c.Health.Interval, c.Health.Timeout, c.Health.UnhealthyAfter = 20*time.Millisecond, 50*time.Millisecond, 2
		c.Health.EjectAfterFailures = 1000
		// Without the hedge, the hung attempt ends here, 504.
		c.Upstream.ResponseTimeout = 5 * time.Second
		c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 1, Floor: 200 * time.Millisecond}
		c.Upstream.Retries = 1
	})
	healthy := func(i int, want bool) {
		t.Helper()
		down[i].Store(!want)
		testwait.For(t, fmt.Sprintf("the checks to find %s healthy: %v", names[i], want), func() bool { return podCounts(t, s, names[i]).Healthy == want })
	}
	healthy(1, false)
	healthy(2, false)
	answer := postLater(s, `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}`)
	holds := func(i int) {
		t.Helper()
		testwait.For(t, names[i]+" to hold the request", func() bool { return held[i].Load() == 1 })
	}
	holds(0)
	healthy(1, true)
	healthy(0, false)
	holds(1)
	healthy(0, true)
	healthy(2, true)
	healthy(1, false)
	holds(2)
	if a := <-answer; a.code != http.StatusOK || a.pod != "a" {
		t.Fatalf("%d from %q, want 200 from a, the pod back up: %s", a.code, a.pod, a.body)
	}
	if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="hung"}`); n != 1 {
		t.Fatalf("%v hedged retries, want 1", n)
	}
	waitIdle(t, s)
}

// TestRetryPDDecodeLeg: a decode pod that resets the decode leg before its
// answer's first byte may have read the prefill's KV, so the whole pair is
// retried: the client gets its answer from the other decode pod.
func TestRetryPDDecodeLeg(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	bad := fakePod(t, resetPod)
	badPod := pdPod(dec, bad, "rs0")
	badPod.Name = "bad"
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), badPod},
		func(c *config.Config) {
			c.Health.Interval = time.Hour
			c.Health.EjectAfterFailures = 100 // the bad pod stays a candidate
		})
	// The decode pick between dec and bad is a draw among equals, which
	// 8 requests may all miss (one run in 2^8): more are sent, up to 64,
	// until one decode leg went to bad.
	const resets = `pdlb_upstream_retries_total{reason="reset"}`
	for i := 0; i < 8 || (i < 64 && metricValue(t, s, resets) == 0); i++ {
		resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", i%2 == 1, 8))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
			t.Fatalf("request %d: %d via %q/%q: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), b)
		}
	}
	if n := metricValue(t, s, resets); n == 0 {
		t.Fatal("no decode leg went to the resetting pod: the test shows nothing")
	}
	ledgerSettles(t, s)
}

// TestRetryPDDecodeRefusedOverBudget: a decode pod that refuses the
// decode leg's connection is found out by the refusal, so the leg moves
// to the other decode pod whatever the retry budget, as a combined
// request's retry goes on once its pod is found out; no retry was refused
// by the budget, and pdlb_upstream_retry_budget_exhausted_total says so.
func TestRetryPDDecodeRefusedOverBudget(t *testing.T) {
	dead := testnet.Refusing(t)
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	badPod := pdPod(dec, dead, "rs0")
	badPod.Name = "bad"
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), badPod},
		func(c *config.Config) {
			c.Health.Interval = time.Hour // the refusal alone finds the bad pod out
			c.Upstream.Retry.Budget = config.RetryBudget{Percent: 1}
		})
	// The decode pick between dec and bad is a draw among equals: requests
	// go until one decode leg went to bad, which the refusal takes out.
	for i := 0; i < 64 && metricValue(t, s, `pdlb_pod_healthy{pod="bad"}`) == 1; i++ {
		resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", i%2 == 1, 8))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
			t.Fatalf("request %d: %d via %q/%q: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), b)
		}
	}
	if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`); n == 0 {
		t.Fatal("no decode leg went to the refusing pod: the test shows nothing")
	}
	if n := metricValue(t, s, "pdlb_upstream_retry_budget_exhausted_total"); n != 0 {
		t.Fatalf("pdlb_upstream_retry_budget_exhausted_total %v, and every request was retried and answered", n)
	}
	ledgerSettles(t, s)
}

// TestRetryPDPrefillFoundDown: a prefill pod that wedges, health checks
// included, while it holds prefill legs gives them up once the checks find
// it dead; their pairs go to the other prefill pod.
func TestRetryPDPrefillFoundDown(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	var down atomic.Bool
	var waiting atomic.Int32
	badPod := pdPod(pre, wedgingPod(t, &down, &waiting), "rs0")
	badPod.Name = "bad"
	s := pdGateway(t, e, []config.Pod{badPod, pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")},
		func(c *config.Config) {
			c.Health.Interval, c.Health.Timeout = 50*time.Millisecond, 100*time.Millisecond
			c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = time.Minute, time.Minute
			c.PD.PrefillRequestTimeout = time.Minute
		})
	patient := &http.Client{Timeout: 20 * time.Second}
	const n = 6
	answers := make(chan string, n)
	for i := range n {
		go func() {
			// Prompts of their own, so no cache draws them to one pod.
			prompt := strings.Repeat(fmt.Sprintf("request %d has a prompt of its own ", i), 8)
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":8,"stream":%v}`, prompt, i%2 == 1)
			resp, err := patient.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				answers <- err.Error()
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers <- fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("x-pdlb-prefill-pod"))
		}()
	}
	testwait.For(t, "prefill legs waiting on the pod about to wedge", func() bool { return waiting.Load() > 0 })
	down.Store(true)
	for range n {
		if a := <-answers; a != "200 pre" {
			t.Fatalf("answer %q, want 200 prefilled on pre", a)
		}
	}
	if got := metricValue(t, s, `pdlb_upstream_retries_total{reason="down"}`); got < float64(waiting.Load()) {
		t.Fatalf("%v retries for down, want one per leg the pod held (%d)", got, waiting.Load())
	}
	ledgerSettles(t, s)
}

// TestRetryBudgetFleetWide: when every pod resets every request, the
// retries stay within upstream.retry_budget's share of the requests in
// flight, and every client gets a clean 502 in OpenAI's shape.
func TestRetryBudgetFleetWide(t *testing.T) {
	const clients, retries = 50, 2
	var attempts atomic.Int64
	var pods []config.Pod
	for i := range 3 {
		addr := fakePod(t, func(c net.Conn, r *http.Request) {
			attempts.Add(1)
			// Held a moment, so that the burst is in flight together.
			time.Sleep(100 * time.Millisecond)
			resetPod(c, r)
		})
		pods = append(pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: addr})
	}
	s := testGateway(t, pods, func(c *config.Config) {
		c.Health.Interval = time.Hour
		c.Health.EjectAfterFailures = 1000 // the budget alone limits the retries
		c.Upstream.Retries = retries
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[string]int{}
	start := time.Now()
	for range clients {
		wg.Go(func() {
			resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			key := ""
			if err != nil {
				key = err.Error()
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				key = fmt.Sprint(resp.StatusCode)
				if !strings.Contains(string(b), `"error":{`) {
					key += " not in OpenAI's shape"
				}
			}
			mu.Lock()
			statuses[key]++
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(start)
	if statuses["502"] != clients {
		t.Fatalf("clients got %v, want %d × 502", statuses, clients)
	}
	// A retrying request holds its place in the budget until a pod's answer
	// head comes, never here: at most a fifth of the burst (20%) retries,
	// each up to retries times.
	retried, refused := metricValue(t, s, "pdlb_upstream_retries_total"), metricValue(t, s, "pdlb_upstream_retry_budget_exhausted_total")
	t.Logf("%d requests, %d attempts, %v retries, %v refused by the budget; clients got %v, the last in %v (each attempt held 100 ms)",
		clients, attempts.Load(), retried, refused, statuses, took.Round(time.Millisecond))
	if limit := int64(clients + clients/5*retries); attempts.Load() > limit || refused == 0 {
		t.Fatalf("%d attempts for %d requests (limit %d), %v refused by the budget", attempts.Load(), clients, limit, refused)
	}
	waitIdle(t, s)
}

// TestRetryRequestWriteReset: a pod that resets a new connection before
// it took the whole request fails the gateway's write of it, and no byte
// of an answer can have come, so the request goes to the other pod, as
// after a reset that follows the request, on both front ends. The body
// is larger than the sockets' buffers: the write is still under way when
// the reset comes.
func TestRetryRequestWriteReset(t *testing.T) {
	prompt := strings.Repeat("hello ", 2<<20)
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			bad := scriptedPod(t, ln, podScript{serve: resetPod, unread: true})
			s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: bad}, {Name: "good", Model: "m", Address: slowPod(t, 0)}},
				func(c *config.Config) {
					c.Frontend = fe
					c.MaxBodyBytes = 16 << 20
					c.Health.Interval = time.Hour
					c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
				})
			for i := range 2 {
				resp, b := post(t, s, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"%d %s","max_tokens":1}`, i, prompt))
				if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "good" {
					t.Fatalf("request %d: %d from %q: %.300s", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
				}
			}
			if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="reset"}`); n < 1 {
				t.Fatalf("%v retries for a reset, want one per request round robin sent to the bad pod", n)
			}
			waitIdle(t, s)
		})
	}
}

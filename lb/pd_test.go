package lb_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/route"
)

// The tests below run prefill/decode disaggregation end to end: sim pods
// of every engine in the prefill, decode and combined roles, all with one
// seed, behind a gateway on loopback.

// pdEngine is one engine's exchange as a test drives it.
type pdEngine struct {
	name   string
	engine engines.Kind
	style  string // TensorRT-LLM's schedule style
}

var pdEngines = []pdEngine{
	{"vllm", engines.VLLM, ""},
	{"sglang", engines.SGLang, ""},
	{"trtllm-context-first", engines.TRTLLM, route.TRTContextFirst},
	{"trtllm-generation-first", engines.TRTLLM, route.TRTGenerationFirst},
}

// startSim starts one sim pod of model "m" in role; mutate adjusts it.
// startTrio starts a prefill, a decode and a combined pod of e, named
// pre, dec and comb.
func startTrio(t *testing.T, e pdEngine) (pre, dec, comb *sim.Pod) {
	t.Helper()
	return startSim(t, e, "pre", sim.RolePrefill, nil), startSim(t, e, "dec", sim.RoleDecode, nil), startSim(t, e, "comb", sim.RoleCombined, nil)
}

func startSim(t *testing.T, e pdEngine, name, role string, mutate func(*sim.Config)) *sim.Pod {
	t.Helper()
	cfg := sim.Config{Name: name, Model: "m", Engine: e.engine, Role: role, Seed: 7, Speedup: 200,
		DefaultMaxTokens: 16, KVScale: 1.0 / 4096}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// restartSim closes p and starts its engine again at its address, as a
// container restart does; the test is skipped when the new process's
// transceiver took the old one's port again.
func restartSim(t *testing.T, e pdEngine, p *sim.Pod) *sim.Pod {
	t.Helper()
	c, addr, before := p.Config(), p.Addr(), p.KVXferAddr()
	p.Close()
	q := startSim(t, e, c.Name, c.Role, func(c *sim.Config) { c.Listen = addr })
	if q.KVXferAddr() == before {
		t.Skip("the restarted pod's transceiver took the old port again")
	}
	return q
}

// pdPod is p's entry in the gateway's configuration, at addr (its own
// address unless a proxy stands in front of it).
func pdPod(p *sim.Pod, addr, roleset string) config.Pod {
	c := p.Config()
	pod := config.Pod{Name: c.Name, Model: "m", Address: addr, Engine: string(c.Engine), Role: c.Role}
	if c.Role != sim.RoleCombined {
		pod.Roleset = roleset
	}
	if c.Engine == engines.SGLang && c.Role == sim.RolePrefill {
		_, port, _ := net.SplitHostPort(p.KVXferAddr())
		pod.BootstrapPort, _ = strconv.Atoi(port)
	}
	return pod
}

// pdGateway starts a gateway with e's schedule style; edit adjusts the
// configuration further.
func pdGateway(t *testing.T, e pdEngine, pods []config.Pod, edit func(*config.Config)) *lb.Server {
	t.Helper()
	return testGateway(t, pods, func(c *config.Config) {
		if e.style != "" {
			c.PD.TRTScheduleStyle = e.style
		}
		if edit != nil {
			edit(c)
		}
	})
}

// pdAnswer is what a client compares: the text and the finish reason.
type pdAnswer struct{ text, finish string }

// askDirect sends body to a pod directly, as the reference answer.
func askDirect(t *testing.T, addr, path, body string) pdAnswer {
	t.Helper()
	resp, err := client.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("direct %s: %d %s", path, resp.StatusCode, b)
	}
	return parseAnswer(t, resp, string(b))
}

// parseAnswer reads a whole or streamed completion answer: its choices'
// texts in index order (a stream interleaves a batch's), and the last
// finish reason.
func parseAnswer(t *testing.T, resp *http.Response, body string) pdAnswer {
	t.Helper()
	type choice struct {
		Index        int
		Text         string
		Message      struct{ Content string }
		Delta        struct{ Content string }
		FinishReason *string `json:"finish_reason"`
	}
	var a pdAnswer
	var texts []string
	add := func(data string) {
		var c struct{ Choices []choice }
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("bad answer %q: %v", data, err)
		}
		for _, ch := range c.Choices {
			if ch.Index >= len(texts) {
				texts = append(texts, make([]string, ch.Index+1-len(texts))...)
			}
			texts[ch.Index] += ch.Text + ch.Message.Content + ch.Delta.Content
			if ch.FinishReason != nil {
				a.finish = *ch.FinishReason
			}
		}
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		add(body)
		a.text = strings.Join(texts, "")
		return a
	}
	done := false
	readEvents(t, strings.NewReader(body), func(data string, _ time.Time) {
		if data == "[DONE]" {
			done = true
		} else {
			add(data)
		}
	})
	if !done {
		t.Fatalf("stream without [DONE]: %q", body)
	}
	a.text = strings.Join(texts, "")
	return a
}

// pdBody is a request of path with a prompt long enough to span blocks.
func pdBody(path string, stream bool, maxTokens int) string {
	prompt := strings.Repeat("the prefill pod computes this prompt once ", 8)
	if strings.Contains(path, "chat") {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%v}`, prompt, maxTokens, stream)
	}
	return fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d,"stream":%v}`, prompt, maxTokens, stream)
}

// metricValue sums the samples of the admin page's series whose line
// starts with prefix.
func metricValue(t *testing.T, s *lb.Server, prefix string) float64 {
	t.Helper()
	return adminMetric(t, s.AdminAddr(), prefix)
}

// adminMetric is metricValue for the gateway whose admin listener is at
// admin (one in another process, say).
func adminMetric(t *testing.T, admin, prefix string) float64 {
	t.Helper()
	sum := 0.0
	for _, line := range strings.Split(get(t, "http://"+admin+"/metrics"), "\n") {
		if strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			sum += v
		}
	}
	return sum
}

// ledgerSettles waits until no token ledger holds a charge.
func ledgerSettles(t *testing.T, s *lb.Server) {
	t.Helper()
	testwait.For(t, "the token ledgers to return to zero", func() bool {
		return metricValue(t, s, "pd_token_load_active_tokens")+metricValue(t, s, "pd_token_load_kv_tokens")+
			metricValue(t, s, "pd_token_load_decode_tokens") == 0
	})
}

func TestPDAnswersEqualCombined(t *testing.T) {
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) {
			pre, dec, comb := startTrio(t, e)
			log := filepath.Join(t.TempDir(), "access.log")
			s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), pdPod(comb, comb.Addr(), "")},
				func(c *config.Config) { c.AccessLog = log })
			legs := int64(0)
			for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
				for _, stream := range []bool{false, true} {
					body := pdBody(path, stream, 12)
					want := askDirect(t, comb.Addr(), path, body)
					resp, b := post(t, s, path, body)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("%s stream=%v: %d %s", path, stream, resp.StatusCode, b)
					}
					if got := parseAnswer(t, resp, b); got != want || want.finish != "length" {
						t.Fatalf("%s stream=%v: PD answer %+v, combined %+v", path, stream, got, want)
					}
					if p, d, pod := resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), resp.Header.Get("x-pdlb-pod"); p != "pre" || d != "dec" || pod != "dec" {
						t.Fatalf("%s stream=%v: prefill %q, decode %q, pod %q", path, stream, p, d, pod)
					}
					legs++
					testwait.For(t, "the prefill pod to free the KV", func() bool { return pre.Stats().HeldKVBlocks == 0 })
				}
			}
			if st := dec.Stats(); st.KVPulls != legs || st.KVPullFailures != 0 {
				t.Fatalf("decode pod pulled %d times (%d failed), want %d", st.KVPulls, st.KVPullFailures, legs)
			}
			ledgerSettles(t, s)
			if n := metricValue(t, s, `pdlb_pd_routed_total{model="m",kind="pair"}`); n != float64(legs) {
				t.Fatalf("pdlb_pd_routed_total pair = %v, want %d", n, legs)
			}
			// The access log names both legs' pods.
			lines := readAccessLog(t, s, log)
			for _, l := range lines {
				if l.num("status") != 200 || l.str("pod") != "dec" || l.str("prefill_pod") != "pre" {
					t.Fatalf("access log line %v", l)
				}
			}
			if len(lines) != int(legs) {
				t.Fatalf("%d access log lines, want %d", len(lines), legs)
			}
		})
	}
}

func TestPDDecodeKilledFallsBack(t *testing.T) {
	for _, e := range pdEngines[:2] {
		t.Run(e.name, func(t *testing.T) {
			pre, dec, comb := startTrio(t, e)
			s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), pdPod(comb, comb.Addr(), "")},
				func(c *config.Config) { c.Health.Interval = time.Hour }) // the gateway learns of the death from the request
			if err := dec.Kill(); err != nil {
				t.Fatal(err)
			}
			for _, stream := range []bool{false, true} {
				path := "/v1/chat/completions"
				body := pdBody(path, stream, 8)
				want := askDirect(t, comb.Addr(), path, body)
				resp, b := post(t, s, path, body)
				if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "comb" {
					t.Fatalf("stream=%v: %d from %q: %s", stream, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
				}
				if got := parseAnswer(t, resp, b); got != want {
					t.Fatalf("stream=%v: answer %+v, combined %+v", stream, got, want)
				}
			}
			ledgerSettles(t, s)
		})
	}
}

func TestPDDecodeMovesToAnotherRoleset(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	pre1 := startSim(t, e, "pre1", sim.RolePrefill, nil)
	dec1 := startSim(t, e, "dec1", sim.RoleDecode, nil)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"),
		pdPod(pre1, pre1.Addr(), "rs1"), pdPod(dec1, dec1.Addr(), "rs1")},
		func(c *config.Config) { c.Health.Interval = time.Hour })
	if err := dec.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 8))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != "dec1" {
			t.Fatalf("%d via %q/%q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), b)
		}
	}
	for _, p := range []*sim.Pod{pre, pre1} {
		testwait.For(t, "every prefill pod to free its KV", func() bool { return p.Stats().HeldKVBlocks == 0 })
	}
	ledgerSettles(t, s)
}

// TestPDRetryBudgetFreedAtFirstByte: a prefill/decode pair whose decode
// leg moved to another pod (a retry) gives its place in the retry budget
// back once the decode pod's answer begins, as a plain retry does, not
// when its stream ends.
func TestPDRetryBudgetFreedAtFirstByte(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	pre1 := startSim(t, e, "pre1", sim.RolePrefill, nil)
	// Real time: the stream lasts while the test looks.
	dec1 := startSim(t, e, "dec1", sim.RoleDecode, func(c *sim.Config) { c.Speedup = 1 })
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"),
		pdPod(pre1, pre1.Addr(), "rs1"), pdPod(dec1, dec1.Addr(), "rs1")},
		func(c *config.Config) { c.Health.Interval = time.Hour })
	if err := dec.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		req, err := newPost(s, pdBody("/v1/chat/completions", true, 400))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != "dec1" || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("request %d: %d via %q: %q %v", i, resp.StatusCode, resp.Header.Get("x-pdlb-decode-pod"), line, err)
		}
		if n := metricValue(t, s, "pdlb_upstream_retries_in_flight"); n != 0 {
			t.Fatalf("request %d streaming: %v requests retrying, want 0", i, n)
		}
		resp.Body.Close()
	}
	waitIdle(t, s)
}

// TestPDAnswerFromPrefillCountsItsToken: a TensorRT-LLM context pod
// whose answer finished at its first token answers the client itself;
// that token counts (pdlb_completion_tokens_total, an API key's output
// budget) as any answer's do.
func TestPDAnswerFromPrefillCountsItsToken(t *testing.T) {
	e := pdEngines[2] // context_first
	one := func(c *sim.Config) { c.DefaultMaxTokens = 1 }
	pre := startSim(t, e, "pre", sim.RolePrefill, one)
	dec := startSim(t, e, "dec", sim.RoleDecode, one)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, nil)
	for i, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"stream":%v}`, strings.Repeat("the prefill pod computes this prompt once ", 8), stream)
		resp, b := post(t, s, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "pre" {
			t.Fatalf("stream=%v: %d from %q: %s", stream, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
		}
		if got := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`); got != float64(i+1) {
			t.Fatalf("stream=%v: pdlb_completion_tokens_total = %v after the context pod's one-token answers, want %d", stream, got, i+1)
		}
	}
}

// TestPDAnswerFromPrefillUsageDefault: the stream the gateway makes of a
// context pod's one-token answer carries a usage chunk exactly when the
// engine's own stream would; TensorRT-LLM's include_usage defaults to true
// once stream_options is present.
func TestPDAnswerFromPrefillUsageDefault(t *testing.T) {
	e := pdEngines[2] // context_first
	one := func(c *sim.Config) { c.DefaultMaxTokens = 1 }
	pre := startSim(t, e, "pre", sim.RolePrefill, one)
	dec := startSim(t, e, "dec", sim.RoleDecode, one)
	comb := startSim(t, e, "comb", sim.RoleCombined, one)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, nil)
	hasUsage := func(body string) bool {
		found := false
		readEvents(t, strings.NewReader(body), func(data string, _ time.Time) {
			var c struct{ Usage json.RawMessage }
			if json.Unmarshal([]byte(data), &c) == nil && len(c.Usage) > 0 && string(c.Usage) != "null" {
				found = true
			}
		})
		return found
	}
	prompt := strings.Repeat("the prefill pod computes this prompt once ", 8)
	for _, opts := range []string{``, `,"stream_options":{}`, `,"stream_options":{"include_usage":true}`, `,"stream_options":{"include_usage":false}`} {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"stream":true%s}`, prompt, opts)
		resp, err := client.Post("http://"+comb.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		direct, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp, b := post(t, s, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "pre" {
			t.Fatalf("%s: %d from %q: %s", opts, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
		}
		if got, want := hasUsage(b), hasUsage(string(direct)); got != want {
			t.Fatalf("stream options %q: usage chunk %v through the gateway, %v from the engine\ngateway: %s\nengine: %s", opts, got, want, b, direct)
		}
	}
}

func TestPDPrefillKilledFailsFast(t *testing.T) {
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, nil)
			s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")},
				func(c *config.Config) { c.Health.Interval = time.Hour })
			// Warm the server-info cache of generation_first, then kill.
			if resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 4)); resp.StatusCode != http.StatusOK {
				t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
			}
			if err := pre.Kill(); err != nil {
				t.Fatal(err)
			}
			// The decode pod may fail the stream it opened before the
			// prefill leg's refusal is known: the refusal is the answer
			// still (TestPDPrefillFailsAfterDecodeAnswer).
			resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", true, 8))
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("x-error-pd-prefill") != "true" {
				t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
			}
			// The refusal took the prefill pod out: the next request is
			// not sent to it.
			if resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 8)); resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("after the refusal: %d %v %s", resp.StatusCode, resp.Header, b)
			}
			testwait.For(t, "the decode pod to drop what the failed prefill left", func() bool {
				st := dec.Stats()
				return st.Running+st.Waiting == 0 && st.UsedBlocks == 0
			})
			ledgerSettles(t, s)
		})
	}
}

// TestPDPrefillFailsAfterDecodeAnswer: a generation_first decode pod
// fails the stream it opened as soon as the KV transfer is refused, while
// the context leg on the same dead pod fails an instant later, or hangs
// well past the moments a concurrent decode answer waits for it
// (lb/pd's prefillGrace, 250 ms) and then fails. TensorRT-LLM's own
// disaggregated server relays the generation stream only once its
// context leg answered (it gathers both legs' tasks first:
// openai_disagg_service.py, _send_disagg_request_gen_first), so the
// client gets the context leg's error, not 200 and the decode pod's
// error event.
func TestPDPrefillFailsAfterDecodeAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		hang time.Duration
	}{{"fails", 0}, {"hangs", time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			dec := startSim(t, pdEngines[3], "dec", sim.RoleDecode, nil)
			s := deadContextPair(t, dec, func(net.Conn) {
				// Closed unanswered once the decode pod found its KV
				// unreachable, and hang later.
				for deadline := time.Now().Add(testwait.Timeout); dec.Stats().KVPullFailures == 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(tc.hang)
			})
			resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", true, 8))
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("x-error-pd-prefill") != "true" {
				t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
			}
			ledgerSettles(t, s)
		})
	}
}

// deadContextPair is a gateway over a TensorRT-LLM generation_first pair
// of dec and a context pod whose /server_info names a dead KV endpoint
// (dec's pull of the KV fails) and whose context leg is leg.
func deadContextPair(t *testing.T, dec *sim.Pod, leg func(net.Conn)) *lb.Server {
	t.Helper()
	info := fmt.Sprintf(`{"disaggregated_params":{"ctx_info_endpoint":"tcp://%s","ctx_dp_rank":0}}`, testnet.Refusing(t))
	preAddr := fakePod(t, func(c net.Conn, r *http.Request) {
		if r.URL.Path == "/server_info" {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(info), info)
			return
		}
		leg(c)
	})
	pre := pdPod(dec, preAddr, "rs0")
	pre.Name, pre.Role = "pre", sim.RolePrefill
	return pdGateway(t, pdEngines[3], []config.Pod{pre, pdPod(dec, dec.Addr(), "rs0")}, nil)
}

// TestPDClientLeavesWhileDecodeAnswerWaits: a client that leaves while
// its generation_first decode answer waits for the hung context leg
// (TestPDPrefillFailsAfterDecodeAnswer/hangs) cuts both legs: the context pod's
// connection closes, and nothing stays charged or in flight.
func TestPDClientLeavesWhileDecodeAnswerWaits(t *testing.T) {
	dec := startSim(t, pdEngines[3], "dec", sim.RoleDecode, nil)
	var reached atomic.Bool
	cut := make(chan struct{})
	s := deadContextPair(t, dec, func(c net.Conn) {
		reached.Store(true)
		_, _ = io.Copy(io.Discard, c) // until the gateway closes it
		close(cut)
	})
	body := pdBody("/v1/chat/completions", true, 8)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// The legs go at once and the decode pod's pull fails without the
	// context leg: a client that left before that leg reached its pod
	// would have it cut unsent, and the pod would see no leg to close.
	testwait.For(t, "the context leg to reach its pod and the decode pod to fail the KV transfer", func() bool {
		return reached.Load() && dec.Stats().KVPullFailures > 0
	})
	c.Close()
	select {
	case <-cut:
	case <-time.After(testwait.Timeout):
		t.Fatal("the context leg's connection stayed open after the client left")
	}
	waitIdle(t, s)
}

// stallProxy stands in front of addr: it relays requests whole, and of
// each data-path connection (not the gateway's health checks) only the
// response headers, then nothing: a decode pod whose answer hangs after it
// took the KV.
func stallProxy(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { stallConn(c, addr) })
		}
	})
	return ln.Addr().String()
}

func stallConn(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	br := bufio.NewReader(c)
	head, err := br.Peek(1)
	if err != nil || len(head) == 0 {
		return
	}
	// A health check or scrape passes whole; its client names itself.
	first, _ := br.Peek(br.Buffered())
	health := bytes.Contains(first, []byte("pdlb-health"))
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		// Either side closing ends both.
		_, _ = io.Copy(up, br)
		up.Close()
		c.Close()
	})
	if health {
		_, _ = io.Copy(c, up)
		return
	}
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := up.Read(buf)
		got = append(got, buf[:n]...)
		if i := bytes.Index(got, []byte("\r\n\r\n")); i >= 0 {
			_, _ = c.Write(got[:i+4])
			_, _ = io.Copy(io.Discard, up)
			return
		}
		if err != nil {
			return
		}
	}
}

func TestPDDecodeWatchdog(t *testing.T) {
	for _, e := range pdEngines[:2] {
		t.Run(e.name, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, nil)
			hung := stallProxy(t, dec.Addr())
			s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, hung, "rs0")}, func(c *config.Config) {
				c.PD.DecodeFirstResponseTimeout = 300 * time.Millisecond
				c.PD.DecodeResponseTimeout = 300 * time.Millisecond
				// An abandoned concurrent decode leg that got no headers
				// ends by its own bound, the prefill timeout plus the
				// watchdog's: keep the test's short.
				c.PD.PrefillRequestTimeout = time.Second
			})
			// A stream's head passes, as engines send it before the KV
			// pull, and its first chunk does not: the client, sent
			// nothing yet, gets the watchdog's 504, as without a stream.
			for _, stream := range []bool{true, false} {
				resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", stream, 8))
				if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("x-error-pd-decode") != "true" || !strings.Contains(b, "decode watchdog") {
					t.Fatalf("stream %v: %d %v %s", stream, resp.StatusCode, resp.Header, b)
				}
			}
			if n := metricValue(t, s, `gateway_request_model_fail_total{model="m",status="pd_decode_watchdog",status_code="504"}`); n != 2 {
				t.Fatalf("watchdog counted %v requests, want 2", n)
			}
			testwait.For(t, "the prefill pod to free the KV and the decode pod its slots", func() bool {
				st := dec.Stats()
				return pre.Stats().HeldKVBlocks == 0 && st.Running+st.Waiting == 0 && st.UsedBlocks == 0
			})
			ledgerSettles(t, s)
		})
	}
}

// TestPDClientLeaves: a client that leaves during the prefill has its
// prefill leg cut (closing the leg's connection is how a pod learns to
// abort; SGLang's legs also get /abort_request) and gets no decode leg; one
// that leaves during a whole answer's decode has the decode leg cut. Every
// engine's exchange, on gnet, whose loop sees the client go while a worker
// waits, and on fasthttp, where the exchange watches the connection;
// nothing stays charged, and the request counts 499.
func TestPDClientLeaves(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, e := range pdEngines {
			for _, during := range []string{"prefill", "decode"} {
				t.Run(fe+"/"+e.name+"/"+during, func(t *testing.T) { testPDClientLeaves(t, fe, e, during) })
			}
		}
	}
}

func testPDClientLeaves(t *testing.T, fe string, e pdEngine, during string) {
	slow := func(c *sim.Config) { c.Speedup = 1 }
	pre := startSim(t, e, "pre", sim.RolePrefill, slow)
	dec := startSim(t, e, "dec", sim.RoleDecode, slow)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "g"), pdPod(dec, dec.Addr(), "g")}, func(c *config.Config) { c.Frontend = fe })
	// A stream leaves in its prefill, a whole answer in its decode:
	// neither has had a byte of its answer.
	stream, busy := true, pre
	if during == "decode" {
		stream, busy = false, dec
	}
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":3000,"stream":%v}`, strings.Repeat("a long prompt to prefill ", 2000), stream)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	testwait.For(t, "the "+during+" to start", func() bool { return busy.Stats().Running == 1 })
	c.Close()
	testwait.For(t, "both pods to be idle", func() bool {
		p, d := pre.Stats(), dec.Stats()
		return p.Running+p.Waiting+d.Running+d.Waiting == 0 && metricValue(t, s, "pdlb_requests_in_flight") == 0
	})
	p, d := pre.Stats(), dec.Stats()
	switch {
	case during == "prefill" && (p.Aborted != 1 || p.PromptTokens != 0 || d.GeneratedTokens != 0):
		t.Fatalf("after leaving in the prefill: prefill pod %+v, decode pod %+v; want the prefill aborted and no decoding", p, d)
	case during == "decode" && (d.Aborted != 1 || d.GeneratedTokens >= 3000):
		t.Fatalf("after leaving in the decode: decode pod %+v; want it aborted", d)
	}
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_requests_total{model="m",code="499"}`); n != 1 {
		t.Fatalf("%v requests counted 499, want 1", n)
	}
	if n := metricValue(t, s, "pdlb_upstream_errors_total"); n != 0 {
		t.Fatalf("the pods were charged %v failures for a client that left", n)
	}
}

// TestPDLegsKeepConnections: on gnet, whose legs are watched for the
// client leaving, every engine's legs go over the pods' keep-alive
// connections: five exchanges in a row open no new connection after the
// first (each leg used to dial its own, closed after the answer).
func TestPDLegsKeepConnections(t *testing.T) {
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, nil)
			s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "g"), pdPod(dec, dec.Addr(), "g")}, func(c *config.Config) {
				c.Frontend = "gnet"
				// Only the legs reach the pods.
				c.Health.Interval = time.Hour
				c.Health.MetricsInterval = 0
			})
			ask := func(stream bool) {
				body := pdBody("/v1/chat/completions", stream, 8)
				resp, b := post(t, s, "/v1/chat/completions", body)
				if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-prefill-pod") != "pre" {
					t.Fatalf("stream=%v: %d (prefill pod %q) %s", stream, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), b)
				}
			}
			ask(false)
			p0, d0 := pre.Stats().Accepted, dec.Stats().Accepted
			for i := 0; i < 5; i++ {
				ask(i%2 == 0)
			}
			if p, d := pre.Stats().Accepted-p0, dec.Stats().Accepted-d0; p != 0 || d != 0 {
				t.Fatalf("five more exchanges opened %d connections to the prefill pod and %d to the decode pod; want 0 (keep-alive)", p, d)
			}
			ledgerSettles(t, s)
		})
	}
}

// TestPDConnectionCapIsNotPodFailure: a leg the gateway's own cap refuses
// (every connection upstream.max_conns_per_pod allows is busy) is answered
// 503 naming the knob, and is not the pod's failure: a burst must not eject
// a healthy prefill pod.
func TestPDConnectionCapIsNotPodFailure(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, func(c *sim.Config) { c.Speedup = 1 })
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "g"), pdPod(dec, dec.Addr(), "g")}, func(c *config.Config) {
		c.Upstream.MaxConnsPerPod = 1
		c.Health.EjectAfterFailures = 1
		// Only the legs reach the pods.
		c.Health.Interval = time.Hour
		c.Health.MetricsInterval = 0
	})
	long := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2}`, strings.Repeat("a long prompt to prefill ", 2000))
	first := make(chan int, 1)
	go func() {
		resp, _ := post(t, s, "/v1/completions", long)
		first <- resp.StatusCode
	}()
	testwait.For(t, "the first prefill to start", func() bool { return pre.Stats().Running == 1 })
	resp, body := post(t, s, "/v1/completions", pdBody("/v1/completions", false, 2))
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "max_conns_per_pod") {
		t.Fatalf("a leg over the connection cap: %d %s; want 503 naming upstream.max_conns_per_pod", resp.StatusCode, body)
	}
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the request holding the connection: %d", code)
	}
	if n := metricValue(t, s, "pdlb_upstream_errors_total"); n != 0 {
		t.Fatalf("the pods were charged %v failures for the gateway's own cap", n)
	}
	if resp, body := post(t, s, "/v1/completions", pdBody("/v1/completions", false, 2)); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the burst: %d %s; the prefill pod should still serve", resp.StatusCode, body)
	}
	ledgerSettles(t, s)
}

// failingPrefill stands in front of a prefill pod: it passes what the
// gateway reads of it (health, metrics, server info) and answers every
// prefill leg with answer, as a pod that is up but failing does.
func failingPrefill(t *testing.T, addr string, answer func(w http.ResponseWriter)) string {
	t.Helper()
	target, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	pass := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			pass.ServeHTTP(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		answer(w)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// prefill500 answers a prefill leg 500.
func prefill500(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusInternalServerError)
	io.WriteString(w, `{"error":{"message":"prefill failed","type":"InternalServerError","code":500}}`)
}

// TestPDConcurrentDecodeCutOnPrefillFailure: in the concurrent exchanges
// (SGLang, TensorRT-LLM generation_first) the decode leg waits on its pod
// for KV from the prefill leg; when the prefill leg fails, the decode leg's
// connection is closed at once, so the decode pod stops waiting instead of
// holding the request until its KV timeout.
func TestPDConcurrentDecodeCutOnPrefillFailure(t *testing.T) {
	for _, e := range []pdEngine{pdEngines[1], pdEngines[3]} {
		t.Run(e.name, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, func(c *sim.Config) { c.KVTimeout = time.Hour })
			s := pdGateway(t, e, []config.Pod{pdPod(pre, failingPrefill(t, pre.Addr(), prefill500), "g"), pdPod(dec, dec.Addr(), "g")},
				func(c *config.Config) { c.Health.Interval = time.Hour })
			resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", true, 8))
			if resp.StatusCode < 500 || resp.Header.Get("x-error-pd-prefill") != "true" {
				t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
			}
			testwait.For(t, "the decode pod to stop waiting for the KV", func() bool {
				st := dec.Stats()
				return st.Running+st.Waiting == 0
			})
			ledgerSettles(t, s)
		})
	}
}

// prefillAborted answers a prefill leg as SGLang answers a streamed
// request its scheduler aborts (serving_chat.py): 200, an error event,
// [DONE].
func prefillAborted(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, `data: {"error": {"object": "error", "message": "queue full", "type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}`+"\n\n")
	io.WriteString(w, "data: [DONE]\n\n")
}

// TestPDStreamedPrefillErrorEvent: SGLang's prefill leg carries the
// client's "stream": true, so a prefill the engine fails after accepting
// it answers 200 with an error event. That is a failed prefill leg: the
// decode leg, which would wait for KV that never comes, is dropped and the
// client gets the prefill's error at once, not the decode watchdog's.
func TestPDStreamedPrefillErrorEvent(t *testing.T) {
	e := pdEngines[1]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, func(c *sim.Config) { c.KVTimeout = time.Hour })
	s := pdGateway(t, e, []config.Pod{pdPod(pre, failingPrefill(t, pre.Addr(), prefillAborted), "g"), pdPod(dec, dec.Addr(), "g")},
		func(c *config.Config) {
			c.Health.Interval = time.Hour
			c.PD.DecodeFirstResponseTimeout = 2 * time.Second
		})
	resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", true, 8))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("x-error-pd-prefill") != "true" || !strings.Contains(b, "queue full") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
	testwait.For(t, "the decode pod to stop waiting for the KV", func() bool {
		st := dec.Stats()
		return st.Running+st.Waiting == 0
	})
	ledgerSettles(t, s)
}

// TestPDReady: a model served only by prefill and decode pods is ready
// while one roleset has an available pod of each role, and not when its
// only decode pod is down or sits in another roleset than every prefill
// pod (pairs never cross rolesets).
func TestPDReady(t *testing.T) {
	e := pdEngines[0]
	ready := func(s *lb.Server) (int, string) {
		t.Helper()
		resp, err := client.Get("http://" + s.Addr() + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	apart := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs1")}, nil)
	if code, b := ready(apart); code != http.StatusServiceUnavailable || b != "no available pod for: m\n" {
		t.Fatalf("prefill and decode in two rolesets: %d %q", code, b)
	}
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")},
		func(c *config.Config) { c.Health.Interval, c.Health.Timeout = 50*time.Millisecond, 20*time.Millisecond })
	if code, b := ready(s); code != http.StatusOK {
		t.Fatalf("one roleset with both roles: %d %q", code, b)
	}
	if err := dec.Kill(); err != nil {
		t.Fatal(err)
	}
	waitNotReady(t, s, "the model unready once its only decode pod is down")
}

// TestPDPrefillInfoRefusedMovesOn: TensorRT-LLM generation_first asks the
// prefill pod for its /server_info before the legs; a prefill pod that
// refuses that call received nothing of the request, so the pair goes to
// the other prefill pod, and the refusal takes the dead pod out of the
// next picks.
func TestPDPrefillInfoRefusedMovesOn(t *testing.T) {
	e := pdEngines[3]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	pre1 := startSim(t, e, "pre1", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(pre1, pre1.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")},
		func(c *config.Config) { c.Health.Interval = time.Hour })
	// Killed before any exchange asked it for its server info.
	if err := pre.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		// Prompts of their own, so no cache draws them to one pod.
		prompt := strings.Repeat(fmt.Sprintf("request %d has a prompt of its own ", i), 8)
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":8}`, prompt)
		resp, b := post(t, s, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-prefill-pod") != "pre1" {
			t.Fatalf("request %d: %d via %q: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), b)
		}
	}
	ledgerSettles(t, s)
}

// TestPDDecodeRefusedCountsOneRetry: a decode leg its pod refused, with
// no other decode pod to move to, is one retry: the pair goes to the
// combined pod, and pdlb_upstream_retries_total counts it once; it is one
// request, which pdlb_pd_routed_total counts once too (it counted a pair
// and a combined).
func TestPDDecodeRefusedCountsOneRetry(t *testing.T) {
	e := pdEngines[0]
	pre, dec, comb := startTrio(t, e)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), pdPod(comb, comb.Addr(), "")},
		func(c *config.Config) { c.Health.Interval = time.Hour })
	if err := dec.Kill(); err != nil {
		t.Fatal(err)
	}
	resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 8))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "comb" {
		t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
	}
	if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`); n != 1 {
		t.Fatalf("%v retries counted for one, want 1", n)
	}
	if n := metricValue(t, s, `pdlb_pd_routed_total{model="m",`); n != 1 {
		t.Errorf("pdlb_pd_routed_total counted %v for one request (pair %v, combined %v), want 1", n,
			metricValue(t, s, `pdlb_pd_routed_total{model="m",kind="pair"}`), metricValue(t, s, `pdlb_pd_routed_total{model="m",kind="combined"}`))
	}
	waitIdle(t, s)
}

// TestPDMovedDecodeKeepsPrefillCharge: in a concurrent exchange (SGLang)
// the prefill leg runs beside the decode leg, so a decode leg that moves
// to another pod leaves the prefill pod's active charge in place until
// the prefill leg itself ends: token_load must not see an idle prefill
// pod that is computing the prompt.
func TestPDMovedDecodeKeepsPrefillCharge(t *testing.T) {
	e := pdEngines[1]
	pre := startSim(t, e, "pre", sim.RolePrefill, func(c *sim.Config) { c.Speedup = 1 })
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	dec1 := startSim(t, e, "dec1", sim.RoleDecode, nil)
	// Pairs stay in their roleset: the pair is pre and dec, and the
	// decode leg moves to dec1.
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), pdPod(dec1, dec1.Addr(), "rs1")},
		func(c *config.Config) { c.Health.Interval = time.Hour })
	if err := dec.Kill(); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2}`, strings.Repeat("a long prompt to prefill ", 2000))
	answered := make(chan string, 1)
	go func() {
		resp, b := post(t, s, "/v1/completions", body)
		answered <- fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("x-pdlb-decode-pod"), " ", b)
	}()
	testwait.For(t, "the decode leg to move while the prefill runs", func() bool {
		return metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`) == 1 && pre.Stats().Running == 1
	})
	active := metricValue(t, s, `pd_token_load_active_tokens{pod="pre"}`)
	if pre.Stats().Running == 1 && active == 0 {
		t.Errorf("the prefill pod computes the prompt with no active tokens charged")
	}
	if a := <-answered; !strings.HasPrefix(a, "200 dec1 ") {
		t.Fatalf("answer %s", a)
	}
	waitIdle(t, s)
}

// TestPDLatePrefillLegKeepsRetryCharge: a concurrent prefill leg
// (TensorRT-LLM generation_first) may end after its request, whose decode
// pod reset the decode leg, was retried on the combined pod; when it ends,
// it must not release the retry's active charge, which the same request id
// holds.
func TestPDLatePrefillLegKeepsRetryCharge(t *testing.T) {
	e := pdEngines[3]
	hang := make(chan struct{})
	took := make(chan struct{}, 1)
	pre := startSim(t, e, "pre", sim.RolePrefill, func(c *sim.Config) { c.KVTimeout = time.Hour })
	dec := fakePod(t, func(net.Conn, *http.Request) {}) // reset before any byte
	comb := fakePod(t, func(net.Conn, *http.Request) {
		took <- struct{}{}
		<-hang
	})
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"),
		{Name: "dec", Model: "m", Address: dec, Engine: "trtllm", Role: sim.RoleDecode, Roleset: "rs0"},
		{Name: "comb", Model: "m", Address: comb, Engine: "trtllm"}},
		func(c *config.Config) {
			c.Health.Interval = time.Hour
			c.PD.PrefillRequestTimeout = 300 * time.Millisecond
		})
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		resp, err := client.Post("http://"+s.Addr()+"/v1/completions", "application/json",
			strings.NewReader(pdBody("/v1/completions", false, 2)))
		if err == nil {
			resp.Body.Close()
		}
	}()
	// Before the pods' cleanups wait for their connections.
	defer func() { close(hang); <-answered }()
	<-took
	testwait.For(t, "the first attempt's prefill leg to end", func() bool {
		return metricValue(t, s, `pdlb_pod_in_flight{pod="pre"}`) == 0
	})
	if active := metricValue(t, s, `pd_token_load_active_tokens{pod="comb"}`); active == 0 {
		t.Errorf("the retry on comb computes the prompt with no active tokens charged")
	}
}

// pickupPair starts a concurrent pair of e (SGLang or TensorRT-LLM
// generation_first) whose prefill pod (a sim) answers its leg only once a
// decode pod took the KV, which the fake decode pod, decode, never does;
// edit adjusts the gateway.
func pickupPair(t *testing.T, e pdEngine, decode func(net.Conn, *http.Request), edit func(*config.Config)) *lb.Server {
	t.Helper()
	pre := startSim(t, e, "pre", sim.RolePrefill, func(c *sim.Config) { c.KVTimeout = time.Hour })
	dec := fakePod(t, decode)
	return pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"),
		{Name: "dec", Model: "m", Address: dec, Engine: string(e.engine), Role: sim.RoleDecode, Roleset: "rs0"}},
		func(cfg *config.Config) {
			cfg.Health.Interval = time.Hour
			cfg.Health.EjectAfterFailures = 1
			edit(cfg)
		})
}

// prefillLegCountedNothing waits until nothing is charged or in flight on
// a pickupPair's gateway, and checks that its prefill leg counted no
// failure against pod "pre".
func prefillLegCountedNothing(t *testing.T, s *lb.Server) {
	t.Helper()
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_upstream_errors_total{pod="pre"}`); n != 0 {
		t.Fatalf("the abandoned prefill leg counted %v failures against its pod", n)
	}
	if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="pre"}`); n != 0 {
		t.Fatalf("the prefill pod was ejected %v times", n)
	}
}

// TestPDAbandonedPrefillLegCountsNothing: when the decode leg of a
// concurrent exchange fails (TensorRT-LLM generation_first, which has no
// abort call), no decode pod will take the prefill leg's KV: the gateway
// gives the leg up at once, which gives the prefill pod's counts back,
// and the leg counts no failure against the healthy prefill pod.
func TestPDAbandonedPrefillLegCountsNothing(t *testing.T) {
	reset := func(net.Conn, *http.Request) {}
	answer500 := func(c net.Conn, _ *http.Request) {
		const body = `{"error":{"message":"decode failed"}}`
		fmt.Fprintf(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	for _, c := range []struct {
		name    string
		decode  func(net.Conn, *http.Request)
		timeout time.Duration // the prefill leg's; past testwait's bound, the counts are held until it
		status  int
		inBody  string
	}{
		{"decode reset", reset, time.Minute, http.StatusBadGateway, "server closed connection"},
		// The decode pod's own answer is relayed, whole.
		{"decode answered 500", answer500, time.Minute, http.StatusInternalServerError, `"decode failed"`},
		{"decode reset, short prefill timeout", reset, 300 * time.Millisecond, http.StatusBadGateway, "server closed connection"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := pickupPair(t, pdEngines[3], c.decode, func(cfg *config.Config) { cfg.PD.PrefillRequestTimeout = c.timeout })
			// A client that keeps its connection: closing it would cut the
			// leg as a client that left.
			kc := &http.Client{Timeout: 20 * time.Second}
			defer kc.CloseIdleConnections()
			resp, b := postVia(t, kc, s, "/v1/completions", pdBody("/v1/completions", false, 2))
			if resp.StatusCode != c.status || !strings.Contains(b, c.inBody) {
				t.Fatalf("%d %s, want %d with %s", resp.StatusCode, b, c.status, c.inBody)
			}
			prefillLegCountedNothing(t, s)
		})
	}
}

// TestPDBrokenDecodeStreamGivesUpPrefillLeg: in an SGLang exchange the
// decode pod's 200 may reach the client while the prefill leg still runs
// (its decode pod answers at once, then waits for the KV). When that stream then breaks (the pod cuts it, the decode
// watchdog finds it idle, the engine ends it with its error event, the
// client leaves) no decode leg will take the KV: the prefill leg is given
// up at once, as when the decode leg fails before its 200, on fasthttp
// too, which cannot watch the client while the leg runs.
func TestPDBrokenDecodeStreamGivesUpPrefillLeg(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
	const token = `data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n"
	const errEvent = `data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"
	cut := func(c net.Conn, _ *http.Request) { io.WriteString(c, head+token+`data: {"choi`) }
	engineError := func(c net.Conn, _ *http.Request) { io.WriteString(c, head+token+errEvent+"data: [DONE]\n\n") }
	stalls := func(c net.Conn, _ *http.Request) {
		io.WriteString(c, head+token)
		io.Copy(io.Discard, c) // until the gateway closes it
	}
	// Tokens until the gateway closes the stream (at most 20 s).
	streams := func(c net.Conn, _ *http.Request) {
		io.WriteString(c, head)
		for range 2000 {
			if _, err := io.WriteString(c, token); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	body := pdBody("/v1/completions", true, 2)
	// ask reads the answer whole, over a connection it keeps until the
	// test ends: closing it would cut the leg as a client that left.
	ask := func(want string) func(t *testing.T, s *lb.Server) {
		return func(t *testing.T, s *lb.Server) {
			kc := &http.Client{Timeout: 20 * time.Second}
			t.Cleanup(kc.CloseIdleConnections)
			resp, b := postVia(t, kc, s, "/v1/completions", body)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(b, token) || !strings.Contains(b, want) {
				t.Fatalf("%d %q, want 200, a token, then %s", resp.StatusCode, b, want)
			}
		}
	}
	leave := func(t *testing.T, s *lb.Server) {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("no token before %v", err)
			}
			if strings.HasPrefix(line, "data: ") {
				return
			}
		}
	}
	for _, c := range []struct {
		name     string
		decode   func(net.Conn, *http.Request)
		frontend string
		timeout  time.Duration // the prefill leg's; past testwait's bound, the counts are held until it
		client   func(t *testing.T, s *lb.Server)
	}{
		{"stream cut", cut, "gnet", time.Minute, ask(`data: {"error"`)},
		{"engine error event", engineError, "gnet", time.Minute, ask("Internal server error")},
		{"stream idle", stalls, "gnet", time.Minute, ask("decode watchdog")},
		{"client left mid-stream", streams, "fasthttp", time.Minute, leave},
		{"stream cut, short prefill timeout", cut, "gnet", 300 * time.Millisecond, ask(`data: {"error"`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			// SGLang: a generation_first decode answer waits for its
			// context leg (TestPDPrefillFailsAfterDecodeAnswer/hangs).
			s := pickupPair(t, pdEngines[1], c.decode, func(cfg *config.Config) {
				cfg.Frontend = c.frontend
				cfg.PD.PrefillRequestTimeout = c.timeout
				cfg.PD.DecodeStreamIdleTimeout = 300 * time.Millisecond
			})
			c.client(t, s)
			prefillLegCountedNothing(t, s)
		})
	}
}

// TestPDWholeAnswerCutByPrefillSparesDecodePod: in a concurrent exchange
// a failed prefill leg cuts the decode leg's connection, which may be
// past its head, its whole answer being read. The client gets the
// prefill leg's failure, and the decode pod is not counted a failure:
// it was cut, it did not fail.
func TestPDWholeAnswerCutByPrefillSparesDecodePod(t *testing.T) {
	// The head and the start of a body, then nothing until the gateway
	// closes the connection.
	partial := func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":")
		io.Copy(io.Discard, c)
	}
	// The prefill leg times out: no decode pod takes its KV.
	s := pickupPair(t, pdEngines[3], partial, func(cfg *config.Config) { cfg.PD.PrefillRequestTimeout = 300 * time.Millisecond })
	kc := &http.Client{Timeout: 20 * time.Second}
	defer kc.CloseIdleConnections()
	resp, b := postVia(t, kc, s, "/v1/completions", pdBody("/v1/completions", false, 2))
	if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("x-error-pd-prefill") != "true" {
		t.Fatalf("%d %v %s, want the prefill leg's timeout", resp.StatusCode, resp.Header, b)
	}
	if n := metricValue(t, s, `pdlb_upstream_errors_total{pod="dec"}`); n != 0 {
		t.Fatalf("the decode pod was counted %v failures for an answer the prefill leg's failure cut", n)
	}
	waitIdle(t, s)
}

// TestSGLangAbortSparesOthers: a client that leaves its SGLang exchange
// has it aborted on both pods (/abort_request), and only it: SGLang
// aborts every request whose rid starts with the one named, and the
// request ids job-1 and job-10 do. job-10 runs to its end.
func TestSGLangAbortSparesOthers(t *testing.T) {
	e := pdEngines[1]
	slow := func(c *sim.Config) { c.Speedup = 1 }
	pre := startSim(t, e, "pre", sim.RolePrefill, slow)
	dec := startSim(t, e, "dec", sim.RoleDecode, slow)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "g"), pdPod(dec, dec.Addr(), "g")}, func(c *config.Config) { c.Frontend = "gnet" })
	send := func(id string, maxTokens int) net.Conn {
		body := pdBody("/v1/completions", false, maxTokens)
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", id, len(body), body)
		return c
	}
	ten := send("job-10", 200)
	defer ten.Close()
	testwait.For(t, "job-10 to decode", func() bool { return dec.Stats().Running == 1 })
	one := send("job-1", 3000)
	testwait.For(t, "job-1 to decode", func() bool { return dec.Stats().Running == 2 })
	one.Close()
	resp, err := http.ReadResponse(bufio.NewReader(ten), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"finish_reason":"length"`) {
		t.Fatalf("job-10, after job-1's client left: %d %s", resp.StatusCode, b)
	}
}

// TestSGLangAbortFollowsMovedDecodeLeg: a decode leg moved off a pod
// that refused it is aborted (/abort_request) on the pod it moved to
// when the prefill leg fails: that pod holds the request, waiting for
// KV that will not come, while the refusing pod never had it.
func TestSGLangAbortFollowsMovedDecodeLeg(t *testing.T) {
	var mu sync.Mutex
	var aborts []string
	hold := func(c net.Conn, _ *http.Request) { io.Copy(io.Discard, c) } // until the gateway closes it
	pre := fakePod(t, hold)
	dec1 := fakePod(t, func(c net.Conn, r *http.Request) {
		if r.URL.Path != "/abort_request" {
			hold(c, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		aborts = append(aborts, string(b))
		mu.Unlock()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	})
	// Pairs stay in their roleset: the pair is pre and dec, which refuses
	// the decode leg, and the leg moves to dec1.
	s := pdGateway(t, pdEngines[1], []config.Pod{
		{Name: "pre", Model: "m", Address: pre, Engine: "sglang", Role: sim.RolePrefill, Roleset: "rs0"},
		{Name: "dec", Model: "m", Address: testnet.Refusing(t), Engine: "sglang", Role: sim.RoleDecode, Roleset: "rs0"},
		{Name: "dec1", Model: "m", Address: dec1, Engine: "sglang", Role: sim.RoleDecode, Roleset: "rs1"}},
		func(c *config.Config) {
			c.Health.Interval = time.Hour
			// The prefill leg fails by its timeout, long after the decode
			// leg moved.
			c.PD.PrefillRequestTimeout = time.Second
		})
	resp, b := post(t, s, "/v1/completions", pdBody("/v1/completions", false, 8))
	if resp.StatusCode < 500 || resp.Header.Get("x-error-pd-prefill") != "true" {
		t.Fatalf("%d %v %s, want the prefill leg's failure", resp.StatusCode, resp.Header, b)
	}
	if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`); n != 1 {
		t.Fatalf("%v decode legs moved, want 1", n)
	}
	rid := resp.Header.Get("X-Request-Id")
	testwait.For(t, "dec1, which holds the decode leg, to get /abort_request", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range aborts {
			if strings.Contains(a, `"rid":"`+rid+`-`) {
				return true
			}
		}
		return false
	})
	waitIdle(t, s)
}

// prefillStopped answers a vLLM prefill leg as vLLM does when the one
// token it produced ends the answer (EOS, a stop token or string): its
// KV connector hands nothing over (request_finished returns no params
// unless the request was length-capped), so kv_transfer_params is null.
func prefillStopped(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"cmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":80,"completion_tokens":1,"total_tokens":81},"kv_transfer_params":null}`)
}

// TestPDVLLMPrefillWithoutKV: a vLLM prefill leg that stopped at its
// token answers kv_transfer_params null; vLLM's own proxy then sends the
// decode leg without them, and the decode pod prefills the prompt itself.
// The client gets the decode pod's answer, not a 502 blaming the prefill.
func TestPDVLLMPrefillWithoutKV(t *testing.T) {
	e := pdEngines[0]
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, nil)
			s := pdGateway(t, e, []config.Pod{pdPod(pre, failingPrefill(t, pre.Addr(), prefillStopped), "g"), pdPod(dec, dec.Addr(), "g")},
				func(c *config.Config) {
					c.Frontend = fe
					c.Health.Interval = time.Hour
				})
			for _, stream := range []bool{false, true} {
				resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", stream, 8))
				if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
					t.Fatalf("stream %v: %d %v %s", stream, resp.StatusCode, resp.Header, b)
				}
				if a := parseAnswer(t, resp, b); a.text == "" {
					t.Fatalf("stream %v: no text in %s", stream, b)
				}
			}
			ledgerSettles(t, s)
		})
	}
}

// TestPDKVTransferSecondsTimesFirstToken: pdlb_pd_kv_transfer_seconds
// is the KV handoff as the gateway sees it, from the prefill leg's answer
// to the decode stream's first token. vLLM's decode pod sends a stream's
// head at once (its OpenAI server's StreamingResponse sends it before the
// engine runs), then pulls the KV and decodes: the head times nothing of
// the handoff. A whole answer comes once the whole decode is done: it is
// not timed.
func TestPDKVTransferSecondsTimesFirstToken(t *testing.T) {
	const pull = 300 * time.Millisecond // the fake decode pod's, before its first token
	const events = `data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}]}` + "\n\n" + "data: [DONE]\n\n"
	const whole = `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ab","finish_reason":"length"}]}`
	pre := startSim(t, pdEngines[0], "pre", sim.RolePrefill, nil)
	dec := fakePod(t, func(c net.Conn, r *http.Request) {
		var body struct{ Stream bool }
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body.Stream {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
			time.Sleep(pull)
			io.WriteString(c, events)
			return
		}
		time.Sleep(pull)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(whole), whole)
	})
	s := pdGateway(t, pdEngines[0], []config.Pod{pdPod(pre, pre.Addr(), "g"),
		{Name: "dec", Model: "m", Address: dec, Engine: "vllm", Role: sim.RoleDecode, Roleset: "g"}},
		func(c *config.Config) { c.Health.Interval = time.Hour })
	const series = `pdlb_pd_kv_transfer_seconds_`
	if resp, b := post(t, s, "/v1/completions", pdBody("/v1/completions", true, 2)); resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
		t.Fatalf("stream: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if n, sum := metricValue(t, s, series+"count"), metricValue(t, s, series+"sum"); n != 1 || sum < pull.Seconds() {
		t.Errorf("after a stream whose first token came %v after its head: %v handoffs timed, %.3f s in all; want 1 of at least %v", pull, n, sum, pull)
	}
	if resp, b := post(t, s, "/v1/completions", pdBody("/v1/completions", false, 2)); resp.StatusCode != http.StatusOK {
		t.Fatalf("whole: %d %s", resp.StatusCode, b)
	}
	if n := metricValue(t, s, series+"count"); n != 1 {
		t.Errorf("after a whole answer: %v handoffs timed, want the stream's alone", n)
	}
}

// TestPDPrefillSecondsTimesAnswers: pdlb_pd_prefill_seconds times a
// prefill leg up to its pod's answer. A leg its pod never received (the
// connection refused) has none, and must not enter the histogram: during
// a prefill pod's outage, its legs' instant failures read as prefills
// that took no time.
func TestPDPrefillSecondsTimesAnswers(t *testing.T) {
	for _, e := range []pdEngine{pdEngines[0], pdEngines[1]} {
		t.Run(e.name, func(t *testing.T) {
			dead := startSim(t, e, "dead", sim.RolePrefill, nil)
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, nil)
			s := pdGateway(t, e, []config.Pod{pdPod(dead, dead.Addr(), "rs0"), pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")},
				func(c *config.Config) { c.Health.Interval = time.Hour })
			if err := dead.Kill(); err != nil {
				t.Fatal(err)
			}
			// The prefill pick between dead and pre is a draw: requests go
			// until one prefill leg went to dead, whose refusal takes it out.
			n := 0
			for ; n < 64 && metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`) == 0; n++ {
				prompt := strings.Repeat(fmt.Sprintf("request %d has a prompt of its own ", n), 8)
				body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4}`, prompt)
				if resp, b := post(t, s, "/v1/completions", body); resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d %s", n, resp.StatusCode, b)
				}
			}
			if metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`) == 0 {
				t.Fatal("no prefill leg went to the dead pod: the test shows nothing")
			}
			waitIdle(t, s)
			if got := metricValue(t, s, `pdlb_pd_prefill_seconds_count{model="m"}`); got != float64(n) {
				t.Fatalf("pdlb_pd_prefill_seconds counted %v legs for %d answered prefills", got, n)
			}
		})
	}
}

// TestPDLastDecodeServesWhileEjected: a 1P1D model's decode pod that
// failed twice (two 500s, its checks passing) is ejected for an hour, and
// the next request is paired with it at once (a panic pick) rather than
// answered 503 "no healthy pod" for the ejection time.
func TestPDLastDecodeServesWhileEjected(t *testing.T) {
	e := pdEngines[0]
	pre, dec := startSim(t, e, "pre", sim.RolePrefill, nil), startSim(t, e, "dec", sim.RoleDecode, nil)
	target, err := url.Parse("http://" + dec.Addr())
	if err != nil {
		t.Fatal(err)
	}
	pass := httputil.NewSingleHostReverseProxy(target)
	var failed atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && failed.Add(1) <= 2 {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"message":"CUDA error","type":"InternalServerError","code":500}}`)
			return
		}
		pass.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "g"), pdPod(dec, front.Listener.Addr().String(), "g")}, func(c *config.Config) {
		c.Health.Interval = time.Hour // the pods stay healthy by their checks
		c.Health.EjectAfterFailures = 2
		c.Health.EjectionTime = time.Hour
		c.Upstream.Retries = 0
	})
	path := "/v1/chat/completions"
	for i := range 2 {
		if resp, b := post(t, s, path, pdBody(path, false, 8)); resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("request %d: %d %s; want the decode pod's 500", i, resp.StatusCode, b)
		}
	}
	if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="dec"}`); n != 1 {
		t.Fatalf("dec ejected %v times after two failures, want 1", n)
	}
	resp, b := post(t, s, path, pdBody(path, false, 8))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "dec" {
		t.Fatalf("the model's only decode pod, ejected and back: %d from %q %s; want it served", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
	}
	if n := metricValue(t, s, `pdlb_panic_picks_total{model="m"}`); n != 1 {
		t.Fatalf("%v panic picks, want 1", n)
	}
	ledgerSettles(t, s)
}

package lb_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// chat is a chat body whose system prompt is long enough to span many
// prefix-index blocks.
func chat(system, user string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "m",
		"messages":   []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return string(b)
}

func TestCacheAwareRoutingFollowsPrefixes(t *testing.T) {
	sims := testFleet(t, "m", 4, 100)
	for _, policy := range []string{"prefix_cache", "cache_aware", "slo_cache"} {
		t.Run(policy, func(t *testing.T) {
			s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
				c.Models = []config.Model{{Name: "m", Policy: policy}}
			})
			conversationsStayHome(t, s, func(body string) (*http.Response, string) {
				return post(t, s, "/v1/chat/completions", body)
			})
		})
	}
}

// TestBatchPromptsKeyedEach: where the gateway sent a completion batch,
// it records each prompt's blocks from the root, as the engine caches
// them (without a tokenizer, from its own picks), so the batch's second
// prompt sent alone later is predicted cached on the batch's pod, and
// goes there.
func TestBatchPromptsKeyedEach(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 2, 100)...), func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", Policy: "prefix_cache", BlockSize: 16}}
	})
	second, _ := json.Marshal(strings.Repeat("A train leaves the harbour at dawn with coal, timber and letters. ", 20))
	resp, b := post(t, s, "/v1/completions", `{"model":"m","max_tokens":1,"prompt":["A question first.",`+string(second)+`]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	home := resp.Header.Get("x-pdlb-pod")
	before := metricValue(t, s, `pdlb_prefix_cached_tokens_total{model="m"}`)
	resp, b = post(t, s, "/v1/completions", `{"model":"m","max_tokens":1,"prompt":`+string(second)+`}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// The stand-in's 4 bytes a token, in whole blocks of 16.
	full := (len(second) - 2) / 4 / 16 * 16
	if cached := metricValue(t, s, `pdlb_prefix_cached_tokens_total{model="m"}`) - before; cached < float64(full) {
		t.Errorf("the batch's second prompt alone was predicted %v tokens cached; want its %d on %s", cached, full, home)
	}
	if pod := resp.Header.Get("x-pdlb-pod"); pod != home {
		t.Errorf("the batch's second prompt alone went to %s; the batch went to %s", pod, home)
	}
}

// TestPerRequestCachePolicyReadsTheIndex: a cache-aware policy that a
// routing-strategy header or a profile chooses, on a model whose own
// policy reads no prefixes, still finds what the pods hold.
func TestPerRequestCachePolicyReadsTheIndex(t *testing.T) {
	sims := testFleet(t, "m", 4, 100)
	for _, tc := range []struct{ name, header, value string }{
		{"header", "routing-strategy", "prefix_cache"},
		{"profile", "config-profile", "cache"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
				c.Models = []config.Model{{Name: "m", Policy: "least_request",
					Profiles: []config.Profile{{Name: "default"}, {Name: "cache", RoutingStrategy: "prefix_cache"}}}}
			})
			conversationsStayHome(t, s, func(body string) (*http.Response, string) {
				return postWith(t, s, body, tc.header, tc.value)
			})
		})
	}
}

// TestDecodeScorerIsNoStrategy: decode_token_load scores decode pods by
// their decode charges, which a pick among combined pods never takes: as
// a routing-strategy it picked a pod at random. It is refused as an
// unknown strategy, naming the header.
func TestDecodeScorerIsNoStrategy(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 2, 100)...), func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", Profiles: []config.Profile{{Name: "default"}}}}
	})
	resp, b := postWith(t, s, chatBody, "routing-strategy", "decode_token_load")
	if resp.StatusCode != 400 || !strings.Contains(b, "routing-strategy") {
		t.Fatalf("routing-strategy: decode_token_load: %d %s, want 400 naming the header", resp.StatusCode, b)
	}
}

// conversationsStayHome sends three turns of four conversations, each
// with its own long system prompt, through send: every turn of a
// conversation must land on the pod that served its first turn, and the
// gateway must count cached tokens.
func conversationsStayHome(t *testing.T, s *lb.Server, send func(body string) (*http.Response, string)) {
	t.Helper()
	home := map[int]string{}
	for turn := 0; turn < 3; turn++ {
		for conv := 0; conv < 4; conv++ {
			system := strings.Repeat(fmt.Sprintf("conversation %d system prompt. ", conv), 200)
			resp, b := send(chat(system, fmt.Sprintf("turn %d", turn), 2, false))
			if resp.StatusCode != 200 {
				t.Fatalf("%d: %s", resp.StatusCode, b)
			}
			pod := resp.Header.Get("x-pdlb-pod")
			if turn == 0 {
				home[conv] = pod
			} else if pod != home[conv] {
				t.Fatalf("conversation %d turn %d went to %s, its prefix is on %s", conv, turn, pod, home[conv])
			}
		}
	}
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	if !strings.Contains(metrics, `pdlb_prefix_cached_tokens_total{model="m"}`) || strings.Contains(metrics, `pdlb_prefix_cached_tokens_total{model="m"} 0`) {
		t.Fatalf("no cached tokens counted:\n%s", metrics)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// indexBlocks reads the blocks the gateway's index holds for pod.
func indexBlocks(t *testing.T, s *lb.Server, pod string) (blocks int, events uint64) {
	t.Helper()
	var out struct {
		Models []struct {
			Pods []struct {
				Pod            string
				Blocks         int
				EventsReceived uint64 `json:"events_received"`
			}
		}
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/index")), &out); err != nil {
		t.Fatal(err)
	}
	for _, m := range out.Models {
		for _, p := range m.Pods {
			if p.Pod == pod {
				return p.Blocks, p.EventsReceived
			}
		}
	}
	t.Fatalf("pod %s not in /admin/index", pod)
	return 0, 0
}

func TestKVEventsKeepTheIndexExact(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	pod, err := sim.Start(sim.Config{Name: "kv-0", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, KVEvents: pub})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	s := testGateway(t, []config.Pod{{Name: "kv-0", Model: "m", Address: pod.Addr(), KVEvents: pub.Endpoint(), KVReplay: pub.ReplayEndpoint()}},
		func(c *config.Config) { c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}} })
	resp, b := post(t, s, "/v1/chat/completions", chat(strings.Repeat("a long shared system prompt ", 300), "hi", 2, false))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	testwait.For(t, "KV events to arrive", func() bool { _, ev := indexBlocks(t, s, "kv-0"); return ev > 0 })
	if blocks, _ := indexBlocks(t, s, "kv-0"); blocks == 0 {
		t.Fatal("index holds nothing after the pod stored blocks")
	}
	if c := metricValue(t, s, `pdlb_kv_feed_connected_ranks{pod="kv-0"}`); c != 1 {
		t.Fatalf("pdlb_kv_feed_connected_ranks of a followed pod = %v, want 1", c)
	}
	// The engine drops its cache: the gateway must follow within 100 ms.
	start := time.Now()
	pod.ResetPrefixCache()
	testwait.For(t, "the index to forget the cleared pod", func() bool { blocks, _ := indexBlocks(t, s, "kv-0"); return blocks == 0 })
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Logf("index followed the clear after %v (target 100 ms; machine load may explain it)", d)
	}
}

// TestKVFeedOutlivesAReload: a reload (or a discovery update) that keeps a
// pod keeps following its KV events where it was, so the blocks it stored
// before the reload leave the index when it evicts them after it, even
// once the pod's replay buffer has moved on, as a busy engine's has.
func TestKVFeedOutlivesAReload(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sims := testFleet(t, "m", 2, 100)
	kv := config.Pod{Name: "kv-0", Model: "m", Address: sims[0].Addr(), KVEvents: pub.Endpoint(), KVReplay: pub.ReplayEndpoint()}
	s := testGateway(t, []config.Pod{kv}, func(c *config.Config) { c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}} })
	// stored publishes one chain of n blocks (hashes from h) until the
	// index holds want blocks for the pod: the subscriber may join late.
	stored := func(h uint64, n, want int) {
		t.Helper()
		hashes, tokens := make([]uint64, n), make([]uint32, n*config.DefaultBlockSize)
		for i := range hashes {
			hashes[i] = h + uint64(i)
		}
		for i := range tokens {
			tokens[i] = uint32(h) + uint32(i)
		}
		testwait.For(t, fmt.Sprintf("the index to hold %d blocks", want), func() bool {
			if b, _ := indexBlocks(t, s, "kv-0"); b == want {
				return true
			}
			pub.BlockStored(0, false, hashes, tokens, config.DefaultBlockSize, engines.ExtraKeys{})
			time.Sleep(20 * time.Millisecond)
			return false
		})
	}
	stored(1000, 4, 4)
	cfg := s.Gateway.Config()
	cfg.Pods = append(cfg.Pods, podsOf("m", sims[1])...)
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	// Another prompt after the reload: the pod's feed is live again.
	stored(2000, 1, 5)
	// The pod evicts the first prompt.
	pub.BlockRemoved([]uint64{1000, 1001, 1002, 1003})
	testwait.For(t, "the evicted blocks to leave the index", func() bool { b, _ := indexBlocks(t, s, "kv-0"); return b == 1 })
}

func TestAdmissionShedsWhatCannotMeetItsTarget(t *testing.T) {
	bothClients(t, testAdmissionShedsWhatCannotMeetItsTarget)
}

func testAdmissionShedsWhatCannotMeetItsTarget(t *testing.T, via *http.Client) {
	// One pod prefilling at 2,000 tokens/s (speedup 1) and a 0.5 s target:
	// a prompt of ~1,600 tokens takes ~0.8 s, so it can never make it and
	// is rejected at once, before any upstream work; short prompts pass.
	pod := physicsPod(t, "slow", 1, func(p *sim.Physics) { p.PrefillTokensPerSec = 2000 })
	s := testGateway(t, []config.Pod{{Name: "slow", Model: "m", Address: pod.Addr(), PrefillTokensPerSec: 2000}}, func(c *config.Config) {
		c.Admission.Enabled = true
		c.Admission.Interactive.TTFTSLO = 0.5
	})
	start := time.Now()
	resp, b := postVia(t, via, s, "/v1/chat/completions", chat(strings.Repeat("x", 6400), "hi", 2, false))
	took := time.Since(start)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(b, "predicted time to first token") {
		t.Fatalf("got %d %q (Retry-After %q), want 429", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if st := pod.Stats(); st.PromptTokens != 0 {
		t.Fatalf("a rejected request reached the pod: %+v", st)
	}
	t.Logf("rejection answered in %v", took)
	if resp, b := postVia(t, via, s, "/v1/chat/completions", chat("short", "hi", 2, false)); resp.StatusCode != 200 {
		t.Fatalf("a short prompt was not admitted: %d %s", resp.StatusCode, b)
	}
	// The Responses API's prompt is judged as a chat's.
	before := pod.Stats().PromptTokens
	resp, b = postVia(t, via, s, "/v1/responses", `{"model":"m","max_output_tokens":2,"store":false,"instructions":"`+strings.Repeat("x", 6400)+`","input":"hi"}`)
	if resp.StatusCode != 429 || !strings.Contains(b, "predicted time to first token") {
		t.Fatalf("long Responses request: got %d %.200q, want 429", resp.StatusCode, b)
	}
	if st := pod.Stats(); st.PromptTokens != before {
		t.Fatalf("a rejected Responses request reached the pod: %+v", st)
	}
	if resp, b := postVia(t, via, s, "/v1/responses", `{"model":"m","max_output_tokens":2,"store":false,"input":"hi"}`); resp.StatusCode != 200 {
		t.Fatalf("a short Responses request was not admitted: %d %s", resp.StatusCode, b)
	}
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{`pdlb_admission_requests_total{class="interactive",decision="rejected"} 2`, `pdlb_admission_requests_total{class="interactive",decision="admitted"} 2`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}

func TestBatchRequestsWait(t *testing.T) { bothClients(t, testBatchRequestsWait) }

func testBatchRequestsWait(t *testing.T, via *http.Client) {
	// A batch request that cannot meet its target now waits in the bounded
	// queue for the prediction to clear, and is answered either way within
	// its max wait; an interactive one in the same situation is rejected at
	// once.
	pod := physicsPod(t, "p", 1, func(p *sim.Physics) { p.PrefillTokensPerSec = 20000 })
	s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod.Addr()}}, func(c *config.Config) {
		c.Admission.Enabled = true
		c.Admission.Interactive.TTFTSLO = 0.3
		c.Admission.Batch.TTFTSLO = 0.5
		c.Admission.Batch.MaxWait = 2
	})
	// ~4,000 tokens each, 0.2 s of prefill, and no two share a prefix.
	long := func(i int) string { return chat(fmt.Sprint(i)+strings.Repeat("y", 16000), "hi", 2, false) }
	var wg sync.WaitGroup
	codes := make([]int, 6)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := strings.NewReader(long(i))
			r, err := via.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", req)
			if err != nil {
				t.Error(err)
				return
			}
			r.Body.Close()
			codes[i] = r.StatusCode
		}()
	}
	wg.Wait()
	interactiveRejected := 0
	for _, c := range codes {
		if c == 429 {
			interactiveRejected++
		}
	}
	if interactiveRejected == 0 {
		t.Fatalf("six concurrent 0.2 s prefills against a 0.3 s target: none rejected (%v)", codes)
	}
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := newPost(s, long(100+i))
			req.Header.Set("x-priority", "batch")
			r, err := via.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			r.Body.Close()
			codes[i] = r.StatusCode
		}()
	}
	wg.Wait()
	ok := 0
	for i, c := range codes {
		if c != 200 && c != 429 {
			t.Fatalf("batch request %d: %d (all %v)", i, c, codes)
		}
		if c == 200 {
			ok++
		}
	}
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	if ok == 0 || strings.Contains(metrics, `pdlb_admission_requests_total{class="batch",decision="deferred"} 0`) ||
		!strings.Contains(metrics, `pdlb_admission_waiting{class="batch"} 0`) {
		t.Fatalf("batch codes %v; want some served and some deferred, none left waiting:\n%s", codes, metrics)
	}
	if resp, b := postWith(t, s, chat("s", "hi", 2, false), "x-priority", "urgent"); resp.StatusCode != 400 || !strings.Contains(b, "x-priority") {
		t.Fatalf("unknown priority: %d %s", resp.StatusCode, b)
	}
}

// batchGateway is a gateway on front end fe with admission on, over one
// sim pod prefilling 2,000 tokens/s that the gateway first believes does
// gatewaySpeed; batch requests wait up to a minute for a TTFT of slo
// seconds.
func batchGateway(t *testing.T, fe string, gatewaySpeed, slo float64) (*sim.Pod, *lb.Server) {
	t.Helper()
	pod := physicsPod(t, "slow", 1, func(p *sim.Physics) { p.PrefillTokensPerSec = 2000 })
	s := testGateway(t, []config.Pod{{Name: "slow", Model: "m", Address: pod.Addr(), PrefillTokensPerSec: gatewaySpeed}}, func(c *config.Config) {
		c.Frontend = fe
		c.Admission.Enabled = true
		c.Admission.Batch.TTFTSLO = slo
		c.Admission.Batch.MaxWait = 60
	})
	return pod, s
}

// sendBatch sends body as a batch-class completion on a connection of its
// own, for the caller to close.
func sendBatch(t *testing.T, s *lb.Server, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Priority: batch\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return c
}

// TestDeferredClientLeaves: a batch request waiting for admission whose
// client leaves gives its queue slot up at once, on both front ends (gnet's
// loop sees the client go, fasthttp's waiter watches its connection),
// instead of holding it to the end of its wait and then going to a pod for
// nobody.
func TestDeferredClientLeaves(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) { testDeferredClientLeaves(t, fe) })
	}
}

func testDeferredClientLeaves(t *testing.T, fe string) {
	pod, s := batchGateway(t, fe, 2000, 0.5)
	// ~1,600 tokens: 0.8 s of prefill, so the prediction never clears.
	c := sendBatch(t, s, chat(strings.Repeat("x", 6400), "hi", 2, false))
	waiting := func() float64 { return metricValue(t, s, `pdlb_admission_waiting{class="batch"}`) }
	testwait.For(t, "the request to wait for admission", func() bool { return waiting() == 1 })
	c.Close()
	testwait.For(t, "its slot to be given up", func() bool { return waiting() == 0 })
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_requests_total{model="m",code="499"}`); n != 1 {
		t.Fatalf("%v requests counted 499, want 1", n)
	}
	if st := pod.Stats(); st.PromptTokens != 0 {
		t.Fatalf("the request of a client that left reached the pod: %+v", st)
	}
}

// TestAdmittedClientLeaves: a request admission deferred, then admitted,
// goes to its pod from a worker (gnet); a client that leaves during its
// prefill has the pod abort it there too.
func TestAdmittedClientLeaves(t *testing.T) {
	// The gateway starts from half the pod's prefill speed: a request
	// waiting behind another is predicted to miss its target until the
	// first prefill ends sooner than predicted.
	pod, s := batchGateway(t, "gnet", 1000, 1.3)
	// First a long stream of ~1,000 tokens of prompt (0.5 s of prefill);
	// then a batch request of ~600 (0.3 s), predicted to wait 1.6 s in all,
	// which is admitted once that prefill is done (its first token out).
	first := make(chan struct{})
	go func() {
		defer close(first)
		resp, b := post(t, s, "/v1/chat/completions", chat(strings.Repeat("w", 4000), "hi", 100, true))
		if resp.StatusCode != 200 {
			t.Errorf("the first request: %d %s", resp.StatusCode, b)
		}
	}()
	testwait.For(t, "the first prefill to start", func() bool { return pod.Stats().Running == 1 })
	c := sendBatch(t, s, chat(strings.Repeat("z", 2400), "hi", 2, false))
	testwait.For(t, "the batch request to be admitted and reach the pod", func() bool { return pod.Stats().Running == 2 })
	c.Close()
	testwait.For(t, "the pod to abort it", func() bool { return pod.Stats().Aborted == 1 })
	<-first
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_requests_total{model="m",code="499"}`); n != 1 {
		t.Fatalf("%v requests counted 499, want 1", n)
	}
	if n := metricValue(t, s, `pdlb_admission_requests_total{class="batch",decision="deferred"}`); n != 1 {
		t.Fatalf("%v batch requests deferred, want 1: the test did not take the path it is for", n)
	}
}

func TestAdmissionLearnsTPOT(t *testing.T) { bothClients(t, testAdmissionLearnsTPOT) }

func testAdmissionLearnsTPOT(t *testing.T, via *http.Client) {
	// A pod whose decode steps take 0.2 s against a 0.1 s TPOT target: the
	// first streams teach the gateway its step time, after which requests
	// are refused before any upstream work.
	pod := physicsPod(t, "slow-decode", 10, func(p *sim.Physics) { p.DecodeBaseSec = 0.2 })
	s := testGateway(t, []config.Pod{{Name: "slow-decode", Model: "m", Address: pod.Addr()}}, func(c *config.Config) {
		c.Admission.Enabled = true
		// Wall time is sim time over the speedup, so the gateway sees
		// 20 ms steps: the target is scaled alike, and sits above what
		// the untaught line predicts (about 10 ms).
		c.Admission.Interactive.TPOTSLO = 0.015
	})
	rejected, served := false, 0
	for i := 0; i < 10 && !rejected; i++ {
		resp, b := postVia(t, via, s, "/v1/chat/completions", chat("s", fmt.Sprint("q", i), 8, true))
		switch resp.StatusCode {
		case 200:
			served++
		case 429:
			if !strings.Contains(b, "time per output token") {
				t.Fatalf("refused for another reason: %s", b)
			}
			rejected = true
		default:
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	if !rejected || served == 0 {
		t.Fatalf("%d streams served at 20 ms per token against a 15 ms target before one was refused (refused: %v); the first must pass, a later one must not", served, rejected)
	}
}

// physicsPod starts one sim pod of model "m" whose timing model tune
// adjusts.
func physicsPod(t *testing.T, name string, speedup float64, tune func(*sim.Physics)) *sim.Pod {
	t.Helper()
	physics := sim.DefaultPhysics()
	tune(&physics)
	pod, err := sim.Start(sim.Config{Name: name, Model: "m", Listen: "127.0.0.1:0", Speedup: speedup, Physics: physics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	return pod
}

// TestAdmissionCountsEveryChoice: a request's n choices of each of its
// prompts join the decode batch as sequences of their own, each adding
// to the step time: a TPOT target the step at one more sequence meets
// may be missed at forty more.
func TestAdmissionCountsEveryChoice(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
		c.Admission.Enabled = true
		// The untaught line: 10 ms a step and 0.2 ms a sequence, so
		// 10.2 ms at one sequence and 18 ms at forty. Whole answers
		// teach it nothing.
		c.Admission.Interactive.TPOTSLO = 0.015
	})
	f := func(path, body string, status int) {
		t.Helper()
		resp, b := post(t, s, path, body)
		if resp.StatusCode != status || status == 429 && !strings.Contains(b, "time per output token") {
			t.Errorf("%s: %d %.120s, want %d", body, resp.StatusCode, b, status)
		}
	}
	f("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, 200)
	f("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"n":40}`, 429)
	f("/v1/completions", `{"model":"m","prompt":["a","b","c","d","e","f","g","h","i","j"],"max_tokens":2,"n":4}`, 429)
	f("/v1/completions", `{"model":"m","prompt":["a","b"],"max_tokens":2,"n":2}`, 200)
}

// TestAdmissionCountsChoicesInFlight: the choices of a request already
// running are sequences of the decode batch too, as the engine's running
// gauge counts them; before the next scrape (none here) the gateway's own
// count must say so.
func TestAdmissionCountsChoicesInFlight(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.Admission.Enabled = true
		c.Health.MetricsInterval = 0
		// The untaught line (10 ms a step, 0.2 ms a sequence): 14 ms
		// for the twenty choices alone, 15.2 ms with six more.
		c.Admission.Interactive.TPOTSLO = 0.015
	})
	resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"long"}],"max_tokens":2000,"n":20,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the twenty choices: %d, want 200", resp.StatusCode)
	}
	bufio.NewReader(resp.Body).ReadString('\n') // the stream is under way
	if got := sims[0].Stats().Running; got != 20 {
		t.Fatalf("the engine runs %d sequences, want 20", got)
	}
	over, b := post(t, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"n":6}`)
	if over.StatusCode != 429 || !strings.Contains(b, "time per output token") {
		t.Errorf("six more choices beside twenty: %d %.120s, want 429", over.StatusCode, b)
	}
}

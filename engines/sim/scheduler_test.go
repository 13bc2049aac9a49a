package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

// metricValue returns the value of the series whose line starts with
// prefix (name and labels) in a Prometheus text exposition.
func metricValue(t *testing.T, text []byte, prefix string) float64 {
	t.Helper()
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			var v float64
			if _, err := fmt.Sscan(line[len(prefix)+1:], &v); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no series %s in\n%s", prefix, text)
	return 0
}

func TestPrefixCacheHitShortensTTFT(t *testing.T) {
	// A 20,000-token prompt takes 1 s of simulated prefill, 200 ms at
	// speedup 5; the second time all but its last partial block is cached.
	p := testPod(t, Config{Model: "m", Speedup: 5})
	c := testClient(t)
	content := strings.Repeat("0123456789abcdef", 5000)
	prompt := chatTokens(content)
	body := chatBody(content, map[string]any{"stream": true, "max_tokens": 2})
	l := `{model_name="m",engine="0"}`
	// ttft streams body and returns when its first token came and the sum
	// of the pod's simulated TTFTs so far.
	ttft := func() (time.Duration, float64) {
		_, events := stream(t, c, context.Background(), "http://"+p.Addr()+"/v1/chat/completions", body)
		parseChunks(t, events)
		_, text := get(t, c, "http://"+p.Addr()+"/metrics")
		return events[0].at, metricValue(t, text, "vllm:time_to_first_token_seconds_sum"+l)
	}
	cold, coldSim := ttft()
	_, sum := ttft()
	// The pod paces a prefill in wall time, so the cold first token comes
	// no sooner; a warm one comes as soon as the machine lets it, which
	// under load is no measure of the cache: its simulated TTFT, exact
	// whatever the load, is.
	if cold < 150*time.Millisecond {
		t.Fatalf("cold TTFT %v: the prefill was not paced", cold)
	}
	hits := len(prompt) / DefaultBlockSize * DefaultBlockSize
	if want := DefaultPhysics().PrefillSec(len(prompt)); math.Abs(coldSim-want) > 1e-6 {
		t.Fatalf("cold simulated TTFT %v s, want the whole prefill's %v s", coldSim, want)
	}
	if warmSim, want := sum-coldSim, DefaultPhysics().PrefillSec(len(prompt)-hits); math.Abs(warmSim-want) > 1e-6 {
		t.Fatalf("warm simulated TTFT %v s, want the uncached %d tokens' %v s: the cache did not help", warmSim, len(prompt)-hits, want)
	}
	_, text := get(t, c, "http://"+p.Addr()+"/metrics")
	if got := metricValue(t, text, "vllm:prefix_cache_hits_total"+l); got != float64(hits) {
		t.Fatalf("prefix_cache_hits_total = %v, want %d", got, hits)
	}
	if got := metricValue(t, text, "vllm:prefix_cache_queries_total"+l); got != float64(2*len(prompt)) {
		t.Fatalf("prefix_cache_queries_total = %v, want %d", got, 2*len(prompt))
	}
	if got := metricValue(t, text, "vllm:prompt_tokens_total"+l); got != float64(2*len(prompt)) {
		t.Fatalf("prompt_tokens_total = %v, want %d", got, 2*len(prompt))
	}
}

func TestMetricNames(t *testing.T) {
	want := map[engines.Kind][]string{
		engines.VLLM: {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
			"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
			"vllm:generation_tokens_total", `vllm:request_success_total{model_name="m",engine="0",finished_reason="length"}`,
			"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
			"vllm:e2e_request_latency_seconds_bucket", `le="2560"`},
		engines.SGLang: {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
			"sglang:gen_throughput", "sglang:cache_hit_rate", "sglang:prompt_tokens_total",
			"sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_bucket",
			"sglang:inter_token_latency_seconds_bucket", `le="400"`},
	}
	for eng, names := range want {
		p := testPod(t, Config{Model: "m", Engine: eng, Speedup: fast})
		c := testClient(t)
		if status, body := post(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": "count me", "max_tokens": 4}); status != 200 {
			t.Fatalf("%s: %d %s", eng, status, body)
		}
		_, text := get(t, c, "http://"+p.Addr()+"/metrics")
		for _, n := range names {
			if !bytes.Contains(text, []byte(n)) {
				t.Errorf("%s: /metrics lacks %s", eng, n)
			}
		}
		// The gateway's scraper reads it.
		load, ok := engines.ParseMetrics(eng, text)
		if !ok || load.Running != 0 || load.Waiting != 0 || load.GeneratedTokens != 4 {
			t.Errorf("%s: ParseMetrics = %+v, %v", eng, load, ok)
		}
	}

	p := testPod(t, Config{Engine: engines.TRTLLM, Speedup: fast})
	c := testClient(t)
	post(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": "count me", "max_tokens": 4})
	_, body := get(t, c, "http://"+p.Addr()+"/metrics")
	var stats []map[string]any
	if err := json.Unmarshal(body, &stats); err != nil || len(stats) != 1 {
		t.Fatalf("trtllm /metrics: %v %s", err, body)
	}
	kv, _ := stats[0]["kvCacheStats"].(map[string]any)
	if stats[0]["numActiveRequests"] != 0.0 || stats[0]["numCompletedRequests"] != 1.0 || stats[0]["iter"] != 3.0 ||
		kv["maxNumBlocks"] != float64(DefaultCacheBlocks) || kv["tokensPerBlock"] != float64(DefaultBlockSize) {
		t.Fatalf("trtllm /metrics: %s", body)
	}
}

func TestClientDisconnectFreesSlot(t *testing.T) {
	// One batch slot; a 10,000-token answer would hold it for 100 s.
	phys := DefaultPhysics()
	phys.MaxBatch = 1
	p := testPod(t, Config{Physics: phys, Speedup: 1})
	c := testClient(t)
	base := "http://" + p.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"prompt": "never ending", "stream": true, "max_tokens": 10000})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	// A non-streaming request queued behind it gives up too: its client
	// leaves once the pod has it waiting (a fixed timeout could pass
	// before the pod read it, on a loaded machine, and nothing would be
	// aborted).
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	qb, _ := json.Marshal(map[string]any{"prompt": "queued", "max_tokens": 3})
	qreq, _ := http.NewRequestWithContext(qctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(qb))
	queued := make(chan error, 1)
	go func() {
		_, err := c.Do(qreq)
		queued <- err
	}()
	testwait.For(t, "the request to queue", func() bool { return p.Stats().Waiting == 1 })
	qcancel()
	if err := <-queued; err == nil {
		t.Fatal("queued request answered while the slot was taken")
	}
	testwait.For(t, "the queued request to be aborted", func() bool { return p.Stats().Aborted == 1 && p.Stats().Waiting == 0 })
	if s := p.Stats(); s.Running != 1 {
		t.Fatalf("stats %+v: the streaming request should still hold the slot", s)
	}
	cancel()
	resp.Body.Close()
	testwait.For(t, "the streaming request to be aborted", func() bool { return p.Stats().Aborted == 2 && p.Stats().Running == 0 })
	if s := p.Stats(); s.UsedBlocks != 0 {
		t.Fatalf("stats %+v: blocks not freed", s)
	}
	start := time.Now()
	if status, body := post(t, c, base+"/v1/completions", map[string]any{"prompt": "next", "max_tokens": 3}); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("next request took %v", d)
	}
}

// firstChunkThen starts a long stream, runs action after its first chunk and
// returns the rest of the stream's events.
func firstChunkThen(t *testing.T, c *http.Client, url string, body map[string]any, action func()) []sseEvent {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first line %q: %v", first, err)
	}
	if blank, err := br.ReadString('\n'); blank != "\n" || err != nil {
		t.Fatalf("line after the first event %q: %v", blank, err)
	}
	action()
	return append([]sseEvent{{data: []byte(strings.TrimSpace(first[len("data: "):]))}}, readSSE(t, br, time.Now())...)
}

func TestSGLangAbortRequest(t *testing.T) {
	p := testPod(t, Config{Engine: engines.SGLang, Speedup: 1})
	c := testClient(t)
	base := "http://" + p.Addr()
	events := firstChunkThen(t, c, base+"/v1/chat/completions",
		chatBody("abort me", map[string]any{"stream": true, "max_tokens": 10000, "rid": "req-42"}), func() {
			if status, body := post(t, c, base+"/abort_request", map[string]any{"rid": "req-42"}); status != 200 {
				t.Fatalf("abort_request: %d %s", status, body)
			}
		})
	if _, finish := streamedText(parseChunks(t, events)); finish != "abort" {
		t.Fatalf("finish_reason %q, want abort", finish)
	}
	var info map[string]any
	_, body := get(t, c, base+"/get_server_info")
	if err := json.Unmarshal(body, &info); err != nil || info["served_model_name"] != DefaultModel || info["max_running_requests"] != float64(DefaultMaxBatch) {
		t.Fatalf("get_server_info: %v %s", err, body)
	}
}

// TestSGLangAbortByPrefix: as SGLang, an abort drops every request whose
// rid starts with the one it names (its scheduler's match), but only a
// rid some request holds is passed on (its tokenizer manager's check): a
// mere prefix drops none.
func TestSGLangAbortByPrefix(t *testing.T) {
	p := testPod(t, Config{Engine: engines.SGLang, Speedup: 1})
	c := testClient(t)
	base := "http://" + p.Addr()
	stream := func(rid string) chan string {
		end := make(chan string, 1)
		b, _ := json.Marshal(chatBody("abort me", map[string]any{"stream": true, "max_tokens": 10000, "rid": rid}))
		go func() {
			resp, err := c.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				end <- err.Error()
				return
			}
			all, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			end <- string(all)
		}()
		return end
	}
	ended := func(name string, end chan string) {
		t.Helper()
		select {
		case got := <-end:
			if !strings.Contains(got, `"finish_reason":"abort"`) {
				t.Fatalf("%s: %s, want it aborted", name, got)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: still running 20 s after the abort", name)
		}
	}
	abort := func(rid string) {
		t.Helper()
		if status, body := post(t, c, base+"/abort_request", map[string]any{"rid": rid}); status != 200 {
			t.Fatalf("abort_request %s: %d %s", rid, status, body)
		}
	}
	one, ten, other := stream("job-1"), stream("job-10"), stream("other")
	testwait.For(t, "three streams running", func() bool { return p.Stats().Running == 3 })
	// Taken in order: by the time "other" ended, "job" was passed over.
	abort("job")
	abort("other")
	ended("other", other)
	if n := p.Stats().Running; n != 2 {
		t.Fatalf("%d requests run after an abort of a prefix no request holds, want 2", n)
	}
	abort("job-1")
	ended("job-1", one)
	ended("job-10, which job-1 is a prefix of", ten)
}

func TestCloseAbortsStreams(t *testing.T) {
	p := testPod(t, Config{Speedup: 1})
	c := testClient(t)
	events := firstChunkThen(t, c, "http://"+p.Addr()+"/v1/completions",
		map[string]any{"prompt": "interrupted", "stream": true, "max_tokens": 10000}, func() {
			go p.Close()
		})
	if _, finish := streamedText(parseChunks(t, events)); finish != "abort" {
		t.Fatalf("finish_reason %q, want abort", finish)
	}
}

// TestAFullHitComputesTheLastBlock: a prompt found whole in the cache still
// computes its last token for the logits, and the hit is whole blocks, so
// a block-aligned prompt sent again computes its last block: vLLM's
// max_cache_hit_length = num_tokens - 1 (KVCacheManager.get_computed_blocks),
// SGLang's max_prefix_len = input_len - 1, page-aligned.
func TestAFullHitComputesTheLastBlock(t *testing.T) {
	const bs = 16
	phys := DefaultPhysics()
	phys.BlockSize = bs
	tokens := make([]int, 2*bs)
	for i := range tokens {
		tokens[i] = 100 + i
	}
	body := map[string]any{"prompt": tokens, "max_tokens": 1}
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang} {
		p := testPod(t, Config{Engine: engine, Model: "m", Physics: phys, Speedup: fast})
		c := testClient(t)
		url := "http://" + p.Addr() + "/v1/completions"
		post(t, c, url, body)
		post(t, c, url, body)
		if hit := p.Stats().HitTokens; hit != bs {
			t.Fatalf("%s: %d tokens hit, want the first block's %d", engine, hit, bs)
		}
		if engine != engines.VLLM {
			continue
		}
		// Simulated TTFTs, exact on an idle pod: the whole prompt, then
		// its last block.
		_, text := get(t, c, "http://"+p.Addr()+"/metrics")
		sum := metricValue(t, text, `vllm:time_to_first_token_seconds_sum{model_name="m",engine="0"}`)
		if want := phys.PrefillSec(2*bs) + phys.PrefillSec(bs); math.Abs(sum-want) > 1e-9 {
			t.Fatalf("time_to_first_token_seconds_sum = %v, want %v", sum, want)
		}
	}
}

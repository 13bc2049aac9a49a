package sim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/vllm"
	"pdlb/internal/testwait"
)

// TestDataParallelRanksCacheApart: a pod of two data-parallel ranks sends
// requests to them in turn; each rank caches alone and publishes its own
// events, and a cache reset clears both.
func TestDataParallelRanksCacheApart(t *testing.T) {
	const bs = 16
	phys := DefaultPhysics()
	phys.BlockSize = bs
	sinks := []*recordingSink{{}, {}}
	p := testPod(t, Config{Model: "m", Physics: phys, Speedup: fast, DataParallelSize: 2, KVEvents: sinks[0], RankKVEvents: []KVEventSink{sinks[1]}})
	c := testClient(t)
	url := "http://" + p.Addr() + "/v1/completions"
	// A token past four blocks: a hit computes none of them again (see
	// TestKVEventsCopyABlockComputedAgain).
	tokens := make([]uint32, 4*bs+1)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	// send posts the prompt and returns the tokens found cached and the
	// blocks each rank published as stored.
	send := func() (hit int64, stored [2]int) {
		t.Helper()
		before := p.Stats().HitTokens
		if status, b := post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": 1}); status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		for r, s := range sinks {
			for _, e := range s.take() {
				stored[r] += len(e.hashes)
			}
		}
		return p.Stats().HitTokens - before, stored
	}
	for i, want := range []struct {
		hit    int64
		stored [2]int
	}{
		{0, [2]int{4, 0}},      // rank 0 computes the prompt
		{0, [2]int{0, 4}},      // rank 1 has its own cache
		{4 * bs, [2]int{0, 0}}, // rank 0 again: a hit
		{4 * bs, [2]int{0, 0}}, // rank 1 again
	} {
		if hit, stored := send(); hit != want.hit || stored != want.stored {
			t.Fatalf("request %d: %d tokens hit, blocks stored by rank %v; want %d, %v", i, hit, stored, want.hit, want.stored)
		}
	}
	if status, _ := post(t, c, "http://"+p.Addr()+"/reset_prefix_cache", map[string]any{}); status != 200 {
		t.Fatalf("reset_prefix_cache: %d", status)
	}
	// The reset is queued to the scheduler: a request after it follows it.
	if status, b := post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": 1}); status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	for r, s := range sinks {
		if got := s.take(); len(got) == 0 || got[0].kind != "cleared" {
			t.Fatalf("rank %d after a reset: %v, want a clear first", r, got)
		}
	}
}

// TestFleetDataParallelPod: a pod of two ranks publishes each rank's
// events on kv_events' ports + its rank, its replay socket after them.
func TestFleetDataParallelPod(t *testing.T) {
	fc, err := ParseFleet([]byte("pods:\n  - kv_events: tcp://127.0.0.1:7000\n    data_parallel_size: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c, ev := fc.Pods[0], fc.Events[0]; c.DataParallelSize != 2 || ev.ReplayEndpoint != "tcp://127.0.0.1:7002" {
		t.Fatalf("data_parallel_size %d, replay %q; want 2, tcp://127.0.0.1:7002", c.DataParallelSize, ev.ReplayEndpoint)
	}
	fc, err = ParseFleet([]byte("pods:\n  - listen: 127.0.0.1:0\n    kv_events: tcp://127.0.0.1:0\n    data_parallel_size: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	fl, err := StartFleet(fc)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	var got [2]storedBlocks
	for r := range got {
		sub, err := vllm.NewSubscriber(vllm.SubscriberConfig{Endpoint: fl.Publisher(0).Endpoint(), ReplayEndpoint: fl.Publisher(0).ReplayEndpoint(),
			DataParallelRank: int64(r)}, &got[r])
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
	}
	c := testClient(t)
	// Requests take the ranks in turn; ZMQ drops what is published before
	// a subscription is in place, so send until both ranks' blocks arrive.
	deadline := time.Now().Add(10 * time.Second)
	for got[0].n.Load() == 0 || got[1].n.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("blocks stored by rank 0: %d, by rank 1: %d", got[0].n.Load(), got[1].n.Load())
		}
		body := chatBody(strings.Repeat("a long enough prompt to fill blocks ", 8)+time.Now().String(), map[string]any{"max_tokens": 1})
		if status, b := post(t, c, "http://"+fl.Pods()[0].Addr()+"/v1/chat/completions", body); status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dataParallelPod starts a pod of two ranks of 100 blocks of 16 tokens
// each, whose decode steps take a simulated second, so what requests hold
// does not move while a test looks.
func dataParallelPod(t *testing.T, engine engines.Kind) *Pod {
	t.Helper()
	phys := DefaultPhysics()
	phys.BlockSize = 16
	phys.CacheBlocks = 100
	phys.DecodeBaseSec = 1
	return testPod(t, Config{Model: "m", Engine: engine, Physics: phys, Speedup: 1, MaxModelLen: 1600, DataParallelSize: 2})
}

// TestDataParallelRanksHaveKVRoomEach: each data-parallel rank is an
// engine core of its own, with a KV cache of cache_blocks (vLLM's
// EngineCore per DP rank, SGLang's scheduler per dp_rank), so a pod of two
// ranks of 100 blocks runs two requests of 71 blocks at once, one a rank.
func TestDataParallelRanksHaveKVRoomEach(t *testing.T) {
	p := dataParallelPod(t, engines.VLLM)
	c := testClient(t)
	startStream(t, c, p, sharedPrefixPrompt(0)) // rank 0
	b, _ := json.Marshal(map[string]any{"prompt": tokenRange(50000, 64*16+8), "stream": true, "max_tokens": 100})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.Addr()+"/v1/completions", bytes.NewReader(b))
	go func() { // rank 1
		if resp, err := c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	testwait.For(t, "two requests", func() bool { s := p.Stats(); return s.Running+s.Waiting == 2 })
	if s := p.Stats(); s.Running != 2 || s.Waiting != 0 {
		t.Fatalf("stats %+v: want 2 running, one on each rank", s)
	}
}

// tokenRange is n token ids from first on.
func tokenRange(first, n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(first + i)
	}
	return ids
}

// TestDataParallelRankGauges: the load gauges of a pod of two ranks come
// one series a rank, each its rank's own, as the engines export them:
// vLLM's under engine="<rank>" (PrometheusStatLogger's per-engine
// labels), SGLang's schedulers' under dp_rank="<rank>". The gateway's
// scraper adds up the requests and averages the ranks' KV usage.
func TestDataParallelRankGauges(t *testing.T) {
	for _, tc := range []struct {
		engine       engines.Kind
		running, kv  string // metric names
		rank0, rank1 string // label sets
	}{
		{engines.VLLM, "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
			`{model_name="m",engine="0"}`, `{model_name="m",engine="1"}`},
		{engines.SGLang, "sglang:num_running_reqs", "sglang:token_usage",
			`{model_name="m",tp_rank="0",dp_rank="0"}`, `{model_name="m",tp_rank="0",dp_rank="1"}`},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			p := dataParallelPod(t, tc.engine)
			c := testClient(t)
			// The ranks take requests in turn: rank 0 runs prompts of 11
			// and 31 blocks, rank 1 one of 21.
			for i := range 3 {
				startStream(t, c, p, tokenRange(100000*(i+1), 16*(10+10*i)+8))
			}
			_, text := get(t, c, "http://"+p.Addr()+"/metrics")
			if r0, r1 := metricValue(t, text, tc.running+tc.rank0), metricValue(t, text, tc.running+tc.rank1); r0 != 2 || r1 != 1 {
				t.Fatalf("running: rank 0 %v, rank 1 %v; want 2, 1\n%s", r0, r1, text)
			}
			// Their first tokens fit in the prompts' last blocks.
			kv0, kv1 := metricValue(t, text, tc.kv+tc.rank0), metricValue(t, text, tc.kv+tc.rank1)
			if kv0 != 0.42 || kv1 != 0.21 {
				t.Fatalf("KV usage: rank 0 %v, rank 1 %v; want 0.42, 0.21", kv0, kv1)
			}
			load, ok := engines.ParseMetrics(tc.engine, text)
			if !ok || load.Running != 3 || load.KVUsage != (kv0+kv1)/2 {
				t.Fatalf("ParseMetrics = %+v, %v: want 3 running, KV usage %v", load, ok, (kv0+kv1)/2)
			}
		})
	}
}

// TestFleetRankPortsRefused: a fleet file whose ranks' KV-event ports run
// past 65535 or into their replay sockets' is refused at load naming the
// setting, as a serve config is, rather than failing to bind at start.
func TestFleetRankPortsRefused(t *testing.T) {
	f := func(pod, want string) {
		t.Helper()
		_, err := ParseFleet([]byte("pods:\n  - " + pod + "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want %q", pod, err, want)
		}
	}
	f("{kv_events: tcp://127.0.0.1:7000, kv_replay: tcp://127.0.0.1:7001, data_parallel_size: 2}",
		`pods[0].kv_replay = "tcp://127.0.0.1:7001" puts the replay sockets of ranks 0 to 1 on ports 7001 to 7002`)
	f("{kv_events: tcp://127.0.0.1:65535, kv_replay: tcp://127.0.0.1:6000, data_parallel_size: 2}",
		"pods[0].data_parallel_size = 2 puts rank 1's KV events on port 65536")
}

// rankSeries is the label set of rank r's gauges on a pod of two ranks of
// engine k whose model is "m".
func rankSeries(k engines.Kind, r int) string {
	if k == engines.SGLang {
		return fmt.Sprintf(`{model_name="m",tp_rank="0",dp_rank="%d"}`, r)
	}
	return fmt.Sprintf(`{model_name="m",engine="%d"}`, r)
}

// rankRunning scrapes p's /metrics and returns the running requests of
// each of its two ranks.
func rankRunning(t *testing.T, c *http.Client, p *Pod) [2]float64 {
	t.Helper()
	name := "vllm:num_requests_running"
	if p.Config().Engine == engines.SGLang {
		name = "sglang:num_running_reqs"
	}
	_, text := get(t, c, "http://"+p.Addr()+"/metrics")
	return [2]float64{metricValue(t, text, name+rankSeries(p.Config().Engine, 0)), metricValue(t, text, name+rankSeries(p.Config().Engine, 1))}
}

// TestDataParallelRankChoice: a request goes to the rank the engine's API
// server picks. vLLM's (DPLBAsyncMPClient.get_core_engine_for_request)
// takes the rank of fewest waiting plus running requests, ties in turn;
// SGLang's DataParallelController goes round robin by default. Rank 0
// runs a long stream and rank 1 a request that ends at once: the third
// request goes to the idle rank 1 on vLLM, to rank 0 on SGLang.
func TestDataParallelRankChoice(t *testing.T) {
	for _, tc := range []struct {
		engine engines.Kind
		want   [2]float64
	}{
		{engines.VLLM, [2]float64{1, 1}},
		{engines.SGLang, [2]float64{2, 0}},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			p := dataParallelPod(t, tc.engine)
			c := testClient(t)
			startStream(t, c, p, tokenRange(1000, 40))
			if status, b := post(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": tokenRange(2000, 40), "max_tokens": 1}); status != 200 {
				t.Fatalf("%d %s", status, b)
			}
			startStream(t, c, p, tokenRange(3000, 40))
			if got := rankRunning(t, c, p); got != tc.want {
				t.Fatalf("running on ranks 0 and 1: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDataParallelRankHeader: X-Data-Parallel-Rank sends a request to the
// rank it names, on vLLM (OpenAIServing._get_data_parallel_rank) and
// SGLang (extract_routed_dp_rank_from_header). A rank the pod lacks is
// refused as vLLM's input processor and SGLang's tokenizer manager refuse
// it; a value that is no integer vLLM ignores and SGLang refuses.
func TestDataParallelRankHeader(t *testing.T) {
	for _, tc := range []struct {
		engine             engines.Kind
		outOfRange, notInt string // "" for no refusal
	}{
		{engines.VLLM, "data_parallel_rank 2 is out of range [0, 2).", ""},
		{engines.SGLang, "routed_dp_rank=2 out of range [0, 2)", "Invalid X-Data-Parallel-Rank header: must be an integer, got 'one'"},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			p := dataParallelPod(t, tc.engine)
			c := testClient(t)
			for i := range 2 {
				startStreamWith(t, c, p, tokenRange(1000*(i+1), 40), onRank("1"))
			}
			if got := rankRunning(t, c, p); got != [2]float64{0, 2} {
				t.Fatalf("running on ranks 0 and 1: %v, want [0 2]", got)
			}
			for rank, want := range map[string]string{"2": tc.outOfRange, "one": tc.notInt} {
				status, out := postWith(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": tokenRange(5000, 40), "max_tokens": 1}, onRank(rank))
				body := string(out)
				if want == "" && status != 200 || want != "" && (status != 400 || !strings.Contains(body, want)) {
					t.Errorf("X-Data-Parallel-Rank: %s: %d %s; want %q", rank, status, body, cmp.Or(want, "200"))
				}
			}
		})
	}
}

// TestDataParallelRankCounters: vLLM's PrometheusStatLogger keeps every
// counter and histogram per engine (labels model_name and engine), so a
// request served by rank 1 counts under engine="1". SGLang's tokenizer
// manager counts for the pod, while each rank's scheduler reports its own
// cache hit rate and throughput under its dp_rank
// (SchedulerMetricsCollector). The gateway's scraper adds the ranks'
// generated tokens up.
func TestDataParallelRankCounters(t *testing.T) {
	for _, tc := range []struct {
		engine engines.Kind
		want   map[string]float64 // series: value
	}{
		{engines.VLLM, map[string]float64{
			`vllm:prompt_tokens_total{model_name="m",engine="0"}`:                            40,
			`vllm:prompt_tokens_total{model_name="m",engine="1"}`:                            2 * 48,
			`vllm:prefix_cache_queries_total{model_name="m",engine="1"}`:                     2 * 48,
			`vllm:prefix_cache_hits_total{model_name="m",engine="1"}`:                        32,
			`vllm:generation_tokens_total{model_name="m",engine="0"}`:                        1,
			`vllm:generation_tokens_total{model_name="m",engine="1"}`:                        2,
			`vllm:request_success_total{model_name="m",engine="0",finished_reason="length"}`: 1,
			`vllm:request_success_total{model_name="m",engine="1",finished_reason="length"}`: 2,
			`vllm:time_to_first_token_seconds_count{model_name="m",engine="0"}`:              1,
			`vllm:time_to_first_token_seconds_count{model_name="m",engine="1"}`:              2,
			`vllm:e2e_request_latency_seconds_count{model_name="m",engine="1"}`:              2,
			`vllm:nixl_num_failed_transfers_total{model_name="m",engine="1"}`:                0,
		}},
		{engines.SGLang, map[string]float64{
			`sglang:prompt_tokens_total{model_name="m"}`:                    40 + 2*48,
			`sglang:cached_tokens_total{model_name="m"}`:                    32,
			`sglang:num_requests_total{model_name="m"}`:                     3,
			`sglang:cache_hit_rate{model_name="m",tp_rank="0",dp_rank="0"}`: 0,
			`sglang:cache_hit_rate{model_name="m",tp_rank="0",dp_rank="1"}`: 32.0 / (2 * 48),
		}},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			p := dataParallelPod(t, tc.engine)
			c := testClient(t)
			// Rank 0 serves a prompt of 40 tokens, rank 1 one of 48
			// twice, the second time with its two whole blocks cached.
			for _, s := range []struct {
				rank  string
				first int
				n     int
			}{{"0", 1000, 40}, {"1", 2000, 48}, {"1", 2000, 48}} {
				if status, out := postWith(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": tokenRange(s.first, s.n), "max_tokens": 1}, onRank(s.rank)); status != 200 {
					t.Fatalf("%d %s", status, out)
				}
			}
			_, text := get(t, c, "http://"+p.Addr()+"/metrics")
			for series, want := range tc.want {
				if got := metricValue(t, text, series); got != want {
					t.Errorf("%s = %v, want %v", series, got, want)
				}
			}
			if load, _ := engines.ParseMetrics(tc.engine, text); load.GeneratedTokens != 3 {
				t.Errorf("ParseMetrics: %v generated tokens, want 3", load.GeneratedTokens)
			}
		})
	}
}

// TestDataParallelRanksStepApart: each data-parallel rank is an engine
// core of its own, with its own prefill and decode batch (vLLM's
// EngineCore busy loop per DP rank, SGLang's scheduler per dp_rank). Rank
// 0 decodes three requests and prefills a prompt of 2,000 tokens (2 s);
// a request on rank 1 meanwhile prefills at once (TTFT 0.01 s) and
// decodes alone, in steps of 0.11 s, not those of rank 0's batch.
func TestDataParallelRanksStepApart(t *testing.T) {
	phys := DefaultPhysics()
	phys.BlockSize = 16
	phys.PrefillTokensPerSec = 1000
	phys.DecodeBaseSec = 0.01
	phys.DecodePerSeqSec = 0.1
	p := testPod(t, Config{Model: "m", Physics: phys, Speedup: 10, MaxModelLen: 4096, DataParallelSize: 2})
	c := testClient(t)
	for i := range 3 {
		startStreamWith(t, c, p, tokenRange(1000*(i+1), 10), onRank("0"))
	}
	b, _ := json.Marshal(map[string]any{"prompt": tokenRange(10000, 2000), "max_tokens": 1})
	long, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.Addr()+"/v1/completions", bytes.NewReader(b))
	long.Header.Set("X-Data-Parallel-Rank", "0")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := c.Do(long); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	t.Cleanup(func() { <-done })
	testwait.For(t, "rank 0's prefill", func() bool { return p.Stats().Running == 4 })

	if status, out := postWith(t, c, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": tokenRange(50000, 10), "max_tokens": 10}, onRank("1")); status != 200 {
		t.Fatalf("%d %s", status, out)
	}
	_, text := get(t, c, "http://"+p.Addr()+"/metrics")
	for series, want := range map[string]float64{
		`vllm:time_to_first_token_seconds_bucket{model_name="m",engine="1",le="0.02"}`: 1,
		`vllm:inter_token_latency_seconds_bucket{model_name="m",engine="1",le="0.15"}`: 9,
		`vllm:inter_token_latency_seconds_count{model_name="m",engine="1"}`:            9,
	} {
		if got := metricValue(t, text, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestSGLangPrefillRankFollowsRoom: an SGLang prefill pod's
// DataParallelController sends a request to the rank of its bootstrap
// room modulo the ranks (follow_bootstrap_room, the prefill default of
// ServerArgs._handle_load_balance_method), so that its decode side knows
// where the KV is; a request that names its rank goes there. The first
// request, room 3, is rank 1's where round robin would give rank 0; the
// second names rank 0.
func TestSGLangPrefillRankFollowsRoom(t *testing.T) {
	phys := DefaultPhysics()
	phys.BlockSize = 16
	p := testPod(t, Config{Engine: engines.SGLang, Model: "m", Physics: phys, Speedup: fast, Role: RolePrefill, DataParallelSize: 2})
	c := testClient(t)
	host, port, _ := net.SplitHostPort(p.KVXferAddr())
	portN, _ := strconv.Atoi(port)
	used := func(rank int) float64 {
		_, text := get(t, c, "http://"+p.Addr()+"/metrics")
		return metricValue(t, text, "sglang:num_used_tokens"+rankSeries(engines.SGLang, rank))
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for i, s := range []struct {
		room int
		rank string
	}{{3, ""}, {5, "0"}} {
		b, _ := json.Marshal(map[string]any{"prompt": tokenRange(1000*(i+1), 40), "max_tokens": 1,
			"bootstrap_host": host, "bootstrap_port": portN, "bootstrap_room": s.room})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.Addr()+"/v1/completions", bytes.NewReader(b))
		if s.rank != "" {
			req.Header.Set("X-Data-Parallel-Rank", s.rank)
		}
		// The answer waits for a decode pod's pickup, which never comes.
		wg.Go(func() {
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
		testwait.For(t, "the prompt's KV held", func() bool { return p.Stats().HeldKVBlocks == 3*(i+1) })
	}
	if u0, u1 := used(0), used(1); u0 != 48 || u1 != 48 {
		t.Fatalf("tokens in use on ranks 0 and 1: %v, %v; want 48 each", u0, u1)
	}
}

// onRank is the header that sends a request to a data-parallel rank.
func onRank(rank string) http.Header { return http.Header{"X-Data-Parallel-Rank": {rank}} }

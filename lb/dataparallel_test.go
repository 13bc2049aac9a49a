package lb_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/lbtest"
	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
	"pdlb/lb/kvindex"
)

// TestDataParallelPodRanks: a vLLM pod of two data-parallel ranks behind
// one API server (vllm serve --data-parallel-size 2) caches each request on
// the rank that served it, and each rank publishes its KV events on
// kv_events' ports + its rank. With data_parallel_size the gateway follows
// both ranks: a prompt only rank 1 holds is the pod's, and a request that
// repeats it goes there. Without it the gateway follows rank 0 alone and
// never sees the prompt.
func TestDataParallelPodRanks(t *testing.T) {
	for _, ranks := range []int{2, 0} {
		t.Run(map[int]string{2: "data_parallel_size=2", 0: "unset"}[ranks], func(t *testing.T) {
			pubs := rankPublishers(t)
			dp, err := sim.Start(sim.Config{Name: "dp", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DataParallelSize: 2,
				KVEvents: pubs[0], RankKVEvents: []sim.KVEventSink{pubs[1]}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dp.Close() })
			pods := append([]config.Pod{{Name: "dp", Model: "m", Address: dp.Addr(), KVEvents: pubs[0].Endpoint(), KVReplay: pubs[0].ReplayEndpoint(),
				DataParallelSize: ranks}}, podsOf("m", testFleet(t, "m", 1, 100)...)...)
			s := testGateway(t, pods, func(c *config.Config) { c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}} })

			// Straight to the pod, whose idle ranks take requests in
			// turn: the first prompt is rank 0's, the second rank 1's.
			first, second := tokenIDs(1000, 256), tokenIDs(5000, 256)
			for _, ids := range [][]int{first, second} {
				resp, err := client.Post("http://"+dp.Addr()+"/v1/completions", "application/json", strings.NewReader(completionOfIDs(ids)))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("pod: %d", resp.StatusCode)
				}
			}
			// A subscription that came late catches up at the next batch
			// of its rank; removing a block no rank holds is one.
			settled := func(ids []int) bool {
				for _, p := range pubs {
					p.BlockRemoved([]uint64{1})
				}
				time.Sleep(10 * time.Millisecond)
				return indexMatch(t, s, "m", ids)["dp"] == len(ids)
			}
			testwait.For(t, "rank 0's blocks in the index", func() bool { return settled(first) })
			if ranks == 0 {
				if n := indexMatch(t, s, "m", second)["dp"]; n != 0 {
					t.Fatalf("rank 1's prompt matches %d tokens on the pod without data_parallel_size", n)
				}
				return
			}
			testwait.For(t, "rank 1's blocks in the index", func() bool { return settled(second) })
			if c := metricValue(t, s, `pdlb_kv_feed_connected_ranks{pod="dp"}`); c != 2 {
				t.Fatalf("pdlb_kv_feed_connected_ranks of a pod of 2 ranks both followed = %v, want 2", c)
			}
			repeat := append(second, tokenIDs(9000, 32)...)
			resp, b := post(t, s, "/v1/completions", completionOfIDs(repeat))
			if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "dp" {
				t.Fatalf("the repeat went to %q (%d %s), want dp, whose rank 1 holds its prefix", resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b)
			}
		})
	}
}

// tokenIDs returns n token ids from first on.
func tokenIDs(first, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = first + i
	}
	return ids
}

// completionOfIDs is a completion body for model m whose prompt is ids.
func completionOfIDs(ids []int) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 1})
	return string(b)
}

// indexMatch asks the gateway's index how many leading tokens of ids each
// pod of model holds (POST /admin/index/match, what pdlb tokenize --admin
// asks).
func indexMatch(t *testing.T, s *lb.Server, model string, ids any) map[string]int {
	t.Helper()
	q, _ := json.Marshal(map[string]any{"model": model, "ids": ids})
	resp, err := client.Post("http://"+s.AdminAddr()+"/admin/index/match", "application/json", strings.NewReader(string(q)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Pods []struct {
			Pod          string
			CachedTokens int `json:"cached_tokens"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	held := map[string]int{}
	for _, p := range out.Pods {
		held[p.Pod] = p.CachedTokens
	}
	return held
}

// TestDataParallelRankFollowsPrefix: conversations of several turns on a
// pod of two data-parallel ranks, each turn's prompt the last one's and
// more. Left to the engine's balancer, which knows loads and no prefixes,
// a turn finds the rank caching its conversation about half the time;
// with X-Data-Parallel-Rank naming the rank the KV events show holding the
// longest prefix, nearly always: the pod's prefix-cache hit rate, by its
// own metrics, is far higher with data_parallel_routing "prefix" than with
// "engine".
func TestDataParallelRankFollowsPrefix(t *testing.T) {
	for _, e := range []struct {
		engine        engines.Kind
		hits, queries string
	}{
		{engines.VLLM, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
		{engines.SGLang, "sglang:cached_tokens_total", "sglang:prompt_tokens_total"},
	} {
		t.Run(string(e.engine), func(t *testing.T) {
			bothClients(t, func(t *testing.T, via *http.Client) {
				rates, pins := map[string]float64{}, map[string]float64{}
				for _, routing := range []string{config.DataParallelByPrefix, config.DataParallelByEngine} {
					dp, s := rankedPod(t, e.engine, routing, nil)
					rates[routing], pins[routing] = conversationHitRate(t, via, dp, s, e.hits, e.queries)
				}
				t.Logf("prefix-cache hit rate: %.3f with data_parallel_routing prefix (%g requests named a rank), %.3f with engine",
					rates["prefix"], pins["prefix"], rates["engine"])
				if rates["prefix"] < rates["engine"]+0.2 {
					t.Errorf("prefix-cache hit rate %.3f naming the rank, %.3f leaving it to the engine; want 0.2 more", rates["prefix"], rates["engine"])
				}
				if pins["prefix"] == 0 || pins["engine"] != 0 {
					t.Errorf("requests that named a rank: %g with data_parallel_routing prefix, %g with engine; want some, none", pins["prefix"], pins["engine"])
				}
			})
		})
	}
}

// TestDataParallelRankNamed: a request names the rank holding its prefix,
// which its explanation shows; a client's own X-Data-Parallel-Rank goes
// to the pod as sent and decides.
func TestDataParallelRankNamed(t *testing.T) {
	dp, s := rankedPod(t, engines.VLLM, config.DataParallelByPrefix, nil)
	rankPrompts := func(rank int) float64 {
		return adminMetric(t, dp.Addr(), fmt.Sprintf(`vllm:prompt_tokens_total{model_name="m",engine="%d"}`, rank))
	}
	turn := func(ids []int, wantRank int, headers ...string) *http.Response {
		t.Helper()
		before, events := rankPrompts(wantRank), kvEventsReceived(t, s, "dp")
		resp, b := send(t, client, s, http.MethodPost, "/v1/completions", completionOfIDs(ids),
			append([]string{"Content-Type", "application/json"}, headers...)...)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if got := rankPrompts(wantRank) - before; got != float64(len(ids)) {
			t.Fatalf("rank %d got %g prompt tokens, want the request's %d", wantRank, got, len(ids))
		}
		testwait.For(t, "the request's KV events", func() bool { return kvEventsReceived(t, s, "dp") > events })
		return resp
	}
	prompt := tokenIDs(7000, 128)
	turn(prompt, 1, "X-Data-Parallel-Rank", "1")
	if n := metricValue(t, s, "pdlb_data_parallel_rank_pins_total"); n != 0 {
		t.Fatalf("%g requests named a rank; the client named its own", n)
	}

	resp := turn(append(prompt, tokenIDs(9000, 64)...), 1, "x-pdlb-debug", "explain")
	var e struct {
		Rank *struct {
			Rank         int `json:"rank"`
			CachedTokens int `json:"cached_tokens"`
			OthersTokens int `json:"others_cached_tokens"`
		} `json:"data_parallel_rank"`
	}
	if err := json.Unmarshal([]byte(resp.Header.Get("x-pdlb-explain")), &e); err != nil || e.Rank == nil ||
		e.Rank.Rank != 1 || e.Rank.CachedTokens != len(prompt) || e.Rank.OthersTokens != 0 {
		t.Fatalf("explained %s (%v); want rank 1 holding %d tokens, the others none", resp.Header.Get("x-pdlb-explain"), err, len(prompt))
	}
	if n := metricValue(t, s, "pdlb_data_parallel_rank_pins_total"); n != 1 {
		t.Fatalf("%g requests named a rank, want 1", n)
	}

	turn(append(prompt, tokenIDs(11000, 64)...), 0, "X-Data-Parallel-Rank", "0")
	if n := metricValue(t, s, "pdlb_data_parallel_rank_pins_total"); n != 1 {
		t.Fatalf("%g requests named a rank, want 1: the client named its own", n)
	}
}

// TestDataParallelBusyRankLeftToEngine: the rank holding a prompt's
// prefix is not named while it has requests waiting and more than twice
// the requests of the pod's other rank (rankBusy): the request goes
// without X-Data-Parallel-Rank, and vLLM's balancer gives it to the idle
// rank, where it starts at once rather than queueing behind a batch. Its
// explanation says why; pdlb_data_parallel_rank_pins_total stays 0.
func TestDataParallelBusyRankLeftToEngine(t *testing.T) {
	// One sequence a rank, each decode step 0.2 s (at speedup 100): rank
	// 1 runs a stream of 5,000 tokens while two more wait, until the test
	// hangs up on them.
	dp, s := rankedPod(t, engines.VLLM, config.DataParallelByPrefix, func(c *sim.Config) {
		c.Physics = sim.DefaultPhysics()
		c.Physics.MaxBatch, c.Physics.DecodeBaseSec = 1, 20
	})
	ctx, hangUp := context.WithCancel(context.Background())
	var held sync.WaitGroup
	t.Cleanup(func() { hangUp(); held.Wait() })
	for i := range 3 {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": tokenIDs(200_000+1000*i, 64), "max_tokens": 5000, "stream": true})
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+dp.Addr()+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Data-Parallel-Rank", "1")
		held.Add(1)
		go func() {
			defer held.Done()
			if resp, err := client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	// The gateway's last scrape shows them: rank 0 has none.
	testwait.For(t, "rank 1's one running and two waiting in the gateway's scrape", func() bool {
		var view struct {
			Pods []struct {
				Metrics *struct{ Running, Waiting float64 }
			}
		}
		if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/pods")), &view); err != nil {
			t.Fatal(err)
		}
		m := view.Pods[0].Metrics
		return m != nil && m.Running == 1 && m.Waiting == 2
	})

	rankPrompts := func(rank int) float64 {
		return adminMetric(t, dp.Addr(), fmt.Sprintf(`vllm:prompt_tokens_total{model_name="m",engine="%d"}`, rank))
	}
	before0, before1 := rankPrompts(0), rankPrompts(1)
	// Rank 1 holds the first 64 tokens (rankedPod's prompt for it).
	ids := append(tokenIDs(101_000, 64), tokenIDs(9000, 64)...)
	resp, b := send(t, client, s, http.MethodPost, "/v1/completions", completionOfIDs(ids),
		"Content-Type", "application/json", "x-pdlb-debug", "explain")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var e struct {
		Rank *struct {
			Rank         int  `json:"rank"`
			CachedTokens int  `json:"cached_tokens"`
			Busy         bool `json:"busy"`
		} `json:"data_parallel_rank"`
	}
	if err := json.Unmarshal([]byte(resp.Header.Get("x-pdlb-explain")), &e); err != nil || e.Rank == nil ||
		e.Rank.Rank != 1 || e.Rank.CachedTokens != 64 || !e.Rank.Busy {
		t.Fatalf("explained %s (%v); want rank 1, holding 64 tokens, busy", resp.Header.Get("x-pdlb-explain"), err)
	}
	if got0, got1 := rankPrompts(0)-before0, rankPrompts(1)-before1; got0 != float64(len(ids)) || got1 != 0 {
		t.Fatalf("prompt tokens: rank 0 got %g, rank 1 %g; want the request's %d on rank 0, the idle one", got0, got1, len(ids))
	}
	if n := metricValue(t, s, "pdlb_data_parallel_rank_pins_total"); n != 0 {
		t.Fatalf("%g requests named a rank; the rank holding the prefix was busy", n)
	}
}

// TestDataParallelTooManyRanksLogged: the prefix index tells at most
// kvindex.MaxRankedRanks ranks of a pod apart, so a pod of more never has
// a rank named. The operator reads it once, when the gateway starts
// following the pod's KV events, in a line naming the pod and its ranks;
// not for a pod of that many, nor for one whose ranks are the engine's to
// pick anyway (here a discovered one, data_parallel_routing engine on its
// DNS entry).
func TestDataParallelTooManyRanksLogged(t *testing.T) {
	sims := testFleet(t, "m", 3, 100)
	// Nothing publishes on these ports: the feeds wait for the engines.
	// They are below the ephemeral ports (Linux: 32768 on), where no
	// test's listener lands: one that is no publisher would take a feed's
	// dial and never greet it.
	const most = kvindex.MaxRankedRanks
	wide, edge := podsOf("m", sims[0])[0], podsOf("m", sims[1])[0]
	wide.KVEvents, wide.KVReplay, wide.DataParallelSize = "tcp://127.0.0.1:20000", "tcp://127.0.0.1:21100", most+1
	edge.KVEvents, edge.KVReplay, edge.DataParallelSize = "tcp://127.0.0.1:22200", "tcp://127.0.0.1:23300", most
	host, port, _ := net.SplitHostPort(sims[2].Addr())
	p, _ := strconv.Atoi(port)
	var logs testlog.Buffer
	lbtest.StartGatewayLog(t, []config.Pod{wide, edge}, func(c *config.Config) {
		c.Discovery.DNS = []spec.DNS{{Name: host, Port: p, Model: "m", KVEventsPort: 24400, KVReplayPort: 25500, DataParallelSize: most + 1,
			DataParallelRouting: config.DataParallelByEngine, Interval: 50 * time.Millisecond}}
	}, slog.New(slog.NewTextHandler(&logs, nil)))
	testwait.For(t, "the discovered pod's feed", func() bool {
		return strings.Contains(logs.String(), fmt.Sprintf("following KV events\" pod=%s", sims[2].Addr()))
	})
	const tooMany = "ranks never named"
	l := logs.String()
	if n := strings.Count(l, tooMany); n != 1 || !strings.Contains(l, fmt.Sprintf("pod=%s ranks=%d", wide.Name, most+1)) {
		t.Fatalf("want one line saying pod %s's %d ranks are never named (%q), got %d:\n%s", wide.Name, most+1, tooMany, n, l)
	}
}

// conversationHitRate runs conversations through gateway s, whose pod dp
// (serving the prompts) has two data-parallel ranks, and returns dp's
// prefix-cache hit rate over them (its hits metric's growth over its
// queries') and the requests the gateway sent to a rank it named.
func conversationHitRate(t *testing.T, via *http.Client, dp *sim.Pod, s *lb.Server, hitsMetric, queriesMetric string) (rate, pins float64) {
	t.Helper()
	hits0, queries0 := adminMetric(t, dp.Addr(), hitsMetric), adminMetric(t, dp.Addr(), queriesMetric)

	// Four conversations of five turns, taken in an order drawn from a
	// fixed seed; a turn adds 64 tokens to the last one's prompt.
	const convs, turns = 4, 5
	rng := rand.New(rand.NewPCG(1, 2))
	var order []int
	for c := range convs {
		for range turns {
			order = append(order, c)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	prompts := make([][]int, convs)
	for i, c := range order {
		prompts[c] = append(prompts[c], tokenIDs(1000*(1+i), 64)...)
		events := kvEventsReceived(t, s, "dp")
		resp, b := postVia(t, via, s, "/v1/completions", completionOfIDs(prompts[c]))
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, b)
		}
		// The next turn is routed on this one's blocks.
		testwait.For(t, "the turn's KV events", func() bool { return kvEventsReceived(t, s, "dp") > events })
	}
	queries := adminMetric(t, dp.Addr(), queriesMetric) - queries0
	return (adminMetric(t, dp.Addr(), hitsMetric) - hits0) / queries, metricValue(t, s, "pdlb_data_parallel_rank_pins_total")
}

// rankedPod starts a gateway over one sim pod of engine with two
// data-parallel ranks, whose KV events it follows, routed among its ranks
// as routing says; both ranks' feeds follow when it returns. edit, when
// not nil, changes the pod's config before it starts.
func rankedPod(t *testing.T, engine engines.Kind, routing string, edit func(*sim.Config)) (*sim.Pod, *lb.Server) {
	t.Helper()
	pubs := rankPublishers(t)
	cfg := sim.Config{Name: "dp", Model: "m", Engine: engine, Listen: "127.0.0.1:0", Speedup: 100, DataParallelSize: 2,
		KVEvents: pubs[0], RankKVEvents: []sim.KVEventSink{pubs[1]}}
	if edit != nil {
		edit(&cfg)
	}
	dp, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	s := testGateway(t, []config.Pod{{Name: "dp", Model: "m", Engine: string(engine), Address: dp.Addr(),
		KVEvents: pubs[0].Endpoint(), KVReplay: pubs[0].ReplayEndpoint(), DataParallelSize: 2, DataParallelRouting: routing}},
		func(c *config.Config) {
			c.Tracing.Explain = true // no token needed
			c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}}
		})

	// A prompt sent straight to each rank is in the index.
	for rank := range 2 {
		ids := tokenIDs(100_000+1000*rank, 64)
		req, _ := http.NewRequest("POST", "http://"+dp.Addr()+"/v1/completions", strings.NewReader(completionOfIDs(ids)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Data-Parallel-Rank", strconv.Itoa(rank))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		testwait.For(t, fmt.Sprintf("rank %d's blocks in the index", rank), func() bool {
			for _, p := range pubs {
				p.BlockRemoved([]uint64{1}) // a batch: a late subscriber catches up
			}
			time.Sleep(10 * time.Millisecond)
			return indexMatch(t, s, "m", ids)["dp"] == len(ids)
		})
	}
	return dp, s
}

// rankPublishers starts the KV-event publishers of a pod's two
// data-parallel ranks, on loopback ports of their own.
func rankPublishers(t *testing.T) []*vllm.Publisher {
	t.Helper()
	pubs, err := vllm.StartRanks(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pubs {
		t.Cleanup(func() { p.Close() })
	}
	return pubs
}

// kvEventsReceived is the events the gateway's feeds of pod received, all
// its ranks' (GET /admin/index).
func kvEventsReceived(t *testing.T, s *lb.Server, pod string) uint64 {
	t.Helper()
	_, events := indexBlocks(t, s, pod)
	return events
}

// TestDataParallelPrefillRank: a prefill/decode pair whose prefill pod
// runs two ranks names the rank holding its prefix for the prefill leg,
// which its explanation shows. On vLLM in X-Data-Parallel-Rank (the decode
// pulls the KV from the engine its kv_transfer_params name, whichever rank
// that is); on SGLang through the bootstrap room, which the decode side
// fetches the KV by too. A client's own X-Data-Parallel-Rank decides.
func TestDataParallelPrefillRank(t *testing.T) {
	for _, e := range pdEngines[:2] {
		t.Run(e.name, func(t *testing.T) {
			_, s := rankedPair(t, e, config.DataParallelByPrefix)
			turn := func(ids []int, headers ...string) *http.Response {
				t.Helper()
				events := kvEventsReceived(t, s, "dp")
				resp, b := send(t, client, s, http.MethodPost, "/v1/completions", completionOfIDs(ids),
					append([]string{"Content-Type", "application/json"}, headers...)...)
				if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-prefill-pod") != "dp" {
					t.Fatalf("%d, prefill on %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), b)
				}
				testwait.For(t, "the prefill's KV events", func() bool { return kvEventsReceived(t, s, "dp") > events })
				return resp
			}
			prompt := tokenIDs(7000, 256)
			turn(prompt)
			resp := turn(append(prompt, tokenIDs(9000, 64)...), "x-pdlb-debug", "explain")
			var x struct {
				Rank *struct {
					CachedTokens int `json:"cached_tokens"`
					OthersTokens int `json:"others_cached_tokens"`
				} `json:"data_parallel_rank"`
			}
			if err := json.Unmarshal([]byte(resp.Header.Get("x-pdlb-explain")), &x); err != nil || x.Rank == nil ||
				x.Rank.CachedTokens != len(prompt) || x.Rank.OthersTokens != 0 {
				t.Fatalf("explained %s (%v); want a rank holding %d tokens, the other none", resp.Header.Get("x-pdlb-explain"), err, len(prompt))
			}
			turn(append(prompt, tokenIDs(11000, 64)...), "X-Data-Parallel-Rank", "0")
			if n := metricValue(t, s, "pdlb_data_parallel_rank_pins_total"); n != 1 {
				t.Fatalf("%g requests named a rank, want 1: the client named its own", n)
			}
		})
	}
}

// TestDataParallelPairRoom: conversations through an SGLang pair whose
// prefill pod runs two ranks. SGLang's prefill side sends a leg to rank
// bootstrap_room % its ranks (follow_bootstrap_room), so a random room
// finds the rank caching the conversation about half the time; a room
// drawn for the rank holding the longest prefix, every time: each turn
// after a conversation's first finds its whole last prompt cached, 64 *
// (0+1+2+3+4) of 64 * (1+2+3+4+5) tokens (conversationHitRate's), 2/3.
// Random rooms reach that only if all 16 such turns draw the rank of the
// turn before, 2^-16.
func TestDataParallelPairRoom(t *testing.T) {
	const best = 2.0 / 3
	rates, pins := map[string]float64{}, map[string]float64{}
	for _, routing := range []string{config.DataParallelByPrefix, config.DataParallelByEngine} {
		dp, s := rankedPair(t, pdEngines[1], routing)
		rates[routing], pins[routing] = conversationHitRate(t, client, dp, s, "sglang:cached_tokens_total", "sglang:prompt_tokens_total")
	}
	t.Logf("prefill pod's prefix-cache hit rate: %.4f with data_parallel_routing prefix (%g rooms chosen), %.4f with engine",
		rates["prefix"], pins["prefix"], rates["engine"])
	if math.Abs(rates["prefix"]-best) > 1e-9 || rates["engine"] >= best {
		t.Errorf("prefix-cache hit rate %.4f choosing the room, %.4f with random rooms; want %.4f, less", rates["prefix"], rates["engine"], best)
	}
	if pins["prefix"] == 0 || pins["engine"] != 0 {
		t.Errorf("requests pinned to a rank: %g with data_parallel_routing prefix, %g with engine; want some, none", pins["prefix"], pins["engine"])
	}
}

// rankedPair starts a gateway over a pair of engine e: prefill pod dp of
// two data-parallel ranks, whose KV events it follows, routed among its
// ranks as routing says, and decode pod dec. Both ranks' feeds follow when
// it returns.
func rankedPair(t *testing.T, e pdEngine, routing string) (*sim.Pod, *lb.Server) {
	t.Helper()
	pubs := rankPublishers(t)
	pre := startSim(t, e, "dp", sim.RolePrefill, func(c *sim.Config) {
		c.DataParallelSize, c.KVEvents, c.RankKVEvents = 2, pubs[0], []sim.KVEventSink{pubs[1]}
	})
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	prePod := pdPod(pre, pre.Addr(), "rs0")
	prePod.KVEvents, prePod.KVReplay, prePod.DataParallelSize, prePod.DataParallelRouting = pubs[0].Endpoint(), pubs[0].ReplayEndpoint(), 2, routing
	s := pdGateway(t, e, []config.Pod{prePod, pdPod(dec, dec.Addr(), "rs0")}, func(c *config.Config) {
		c.Tracing.Explain = true // no token needed
	})

	// Both ranks' feeds follow once they got every batch sent (a late
	// subscriber catches up at its rank's next one).
	sent := uint64(0)
	testwait.For(t, "both ranks' feeds", func() bool {
		for _, p := range pubs {
			p.BlockRemoved([]uint64{1})
		}
		sent += 2
		time.Sleep(10 * time.Millisecond)
		return kvEventsReceived(t, s, "dp") == sent
	})
	return pre, s
}

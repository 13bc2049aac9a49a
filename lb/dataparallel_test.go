package lb_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
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
			pubs, err := vllm.StartRanks(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pubs {
				t.Cleanup(func() { p.Close() })
			}
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

package sim

import (
	"strings"
	"testing"
	"time"

	"pdlb/engines/vllm"
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

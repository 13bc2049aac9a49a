package lb_test

import (
	"fmt"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/redistest"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// TestReplicasRouteAConversationToOnePod: two gateway replicas share one
// Redis and follow the same pods' KV events. A conversation's first turn
// through one replica and its second through the other land on the same
// pod: the second replica knows where the prefix is from the pod's events,
// not from a pick of its own. Each conversation starts on the other
// replica than the one before.
func TestReplicasRouteAConversationToOnePod(t *testing.T) {
	redis := redistest.Start(t, 0)
	var pods []config.Pod
	for i := range 4 {
		pods = append(pods, eventPod(t, sim.Config{Name: fmt.Sprintf("kv-%d", i), Model: "m", Speedup: 100}))
	}
	replica := func(id string) *lb.Server {
		return testGateway(t, pods, func(c *config.Config) {
			c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}}
			c.Redis.Address, c.Redis.ReplicaID = redis.Addr(), id
			c.TokenLoad.SharedSyncIntervalMs = 20
		})
	}
	replicas := []*lb.Server{replica("a"), replica("b")}

	for i := range 6 {
		first, second := replicas[i%2], replicas[(i+1)%2]
		system := strings.Repeat(fmt.Sprintf("conversation %d has a long system prompt of its own. ", i), 60)
		before := make(map[string]uint64)
		for _, p := range pods {
			_, before[p.Name] = indexBlocks(t, second, p.Name)
		}
		resp, b := post(t, first, "/v1/chat/completions", chat(system, "hi", 2, false))
		home := resp.Header.Get("x-pdlb-pod")
		if resp.StatusCode != 200 || home == "" {
			t.Fatalf("conversation %d, first turn: %d %s (pod %q)", i, resp.StatusCode, b, home)
		}
		// The other replica learns of the turn's blocks from the pod's
		// events (the first may have indexed its pick already).
		testwait.For(t, "the other replica to receive the first turn's KV events", func() bool {
			_, events := indexBlocks(t, second, home)
			return events > before[home]
		})
		resp, b = post(t, second, "/v1/chat/completions", chat(system, "and a second question", 2, false))
		if got := resp.Header.Get("x-pdlb-pod"); resp.StatusCode != 200 || got != home {
			t.Fatalf("conversation %d: first turn on %s, second turn through the other replica on %s (%d %s)", i, home, got, resp.StatusCode, b)
		}
	}
}

// eventPod starts a sim pod as cfg says, on loopback, publishing vLLM KV
// events, and returns its entry in the gateway's configuration.
func eventPod(t *testing.T, cfg sim.Config) config.Pod {
	t.Helper()
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cfg.Listen, cfg.KVEvents = "127.0.0.1:0", pub
	pod, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	return config.Pod{Name: cfg.Name, Model: cfg.Model, Address: pod.Addr(), KVEvents: pub.Endpoint(), KVReplay: pub.ReplayEndpoint()}
}

package lb_test

import (
	"context"
	"encoding/json"
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
		// events (the first may have indexed its pick already), and that
		// the turn finished from the shared ledger, as a user's pause
		// before the next turn would let it.
		testwait.For(t, "the other replica to receive the first turn's KV events and its end", func() bool {
			_, events := indexBlocks(t, second, home)
			return events > before[home] && remoteInFlight(t, second, home) == 0
		})
		resp, b = post(t, second, "/v1/chat/completions", chat(system, "and a second question", 2, false))
		if got := resp.Header.Get("x-pdlb-pod"); resp.StatusCode != 200 || got != home {
			t.Fatalf("conversation %d: first turn on %s, second turn through the other replica on %s (%d %s)", i, home, got, resp.StatusCode, b)
		}
	}
}

// TestReplicasSharePrefillLoad: a request in flight through one replica
// counts in the other replica's view of its pod (the policies' in-flight
// count), so the other replica's least_request picks route around it as
// one gateway would.
func TestReplicasSharePrefillLoad(t *testing.T) {
	redis := redistest.Start(t, 0)
	sims := testFleet(t, "m", 2, 1)
	replica := func(id string) *lb.Server {
		return testGateway(t, podsOf("m", sims...), func(c *config.Config) {
			c.Models = []config.Model{{Name: "m", Policy: "least_request"}}
			c.Redis.Address, c.Redis.ReplicaID = redis.Addr(), id
			c.TokenLoad.SharedSyncIntervalMs = 20
			c.Access.AdminToken = adminToken
		})
	}
	a, b := replica("a"), replica("b")

	// A long stream through a, left open: it stays in flight on its pod.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := newPost(a, chat("You are terse.", "write a long story", 5000, true))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	busy := resp.Header.Get("x-pdlb-pod")
	if resp.StatusCode != 200 || busy == "" {
		t.Fatalf("stream through a: %d on pod %q", resp.StatusCode, busy)
	}

	explain := func() explained {
		resp, b := postHeaders(t, b, chat("You are terse.", "hi", 1, false), map[string]string{"x-pdlb-debug": "explain", "x-pdlb-admin-token": adminToken})
		var e explained
		if err := json.Unmarshal([]byte(resp.Header.Get("x-pdlb-explain")), &e); resp.StatusCode != 200 || err != nil {
			t.Fatalf("explained request through b: %d %s, x-pdlb-explain: %v", resp.StatusCode, b, err)
		}
		return e
	}
	inFlight := func(e explained, pod string) int {
		for _, c := range e.Candidates {
			if c.Pod == pod && c.InFlight != nil {
				return *c.InFlight
			}
		}
		return -1
	}
	testwait.For(t, "b's view of "+busy+" to count a's stream in flight", func() bool { return inFlight(explain(), busy) == 1 })
	for i := range 8 {
		if e := explain(); e.Pod == busy {
			t.Fatalf("request %d through b went to %s, which holds a's stream: %+v", i, busy, e)
		}
	}
}

// remoteInFlight is the other replicas' requests in flight on pod as s's
// /admin/pods reports them.
func remoteInFlight(t *testing.T, s *lb.Server, pod string) int {
	t.Helper()
	var out struct {
		Pods []struct {
			Name           string
			RemoteInFlight int `json:"remote_in_flight"`
		}
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/pods")), &out); err != nil {
		t.Fatal(err)
	}
	for _, p := range out.Pods {
		if p.Name == pod {
			return p.RemoteInFlight
		}
	}
	t.Fatalf("pod %s not in /admin/pods", pod)
	return 0
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

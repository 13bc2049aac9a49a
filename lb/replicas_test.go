package lb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/redistest"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/ledger"

	goredis "github.com/redis/go-redis/v9"
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
			c.Tracing.Explain = true
		})
	}
	ids := []string{"a", "b"}
	replicas := []*lb.Server{replica(ids[0]), replica(ids[1])}
	rdb := goredis.NewClient(&goredis.Options{Addr: redis.Addr()})
	defer rdb.Close()

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
		// before the next turn would let it: the first replica's count
		// has ended, it published since, and the second read that.
		testwait.For(t, "the other replica to receive the first turn's KV events", func() bool {
			_, events := indexBlocks(t, second, home)
			return events > before[home]
		})
		testwait.For(t, "the first replica's turn to end", func() bool { return ownInFlight(t, first, home) == 0 })
		// A sync's counts are read before its round trip, which Redis
		// stamps: the first publish stamped after the turn ended may
		// carry counts from before, under a loaded machine's scheduling.
		// Syncs run one after another, so the next one read after it.
		ended := redisNow(t, rdb)
		testwait.For(t, "the first replica to publish after the turn", func() bool { return lastSync(t, rdb, ids[i%2]) > ended })
		stamped := lastSync(t, rdb, ids[i%2])
		testwait.For(t, "the first replica to publish again", func() bool { return lastSync(t, rdb, ids[i%2]) > stamped })
		published := lastSync(t, rdb, ids[i%2])
		testwait.For(t, "the other replica to read that", func() bool { return lastSync(t, rdb, ids[(i+1)%2]) > published })
		if n := remoteInFlight(t, second, home); n != 0 {
			t.Fatalf("conversation %d: after the turn ended the other replica counts %d in flight on %s", i, n, home)
		}
		resp, b = postHeaders(t, second, chat(system, "and a second question", 2, false), map[string]string{"x-pdlb-debug": "explain"})
		if got := resp.Header.Get("x-pdlb-pod"); resp.StatusCode != 200 || got != home {
			t.Fatalf("conversation %d: first turn on %s, second turn through the other replica on %s (%d %s)\nexplain: %s", i, home, got, resp.StatusCode, b, resp.Header.Get("x-pdlb-explain"))
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

// The replicas' membership set in Redis: each sync sets a replica's score
// to Redis's clock plus the expiry (the default key prefix).
const replicaSet = "{pdlb}:decode:replicas"

// redisNow is Redis's clock in ms, the clock of the replicas' syncs.
func redisNow(t *testing.T, rdb *goredis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// lastSync is when replica id last synced, on Redis's clock in ms; 0
// before its first sync.
func lastSync(t *testing.T, rdb *goredis.Client, id string) int64 {
	t.Helper()
	score, err := rdb.ZScore(context.Background(), replicaSet, id).Result()
	if errors.Is(err, goredis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return int64(score) - ledger.DefaultSharedExpiryMs
}

// remoteInFlight is the other replicas' requests in flight on pod as s's
// /admin/pods reports them.
func remoteInFlight(t *testing.T, s *lb.Server, pod string) int {
	t.Helper()
	return podCounts(t, s, pod).RemoteInFlight
}

// ownInFlight is s's own requests in flight on pod, from /admin/pods.
func ownInFlight(t *testing.T, s *lb.Server, pod string) int {
	t.Helper()
	return podCounts(t, s, pod).InFlight
}

type podCount struct {
	Name           string
	Healthy        bool
	InFlight       int `json:"in_flight"`
	RemoteInFlight int `json:"remote_in_flight"`
}

// podCounts is pod's health and in-flight counts in s's /admin/pods.
func podCounts(t *testing.T, s *lb.Server, pod string) podCount {
	t.Helper()
	var out struct{ Pods []podCount }
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/pods")), &out); err != nil {
		t.Fatal(err)
	}
	for _, p := range out.Pods {
		if p.Name == pod {
			return p
		}
	}
	t.Fatalf("pod %s not in /admin/pods", pod)
	return podCount{}
}

// eventPod starts a sim pod as cfg says, on loopback, publishing KV events
// as its engine does, and returns its entry in the gateway's configuration.
func eventPod(t *testing.T, cfg sim.Config) config.Pod {
	t.Helper()
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Engine: cfg.Engine})
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
	return config.Pod{Name: cfg.Name, Model: cfg.Model, Address: pod.Addr(), Engine: string(cfg.Engine), KVEvents: pub.Endpoint(), KVReplay: pub.ReplayEndpoint()}
}

// TestReplicasAdmitOnTheFleetsQueue: admission predicts a request's time
// to first token from its pod's whole prefill queue, the other replicas'
// share included, as the routing policies read it. A replica whose own
// queue on the pod is empty admitted a request that waits behind another
// replica's long prefill.
func TestReplicasAdmitOnTheFleetsQueue(t *testing.T) {
	// The pod prefills 1,000 tokens/s, as the replicas believe: the held
	// prompt's ~3,000 tokens put a new one 3 s from its first token, past
	// the interactive 2 s target; a ~200-token prompt alone takes 0.2 s.
	pod := physicsPod(t, "slow", 1, func(p *sim.Physics) { p.PrefillTokensPerSec = 1000 })
	pods := []config.Pod{{Name: "slow", Model: "m", Address: pod.Addr(), PrefillTokensPerSec: 1000}}
	// Batch: a admits it whatever its own prediction.
	held := heldStream{body: chat(strings.Repeat("x", 12000), "summarize", 4, true), headers: []string{"x-priority", "batch"}}
	resp, body := admittedBeside(t, pods, nil, held, chat(strings.Repeat("y", 800), "hi", 2, false))
	if resp.StatusCode != 429 || !strings.Contains(body, "predicted time to first token") {
		t.Fatalf("a short prompt through b, queued behind a's on the pod: %d %s, want 429 for its predicted TTFT", resp.StatusCode, body)
	}
}

// heldStream is a stream a test holds open through a gateway: its body,
// and header fields as name, value pairs.
type heldStream struct {
	body    string
	headers []string
}

// admittedBeside starts replicas a and b of a gateway over pods, one pod
// with admission on, sharing their load through a Redis server (edit, if
// set, adjusts both configs), and sends held through a, which counts it
// on the pod from its placement (its answer's head waits for the first
// token). Once b counts it too, it returns b's answer to body, then ends
// held and waits for both replicas to settle.
func admittedBeside(t *testing.T, pods []config.Pod, edit func(*config.Config), held heldStream, body string) (*http.Response, string) {
	t.Helper()
	redis := redistest.Start(t, 0)
	replica := func(id string) *lb.Server {
		return testGateway(t, pods, func(c *config.Config) {
			c.Admission.Enabled = true
			c.Redis.Address, c.Redis.ReplicaID = redis.Addr(), id
			c.TokenLoad.SharedSyncIntervalMs = 20
			if edit != nil {
				edit(c)
			}
		})
	}
	a, b := replica("a"), replica("b")
	req, err := newPost(a, held.body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(held.headers); i += 2 {
		req.Header.Set(held.headers[i], held.headers[i+1])
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		if stream, err := client.Do(req.WithContext(ctx)); err == nil {
			io.Copy(io.Discard, stream.Body)
			stream.Body.Close()
		}
	}()
	testwait.For(t, "b to count a's stream on the pod", func() bool { return remoteInFlight(t, b, pods[0].Name) == 1 })
	resp, answer := post(t, b, "/v1/chat/completions", body)
	cancel()
	<-ended
	waitIdle(t, a)
	waitIdle(t, b)
	return resp, answer
}

// TestReplicasAdmitOnTheFleetsBatch: admission predicts a request's time
// per output token at its pod's whole batch, the other replicas'
// requests in flight included, as the routing policies count them. A
// replica with none of its own on the pod predicted the step of a batch
// of one.
func TestReplicasAdmitOnTheFleetsBatch(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	tight := func(c *config.Config) {
		// The untaught step line, 10 ms + 0.2 ms a sequence, takes
		// 10.2 ms at a batch of one and 10.4 ms at two: the target lies
		// between. No scrape tells the pod's own batch.
		c.Admission.Interactive.TPOTSLO = 0.0103
		c.Health.MetricsInterval = 0
	}
	held := heldStream{body: chat("You are terse.", "write a long story", 5000, true)}
	resp, body := admittedBeside(t, podsOf("m", sims...), tight, held, chat("You are terse.", "hi", 2, false))
	if resp.StatusCode != 429 || !strings.Contains(body, "predicted time per output token") {
		t.Fatalf("a request through b beside a's stream: %d %s, want 429 for its predicted TPOT", resp.StatusCode, body)
	}
}

package lb_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/route"
)

// publishChain publishes on pub one chain of n blocks (hashes from h) and
// returns when the pod's block count in s's index is no longer one of
// was: the subscriber may join late, so it publishes again until then.
func publishChain(t *testing.T, s *lb.Server, pub *vllm.Publisher, pod string, h uint64, n int, was ...int) int {
	t.Helper()
	hashes, tokens := make([]uint64, n), make([]uint32, n*config.DefaultBlockSize)
	for i := range hashes {
		hashes[i] = h + uint64(i)
	}
	for i := range tokens {
		tokens[i] = uint32(h) + uint32(i)
	}
	var blocks int
	testwait.For(t, fmt.Sprintf("the index to take %d blocks of %s", n, pod), func() bool {
		blocks, _ = indexBlocks(t, s, pod)
		for _, w := range was {
			if blocks == w {
				pub.BlockStored(0, false, hashes, tokens, config.DefaultBlockSize, engines.ExtraKeys{})
				time.Sleep(20 * time.Millisecond)
				return false
			}
		}
		return true
	})
	return blocks
}

// TestKVFeedReplacedOverKeptEntries: a reload that keeps a pod (same
// name and address) but points its kv_events somewhere else (its engine
// was restarted with another port, or another data_parallel_size) starts
// a new feed for it, which knows none of the blocks the old feed put in
// the index. Those blocks stay the pod's for good: the new feed can never
// take them out (it has not seen their hashes), and a restarted engine
// holds none of them. Routing then sends those prompts' repeats to the
// pod as cache hits it does not have. The same holds when the reload
// takes the pod's kv_events away.
func TestKVFeedReplacedOverKeptEntries(t *testing.T) {
	newPub := func() *vllm.Publisher {
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		return pub
	}
	old := newPub()
	sims := testFleet(t, "m", 1, 100)
	kv := config.Pod{Name: "kv-0", Model: "m", Address: sims[0].Addr(), KVEvents: old.Endpoint(), KVReplay: old.ReplayEndpoint()}
	s := testGateway(t, []config.Pod{kv}, func(c *config.Config) { c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}} })
	if b := publishChain(t, s, old, "kv-0", 1000, 4, 0); b != 4 {
		t.Fatalf("index holds %d blocks of kv-0, want 4", b)
	}

	// The engine restarts, its cache empty, publishing on other ports.
	old.Close()
	restarted := newPub()
	cfg := s.Gateway.Config()
	cfg.Pods[0].KVEvents, cfg.Pods[0].KVReplay = restarted.Endpoint(), restarted.ReplayEndpoint()
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	// One new prompt of one block, from the restarted engine.
	if b := publishChain(t, s, restarted, "kv-0", 2000, 1, 4, 0); b != 1 {
		t.Fatalf("index holds %d blocks of kv-0 after its engine restarted and stored 1 block; want 1 "+
			"(the 4 blocks the old feed stored stay, and no feed can remove them)", b)
	}

	// Its kv_events go from the config: nothing will take that block out.
	cfg.Pods[0].KVEvents, cfg.Pods[0].KVReplay = "", ""
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if b, _ := indexBlocks(t, s, "kv-0"); b != 0 {
		t.Fatalf("index holds %d blocks of kv-0 after a reload took its kv_events away; want 0", b)
	}
}

// TestPDPrefillInfoAfterPodRestart: TensorRT-LLM generation_first reads
// the context pod's /server_info (its KV transceiver's endpoint) and
// keeps it a minute, by the pod's address alone. A context pod that
// restarts at its address (a container restart; a new pod given a
// departed one's address) comes back with another transceiver endpoint,
// and every request to it within the minute sends the generation pod to
// the endpoint of the process that is gone.
func TestPDPrefillInfoAfterPodRestart(t *testing.T) {
	e := pdEngine{"trtllm-generation-first", engines.TRTLLM, route.TRTGenerationFirst}
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	addr := pre.Addr()
	s := pdGateway(t, e, []config.Pod{pdPod(pre, addr, "rs0"), pdPod(dec, dec.Addr(), "rs0")},
		func(c *config.Config) { c.Health.Interval = 50 * time.Millisecond })
	if resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 4)); resp.StatusCode != http.StatusOK {
		t.Fatalf("before the restart: %d %s", resp.StatusCode, b)
	}
	before := pre.KVXferAddr()
	// The engine comes back at the same address, its transceiver on a
	// port of its own.
	restarted := restartSim(t, e, pre)
	testwait.For(t, "the restarted pod to serve", func() bool {
		resp, err := client.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	time.Sleep(200 * time.Millisecond) // a few health checks: the pod is healthy again
	resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 4))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the context pod restarted: %d %s (its transceiver moved from %s to %s)", resp.StatusCode, b, before, restarted.KVXferAddr())
	}
}

// TestRetryAfterReloadSeesTheNewFleet: a rolling update replaces the
// only pod of a model (a reload, or discovery, with the new pod in and
// the old one out) while a request waits for the old pod's first byte;
// the old pod then resets the request as it shuts down. Nothing reached
// the client, so the gateway retries, but the retry picks among the pods
// of the snapshot the request started with: the old pod alone, tried.
// The client gets an error while the new pod stands idle.
func TestRetryAfterReloadSeesTheNewFleet(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			got, release := make(chan struct{}, 1), make(chan struct{})
			old := fakePod(t, func(c net.Conn, _ *http.Request) {
				got <- struct{}{}
				<-release
				resetPod(c, nil)
			})
			next := testFleet(t, "m", 1, 100)[0]
			s := testGateway(t, []config.Pod{{Name: "old", Model: "m", Address: old}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
			})
			done := postLater(s, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
			<-got
			cfg := s.Gateway.Config()
			cfg.Pods = []config.Pod{{Name: "next", Model: "m", Address: next.Addr()}}
			if err := s.Reload(cfg); err != nil {
				t.Fatal(err)
			}
			close(release)
			a := <-done
			if a.code != 200 || a.pod != "next" {
				t.Fatalf("the request the old pod reset after the reload: %d from %q: %s; want 200 from the new pod", a.code, a.pod, a.body)
			}
		})
	}
}

// TestMuteKVPeerHoldsNothingUp: a pod whose kv_events and replay ports
// accept connections and never speak ZeroMQ (a frozen engine, another
// service on the port) must not hold up a reload that drops its feed
// (which runs under the gateway's lock), nor the gateway's shutdown.
func TestMuteKVPeerHoldsNothingUp(t *testing.T) {
	addr, taken := testnet.Mute(t, testnet.Listen(t), nil)
	replay, _ := testnet.Mute(t, testnet.Listen(t), nil)
	sims := testFleet(t, "m", 1, 100)
	kv := config.Pod{Name: "kv-0", Model: "m", Address: sims[0].Addr(), KVEvents: "tcp://" + addr, KVReplay: "tcp://" + replay}
	s := testGateway(t, []config.Pod{kv}, func(c *config.Config) { c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}} })
	testwait.For(t, "the feed's connection", func() bool { return taken.Load() > 0 })
	if !strings.Contains(get(t, "http://"+s.AdminAddr()+"/metrics"), `pdlb_kv_feed_connected_ranks{pod="kv-0"} 0`+"\n") {
		t.Fatal("no pdlb_kv_feed_connected_ranks 0 for a pod whose kv_events port never greets")
	}
	if !strings.Contains(get(t, "http://"+s.AdminAddr()+"/admin/index"), `"connected_ranks": 0`+"\n") {
		t.Fatal("no connected_ranks 0 in /admin/index for a pod whose kv_events port never greets")
	}
	cfg := s.Gateway.Config()
	cfg.Pods[0].KVEvents, cfg.Pods[0].KVReplay = "", ""
	testwait.Returns(t, "a reload dropping the feed", func() {
		if err := s.Reload(cfg); err != nil {
			t.Error(err)
		}
	})

	cfg.Pods[0].KVEvents, cfg.Pods[0].KVReplay = kv.KVEvents, kv.KVReplay
	before := taken.Load()
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the new feed's connection", func() bool { return taken.Load() > before })
	testwait.Returns(t, "Shutdown", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
}

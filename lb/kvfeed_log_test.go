package lb_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"pdlb/engines/vllm"
	"pdlb/internal/lbtest"
	"pdlb/internal/testlog"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

// TestKVFeedLogsStateChanges: the log tells an operator when a pod's
// KV-event feed goes down, comes back and finds its publisher restarted,
// naming the pod, once per change: a pod whose port refuses connections
// for many redial intervals gets one line, not one per redial.
func TestKVFeedLogsStateChanges(t *testing.T) {
	newPub := func(endpoint, replay string) *vllm.Publisher {
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: endpoint, ReplayEndpoint: replay})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		return pub
	}
	pub := newPub("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	sims := testFleet(t, "m", 2, 100)
	pods := []config.Pod{
		{Name: "kv-0", Model: "m", Address: sims[0].Addr(), KVEvents: pub.Endpoint(), KVReplay: pub.ReplayEndpoint()},
		{Name: "kv-down", Model: "m", Address: sims[1].Addr(),
			KVEvents: "tcp://" + testnet.Refusing(t), KVReplay: "tcp://" + testnet.Refusing(t)},
	}
	var logged testlog.Buffer
	s := lbtest.StartGatewayLog(t, pods, func(c *config.Config) { c.Models = []config.Model{{Name: "m", Policy: "prefix_cache"}} },
		slog.New(slog.NewTextHandler(&logged, nil)))
	publishChain(t, s, pub, "kv-0", 1000, 4, 0)

	// The engine stops, stays down for several redial intervals, and
	// starts again on the same ports, its cache empty.
	ep, rp := pub.Endpoint(), pub.ReplayEndpoint()
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the lost feed in the log", func() bool { return strings.Contains(logged.String(), `msg="KV-event feed lost"`) })
	time.Sleep(4 * vllm.DefaultRedialInterval)
	pub = newPub(ep, rp)
	// The feed may connect before the new publisher's replay socket
	// listens, and miss the restart until a live batch shows it.
	testwait.For(t, "the restart in the log", func() bool {
		if strings.Contains(logged.String(), `msg="KV-event publisher restarted`) {
			return true
		}
		pub.AllBlocksCleared()
		time.Sleep(20 * time.Millisecond)
		return false
	})

	lines := func(pod, msg string) int {
		n := 0
		for l := range strings.Lines(logged.String()) {
			if strings.Contains(l, " pod="+pod+" ") && strings.Contains(l, `msg="`+msg) {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		pod, msg string
		want     int
	}{
		{"kv-0", "KV-event feed lost", 1},
		{"kv-0", "KV-event feed connected", 1},
		{"kv-0", "KV-event publisher restarted", 1},
		{"kv-0", "KV-event feed unreachable", 0},
		{"kv-down", "KV-event feed unreachable", 1},
		{"kv-down", "KV-event feed", 1}, // nothing else
	} {
		if n := lines(c.pod, c.msg); n != c.want {
			t.Errorf("%d lines %q of pod %s, want %d; the log:\n%s", n, c.msg, c.pod, c.want, logged.String())
		}
	}
}

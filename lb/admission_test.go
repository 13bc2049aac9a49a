package lb_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// slowPrefillPod starts the sim pod cfg (its name, model, adapters) that
// prefills 200 tokens/s in wall time, so a prompt of 3,000 tokens holds
// its prefill queue for 15 s.
func slowPrefillPod(t *testing.T, cfg sim.Config) (*sim.Pod, config.Pod) {
	t.Helper()
	cfg.Listen, cfg.Speedup, cfg.Physics = "127.0.0.1:0", 1, sim.DefaultPhysics()
	cfg.Physics.PrefillTokensPerSec = 200
	pod, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	return pod, config.Pod{Name: cfg.Name, Model: cfg.Model, Address: pod.Addr(), PrefillTokensPerSec: 200}
}

// holdStream sends body as a stream through s and reads it on until the
// returned func cuts it, which waits for the stream's end.
func holdStream(t *testing.T, s *lb.Server, body string, headers ...string) (cut func()) {
	t.Helper()
	req, err := newPost(s, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		if resp, err := client.Do(req.WithContext(ctx)); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	return func() { cancel(); <-ended }
}

// asyncAnswer is a request's outcome as a test collects it from a goroutine.
type asyncAnswer struct {
	code int
	body string
}

// postAsync sends a chat body with headers (name, value pairs) and
// delivers its answer on the returned channel.
func postAsync(t *testing.T, s *lb.Server, body string, headers ...string) <-chan asyncAnswer {
	t.Helper()
	out := make(chan asyncAnswer, 1)
	go func() {
		resp, b := postWith(t, s, body, headers...)
		out <- asyncAnswer{resp.StatusCode, b}
	}()
	return out
}

// TestDeferralQueuePerModel: a deferred request whose model's pods are
// free is admitted as soon as its prediction clears, although a deferred
// request of another, overloaded model came before it. One queue for
// every model kept it behind that request until the latter's max wait
// ran out.
func TestDeferralQueuePerModel(t *testing.T) {
	hot, hotCfg := slowPrefillPod(t, sim.Config{Name: "hot-0", Model: "hot"})
	cold, coldCfg := slowPrefillPod(t, sim.Config{Name: "cold-0", Model: "cold"})
	s := testGateway(t, []config.Pod{hotCfg, coldCfg}, func(c *config.Config) {
		c.Admission.Enabled = true
		// Interactive requests are admitted whatever their queue: they
		// fill the pods' prefill queues. A batch request waits for a
		// predicted TTFT of 5 s, its wait counted, which one that waited
		// its whole max wait can no longer meet.
		c.Admission.Interactive.TTFTSLO = 1000
		c.Admission.Batch.TTFTSLO = 5
		c.Admission.Batch.MaxWait = 10
	})
	long := func(model string) string {
		return strings.Replace(chat(strings.Repeat("x", 12000), "hi", 4, true), `"m"`, `"`+model+`"`, 1)
	}
	short := func(model string) string {
		return strings.Replace(chat("s", "hi", 2, false), `"m"`, `"`+model+`"`, 1)
	}
	waiting := func() float64 { return metricValue(t, s, `pdlb_admission_waiting{class="batch"}`) }

	cutHot := holdStream(t, s, long("hot"))
	testwait.For(t, "hot's prefill to start", func() bool { return hot.Stats().Running == 1 })
	cutCold := holdStream(t, s, long("cold"))
	testwait.For(t, "cold's prefill to start", func() bool { return cold.Stats().Running == 1 })

	first := postAsync(t, s, short("hot"), "x-priority", "batch")
	testwait.For(t, "hot's batch request to wait", func() bool { return waiting() == 1 })
	second := postAsync(t, s, short("cold"), "x-priority", "batch")
	testwait.For(t, "cold's batch request to wait", func() bool { return waiting() == 2 })

	// Cold's queue drains: its batch request's prediction clears.
	cutCold()
	a := <-second
	if a.code != 200 {
		t.Fatalf("cold's batch request: %d %s", a.code, a.body)
	}
	if n := waiting(); n != 1 {
		t.Fatalf("cold's batch request was answered when %v requests waited, want hot's still waiting: it waited behind it", n)
	}
	cutHot()
	if a := <-first; a.code != 200 {
		t.Fatalf("hot's batch request: %d %s", a.code, a.body)
	}
	waitIdle(t, s)
}

// TestDeferredRepickWaitsForTheAdapter: a request for an adapter that
// waits for admission and is placed anew, on a pod that must load the
// adapter first (the pod that served it failed its checks meanwhile),
// goes to it once the load is done. It went at once, and the pod
// answered 404.
func TestDeferredRepickWaitsForTheAdapter(t *testing.T) {
	served, servedCfg := slowPrefillPod(t, sim.Config{Name: "n-0", Model: "n", LoRAModules: []sim.LoRAModule{{Name: "fin", Path: "/loras/fin"}}})
	bare, err := sim.Start(sim.Config{Name: "n-1", Model: "n", Listen: "127.0.0.1:0", Speedup: 100, EnableLoRA: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bare.Close() })
	// n-0 fails its checks, and n-1's adapter loads wait, when the test
	// says so.
	var sick atomic.Bool
	var listed atomic.Int32 // n-0's /v1/models asked
	release := make(chan struct{})
	front := func(addr string) string {
		return lbtest.Proxy(t, addr, func(w http.ResponseWriter, r *http.Request) bool {
			switch r.URL.Path {
			case "/health":
				if sick.Load() && addr == served.Addr() {
					w.WriteHeader(http.StatusServiceUnavailable)
					return true
				}
			case "/v1/load_lora_adapter":
				<-release
			case "/v1/models":
				if addr == served.Addr() {
					listed.Add(1)
				}
			}
			return false
		})
	}
	servedCfg.Address = front(served.Addr())
	s := testGateway(t, []config.Pod{servedCfg, {Name: "n-1", Model: "n", Address: front(bare.Addr())}}, func(c *config.Config) {
		c.Models = []config.Model{{Name: "n", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "fin", Path: "/loras/fin"}}, LoadAdapters: true}}}
		c.Admission.Enabled = true
		c.Admission.Interactive.TTFTSLO = 1000
		c.Admission.Batch.TTFTSLO = 5
	})
	// Cleanups run last first: a test that fails ends the loads' wait
	// before the servers wait for their handlers.
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	fin := func(system string, stream bool) string {
		return strings.Replace(chat(system, "hi", 2, stream), `"m"`, `"fin"`, 1)
	}
	// A scrape asks one pod's /v1/models after the other: by the second,
	// the gateway knows the first's answer, that n-0 serves fin.
	testwait.For(t, "the gateway to learn n-0's adapters", func() bool { return listed.Load() >= 2 })
	// A long prompt on n-0, the one pod that serves fin, defers the batch
	// request, which n-0's queue would keep 15 s from its first token.
	cut := holdStream(t, s, fin(strings.Repeat("x", 12000), true))
	testwait.For(t, "n-0's prefill to start", func() bool { return served.Stats().Running == 1 })
	deferred := postAsync(t, s, fin("s", false), "x-priority", "batch")
	testwait.For(t, "the batch request to wait", func() bool { return metricValue(t, s, `pdlb_admission_waiting{class="batch"}`) == 1 })
	// n-0 fails its checks: the waiting request is placed on n-1, which
	// begins loading fin.
	sick.Store(true)
	testwait.For(t, "n-0 to fail its checks", func() bool { return metricValue(t, s, `pdlb_pod_healthy{pod="n-0"}`) == 0 })
	testwait.For(t, "fin's load on n-1 to begin", func() bool { return metricValue(t, s, `pdlb_adapter_loads_total{model="n"}`) == 1 })
	select {
	case a := <-deferred:
		t.Fatalf("the request was answered before its adapter loaded on n-1: %d %s", a.code, a.body)
	case <-time.After(100 * time.Millisecond):
	}
	unblock()
	if a := <-deferred; a.code != 200 {
		t.Fatalf("after its adapter loaded: %d %s", a.code, a.body)
	}
	cut()
	waitIdle(t, s)
}

// TestDeferralEndsAtItsTarget: a deferred request whose wait alone has
// passed its TTFT target is shed then, saying so, not at its class's
// longer max wait: no prediction can meet the target any more. It waited
// the whole max wait, and its 429 named a prediction that left the wait
// out.
func TestDeferralEndsAtItsTarget(t *testing.T) {
	pod, podCfg := slowPrefillPod(t, sim.Config{Name: "p-0", Model: "m"})
	s := testGateway(t, []config.Pod{podCfg}, func(c *config.Config) {
		c.Admission.Enabled = true
		c.Admission.Interactive.TTFTSLO = 1000
		c.Admission.Batch.TTFTSLO = 0.5
		c.Admission.Batch.MaxWait = 60
	})
	cut := holdStream(t, s, chat(strings.Repeat("x", 12000), "hi", 4, true))
	testwait.For(t, "the long prefill to start", func() bool { return pod.Stats().Running == 1 })
	start := time.Now()
	resp, b := postWith(t, s, chat("s", "hi", 2, false), "x-priority", "batch")
	// Far below the max wait: the target, not the max wait, ended it.
	if took := time.Since(start); resp.StatusCode != 429 || took > 30*time.Second {
		t.Fatalf("%d after %v: %s; want 429 once its wait passed its 0.5 s target", resp.StatusCode, took, b)
	}
	if !strings.Contains(b, "of it waiting for admission) exceeds the 0.5s target of class batch") {
		t.Fatalf("429 %s; want its wait counted in the prediction it names", b)
	}
	cut()
	waitIdle(t, s)
}

// TestAdmissionCountsTheEventsCache: admission predicts a request's time
// to first token from what its pod holds, as the pods' KV events tell,
// whatever policy chose the pod: under least_request, and decided by the
// PD cascade, a follow-up turn whose long system prompt its pod holds is
// admitted, one with a prompt no pod holds is shed. Where the policy
// reads no prefixes, admission took every prompt as uncached.
func TestAdmissionCountsTheEventsCache(t *testing.T) {
	// The gateway believes the pods prefill 500 tokens/s: the ~850-token
	// prompt is 1.7 s from its first token uncached, past the 1 s target,
	// and its new turn alone a few hundredths of a second.
	_, _, pods, s := eventFleet(t, engines.VLLM, "qwen3", "lr", func(c *config.Config) {
		c.Models[0].Policy = "least_request"
		c.Models[0].Profiles = []config.Profile{{Name: "default"}}
		for i := range c.Pods {
			c.Pods[i].PrefillTokensPerSec = 500
		}
		c.Admission.Enabled = true
		c.Admission.Interactive.TTFTSLO = 1
	})
	system := strings.Repeat("You answer questions about the geography of East Asia, briefly and accurately. ", 60)
	// Both pods hold the system prompt, whichever least_request picks.
	var prompted int
	for _, p := range pods {
		prompted = direct(t, s, p, "/v1/chat/completions", chat(system, "Where is the capital of China?", 2, false))
	}
	if prompted < 700 {
		t.Fatalf("the first prompt is %d tokens; want the long system prompt's", prompted)
	}
	for _, tc := range []struct {
		name    string
		headers []string
	}{{"least_request", nil}, {"pd", []string{"routing-strategy", "pd"}}} {
		if resp, b := postWith(t, s, chat(system, "And of "+tc.name+"?", 2, false), tc.headers...); resp.StatusCode != 200 {
			t.Fatalf("%s: a follow-up turn its pod holds: %d %s", tc.name, resp.StatusCode, b)
		}
	}
	cold := strings.Repeat("You answer questions about the history of South America, in a few words. ", 60)
	if resp, b := postWith(t, s, chat(cold, "Who founded Lima?", 2, false)); resp.StatusCode != 429 || !strings.Contains(b, "predicted time to first token") {
		t.Fatalf("a prompt no pod holds: %d %s, want 429 for its predicted TTFT", resp.StatusCode, b)
	}
	// What the pods were charged and the planner counts: cached tokens.
	if cached := metricValue(t, s, `pdlb_prefix_cached_tokens_total{model="m"}`); cached < 2*(float64(prompted)*0.9-16) {
		t.Fatalf("gateway counted %g cached tokens over two follow-ups of a %d-token prompt", cached, prompted)
	}
	waitIdle(t, s)
}

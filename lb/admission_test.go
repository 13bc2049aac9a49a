package lb_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// slowPrefillPod starts a sim pod of model that prefills 200 tokens/s in wall
// time, so a prompt of 3,000 tokens holds its prefill queue for 15 s.
func slowPrefillPod(t *testing.T, name, model string) (*sim.Pod, config.Pod) {
	t.Helper()
	physics := sim.DefaultPhysics()
	physics.PrefillTokensPerSec = 200
	pod, err := sim.Start(sim.Config{Name: name, Model: model, Listen: "127.0.0.1:0", Speedup: 1, Physics: physics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	return pod, config.Pod{Name: name, Model: model, Address: pod.Addr(), PrefillTokensPerSec: 200}
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
	hot, hotCfg := slowPrefillPod(t, "hot-0", "hot")
	cold, coldCfg := slowPrefillPod(t, "cold-0", "cold")
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

package lb_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// laterAnswer is what a client got: the status, the pod that answered
// (a PD pair's decode pod) and a pair's prefill pod, the explanation of
// its last pick when it asked for one, and the body, or the error.
type laterAnswer struct {
	code              int
	pod, pre, explain string
	body              string
}

// postLater posts body to s's chat completions, with headers (name,
// value, ...), on a goroutine; its answer comes on the channel.
func postLater(s *lb.Server, body string, headers ...string) <-chan laterAnswer {
	done := make(chan laterAnswer, 1)
	go func() {
		req, _ := newPost(s, body)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			done <- laterAnswer{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- laterAnswer{resp.StatusCode, resp.Header.Get("x-pdlb-pod"), resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-explain"), string(b)}
	}()
	return done
}

// TestPDRetryAfterReloadSeesTheNewFleet is TestRetryAfterReloadSeesTheNewFleet
// for a model of prefill and decode pods: a rolling update replaces the
// pair while the old prefill pod holds the request's prefill leg, which
// it then resets. The retry is decided among the new pair.
func TestPDRetryAfterReloadSeesTheNewFleet(t *testing.T) {
	e := pdEngines[0]
	got, release := make(chan struct{}, 1), make(chan struct{})
	oldPre := fakePod(t, func(c net.Conn, _ *http.Request) {
		got <- struct{}{}
		<-release
		resetPod(c, nil)
	})
	oldDec := startSim(t, e, "old-dec", sim.RoleDecode, nil)
	pre, dec := startSim(t, e, "pre", sim.RolePrefill, nil), startSim(t, e, "dec", sim.RoleDecode, nil)
	s := pdGateway(t, e, []config.Pod{{Name: "old-pre", Model: "m", Address: oldPre, Engine: string(e.engine), Role: config.RolePrefill, Roleset: "rs0"},
		pdPod(oldDec, oldDec.Addr(), "rs0")}, func(c *config.Config) { c.Health.Interval = time.Hour })
	done := postLater(s, pdBody("/v1/chat/completions", false, 4))
	<-got
	cfg := s.Gateway.Config()
	cfg.Pods = []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	close(release)
	if a := <-done; a.code != 200 || a.pre != "pre" || a.pod != "dec" {
		t.Fatalf("the request the old prefill pod reset after the reload: %d from %q/%q: %s; want 200 from the new pair", a.code, a.pre, a.pod, a.body)
	}
	ledgerSettles(t, s)
}

// TestDeferredRequestPicksOnTheNewFleet: a batch request waits in
// admission, its pick predicted too slow for its class's target, while a
// reload replaces its model's pods with pods the gateway predicts fast.
// It is admitted on the new pods, a combined pod or a PD pair, at once.
// Before, it kept to the pods of the snapshot it started with, whose
// predictions never cleared, until its wait ran out (a 429); had their
// queues drained, it would have gone to pods no longer in the fleet. A
// request whose model the reload removed is answered 503, as for a model
// without a pod, without waiting out its wait.
func TestDeferredRequestPicksOnTheNewFleet(t *testing.T) {
	e := pdEngines[0]
	// The gateway predicts a prefill of the request's ~1,600 tokens on
	// the old pods to take 0.8 s, on the new ones (20,000 tokens/s) 0.08.
	slow := func(p config.Pod) config.Pod {
		p.PrefillTokensPerSec = 2000
		return p
	}
	for _, c := range []struct {
		name          string
		before, after func() []config.Pod
		code          int
		pod           string
	}{
		{"combined", func() []config.Pod {
			old := startSim(t, e, "old", sim.RoleCombined, nil)
			return []config.Pod{slow(pdPod(old, old.Addr(), ""))}
		}, func() []config.Pod {
			next := startSim(t, e, "next", sim.RoleCombined, nil)
			return []config.Pod{pdPod(next, next.Addr(), "")}
		}, 200, "next"},
		{"pd", func() []config.Pod {
			pre, dec := startSim(t, e, "old-pre", sim.RolePrefill, nil), startSim(t, e, "old-dec", sim.RoleDecode, nil)
			return []config.Pod{slow(pdPod(pre, pre.Addr(), "rs0")), pdPod(dec, dec.Addr(), "rs0")}
		}, func() []config.Pod {
			pre, dec := startSim(t, e, "pre", sim.RolePrefill, nil), startSim(t, e, "dec", sim.RoleDecode, nil)
			return []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
		}, 200, "dec"},
		{"model removed", func() []config.Pod {
			old := startSim(t, e, "old", sim.RoleCombined, nil)
			return []config.Pod{slow(pdPod(old, old.Addr(), ""))}
		}, func() []config.Pod {
			return podsOf("n", testFleet(t, "n", 1, 100)...)
		}, 503, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := testGateway(t, c.before(), func(cfg *config.Config) {
				cfg.Health.Interval = time.Hour
				cfg.Admission.Enabled = true
				cfg.Admission.Batch.TTFTSLO = 0.5
				cfg.Admission.Batch.MaxWait = 3
			})
			done := postLater(s, chat(strings.Repeat("x", 6400), "hi", 2, false), "x-priority", "batch")
			testwait.For(t, "the request to wait for admission", func() bool {
				return metricValue(t, s, `pdlb_admission_waiting{class="batch"}`) == 1
			})
			cfg := s.Gateway.Config()
			cfg.Pods = c.after()
			if err := s.Reload(cfg); err != nil {
				t.Fatal(err)
			}
			if a := <-done; a.code != c.code || a.pod != c.pod {
				t.Fatalf("the request waiting for admission across the reload: %d from %q: %s; want %d from %q", a.code, a.pod, a.body, c.code, c.pod)
			}
			if n := metricValue(t, s, `pdlb_admission_waiting{class="batch"}`); n != 0 {
				t.Fatalf("%v requests left waiting for admission", n)
			}
		})
	}
}

// TestSeekAfterReloadAsksTheNewPods: a retrieval of a stored response the
// gateway does not know seeks it on the model's pods, each once. Here both
// pods of the old fleet answer 404, the second after a reload replaced
// them with two new pods, one of which holds the response: the search
// goes on among the new pods, not ending because as many pods as the
// model has were asked.
func TestSeekAfterReloadAsksTheNewPods(t *testing.T) {
	var n atomic.Int32
	got, release := make(chan struct{}, 1), make(chan struct{})
	old := func(c net.Conn, r *http.Request) {
		if n.Add(1) == 2 {
			got <- struct{}{}
			<-release
		}
		answerJSON(c, 404, `{"error":{"message":"Response with id 'resp_x' not found.","type":"invalid_request_error","param":"response_id","code":404}}`)
	}
	c, d := &responsesPod{stored: map[string]bool{}}, &responsesPod{stored: map[string]bool{"resp_x": true}}
	// The new pods first: their cleanups run after the gateway's.
	next := []config.Pod{{Name: "c", Model: "m", Address: fakePod(t, c.serve)}, {Name: "d", Model: "m", Address: fakePod(t, d.serve)}}
	s := testGateway(t, []config.Pod{{Name: "a", Model: "m", Address: fakePod(t, old)}, {Name: "b", Model: "m", Address: fakePod(t, old)}},
		func(cfg *config.Config) { cfg.Health.Interval = time.Hour })
	done := make(chan laterAnswer, 1)
	go func() {
		resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_x", "")
		done <- laterAnswer{code: resp.StatusCode, pod: resp.Header.Get("x-pdlb-pod"), body: b}
	}()
	<-got
	cfg := s.Gateway.Config()
	cfg.Pods = next
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	close(release)
	a := <-done
	c.mu.Lock()
	cAsked := len(c.byID)
	c.mu.Unlock()
	d.mu.Lock()
	dAsked := len(d.byID)
	d.mu.Unlock()
	if a.code != 200 || a.pod != "d" {
		t.Fatalf("the search for resp_x across the reload: %d from %q (new pods asked: c %d, d %d): %s; want 200 from d", a.code, a.pod, cAsked, dAsked, a.body)
	}
}

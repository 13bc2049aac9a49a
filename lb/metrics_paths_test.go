package lb_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

// TestDeferredChargedOnce: pdlb_ledger_charges_total is "one per attempt
// sent to" the pod; a request admission deferred is picked, and charged,
// again on its worker and then on every poll (5 ms) of its wait at the
// head of the queue (awaitAdmission's replace), so two requests sent once
// each show as many charges as the wait had polls.
func TestDeferredChargedOnce(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			// As TestAdmittedClientLeaves: a batch request waits behind a
			// long prefill until its first token is out.
			pod, s := batchGateway(t, fe, 1000, 1.3)
			first := make(chan struct{})
			go func() {
				defer close(first)
				resp, b := post(t, s, "/v1/chat/completions", chat(strings.Repeat("w", 4000), "hi", 4, true))
				if resp.StatusCode != 200 {
					t.Errorf("the first request: %d %s", resp.StatusCode, b)
				}
			}()
			testwait.For(t, "the first prefill to start", func() bool { return pod.Stats().Running == 1 })
			resp, b := postWith(t, s, chat(strings.Repeat("z", 2400), "hi", 2, false), "x-priority", "batch")
			if resp.StatusCode != 200 {
				t.Fatalf("the batch request: %d %s", resp.StatusCode, b)
			}
			<-first
			waitIdle(t, s)
			if n := metricValue(t, s, `pdlb_admission_requests_total{class="batch",decision="deferred"}`); n != 1 {
				t.Fatalf("%v batch requests deferred, want 1: the test did not take the path it is for", n)
			}
			if n := metricValue(t, s, `pdlb_ledger_charges_total{pod="slow"}`); n != 2 {
				t.Errorf("pdlb_ledger_charges_total{pod=\"slow\"} = %v for two requests sent once each, want 2", n)
			}
		})
	}
}

// TestTooManyHeaderFieldsCounted: a request over max_headers fields gets
// 431 as one over max_header_bytes does, and is counted as that one is,
// under no model: pdlb_requests_total{code="431"} missed it.
func TestTooManyHeaderFieldsCounted(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
				c.Frontend = fe
				c.MaxHeaders = 16
			})
			var many []string
			for i := range 20 {
				many = append(many, "X-Filler-"+strconv.Itoa(i), "x")
			}
			resp, b := postWith(t, s, chatBody, many...)
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Fatalf("%d %s, want 431", resp.StatusCode, b)
			}
			if n := metricValue(t, s, `pdlb_requests_total{model="",code="431"}`); n != 1 {
				t.Errorf("pdlb_requests_total{model=\"\",code=\"431\"} = %v after one 431, want 1", n)
			}
		})
	}
}

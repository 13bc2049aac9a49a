package lb_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// TestRequestDurationCountsGatewayErrors: pdlb_request_duration_seconds
// times every completion of a model once, as pdlb_requests_total counts
// it, whoever answered it: the gateway's own 502 after a pod reset the
// request (no other pod to retry on) and its 503 once the pod is out
// were left out, while a pod's own error status was in.
func TestRequestDurationCountsGatewayErrors(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			bad := fakePod(t, resetPod)
			s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: bad}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
			})
			codes := map[int]int{}
			for range 4 {
				resp, _ := post(t, s, "/v1/chat/completions", chatBody)
				codes[resp.StatusCode]++
			}
			if codes[502] == 0 {
				t.Fatalf("answers %v, want a 502 at least: the test did not take the path it is for", codes)
			}
			waitIdle(t, s)
			answered := metricValue(t, s, `pdlb_requests_total{model="m",`)
			if timed := metricValue(t, s, `pdlb_request_duration_seconds_count{model="m"}`); timed != answered || answered != 4 {
				t.Errorf("pdlb_request_duration_seconds_count{model=\"m\"} = %v, pdlb_requests_total{model=\"m\"} = %v, after 4 requests answered %v; want 4 each", timed, answered, codes)
			}
		})
	}
}

// TestPromptTokensCountedOnce: pdlb_prompt_tokens_total, which the
// planner reads as demand, counts each request's prompt once, as the
// access log does: a request retried on the other pod after the first
// reset it was counted at each placement.
func TestPromptTokensCountedOnce(t *testing.T) {
	good := testFleet(t, "m", 1, 100)[0]
	bad := fakePod(t, resetPod)
	path := filepath.Join(t.TempDir(), "access.log")
	s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: bad}, {Name: "good", Model: "m", Address: good.Addr()}}, func(c *config.Config) {
		c.AccessLog = path
		c.Health.Interval = time.Hour
		c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
	})
	for i := range 4 {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}],"max_tokens":2}`, i)
		if resp, b := post(t, s, "/v1/chat/completions", body); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	waitIdle(t, s)
	counted := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`)
	logged, retried := 0.0, 0
	for _, l := range readAccessLog(t, s, path) {
		logged += l.num("prompt_tokens")
		if l.num("attempts") > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Fatal("no request was retried: the test did not take the path it is for")
	}
	if counted != logged {
		t.Errorf("pdlb_prompt_tokens_total{model=\"m\"} = %v, the access log's prompt_tokens add up to %v (%d of 4 requests retried)", counted, logged, retried)
	}
}

// TestPlainPathErrorsCounted: the gateway's 404 for a path it does not
// serve and its 401 for /v1/models without a key are counted under no
// model, as the 401 of a completion without one is: they were not
// counted at all.
func TestPlainPathErrorsCounted(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
				c.Frontend = fe
				c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good")}}
			})
			for _, r := range []struct {
				method, path string
				status       int
			}{
				{http.MethodPost, "/v1/chat/completion", 404},
				{http.MethodGet, "/v1/models", 401},
			} {
				resp, b := send(t, client, s, r.method, r.path, chatBody)
				if resp.StatusCode != r.status {
					t.Fatalf("%s %s: %d %s, want %d", r.method, r.path, resp.StatusCode, b, r.status)
				}
				series := fmt.Sprintf(`pdlb_requests_total{model="",code="%d"}`, r.status)
				if n := metricValue(t, s, series); n != 1 {
					t.Errorf("%s = %v after %s %s answered %d, want 1", series, n, r.method, r.path, r.status)
				}
			}
		})
	}
}

// TestAdmissionFallbackDecidedOnce: a request admission rejects on its
// model and admits on the model's fallback is one decision, admitted: it
// was counted rejected and admitted, and pdlb_slo_attainment_ratio, which
// counts rejections as misses, saw two requests, one missed.
func TestAdmissionFallbackDecidedOnce(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			m, n := testFleet(t, "m", 1, 100)[0], testFleet(t, "n", 1, 100)[0]
			s := testGateway(t, []config.Pod{
				// Believed to prefill a token a second, until measured:
				// any prompt misses the 2 s TTFT target on it.
				{Name: "slow", Model: "m", Address: m.Addr(), PrefillTokensPerSec: 1},
				{Name: "fast", Model: "n", Address: n.Addr()},
			}, func(c *config.Config) {
				c.Frontend = fe
				c.Admission.Enabled = true
				c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n"}}
			})
			resp, b := post(t, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"stream":true}`)
			if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-model") != "n" {
				t.Fatalf("%d from model %q, want 200 from the fallback n: %s", resp.StatusCode, resp.Header.Get("x-pdlb-model"), b)
			}
			waitIdle(t, s)
			admitted := metricValue(t, s, `pdlb_admission_requests_total{class="interactive",decision="admitted"}`)
			rejected := metricValue(t, s, `pdlb_admission_requests_total{class="interactive",decision="rejected"}`)
			attained := metricValue(t, s, `pdlb_slo_attainment_ratio{class="interactive"}`)
			if admitted != 1 || rejected != 0 || attained != 1 {
				t.Errorf("admitted %v, rejected %v, SLO attainment %v for one request admitted on its fallback; want 1, 0, 1", admitted, rejected, attained)
			}
		})
	}
}

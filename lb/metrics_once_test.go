package lb_test

import (
	"testing"
	"time"

	"pdlb/lb/config"
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

package lb_test

import (
	"net/http"
	"strconv"
	"testing"

	"pdlb/lb/config"
)

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

package lb_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"pdlb/lb/config"
)

// TestRetryBudgetFreedAtFirstByte: a retried request holds its place in
// the retry budget until the head of a pod's answer comes, not for the
// whole answer, on both front ends: a retry whose answer streams on is no
// longer retrying, and a budget counting it would refuse other requests'
// retries while pods that could answer them exist.
func TestRetryBudgetFreedAtFirstByte(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			good := testFleet(t, "m", 1, 1)[0] // real time: the stream lasts
			bad := fakePod(t, resetPod)
			s := testGateway(t, []config.Pod{{Name: "bad", Model: "m", Address: bad}, {Name: "good", Model: "m", Address: good.Addr()}},
				func(c *config.Config) {
					c.Frontend = fe
					c.Health.Interval = time.Hour
					c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
				})
			for i := range 2 {
				req, err := newPost(s, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}],"max_tokens":400,"stream":true}`, i))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				r := bufio.NewReader(resp.Body)
				line, err := r.ReadString('\n')
				if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "good" || !strings.HasPrefix(line, "data: ") {
					t.Fatalf("request %d: %d from %q: %q %v", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), line, err)
				}
				// The stream goes on; the retry, if any, is over.
				if n := metricValue(t, s, "pdlb_upstream_retries_in_flight"); n != 0 {
					t.Fatalf("request %d streaming: %v requests retrying, want 0", i, n)
				}
				resp.Body.Close()
			}
			if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="reset"}`); n == 0 {
				t.Fatal("no request went to the bad pod: the test shows nothing")
			}
			waitIdle(t, s)
		})
	}
}

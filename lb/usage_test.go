package lb_test

import (
	"strings"
	"testing"

	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

// TestStreamOutputCountedWithoutUsage: a stream whose client asked for no
// usage is counted by the engine's usage all the same, which the client
// does not see. Its events alone undercount it: the engine merges the
// deltas of a consumer that lags, and stream_interval batches them.
func TestStreamOutputCountedWithoutUsage(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) { c.Frontend = fe })
			requests, counted := 0.0, 0.0
			// exact: the stream's 64 tokens are counted, whatever its
			// events hold.
			f := func(path, body string, usage, exact bool) {
				t.Helper()
				resp, b := post(t, s, path, body)
				if resp.StatusCode != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") {
					t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
				}
				if got := strings.Contains(b, `"usage"`); got != usage {
					t.Errorf("%s: usage in the stream %v, want %v:\n%s", body, got, usage, b)
				}
				requests++
				testwait.For(t, "the stream to be counted", func() bool {
					return metricValue(t, s, `pdlb_requests_total{model="m"`) == requests
				})
				n := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`)
				if exact && n-counted != 64 {
					t.Errorf("%s: %v completion tokens counted, want 64", body, n-counted)
				}
				counted = n
			}
			chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":64`
			cmpl := `{"model":"m","prompt":"hi","stream":true,"max_tokens":64`
			f("/v1/chat/completions", chat+`}`, false, true)
			f("/v1/completions", cmpl+`}`, false, true)
			f("/v1/completions", cmpl+`,"stream_options":null}`, false, true)
			f("/v1/chat/completions", chat+`,"stream_options":{"include_usage":false}}`, false, true)
			f("/v1/chat/completions", `{"stream_options":{"include_usage":null},"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":64}`, false, true)
			f("/v1/chat/completions", chat+`,"stream_options":{"include_usage":true}}`, true, true)
			f("/v1/completions", cmpl+`,"stream_options":{}}`, true, true)
			// Usage in every chunk on SGLang, none on vLLM: the body goes
			// as it came.
			f("/v1/chat/completions", chat+`,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`, false, false)
		})
	}
}

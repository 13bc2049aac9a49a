package lb_test

import (
	"encoding/json"
	"testing"

	"pdlb/lb/config"
)

// TestEchoWithoutGeneration: lm-eval's loglikelihood request, a
// completion with echo, max_tokens 0 and logprobs, goes to the vLLM pod
// as it came, which answers the prompt alone: pdlb does not refuse the 0
// that vLLM takes with echo (CompletionRequest.to_sampling_params asks
// the engine for one token, and the answer shows none).
func TestEchoWithoutGeneration(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) { c.Frontend = fe })
			resp, b := post(t, s, "/v1/completions", `{"model":"m","prompt":"the cat sat","echo":true,"max_tokens":0,"logprobs":1}`)
			var r struct {
				Choices []struct{ Text string }
				Usage   struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(b), &r); resp.StatusCode != 200 || err != nil || len(r.Choices) != 1 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			if r.Choices[0].Text != "the cat sat" || r.Usage.CompletionTokens != 1 {
				t.Errorf("text %q, %d completion tokens; want the prompt alone, 1 token", r.Choices[0].Text, r.Usage.CompletionTokens)
			}
		})
	}
}

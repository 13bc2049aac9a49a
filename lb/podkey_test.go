package lb_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// TestPodAPIKey: pods started with an API key are served behind a gateway
// with api_keys of its own: the pod's key (its model's, as a discovered
// pod takes it) replaces the client's on every call the gateway makes, on
// either front end: completions, /tokenize, the Responses API's creation,
// retrieval and cancel, the /v1/models scrape that finds a pod's
// adapters, and an adapter's load.
func TestPodAPIKey(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			var sims []*sim.Pod
			for i := range 2 {
				p, err := sim.Start(sim.Config{Name: fmt.Sprint("m-", i), Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4,
					ResponsesStore: true, LoRAModules: []sim.LoRAModule{{Name: "sql", Path: "/loras/sql"}}, MaxLoras: 2, APIKey: "sk-pod"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				sims = append(sims, p)
			}
			s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
				c.Frontend = fe
				c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-client")}}
				c.Models = []config.Model{{Name: "m", PodKey: config.PodKey{APIKey: "sk-pod"},
					LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "fin", Path: "/loras/fin"}}, LoadAdapters: true, MaxLoras: 2}}}
			})
			bothClients(t, func(t *testing.T, via *http.Client) {
				answer := func(want int, method, path, body string) string {
					t.Helper()
					resp, b := send(t, via, s, method, path, body, "Content-Type", "application/json", "Authorization", "Bearer sk-client")
					if resp.StatusCode != want {
						t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
					}
					return b
				}
				f := func(method, path, body string) string {
					t.Helper()
					return answer(200, method, path, body)
				}
				f("POST", "/v1/chat/completions", chatBody)
				f("POST", "/tokenize", `{"model":"m","prompt":"hello"}`)
				b := f("POST", "/v1/responses", `{"model":"m","input":"hello"}`)
				var r struct{ ID string }
				if err := json.Unmarshal([]byte(b), &r); err != nil || r.ID == "" {
					t.Fatalf("no id in %s", b)
				}
				f("GET", "/v1/responses/"+r.ID, "")
				// vLLM's own refusal, past its key.
				answer(400, "POST", "/v1/responses/"+r.ID+"/cancel", "")
				// sql is known from the pods' /v1/models alone; fin is
				// loaded through /v1/load_lora_adapter.
				if got := f("GET", "/v1/models", ""); !strings.Contains(got, `"id":"sql"`) {
					t.Fatalf("/v1/models lists no sql: %s", got)
				}
				f("POST", "/v1/completions", `{"model":"sql","prompt":"hello","max_tokens":2}`)
				f("POST", "/v1/completions", `{"model":"fin","prompt":"hello","max_tokens":2}`)
			})
		})
	}
}

// TestPodAPIKeyPD: both legs of a prefill/decode exchange carry each
// pod's own key (api_key_file, api_key_env), on the engines whose server
// takes one; without api_keys of the gateway's, a client's key that is
// not the pods' is replaced, not passed.
func TestPodAPIKeyPD(t *testing.T) {
	file := t.TempDir() + "/key"
	if err := os.WriteFile(file, []byte("sk-pre\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PDLB_TEST_DECODE_KEY", "sk-dec")
	for _, e := range pdEngines[:2] {
		t.Run(e.name, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, func(c *sim.Config) { c.APIKey = "sk-pre" })
			dec := startSim(t, e, "dec", sim.RoleDecode, func(c *sim.Config) { c.APIKey = "sk-dec" })
			pods := []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
			pods[0].APIKeyFile, pods[1].APIKeyEnv = file, "PDLB_TEST_DECODE_KEY"
			s := pdGateway(t, e, pods, nil)
			for _, stream := range []bool{false, true} {
				resp, b := postWith(t, s, pdBody("/v1/chat/completions", stream, 4), "Authorization", "Bearer sk-client")
				if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-prefill-pod") != "pre" || strings.Contains(b, "Unauthorized") {
					t.Fatalf("stream %v: %d via %q: %s", stream, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), b)
				}
			}
		})
	}
}

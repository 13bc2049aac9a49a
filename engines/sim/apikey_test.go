package sim

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"pdlb/engines"
)

// TestAPIKey: a pod started with an API key answers what its engine
// guards with 401 {"error": "Unauthorized"} unless Authorization carries
// the key as a bearer token (the scheme in any case), and leaves its
// health and metrics open; vLLM guards /tokenize, SGLang /health_generate
// not, and both the sim's own /admin/role.
func TestAPIKey(t *testing.T) {
	c := testClient(t)
	for _, e := range []engines.Kind{engines.VLLM, engines.SGLang} {
		t.Run(string(e), func(t *testing.T) {
			p := testPod(t, Config{Name: "p", Model: "m", Engine: e, Speedup: 1000, DefaultMaxTokens: 4, APIKey: "sk-pod"})
			f := func(method, path, auth string, want int) {
				t.Helper()
				req, _ := http.NewRequest(method, "http://"+p.Addr()+path, nil)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("%s %s with %q: %d %s, want %d", method, path, auth, resp.StatusCode, b, want)
				}
				if want == http.StatusUnauthorized && string(b) != `{"error":"Unauthorized"}` {
					t.Fatalf("%s %s: 401 body %s", method, path, b)
				}
			}
			f("GET", "/v1/models", "", 401)
			f("GET", "/v1/models", "Bearer sk-other", 401)
			f("GET", "/v1/models", "sk-pod", 401)
			f("GET", "/v1/models", "Bearer sk-pod", 200)
			f("GET", "/v1/models", "bearer sk-pod", 200)
			f("POST", "/v1/chat/completions", "", 401)
			f("GET", "/health", "", 200)
			f("GET", "/metrics", "", 200)
			// The sim's role switch, an admin endpoint, as the engine
			// guards its own (vLLM's /sleep, SGLang's /update_weights...).
			f("GET", "/admin/role", "", 401)
			f("POST", "/admin/role", "", 401)
			f("GET", "/admin/role", "Bearer sk-pod", 200)
			if e == engines.VLLM {
				f("POST", "/tokenize", "", 401)
				f("GET", "/version", "", 200)
			} else {
				f("GET", "/health_generate", "", 404)
				f("GET", "/get_server_info", "", 401)
			}
		})
	}
	_, err := Start(Config{Engine: engines.TRTLLM, APIKey: "sk-pod"})
	if !errors.Is(err, errConfig) {
		t.Fatalf("trtllm with a key: %v", err)
	}
}

package sim

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"pdlb/engines"
)

// TestCORS: vLLM and SGLang pods answer as their servers do with their CORS
// settings (any origin, method and header; credentials on SGLang): a
// preflight gets 200 "OK" with the fields, a request with Origin gets
// Access-Control-Allow-Origin: * (SGLang's preflight names the origin, as
// credentials require); trtllm-serve has no CORS, so its preflight is a
// 405 like any OPTIONS.
func TestCORS(t *testing.T) {
	c := testClient(t)
	for _, e := range []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM} {
		t.Run(string(e), func(t *testing.T) {
			p := testPod(t, Config{Name: "p", Model: "m", Engine: e, Speedup: 1000, DefaultMaxTokens: 4})
			req, _ := http.NewRequest(http.MethodOptions, "http://"+p.Addr()+"/v1/chat/completions", nil)
			req.Header.Set("Origin", "https://app.example.com")
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			h := resp.Header
			if e == engines.TRTLLM {
				if resp.StatusCode != http.StatusMethodNotAllowed || h.Get("Access-Control-Allow-Origin") != "" {
					t.Fatalf("preflight: %d %v, want 405 and no CORS", resp.StatusCode, h)
				}
				return
			}
			credentials, allowed := "", "*"
			if e == engines.SGLang {
				credentials, allowed = "true", "https://app.example.com"
			}
			if resp.StatusCode != 200 || string(b) != "OK" || h.Get("Access-Control-Allow-Origin") != allowed ||
				h.Get("Access-Control-Allow-Credentials") != credentials ||
				h.Get("Access-Control-Allow-Headers") != "authorization, content-type" || h.Get("Access-Control-Max-Age") != "600" ||
				!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") {
				t.Fatalf("preflight: %d %q %v", resp.StatusCode, b, h)
			}
			req, _ = http.NewRequest(http.MethodPost, "http://"+p.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
			req.Header.Set("Origin", "https://app.example.com")
			resp, err = c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
				resp.Header.Get("Access-Control-Allow-Credentials") != credentials {
				t.Fatalf("request: %d %v", resp.StatusCode, resp.Header)
			}
		})
	}
}

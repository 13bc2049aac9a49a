package lb_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"pdlb/lb/config"
)

// TestOtherAPIs: the engines' other model-bearing JSON APIs (embeddings,
// tokenize, scores, reranking...) reach a combined pod of the model the
// body names, on either front end and either kind of client connection:
// the body byte for byte, the pod's answer whole, with x-pdlb-pod, as a
// completion's; a GET gets 405 and an unknown model 404 from the gateway.
func TestOtherAPIs(t *testing.T) {
	type got struct {
		Path, Body, Forwarded string
	}
	// The fake pod echoes what it got, as JSON.
	echo := fakePod(t, func(c net.Conn, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		out, _ := json.Marshal(got{r.URL.Path, string(b), r.Header.Get("X-Forwarded-For")})
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nX-Pod-Own: 1\r\nContent-Length: %d\r\n\r\n%s", len(out), out)
	})
	vllm := testFleet(t, "tok", 1, 1000)
	pods := append(podsOf("tok", vllm...), config.Pod{Name: "echo", Model: "emb", Address: echo})
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, pods, func(c *config.Config) { c.Frontend = fe })
			bothClients(t, func(t *testing.T, via *http.Client) {
				for _, path := range []string{"/v1/embeddings", "/v1/rerank", "/score", "/pooling"} {
					body := `{"input":["a","b"],"model":"emb","encoding_format":"float","extra":{"x":[1,2]}}`
					resp, b := postVia(t, via, s, path, body)
					var g got
					if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &g) != nil {
						t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
					}
					if g != (got{path, body, "127.0.0.1"}) {
						t.Errorf("%s: the pod got %+v", path, g)
					}
					if resp.Header.Get("x-pdlb-pod") != "echo" || resp.Header.Get("X-Pod-Own") != "1" || resp.Header.Get("X-Request-Id") == "" {
						t.Errorf("%s: answer's header %v", path, resp.Header)
					}
				}
				// A vLLM pod's /tokenize counts the prompt.
				resp, b := postVia(t, via, s, "/tokenize", `{"model":"tok","prompt":"hello there"}`)
				var tok struct{ Count int }
				if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &tok) != nil || tok.Count == 0 {
					t.Errorf("/tokenize: %d %s", resp.StatusCode, b)
				}
			})
			resp, err := client.Get("http://" + s.Addr() + "/v1/embeddings")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
				t.Errorf("GET /v1/embeddings: %d, Allow %q; want 405, POST", resp.StatusCode, resp.Header.Get("Allow"))
			}
			for _, tc := range []struct {
				body string
				code int
				says string
			}{
				{`{"model":"nope","input":"x"}`, 404, "The model `nope` does not exist."},
				{`{"model":"emb","input":`, 400, "JSON"},
				{`{"input":"x"}`, 400, "this gateway serves emb, tok"},
			} {
				resp, b := post(t, s, "/v1/embeddings", tc.body)
				if resp.StatusCode != tc.code || !strings.Contains(b, tc.says) {
					t.Errorf("%s: %d %s, want %d saying %q", tc.body, resp.StatusCode, b, tc.code, tc.says)
				}
			}
		})
	}
}

// TestOtherAPIsSkipPD: a model served by prefill/decode pods and combined
// pods sends the other APIs to the combined ones, whatever its routing
// strategy: there is nothing to prefill.
func TestOtherAPIsSkipPD(t *testing.T) {
	e := pdEngines[0]
	pre, dec, comb := startTrio(t, e)
	s := testGateway(t, []config.Pod{pdPod(pre, pre.Addr(), "rs"), pdPod(dec, dec.Addr(), "rs"), pdPod(comb, comb.Addr(), "")}, func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", RoutingStrategy: "pd"}}
	})
	for range 4 {
		resp, b := post(t, s, "/tokenize", `{"model":"m","prompt":"hello there"}`)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != comb.Config().Name {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
		}
	}
}

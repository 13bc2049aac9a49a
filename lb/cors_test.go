package lb_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// corsDo is send with Origin origin, none when it is "".
func corsDo(t *testing.T, c *http.Client, s *lb.Server, method, path, origin, body string, extra ...string) (*http.Response, string) {
	t.Helper()
	if origin != "" {
		extra = append([]string{"Origin", origin}, extra...)
	}
	return send(t, c, s, method, path, body, extra...)
}

// wantFields fails unless resp has each field of want (name, value pairs)
// once, with that value; "" wants the field absent.
func wantFields(t *testing.T, what string, resp *http.Response, want ...string) {
	t.Helper()
	for i := 0; i+1 < len(want); i += 2 {
		got := resp.Header.Values(want[i])
		if want[i+1] == "" && len(got) == 0 {
			continue
		}
		if len(got) != 1 || got[0] != want[i+1] {
			t.Errorf("%s: %s = %q, want [%q]", what, want[i], got, want[i+1])
		}
	}
}

// TestCORSDefaults: with vLLM's CORS defaults, a browser's preflight is
// answered by the gateway itself, before api_keys (a browser sends no
// credentials with one), and every answer to a request with Origin, the
// gateway's errors and whole, streamed and HTTP/2 answers alike, carries
// one Access-Control-Allow-Origin: the gateway's, not also the vLLM pod's.
func TestCORSDefaults(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	const origin = "https://app.example.com"
	stream := strings.Replace(chatBody, `"max_tokens":8`, `"max_tokens":8,"stream":true`, 1)
	h2c := &http.Client{Timeout: 20 * time.Second, Transport: &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}}
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
				c.Frontend = fe
				c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good")}}
				c.MaxHeaders = 16
			})
			resp, b := corsDo(t, client, s, http.MethodOptions, "/v1/chat/completions", origin, "",
				"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, content-type")
			if resp.StatusCode != http.StatusNoContent || b != "" {
				t.Fatalf("preflight: %d %q, want 204 and no body", resp.StatusCode, b)
			}
			wantFields(t, "preflight", resp, "Access-Control-Allow-Origin", "*", "Access-Control-Allow-Methods", "POST",
				"Access-Control-Allow-Headers", "authorization, content-type", "Access-Control-Max-Age", "600",
				"Access-Control-Allow-Credentials", "", "Vary", "")
			// A preflight is a request too: held to max_headers.
			many := []string{"Access-Control-Request-Method", "POST"}
			for i := range 20 {
				many = append(many, "X-Filler-"+strconv.Itoa(i), "x")
			}
			if resp, _ := corsDo(t, client, s, http.MethodOptions, "/v1/chat/completions", origin, "", many...); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("preflight with 22 fields: %d, want 431", resp.StatusCode)
			} else {
				wantFields(t, "431", resp, "Access-Control-Allow-Origin", "*")
			}
			// An empty Origin is none.
			resp, _ = corsDo(t, client, s, http.MethodPost, "/v1/chat/completions", "", chatBody, "Origin", "", "Authorization", "Bearer sk-good")
			wantFields(t, "empty Origin", resp, "Access-Control-Allow-Origin", "")
			// An OPTIONS that is no preflight is what it was.
			if resp, _ := corsDo(t, client, s, http.MethodOptions, "/v1/chat/completions", origin, ""); resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("OPTIONS without Access-Control-Request-Method: %d, want 405", resp.StatusCode)
			}
			if resp, b := corsDo(t, client, s, http.MethodPost, "/v1/chat/completions", origin, chatBody); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("no key: %d %s, want 401", resp.StatusCode, b)
			} else {
				wantFields(t, "the gateway's 401", resp, "Access-Control-Allow-Origin", "*")
			}
			auth := []string{"Authorization", "Bearer sk-good"}
			bothClients(t, func(t *testing.T, via *http.Client) {
				for _, body := range []string{chatBody, stream} {
					resp, b := corsDo(t, via, s, http.MethodPost, "/v1/chat/completions", origin, body, auth...)
					if resp.StatusCode != 200 {
						t.Fatalf("%d %s", resp.StatusCode, b)
					}
					wantFields(t, "pod's answer", resp, "Access-Control-Allow-Origin", "*")
				}
				// No Origin, no CORS: the pod added none either.
				resp, _ := corsDo(t, via, s, http.MethodPost, "/v1/chat/completions", "", chatBody, auth...)
				wantFields(t, "no Origin", resp, "Access-Control-Allow-Origin", "")
			})
			for _, body := range []string{chatBody, stream} {
				resp, b := corsDo(t, h2c, s, http.MethodPost, "/v1/chat/completions", origin, body, auth...)
				if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
					t.Fatalf("h2c: %s %d %s", resp.Proto, resp.StatusCode, b)
				}
				wantFields(t, "h2c", resp, "Access-Control-Allow-Origin", "*")
			}
			resp, _ = corsDo(t, h2c, s, http.MethodOptions, "/v1/models", origin, "", "Access-Control-Request-Method", "GET")
			if resp.StatusCode != http.StatusNoContent {
				t.Errorf("h2c preflight: %d, want 204", resp.StatusCode)
			}
		})
	}
}

// TestCORSListed: with the origins, methods and headers listed and
// credentials on, an allowed origin gets itself back (never "*") with
// Vary: Origin, a preflight asking for what is not listed gets 400 naming
// it, and a request from another origin is served without CORS fields.
func TestCORSListed(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.CORS = config.CORS{AllowedOrigins: []string{"https://a.example", "http://localhost:3000"}, AllowedMethods: []string{"GET", "POST"},
			AllowedHeaders: []string{"Authorization"}, AllowCredentials: true, ExposeHeaders: []string{"X-Request-Id"}, MaxAge: time.Hour}
	})
	pre := func(origin, method, headers string) (*http.Response, string) {
		t.Helper()
		return corsDo(t, client, s, http.MethodOptions, "/v1/chat/completions", origin, "",
			"Access-Control-Request-Method", method, "Access-Control-Request-Headers", headers)
	}
	resp, b := pre("http://localhost:3000", "POST", "Authorization, Content-Type")
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("allowed preflight: %d %s", resp.StatusCode, b)
	}
	wantFields(t, "allowed preflight", resp, "Access-Control-Allow-Origin", "http://localhost:3000", "Vary", "Origin",
		"Access-Control-Allow-Credentials", "true", "Access-Control-Allow-Methods", "GET, POST",
		"Access-Control-Allow-Headers", "accept, accept-language, content-language, content-type, authorization", "Access-Control-Max-Age", "3600")
	for _, tc := range []struct{ origin, method, headers, says string }{
		{"https://evil.example", "POST", "", `origin \"https://evil.example\" is not in cors.allowed_origins`},
		{"https://a.example", "DELETE", "", `method \"DELETE\" is not in cors.allowed_methods`},
		{"https://a.example", "POST", "content-type, x-api-key", `header \"x-api-key\" is not in cors.allowed_headers`},
	} {
		resp, b := pre(tc.origin, tc.method, tc.headers)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, tc.says) {
			t.Errorf("preflight %s %s %q: %d %s, want 400 saying %s", tc.origin, tc.method, tc.headers, resp.StatusCode, b, tc.says)
		}
		wantFields(t, "refused preflight", resp, "Access-Control-Allow-Origin", "", "Vary", "Origin")
	}
	resp, b = corsDo(t, client, s, http.MethodPost, "/v1/chat/completions", "https://a.example", chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	wantFields(t, "allowed origin", resp, "Access-Control-Allow-Origin", "https://a.example", "Vary", "Origin",
		"Access-Control-Allow-Credentials", "true", "Access-Control-Expose-Headers", "X-Request-Id")
	resp, _ = corsDo(t, client, s, http.MethodPost, "/v1/chat/completions", "https://evil.example", chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("other origin: %d", resp.StatusCode)
	}
	wantFields(t, "other origin", resp, "Access-Control-Allow-Origin", "", "Access-Control-Allow-Credentials", "", "Vary", "Origin")
}

// TestCORSOff: allowed_origins: [] leaves CORS to the pods, as before:
// OPTIONS gets 405 and the pod's Access-Control-Allow-Origin passes.
func TestCORSOff(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) { c.CORS.AllowedOrigins = []string{} })
	resp, _ := corsDo(t, client, s, http.MethodOptions, "/v1/chat/completions", "https://a.example", "", "Access-Control-Request-Method", "POST")
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("preflight with CORS off: %d, want 405", resp.StatusCode)
	}
	resp, b := corsDo(t, client, s, http.MethodPost, "/v1/chat/completions", "https://a.example", chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	wantFields(t, "the pod's", resp, "Access-Control-Allow-Origin", "*")
}

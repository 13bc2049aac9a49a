package lb_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"pdlb/lb/config"
	"pdlb/lb/limits"
)

func TestAPIKeysAndTheirLimits(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good"), RequestsPerMinute: 2}}
	})
	f := func(key string, status int, inBody string) {
		t.Helper()
		resp, b := postWith(t, s, chatBody, "Authorization", key)
		if resp.StatusCode != status || !strings.Contains(b, inBody) {
			t.Fatalf("key %q: %d %s, want %d with %q", key, resp.StatusCode, b, status, inBody)
		}
		if status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	f("", 401, "API key")
	f("Bearer sk-bad", 401, "API key")
	f("Bearer sk-good", 200, "chat.completion")
	f("bearer sk-good", 200, "chat.completion")
	f("Bearer sk-good", 429, "team-a")
	if strings.Contains(get(t, "http://"+s.AdminAddr()+"/metrics"), "sk-good") {
		t.Fatal("a key leaked into /metrics")
	}
}

// TestAPIKeysGuardModels: with api_keys set, /v1/models is an API request
// like any other: it needs a key, as OpenAI's does.
func TestAPIKeysGuardModels(t *testing.T) {
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
				c.Frontend = frontend
				c.Access.APIKeys = []limits.APIKey{{Name: "team-a", SHA256: limits.HashKey("sk-good")}}
			})
			f := func(key string, status int, inBody string) {
				t.Helper()
				req, err := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/v1/models", nil)
				if err != nil {
					t.Fatal(err)
				}
				if key != "" {
					req.Header.Set("Authorization", key)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != status || !strings.Contains(string(b), inBody) {
					t.Fatalf("key %q: %d %s, want %d with %q", key, resp.StatusCode, b, status, inBody)
				}
			}
			f("", 401, "API key")
			f("Bearer sk-bad", 401, "API key")
			f("Bearer sk-good", 200, `"id":"m"`)
		})
	}
}

package lb_test

import (
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

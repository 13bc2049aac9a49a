package limits

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

var digestA = HashKey("sk-a")

func TestValidate(t *testing.T) {
	f := func(yml, admin, wantInMsg string) {
		t.Helper()
		c := DefaultConfig()
		if err := yaml.Unmarshal([]byte(yml), &c); err != nil {
			t.Fatalf("yaml: %v", err)
		}
		err := c.Validate(admin)
		if wantInMsg == "" {
			if err != nil {
				t.Fatalf("rejected %q (admin %q): %v", yml, admin, err)
			}
			return
		}
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Fatalf("%q (admin %q): error %v does not mention %q", yml, admin, err, wantInMsg)
		}
	}
	key := "api_keys: [{name: a, sha256: " + digestA + ", requests_per_minute: 60, tokens_per_minute: 1000, max_concurrent: 2}]\n"
	f("", "127.0.0.1:9090", "")
	f(key, "", "")
	f(key+"limits: {max_conns_per_ip: 8, idle_timeout: 30s}\n", "[::1]:9090", "")
	f("admin_token: t\n", ":9090", "")
	f("", "localhost:9090", "")
	f("", ":9090", `admin_token = "" must be set when admin (":9090") is not a loopback address`)
	f("", "10.0.0.1:9090", `admin_token = ""`)
	f("", "0.0.0.0:9090", `admin_token = ""`)
	// The guard trims the token a client sends, so one with white space
	// at an end could never match; the message does not echo the secret.
	f("admin_token: |\n  s3cret\n", ":9090", "admin_token has white space at its start or end")
	f("admin_token: ' s3cret'\n", ":9090", "admin_token has white space")
	for _, tok := range []string{"s3cret\n", "\ts3cret"} {
		c := Config{AdminToken: tok}
		if err := c.Validate(":9090"); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("admin_token %q: %v", tok, err)
		}
	}
	f("admin_token: 's3 cret'\n", ":9090", "")
	f("api_keys: [{sha256: "+digestA+"}]\n", "", `api_keys[0].name = ""`)
	f("api_keys: [{name: a, sha256: "+digestA+"}, {name: a, sha256: "+HashKey("b")+"}]\n", "", `api_keys[1].name = "a" is also the name of api_keys[0]`)
	f("api_keys: [{name: a, sha256: "+digestA+"}, {name: b, sha256: "+strings.ToUpper(digestA)+"}]\n", "", "api_keys[1].sha256")
	f("api_keys: [{name: a, sha256: sk-a}]\n", "", `api_keys[0].sha256 = "sk-a" must be 64 hex digits`)
	f("api_keys: [{name: a, sha256: "+strings.Repeat("g", 64)+"}]\n", "", `api_keys[0].sha256`)
	f("api_keys: [{name: a, sha256: "+digestA+", requests_per_minute: -1}]\n", "", "api_keys[0].requests_per_minute = -1")
	f("api_keys: [{name: a, sha256: "+digestA+", tokens_per_minute: -5}]\n", "", "api_keys[0].tokens_per_minute = -5")
	f("api_keys: [{name: a, sha256: "+digestA+", max_concurrent: -2}]\n", "", "api_keys[0].max_concurrent = -2")
	f("limits: {max_conns_per_ip: -1}\n", "", "limits.max_conns_per_ip = -1")
	f("limits: {idle_timeout: -1s}\n", "", `limits.idle_timeout = "-1s"`)
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if c.Conns.MaxConnsPerIP != DefaultMaxConnsPerIP || c.Conns.IdleTimeout != DefaultIdleTimeout || c.APIKeys != nil || c.AdminToken != "" {
		t.Fatalf("%+v", c)
	}
	if c.Conns.IdleTimeout != 2*time.Minute {
		t.Fatalf("idle timeout %v", c.Conns.IdleTimeout)
	}
}

func TestHashKey(t *testing.T) {
	// echo -n test | sha256sum
	if got := HashKey("test"); got != "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" {
		t.Fatal(got)
	}
}

func TestIsLoopback(t *testing.T) {
	f := func(addr string, want bool) {
		t.Helper()
		if got := IsLoopback(addr); got != want {
			t.Fatalf("IsLoopback(%q) = %v", addr, got)
		}
	}
	f("127.0.0.1:9090", true)
	f("127.8.9.1:1", true)
	f("[::1]:9090", true)
	f("[::ffff:127.0.0.1]:9090", true)
	f("localhost:9090", true)
	f(":9090", false)
	f("0.0.0.0:9090", false)
	f("[::]:9090", false)
	f("10.1.2.3:9090", false)
	f("admin.example.com:9090", false)
	f("nonsense", false)
}

func TestNewKey(t *testing.T) {
	key, digest, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _, _ := NewKey()
	if !strings.HasPrefix(key, "sk-pdlb-") || len(key) != len("sk-pdlb-")+43 || digest != HashKey(key) || other == key {
		t.Fatalf("key %q digest %q other %q", key, digest, other)
	}
	ks, err := NewKeys([]APIKey{{Name: "n", SHA256: digest}})
	if err != nil {
		t.Fatal(err)
	}
	if k, d := ks.Lookup([]byte("Bearer "+key), nil); k == nil || !d.OK() {
		t.Fatalf("a new key does not authenticate: %v", d.Limit)
	}
}

package ledger

import (
	"errors"
	"math"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestDefaultConfigIsAIBrixs(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{KVWeight: 0.3, RequestCost: 3500, TTLSeconds: 3600, SessionTTLSeconds: 1800,
		MaxSessions: 100000, HybridCacheLoadFactor: 0.5, MinMatchPct: 0, DecodeOutputGrowth: true,
		SharedLedger: true, SharedSyncIntervalMs: 50, SharedExpiryMs: 2000}
	if c != want {
		t.Fatalf("defaults %+v, want %+v", c, want)
	}
}

func TestValidateNamesEveryKnob(t *testing.T) {
	// f sets one knob and wants Validate to reject it naming every one of
	// want (field, variable, quoted value), or to accept it when want is nil.
	f := func(set func(*Config), want ...string) {
		t.Helper()
		c := DefaultConfig()
		set(&c)
		err := c.Validate()
		if want == nil {
			if err != nil {
				t.Fatalf("rejected a good value: %v", err)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("want an ErrInvalid naming %q, got %v", want, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("error %q lacks %q", err, w)
			}
		}
	}
	f(func(c *Config) { c.KVWeight = 0 }, "kv_weight", "AIBRIX_TOKEN_LOAD_KV_WEIGHT", `"0"`)
	f(func(c *Config) { c.KVWeight = -0.1 }, "kv_weight", `"-0.1"`)
	f(func(c *Config) { c.KVWeight = math.NaN() }, "kv_weight", `"NaN"`)
	f(func(c *Config) { c.KVWeight = math.Inf(1) }, "kv_weight", `"+Inf"`)
	f(func(c *Config) { c.KVWeight = 2 })
	f(func(c *Config) { c.RequestCost = 0 }, "request_cost", "AIBRIX_TOKEN_LOAD_REQUEST_COST", `"0"`)
	f(func(c *Config) { c.RequestCost = -5 }, "request_cost", `"-5"`)
	f(func(c *Config) { c.TTLSeconds = 0 }, "ttl_seconds", "AIBRIX_TOKEN_LOAD_TTL_SECONDS", `"0"`)
	f(func(c *Config) { c.SessionTTLSeconds = -1 }, "session_ttl_seconds", "AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS", `"-1"`)
	f(func(c *Config) { c.SessionTTLSeconds = 0 })
	f(func(c *Config) { c.MaxSessions = 0 }, "max_sessions", "AIBRIX_TOKEN_LOAD_MAX_SESSIONS", `"0"`)
	f(func(c *Config) { c.HybridCacheLoadFactor = 1.5 }, "hybrid_cache_load_factor", "AIBRIX_HYBRID_CACHE_LOAD_FACTOR", `"1.5"`)
	f(func(c *Config) { c.HybridCacheLoadFactor = -0.5 }, "hybrid_cache_load_factor", `"-0.5"`)
	f(func(c *Config) { c.HybridCacheLoadFactor = math.NaN() }, "hybrid_cache_load_factor", `"NaN"`)
	f(func(c *Config) { c.HybridCacheLoadFactor = 0 })
	f(func(c *Config) { c.HybridCacheLoadFactor = 1 })
	f(func(c *Config) { c.MinMatchPct = 101 }, "min_match_pct", "AIBRIX_MIN_MATCH_PCT", `"101"`)
	f(func(c *Config) { c.MinMatchPct = -1 }, "min_match_pct", `"-1"`)
	f(func(c *Config) { c.MinMatchPct = 100 })
	f(func(c *Config) { c.SharedSyncIntervalMs = 0 }, "shared_sync_interval_ms", `"0"`)
	f(func(c *Config) { c.SharedExpiryMs = 50 }, "shared_expiry_ms", `"50"`, "shared_sync_interval_ms (50)")
	f(func(c *Config) { c.DecodeOutputGrowth, c.SharedLedger = false, false })
}

func TestConfigYAMLOverDefaults(t *testing.T) {
	c := DefaultConfig()
	in := "kv_weight: 0.5\nsession_ttl_seconds: 0\nshared_ledger: false\n"
	if err := yaml.Unmarshal([]byte(in), &c); err != nil {
		t.Fatal(err)
	}
	if c.KVWeight != 0.5 || c.SessionTTLSeconds != 0 || c.SharedLedger || c.RequestCost != DefaultRequestCost || !c.DecodeOutputGrowth {
		t.Fatalf("decoded %+v", c)
	}
}

package spec

import (
	"errors"
	"strings"
	"testing"
)

// The annotation of AIBrix's complete example and its PD-knob list, with
// fields this package does not know (they must be ignored).
const fullConfig = `{
  "lockedRoutingStrategy": "pd",
  "defaultProfile": "pd",
  "someFutureField": {"x": 1},
  "profiles": {
    "default": {"routingStrategy": "random"},
    "pd": {
      "routingStrategy": "pd",
      "routingConfig": {
        "combined": true,
        "promptLenBucketMinLength": 2048,
        "promptLenBucketMaxLength": 0,
        "promptLengthBucketing": true,
        "bucketServe": false,
        "bucketServeMode": "rps",
        "prefillScorePolicy": "hybrid_cache_load",
        "decodeScorePolicy": "token_load",
        "promptTokensGte": 10,
        "pd": {
          "prefillRequestTimeout": 90,
          "prefillLoadImbalanceMinSpread": 4,
          "decodeLoadImbalanceMinSpread": 8.5,
          "decodeThroughputImbalanceMinSpread": 1024,
          "decodeScoreRatioThreshold": 2.5,
          "decodeLBWeightRunning": 3,
          "decodeLBWeightThroughput": 0,
          "tokenLoadKVWeight": 0.7,
          "tokenLoadRequestCost": 100,
          "tokenLoadTTLSeconds": 600,
          "tokenLoadSessionTTLSeconds": 0,
          "hybridCacheLoadFactor": 0.25,
          "minMatchPct": 30,
          "decodeAbortTimeout": 0,
          "decodeAbortRetryDelay": 2,
          "decodeFirstResponseTimeout": 45,
          "decodeResponseTimeout": 0,
          "decodeStreamIdleTimeout": 60,
          "notAKnobYet": 1
        }
      }
    }
  }
}`

func TestParseModelConfigFull(t *testing.T) {
	mc, err := ParseModelConfig([]byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	if mc.LockedRoutingStrategy != "pd" || mc.DefaultProfile != "pd" || len(mc.Profiles) != 2 {
		t.Fatalf("%+v", mc)
	}
	p, ok := mc.Profile("")
	if !ok || p.RoutingStrategy != "pd" {
		t.Fatalf("default profile: %+v %v", p, ok)
	}
	rc := p.RoutingConfig
	if !rc.Combined || rc.PromptLenBucketMinLength != 2048 || rc.PromptLenBucketMaxLength != 0 ||
		rc.PromptLengthBucketing == nil || !*rc.PromptLengthBucketing || rc.BucketServe == nil || *rc.BucketServe ||
		rc.BucketServeMode != "rps" || rc.PrefillScorePolicy != "hybrid_cache_load" || rc.DecodeScorePolicy != "token_load" {
		t.Fatalf("routingConfig: %+v", rc)
	}
	k := rc.PD
	f := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || *got != want {
			t.Errorf("pd.%s = %v, want %v", name, got, want)
		}
	}
	f("prefillRequestTimeout", k.PrefillRequestTimeout, 90)
	f("prefillLoadImbalanceMinSpread", k.PrefillLoadImbalanceMinSpread, 4)
	f("decodeLoadImbalanceMinSpread", k.DecodeLoadImbalanceMinSpread, 8.5)
	f("decodeThroughputImbalanceMinSpread", k.DecodeThroughputImbalanceMinSpread, 1024)
	f("decodeScoreRatioThreshold", k.DecodeScoreRatioThreshold, 2.5)
	f("decodeLBWeightRunning", k.DecodeLBWeightRunning, 3)
	f("decodeLBWeightThroughput", k.DecodeLBWeightThroughput, 0)
	f("tokenLoadKVWeight", k.TokenLoadKVWeight, 0.7)
	f("tokenLoadRequestCost", k.TokenLoadRequestCost, 100)
	f("tokenLoadTTLSeconds", k.TokenLoadTTLSeconds, 600)
	f("tokenLoadSessionTTLSeconds", k.TokenLoadSessionTTLSeconds, 0)
	f("hybridCacheLoadFactor", k.HybridCacheLoadFactor, 0.25)
	f("minMatchPct", k.MinMatchPct, 30)
	f("decodeAbortTimeout", k.DecodeAbortTimeout, 0)
	f("decodeAbortRetryDelay", k.DecodeAbortRetryDelay, 2)
	f("decodeFirstResponseTimeout", k.DecodeFirstResponseTimeout, 45)
	f("decodeResponseTimeout", k.DecodeResponseTimeout, 0)
	f("decodeStreamIdleTimeout", k.DecodeStreamIdleTimeout, 60)
}

func TestModelConfigProfileFallback(t *testing.T) {
	f := func(js, name, wantStrategy string, wantOK bool) {
		t.Helper()
		mc, err := ParseModelConfig([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		p, ok := mc.Profile(name)
		if ok != wantOK || p.RoutingStrategy != wantStrategy {
			t.Fatalf("%s: Profile(%q) = %q %v, want %q %v", js, name, p.RoutingStrategy, ok, wantStrategy, wantOK)
		}
	}
	two := `{"defaultProfile": "pd", "profiles": {"default": {"routingStrategy": "random"}, "pd": {"routingStrategy": "pd"}}}`
	f(two, "", "pd", true)
	f(two, "default", "random", true)
	f(two, "low-latency", "pd", true)
	f(`{"profiles": {"default": {"routingStrategy": "pd"}}}`, "other", "pd", true)
	f(`{"profiles": {"fast": {"routingStrategy": "random"}}}`, "", "", false)
	f(`{"profiles": {"fast": {"routingStrategy": "random"}}}`, "fast", "random", true)
	f(`{}`, "", "", false)
	// Unset settings stay nil, so the gateway's own value stands.
	mc, err := ParseModelConfig([]byte(`{"profiles": {"default": {"routingStrategy": "pd"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := mc.Profile(""); p.RoutingConfig.PD.MinMatchPct != nil || p.RoutingConfig.PromptLengthBucketing != nil {
		t.Fatalf("unset knobs must stay nil: %+v", p.RoutingConfig)
	}
}

func TestParseModelConfigRejects(t *testing.T) {
	f := func(js, wantInMsg string) {
		t.Helper()
		_, err := ParseModelConfig([]byte(js))
		if err == nil {
			t.Fatalf("accepted: %s", js)
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Fatalf("error %q does not mention %q", err, wantInMsg)
		}
	}
	rc := func(body string) string {
		return `{"profiles": {"p": {"routingStrategy": "pd", "routingConfig": ` + body + `}}}`
	}
	f(`{"profiles": `, AnnotationConfig)
	f(`{"profiles": {"p": {"routingConfig": {"combined": "yes"}}}}`, AnnotationConfig)
	f(`{"defaultProfile": "pd", "profiles": {}}`, `defaultProfile = "pd" names no profile`)
	f(rc(`{"promptLenBucketMinLength": -1}`), "profiles.p.routingConfig.promptLenBucketMinLength = -1")
	f(rc(`{"promptLenBucketMinLength": 100, "promptLenBucketMaxLength": 10}`), "profiles.p.routingConfig.promptLenBucketMaxLength = 10")
	f(rc(`{"bucketServeMode": "latency"}`), `bucketServeMode = "latency"`)
	f(rc(`{"prefillScorePolicy": "load_balancing"}`), `prefillScorePolicy = "load_balancing"`)
	f(rc(`{"decodeScorePolicy": "prefix_cache"}`), `decodeScorePolicy = "prefix_cache"`)
	f(rc(`{"pd": {"prefillRequestTimeout": 0}}`), "pd.prefillRequestTimeout = 0 must be positive")
	f(rc(`{"pd": {"tokenLoadRequestCost": -5}}`), "pd.tokenLoadRequestCost = -5")
	f(rc(`{"pd": {"decodeAbortTimeout": -1}}`), "pd.decodeAbortTimeout = -1 must not be negative")
	f(rc(`{"pd": {"hybridCacheLoadFactor": 1.5}}`), "pd.hybridCacheLoadFactor = 1.5 must be at most 1")
	f(rc(`{"pd": {"minMatchPct": 101}}`), "pd.minMatchPct = 101 must be at most 100")
}

func FuzzParseModelConfig(f *testing.F) {
	f.Add([]byte(fullConfig))
	f.Add([]byte(`{"profiles": {"default": {"routingStrategy": "pd", "routingConfig": {"combined": true}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		mc, err := ParseModelConfig(data)
		if err != nil {
			return
		}
		// Whatever parses must resolve without panicking and hold its
		// invariants.
		for name, p := range mc.Profiles {
			if got, ok := mc.Profile(name); name != "" && (!ok || got.RoutingStrategy != p.RoutingStrategy) {
				t.Fatalf("Profile(%q) lost the profile", name)
			}
			if rc := p.RoutingConfig; rc.PromptLenBucketMinLength < 0 || (rc.PromptLenBucketMaxLength != 0 && rc.PromptLenBucketMaxLength < rc.PromptLenBucketMinLength) {
				t.Fatalf("invalid bounds accepted: %+v", rc)
			}
		}
	})
}

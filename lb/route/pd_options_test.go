package route

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPDOptionsDefaultsValidate(t *testing.T) {
	o := DefaultPDOptions()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	// AIBrix's table, spot-checked where a typo would hide.
	if o.PrefillLoadImbalanceMinSpread != 16 || o.DecodeThroughputImbalanceMinSpread != 2048 ||
		o.DecodeScoreRatioThreshold != 1.5 || o.TokenLoadRequestCost != 3500 ||
		o.TokenLoadTTL != time.Hour || o.PrefillRequestTimeout != 30*time.Second ||
		o.PrefillScorePolicy != "prefix_cache" || o.DecodeScorePolicy != "load_balancing" ||
		o.TRTScheduleStyle != "context_first" || o.KVConnectorType != "shfs" ||
		!o.DecodeTokenLoadOutputGrowth || !o.TokenLoadSharedLedger || o.PromptLengthBucketing {
		t.Fatalf("defaults differ from AIBrix: %+v", o)
	}
}

func TestPDOptionsValidateNamesEveryKnob(t *testing.T) {
	// f breaks one knob and checks the message names it both ways and
	// quotes the value.
	f := func(edit func(o *PDOptions), want ...string) {
		t.Helper()
		o := DefaultPDOptions()
		edit(&o)
		err := o.Validate()
		if !errors.Is(err, ErrInvalidPDOption) {
			t.Fatalf("err = %v, want ErrInvalidPDOption", err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("error %q lacks %q", err, w)
			}
		}
	}
	f(func(o *PDOptions) { o.BucketServe = true }, "bucket_serve (AIBRIX_BUCKET_SERVE) = true", "AIBRIX_PROMPT_LENGTH_BUCKETING")
	f(func(o *PDOptions) { o.BucketServeMode = "qps" }, `bucket_serve_mode (AIBRIX_BUCKET_SERVE_MODE) = "qps"`)
	f(func(o *PDOptions) { o.PrefillRequestTimeout = 0 }, "prefill_request_timeout (AIBRIX_PREFILL_REQUEST_TIMEOUT) = 0s")
	f(func(o *PDOptions) { o.PrefillScorePolicy = "random" }, `AIBRIX_PREFILL_SCORE_POLICY) = "random"`)
	f(func(o *PDOptions) { o.TokenLoadKVWeight = 0 }, "token_load_kv_weight (AIBRIX_TOKEN_LOAD_KV_WEIGHT) = 0")
	f(func(o *PDOptions) { o.TokenLoadRequestCost = -1 }, "AIBRIX_TOKEN_LOAD_REQUEST_COST) = -1")
	f(func(o *PDOptions) { o.TokenLoadTTL = 0 }, "AIBRIX_TOKEN_LOAD_TTL_SECONDS) = 0s")
	f(func(o *PDOptions) { o.TokenLoadSessionTTL = -time.Second }, "AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS) = -1s")
	f(func(o *PDOptions) { o.TokenLoadMaxSessions = 0 }, "AIBRIX_TOKEN_LOAD_MAX_SESSIONS) = 0")
	f(func(o *PDOptions) { o.HybridCacheLoadFactor = 1.5 }, "AIBRIX_HYBRID_CACHE_LOAD_FACTOR) = 1.5", "between 0 and 1")
	f(func(o *PDOptions) { o.MinMatchPct = 101 }, "min_match_pct (AIBRIX_MIN_MATCH_PCT) = 101")
	f(func(o *PDOptions) { o.DecodeScorePolicy = "prefix_cache" }, `AIBRIX_DECODE_SCORE_POLICY) = "prefix_cache"`)
	f(func(o *PDOptions) { o.KVConnectorType = "rdma" }, `AIBRIX_KV_CONNECTOR_TYPE) = "rdma"`)
	f(func(o *PDOptions) { o.PrefillLoadImbalanceMinSpread = 0 }, "AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD) = 0")
	f(func(o *PDOptions) { o.DecodeLoadImbalanceMinSpread = -3 }, "AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD) = -3")
	f(func(o *PDOptions) { o.DecodeThroughputImbalanceMinSpread = 0 }, "AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD) = 0")
	f(func(o *PDOptions) { o.DecodeScoreRatioThreshold = 0.5 }, "AIBRIX_DECODE_SCORE_RATIO_THRESHOLD) = 0.5")
	f(func(o *PDOptions) { o.DecodeLBWeightRunning = -1 }, "AIBRIX_DECODE_LB_WEIGHT_RUNNING) = -1")
	f(func(o *PDOptions) { o.DecodeLBWeightThroughput = -1 }, "AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT) = -1")
	f(func(o *PDOptions) { o.DecodeLBWeightThroughput, o.DecodeLBWeightRunning = 0, 0 }, "must not both be 0")
	f(func(o *PDOptions) { o.TRTMachineID = 1024 }, "trt_machine_id (AIBRIX_TRT_MACHINE_ID) = 1024", "[0, 1024)")
	f(func(o *PDOptions) { o.TRTMachineID = -1 }, "AIBRIX_TRT_MACHINE_ID) = -1")
	f(func(o *PDOptions) { o.TRTScheduleStyle = "gen_first" }, `AIBRIX_TRT_SCHEDULE_STYLE) = "gen_first"`)
	f(func(o *PDOptions) { o.StdDevFactor = -1 }, "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR) = -1")
	f(func(o *PDOptions) { o.DecodeFirstResponseTimeout = -1 }, "AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT) = -1ns")
	f(func(o *PDOptions) { o.DecodeResponseTimeout = -time.Second }, "AIBRIX_DECODE_RESPONSE_TIMEOUT) = -1s")
	f(func(o *PDOptions) { o.DecodeStreamIdleTimeout = -time.Second }, "AIBRIX_DECODE_STREAM_IDLE_TIMEOUT) = -1s")
	f(func(o *PDOptions) { o.CombinedPrefillBusy = -1 }, "combined_prefill_busy = -1")
	f(func(o *PDOptions) { o.CombinedDecodeBusy = -1 }, "combined_decode_busy = -1")
	f(func(o *PDOptions) { o.CombinedIdleMaxInFlight = -1 }, "combined_idle_max_in_flight = -1")
	f(func(o *PDOptions) { o.LocalPrefillMaxTokens = -1 }, "local_prefill_max_tokens = -1")
	if _, err := NewPDRouter(PDOptions{}); !errors.Is(err, ErrInvalidPDOption) {
		t.Fatalf("NewPDRouter(zero options) = %v, want ErrInvalidPDOption", err)
	}
}

func TestPDOptionsApplyEnv(t *testing.T) {
	env := map[string]string{
		"AIBRIX_PROMPT_LENGTH_BUCKETING":         "true",
		"AIBRIX_BUCKET_SERVE":                    "1",
		"AIBRIX_BUCKET_SERVE_MODE":               "rps",
		"AIBRIX_PREFILL_REQUEST_TIMEOUT":         "45",
		"AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS":  "0",
		"AIBRIX_DECODE_STREAM_IDLE_TIMEOUT":      "2m",
		"AIBRIX_PREFILL_SCORE_POLICY":            "hybrid_cache_load",
		"AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH": "false",
		"AIBRIX_TRT_MACHINE_ID":                  " 17 ",
		"AIBRIX_DECODE_SCORE_RATIO_THRESHOLD":    "2.5",
		"UNRELATED":                              "x",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	o := DefaultPDOptions()
	if err := o.ApplyEnv(lookup); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if !o.PromptLengthBucketing || !o.BucketServe || o.BucketServeMode != "rps" ||
		o.PrefillRequestTimeout != 45*time.Second || o.TokenLoadSessionTTL != 0 ||
		o.DecodeStreamIdleTimeout != 2*time.Minute || o.PrefillScorePolicy != "hybrid_cache_load" ||
		o.DecodeTokenLoadOutputGrowth || o.TRTMachineID != 17 || o.DecodeScoreRatioThreshold != 2.5 {
		t.Fatalf("ApplyEnv: %+v", o)
	}
	// Untouched knobs keep their defaults.
	if o.PrefillLoadImbalanceMinSpread != 16 {
		t.Fatalf("untouched knob changed: %d", o.PrefillLoadImbalanceMinSpread)
	}
	f := func(k, v, want string) {
		t.Helper()
		o := DefaultPDOptions()
		err := o.ApplyEnv(func(name string) (string, bool) { return v, name == k })
		if !errors.Is(err, ErrInvalidPDOption) || !strings.Contains(err.Error(), want) {
			t.Fatalf("ApplyEnv(%s=%q) = %v, want %q", k, v, err, want)
		}
	}
	f("AIBRIX_PROMPT_LENGTH_BUCKETING", "yes", `AIBRIX_PROMPT_LENGTH_BUCKETING = "yes"`)
	f("AIBRIX_TRT_MACHINE_ID", "1.5", `AIBRIX_TRT_MACHINE_ID = "1.5"`)
	f("AIBRIX_TOKEN_LOAD_KV_WEIGHT", "heavy", `AIBRIX_TOKEN_LOAD_KV_WEIGHT = "heavy"`)
	f("AIBRIX_TOKEN_LOAD_TTL_SECONDS", "an hour", `AIBRIX_TOKEN_LOAD_TTL_SECONDS = "an hour"`)
}

func TestModelProfilesResolve(t *testing.T) {
	def := DefaultPDOptions()
	tl := DefaultPDOptions()
	tl.PrefillScorePolicy = PrefillPolicyTokenLoad
	m := ModelProfiles{Profiles: []PDProfile{
		{Name: "default", RoutingStrategy: StrategyPD, PD: def},
		{Name: "long", RoutingStrategy: StrategyPD, PD: tl},
		{Name: "plain", PD: def},
	}}
	if err := m.Freeze(); err != nil {
		t.Fatal(err)
	}
	f := func(profile, header, wantProfile, wantStrategy string) {
		t.Helper()
		res, err := m.Resolve(profile, header)
		if err != nil {
			t.Fatal(err)
		}
		if res.Profile.Name != wantProfile || res.Strategy != wantStrategy {
			t.Fatalf("Resolve(%q, %q) = %s/%s, want %s/%s", profile, header, res.Profile.Name, res.Strategy, wantProfile, wantStrategy)
		}
		if (res.Strategy == StrategyPD) != (res.PD != nil) || (res.Strategy != "" && res.Strategy != StrategyPD) != (res.Policy != nil) {
			t.Fatalf("Resolve(%q, %q): strategy %q with PD %v policy %v", profile, header, res.Strategy, res.PD, res.Policy)
		}
	}
	f("", "", "default", "pd")
	f("long", "", "long", "pd")
	f("nosuch", "", "default", "pd")
	f("", "random", "default", "random")
	f("plain", "", "plain", "")
	if res, _ := m.Resolve("long", ""); res.PD.Options().PrefillScorePolicy != PrefillPolicyTokenLoad {
		t.Fatal("profile's options not in its router")
	}
	if _, err := m.Resolve("", "nosuch"); !errors.Is(err, ErrUnknownStrategy) {
		t.Fatalf("unknown header strategy: %v", err)
	}
	m.LockedRoutingStrategy = StrategyPD
	f("", "random", "default", "pd")
	f("plain", "least_request", "plain", "pd")
	if n := testing.AllocsPerRun(100, func() { _, _ = m.Resolve("long", "random") }); n != 0 {
		t.Fatalf("Resolve allocates %v", n)
	}

	bad := func(m ModelProfiles, want string) {
		t.Helper()
		if err := m.Freeze(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Freeze = %v, want %q", err, want)
		}
	}
	bad(ModelProfiles{}, "profiles must not be empty")
	bad(ModelProfiles{Profiles: []PDProfile{{Name: "a", PD: def}, {Name: "a", PD: def}}}, `profiles[1].name = "a" repeats`)
	bad(ModelProfiles{Profiles: []PDProfile{{PD: def}}}, "profiles[0].name must not be empty")
	bad(ModelProfiles{Profiles: []PDProfile{{Name: "a", RoutingStrategy: "fastest", PD: def}}}, `routing_strategy = "fastest"`)
	bad(ModelProfiles{LockedRoutingStrategy: "x", Profiles: []PDProfile{{Name: "a", PD: def}}}, `locked_routing_strategy = "x"`)
	bad(ModelProfiles{DefaultProfile: "b", Profiles: []PDProfile{{Name: "a", PD: def}}}, `default_profile = "b"`)
	bad(ModelProfiles{Profiles: []PDProfile{{Name: "a", PD: tl}, {Name: "z"}}}, `profiles[1] (profile "z")`)
	// Without a "default" profile the first one is the default.
	m = ModelProfiles{Profiles: []PDProfile{{Name: "a", RoutingStrategy: "round_robin", PD: def}}}
	if err := m.Freeze(); err != nil {
		t.Fatal(err)
	}
	f2, _ := m.Resolve("", "")
	if f2.Profile.Name != "a" || f2.Strategy != "round_robin" {
		t.Fatalf("first profile not the default: %+v", f2)
	}
}

func TestBucketPlanner(t *testing.T) {
	for n := range 1 << 20 {
		if n > 5000 && n%997 != 0 {
			continue
		}
		b := histBin(n)
		lo, hi := binRange(b)
		if n < lo || n >= hi {
			t.Fatalf("histBin(%d) = %d covering [%d, %d)", n, b, lo, hi)
		}
	}
	if b := histBin(1 << 30); b != histBins-1 {
		t.Fatalf("histBin(huge) = %d", b)
	}
	p := NewBucketPlanner(BucketServeRPS)
	if p.Roleset(100) != -1 {
		t.Fatal("a plan before any Rebuild")
	}
	// Roleset 0 alone serves 0..999; roleset 0 and 1 share 1000..; roleset
	// 1 has three times the replicas.
	for range 100 {
		p.Record(500)
	}
	for n := range 400 {
		p.Record(1000 + n*10)
	}
	sets := []BucketRoleset{{Min: 0, Replicas: 1}, {Min: 1000, Replicas: 3}}
	p.Rebuild(sets)
	// 500 requests: roleset 0's share is 125 and it already has 100 of its
	// own, so it takes the lowest 25 of the shared 400 (lengths below
	// about 1250); roleset 1 the rest.
	f := func(n, want int) {
		t.Helper()
		if got := p.Roleset(n); got != want {
			t.Fatalf("Roleset(%d) = %d, want %d", n, got, want)
		}
	}
	f(500, 0)
	f(1100, 0)
	f(1400, 1)
	f(4990, 1)
	f(1<<23, 1)
	// Rebuild halved the picture; an empty picture publishes no plan.
	q := NewBucketPlanner(BucketServeThroughput)
	q.Rebuild(sets)
	if q.Roleset(10) != -1 {
		t.Fatal("plan from no traffic")
	}
	// Throughput mode weighs by tokens: one 10000-token prompt outweighs
	// ninety 100-token ones.
	for range 90 {
		q.Record(100)
	}
	q.Record(10000)
	q.Rebuild([]BucketRoleset{{Replicas: 1}, {Replicas: 1}})
	if q.Roleset(100) != 0 || q.Roleset(10000) != 1 {
		t.Fatalf("throughput bands: 100 → %d, 10000 → %d", q.Roleset(100), q.Roleset(10000))
	}
	if n := testing.AllocsPerRun(100, func() { q.Record(700); _ = q.Roleset(700) }); n != 0 {
		t.Fatalf("Record+Roleset allocate %v", n)
	}
}

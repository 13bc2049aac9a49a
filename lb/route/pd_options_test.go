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
	// f breaks one knob and checks the message names it and quotes the
	// value.
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
	f(func(o *PDOptions) { o.BucketServe = true }, "bucket_serve = true", "prompt_length_bucketing")
	f(func(o *PDOptions) { o.BucketServeMode = "qps" }, `bucket_serve_mode = "qps"`)
	f(func(o *PDOptions) { o.PrefillRequestTimeout = 0 }, `prefill_request_timeout = "0s"`)
	f(func(o *PDOptions) { o.PrefillScorePolicy = "random" }, `prefill_score_policy = "random"`)
	f(func(o *PDOptions) { o.TokenLoadKVWeight = 0 }, "token_load_kv_weight = 0")
	f(func(o *PDOptions) { o.TokenLoadRequestCost = -1 }, "token_load_request_cost = -1")
	f(func(o *PDOptions) { o.TokenLoadTTL = 0 }, `token_load_ttl = "0s"`)
	f(func(o *PDOptions) { o.TokenLoadSessionTTL = -time.Second }, `token_load_session_ttl = "-1s"`)
	f(func(o *PDOptions) { o.TokenLoadMaxSessions = 0 }, "token_load_max_sessions = 0")
	f(func(o *PDOptions) { o.HybridCacheLoadFactor = 1.5 }, "hybrid_cache_load_factor = 1.5", "between 0 and 1")
	f(func(o *PDOptions) { o.MinMatchPct = 101 }, "min_match_pct = 101")
	f(func(o *PDOptions) { o.DecodeScorePolicy = "prefix_cache" }, `decode_score_policy = "prefix_cache"`)
	f(func(o *PDOptions) { o.KVConnectorType = "rdma" }, `kv_connector_type = "rdma"`)
	f(func(o *PDOptions) { o.PrefillLoadImbalanceMinSpread = 0 }, "prefill_load_imbalance_min_spread = 0")
	f(func(o *PDOptions) { o.DecodeLoadImbalanceMinSpread = -3 }, "decode_load_imbalance_min_spread = -3")
	f(func(o *PDOptions) { o.DecodeThroughputImbalanceMinSpread = 0 }, "decode_throughput_imbalance_min_spread = 0")
	f(func(o *PDOptions) { o.DecodeScoreRatioThreshold = 0.5 }, "decode_score_ratio_threshold = 0.5")
	f(func(o *PDOptions) { o.DecodeLBWeightRunning = -1 }, "decode_lb_weight_running = -1")
	f(func(o *PDOptions) { o.DecodeLBWeightThroughput = -1 }, "decode_lb_weight_throughput = -1")
	f(func(o *PDOptions) { o.DecodeLBWeightThroughput, o.DecodeLBWeightRunning = 0, 0 }, "must not both be 0")
	f(func(o *PDOptions) { o.TRTMachineID = 1024 }, "trt_machine_id = 1024", "[0, 1024)")
	f(func(o *PDOptions) { o.TRTMachineID = -1 }, "trt_machine_id = -1")
	f(func(o *PDOptions) { o.TRTScheduleStyle = "gen_first" }, `trt_schedule_style = "gen_first"`)
	f(func(o *PDOptions) { o.StdDevFactor = -1 }, "std_dev_factor = -1")
	f(func(o *PDOptions) { o.DecodeFirstResponseTimeout = -1 }, `decode_first_response_timeout = "-1ns"`)
	f(func(o *PDOptions) { o.DecodeResponseTimeout = -time.Second }, `decode_response_timeout = "-1s"`)
	f(func(o *PDOptions) { o.DecodeStreamIdleTimeout = -time.Second }, `decode_stream_idle_timeout = "-1s"`)
	f(func(o *PDOptions) { o.CombinedPrefillBusy = -1 }, "combined_prefill_busy = -1")
	f(func(o *PDOptions) { o.CombinedDecodeBusy = -1 }, "combined_decode_busy = -1")
	f(func(o *PDOptions) { o.CombinedIdleMaxInFlight = -1 }, "combined_idle_max_in_flight = -1")
	f(func(o *PDOptions) { o.LocalPrefillMaxTokens = -1 }, "local_prefill_max_tokens = -1")
	if _, err := NewPDRouter(PDOptions{}); !errors.Is(err, ErrInvalidPDOption) {
		t.Fatalf("NewPDRouter(zero options) = %v, want ErrInvalidPDOption", err)
	}
}

func TestPDOptionsSet(t *testing.T) {
	o := DefaultPDOptions()
	for knob, v := range map[string]string{
		"prompt_length_bucketing":         "true",
		"bucket_serve":                    "1",
		"bucket_serve_mode":               "rps",
		"prefill_request_timeout":         "45",
		"token_load_session_ttl":          "0",
		"decode_stream_idle_timeout":      "2m",
		"prefill_score_policy":            "hybrid_cache_load",
		"decode_token_load_output_growth": "false",
		"trt_machine_id":                  " 17 ",
		"decode_score_ratio_threshold":    "2.5",
	} {
		if err := o.Set(knob, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if !o.PromptLengthBucketing || !o.BucketServe || o.BucketServeMode != "rps" ||
		o.PrefillRequestTimeout != 45*time.Second || o.TokenLoadSessionTTL != 0 ||
		o.DecodeStreamIdleTimeout != 2*time.Minute || o.PrefillScorePolicy != "hybrid_cache_load" ||
		o.DecodeTokenLoadOutputGrowth || o.TRTMachineID != 17 || o.DecodeScoreRatioThreshold != 2.5 {
		t.Fatalf("Set: %+v", o)
	}
	// Untouched knobs keep their defaults.
	if o.PrefillLoadImbalanceMinSpread != 16 {
		t.Fatalf("untouched knob changed: %d", o.PrefillLoadImbalanceMinSpread)
	}
	f := func(knob, v, want string) {
		t.Helper()
		o := DefaultPDOptions()
		err := o.Set(knob, v)
		if !errors.Is(err, ErrInvalidPDOption) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Set(%s, %q) = %v, want %q", knob, v, err, want)
		}
	}
	f("prompt_length_bucketing", "yes", `prompt_length_bucketing = "yes"`)
	f("trt_machine_id", "1.5", `trt_machine_id = "1.5"`)
	f("token_load_kv_weight", "heavy", `token_load_kv_weight = "heavy"`)
	f("token_load_ttl", "an hour", `token_load_ttl = "an hour"`)
	f("colour", "red", `no knob "colour"`)
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
		if res.UsesCache != (res.Policy != nil && UsesCache(res.Strategy)) {
			t.Fatalf("Resolve(%q, %q): strategy %q with UsesCache %v", profile, header, res.Strategy, res.UsesCache)
		}
	}
	f("", "", "default", "pd")
	f("long", "", "long", "pd")
	f("nosuch", "", "default", "pd")
	f("", "random", "default", "random")
	f("", "prefix_cache", "default", "prefix_cache")
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

// TestBucketPlannerForgets: traffic that stopped fades out of the picture
// entirely. Halving rounded down left every bin that ever saw a request at
// a weight of 1 for good, which in rps mode weighs as much as a live
// request per rebuild and kept a stale plan published.
func TestBucketPlannerForgets(t *testing.T) {
	for _, mode := range []string{BucketServeRPS, BucketServeThroughput} {
		p := NewBucketPlanner(mode)
		for n := range 64 {
			p.Record(100 + 50*n)
		}
		sets := []BucketRoleset{{Replicas: 1}, {Replicas: 1}}
		for range 64 {
			p.Rebuild(sets)
		}
		if got := p.between(0, maxPlanTokens); got != 0 {
			t.Errorf("%s: %v of traffic left after 64 rebuilds without any", mode, got)
		}
		p.Rebuild(sets)
		if k := p.Roleset(100); k != -1 {
			t.Errorf("%s: a plan without traffic bands 100 tokens to roleset %d", mode, k)
		}
	}
}

// TestBucketPlannerZeroShares: a roleset whose share of a shared segment
// is zero gets none of it, and a shared segment without traffic is banded
// to no roleset (the cascade chooses there) until traffic shows where to
// cut it. A zero share used to cut at the top of the segment, handing all
// of it to the lowest roleset.
func TestBucketPlannerZeroShares(t *testing.T) {
	f := func(p *BucketPlanner, n, want int) {
		t.Helper()
		if got := p.Roleset(n); got != want {
			t.Fatalf("Roleset(%d) = %d, want %d", n, got, want)
		}
	}
	// Roleset 0's share is 125 of 500 requests and its own lengths bring
	// 400: the shared lengths from 1000 on all go to roleset 1.
	p := NewBucketPlanner(BucketServeRPS)
	for range 400 {
		p.Record(500)
	}
	for n := range 100 {
		p.Record(1000 + n*10)
	}
	p.Rebuild([]BucketRoleset{{Min: 0, Replicas: 1}, {Min: 1000, Replicas: 3}})
	f(p, 500, 0)
	f(p, 1000, 1)
	f(p, 1500, 1)
	// Both rolesets cover 1000..1999, which saw no traffic.
	q := NewBucketPlanner(BucketServeRPS)
	for range 10 {
		q.Record(500)
		q.Record(5000)
	}
	q.Rebuild([]BucketRoleset{{Min: 0, Max: 1999, Replicas: 1}, {Min: 1000, Replicas: 1}})
	f(q, 500, 0)
	f(q, 1500, -1)
	f(q, 5000, 1)
}

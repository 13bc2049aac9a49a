package route

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"pdlb/engines"
	"pdlb/internal/yamlkeys"
)

// PDOptions carries every knob of the prefill/decode cascade: each of
// AIBrix's gateway settings with the same default (lb/config maps its
// AIBRIX_* variables onto the knobs), the watchdog timeouts a profile may
// override, and pdlb's own knobs (combined overflow, conditional
// disaggregation). Start from DefaultPDOptions, apply YAML or Set, then
// Validate; a PDRouter freezes a validated copy.
type PDOptions struct {
	// PromptLengthBucketing matches requests to pods by prompt length
	// (AIBRIX_PROMPT_LENGTH_BUCKETING, default false).
	PromptLengthBucketing bool `yaml:"prompt_length_bucketing"`
	// BucketServe adds the adaptive band plan on top of bucketing
	// (AIBRIX_BUCKET_SERVE, default false).
	BucketServe bool `yaml:"bucket_serve"`
	// BucketServeMode is the unit of the band cut points: "throughput"
	// (prompt-token mass) or "rps" (request counts) (AIBRIX_BUCKET_SERVE_MODE,
	// default "throughput").
	BucketServeMode string `yaml:"bucket_serve_mode"`
	// PrefillRequestTimeout bounds the prefill leg
	// (AIBRIX_PREFILL_REQUEST_TIMEOUT, seconds, default 30s).
	PrefillRequestTimeout time.Duration `yaml:"prefill_request_timeout"`
	// PrefillScorePolicy scores prefill pods: prefix_cache, least_request,
	// conductor, token_load or hybrid_cache_load (AIBRIX_PREFILL_SCORE_POLICY,
	// default "prefix_cache").
	PrefillScorePolicy string `yaml:"prefill_score_policy"`
	// TokenLoadKVWeight weighs resident KV tokens in the token_load and
	// hybrid_cache_load scores (AIBRIX_TOKEN_LOAD_KV_WEIGHT, default 0.3).
	TokenLoadKVWeight float64 `yaml:"token_load_kv_weight"`
	// TokenLoadRequestCost is the fixed cost of a prefill charge, in tokens
	// (AIBRIX_TOKEN_LOAD_REQUEST_COST, default 3500).
	TokenLoadRequestCost float64 `yaml:"token_load_request_cost"`
	// TokenLoadTTL force-releases charges older than this
	// (AIBRIX_TOKEN_LOAD_TTL_SECONDS, default 3600s).
	TokenLoadTTL time.Duration `yaml:"token_load_ttl"`
	// TokenLoadSessionTTL is how long a session's last prompt size is kept
	// for the session-delta charge; 0 turns the rule off
	// (AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS, default 1800s).
	TokenLoadSessionTTL time.Duration `yaml:"token_load_session_ttl"`
	// TokenLoadMaxSessions bounds the session table
	// (AIBRIX_TOKEN_LOAD_MAX_SESSIONS, default 100000).
	TokenLoadMaxSessions int `yaml:"token_load_max_sessions"`
	// HybridCacheLoadFactor is the discount a full prefix match applies to a
	// pod's load, 0..1 (AIBRIX_HYBRID_CACHE_LOAD_FACTOR, default 0.5).
	HybridCacheLoadFactor float64 `yaml:"hybrid_cache_load_factor"`
	// MinMatchPct ignores prefix matches below this percentage, 0..100
	// (AIBRIX_MIN_MATCH_PCT, default 0 = off).
	MinMatchPct float64 `yaml:"min_match_pct"`
	// DecodeTokenLoadOutputGrowth adds the output generated so far to the
	// token_load decode score (AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH,
	// default true).
	DecodeTokenLoadOutputGrowth bool `yaml:"decode_token_load_output_growth"`
	// TokenLoadSharedLedger shares the decode ledger through Redis when one
	// is configured (AIBRIX_TOKEN_LOAD_SHARED_LEDGER, default true).
	TokenLoadSharedLedger bool `yaml:"token_load_shared_ledger"`
	// DecodeScorePolicy scores decode pods: load_balancing, least_request,
	// conductor or token_load (AIBRIX_DECODE_SCORE_POLICY, default
	// "load_balancing").
	DecodeScorePolicy string `yaml:"decode_score_policy"`
	// KVConnectorType is the vLLM KV transfer adapter, "shfs" or "nixl"
	// (AIBRIX_KV_CONNECTOR_TYPE, default "shfs").
	KVConnectorType string `yaml:"kv_connector_type"`
	// PrefillLoadImbalanceMinSpread: an outstanding-prefill spread (max − min
	// over prefill pods) at least this large sends the prefill to the least
	// loaded pod (AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD, default 16).
	PrefillLoadImbalanceMinSpread int `yaml:"prefill_load_imbalance_min_spread"`
	// DecodeLoadImbalanceMinSpread: a running+pending spread at least this
	// large over decode pods with metrics sends the decode to the least
	// loaded one (AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD, default 16).
	DecodeLoadImbalanceMinSpread int `yaml:"decode_load_imbalance_min_spread"`
	// DecodeThroughputImbalanceMinSpread: a generation-throughput spread
	// above this (tokens/s) sends the decode to the slowest pod
	// (AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD, default 2048).
	DecodeThroughputImbalanceMinSpread float64 `yaml:"decode_throughput_imbalance_min_spread"`
	// DecodeScoreRatioThreshold: when every decode pod reports a drain rate
	// and max/min of (running+pending)/drain_rate exceeds this, the decode
	// goes to the pod that drains soonest (AIBRIX_DECODE_SCORE_RATIO_THRESHOLD,
	// default 1.5).
	DecodeScoreRatioThreshold float64 `yaml:"decode_score_ratio_threshold"`
	// DecodeLBWeightRunning and DecodeLBWeightThroughput weigh the running
	// and inverse-throughput terms of load_balancing
	// (AIBRIX_DECODE_LB_WEIGHT_RUNNING, AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT,
	// defaults 1.0).
	DecodeLBWeightRunning    float64 `yaml:"decode_lb_weight_running"`
	DecodeLBWeightThroughput float64 `yaml:"decode_lb_weight_throughput"`
	// PDOptions are the engine-specific knobs, inline in the section:
	// TensorRT-LLM's trt_machine_id (AIBRIX_TRT_MACHINE_ID, default 0) and
	// trt_schedule_style (AIBRIX_TRT_SCHEDULE_STYLE, default
	// "context_first").
	engines.PDOptions `yaml:",inline"`
	// StdDevFactor skips prefill pods whose outstanding prefills exceed the
	// mean by more than this many standard deviations
	// (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR, default 1).
	StdDevFactor float64 `yaml:"std_dev_factor"`

	// The decode watchdog (AIBrix, "SGLang Decode Watchdog"); 0 disables
	// each. DecodeFirstResponseTimeout bounds the wait for a stream's first
	// chunk after the prefill succeeded (AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT,
	// default 60s); DecodeResponseTimeout the same for a non-streaming
	// answer (AIBRIX_DECODE_RESPONSE_TIMEOUT, default 0 = off);
	// DecodeStreamIdleTimeout the gap between two chunks
	// (AIBRIX_DECODE_STREAM_IDLE_TIMEOUT, default 120s).
	DecodeFirstResponseTimeout time.Duration `yaml:"decode_first_response_timeout"`
	DecodeResponseTimeout      time.Duration `yaml:"decode_response_timeout"`
	DecodeStreamIdleTimeout    time.Duration `yaml:"decode_stream_idle_timeout"`

	// pdlb's own knobs (no AIBRIX_* alias).

	// CombinedPrefillBusy and CombinedDecodeBusy define "PD pairs heavily
	// loaded" for the combined overflow (AIBrix's shouldPickCombined): the
	// least loaded eligible prefill pod has at least CombinedPrefillBusy
	// outstanding prefills, or the least loaded decode pod at least
	// CombinedDecodeBusy running+waiting+pending requests (defaults 8 and
	// 64; 0 disables that half). A combined pod is "idle" when it has at
	// most CombinedIdleMaxInFlight requests in flight (default 0).
	CombinedPrefillBusy     int `yaml:"combined_prefill_busy"`
	CombinedDecodeBusy      int `yaml:"combined_decode_busy"`
	CombinedIdleMaxInFlight int `yaml:"combined_idle_max_in_flight"`
	// LocalPrefillMaxTokens is conditional disaggregation: when
	// the prompt tokens the chosen decode pod does not already hold are at
	// most this many, the prefill leg is skipped and the decode pod prefills
	// locally (default 0 = always disaggregate). Ignored on a model whose
	// decode pods refuse such a request (SGLang's: ModelProfiles.DecodeNeedsExchange).
	LocalPrefillMaxTokens int `yaml:"local_prefill_max_tokens"`
}

// Policy names of the cascade (AIBrix, steps 3 and 4).
const (
	PrefillPolicyPrefixCache     = "prefix_cache"
	PrefillPolicyLeastRequest    = "least_request"
	PrefillPolicyConductor       = "conductor"
	PrefillPolicyTokenLoad       = "token_load"
	PrefillPolicyHybridCacheLoad = "hybrid_cache_load"

	DecodePolicyLoadBalancing = "load_balancing"
	DecodePolicyLeastRequest  = "least_request"
	DecodePolicyConductor     = "conductor"
	DecodePolicyTokenLoad     = "token_load"

	BucketServeThroughput = "throughput"
	BucketServeRPS        = "rps"

	TRTContextFirst    = engines.TRTContextFirst
	TRTGenerationFirst = engines.TRTGenerationFirst
)

// Defaults of PDOptions: AIBrix's table, then pdlb's own.
const (
	DefaultPrefillRequestTimeout              = 30 * time.Second
	DefaultPrefillScorePolicy                 = PrefillPolicyPrefixCache
	DefaultTokenLoadRequestCost               = 3500
	DefaultTokenLoadTTL                       = 3600 * time.Second
	DefaultTokenLoadSessionTTL                = 1800 * time.Second
	DefaultTokenLoadMaxSessions               = 100000
	DefaultTokenLoadSharedLedger              = true
	DefaultDecodeScorePolicy                  = DecodePolicyLoadBalancing
	DefaultKVConnectorType                    = "shfs"
	DefaultPrefillLoadImbalanceMinSpread      = 16
	DefaultDecodeLoadImbalanceMinSpread       = 16
	DefaultDecodeThroughputImbalanceMinSpread = 2048
	DefaultDecodeScoreRatioThreshold          = 1.5
	DefaultDecodeLBWeightRunning              = 1.0
	DefaultDecodeLBWeightThroughput           = 1.0
	DefaultTRTMachineID                       = 0
	DefaultTRTScheduleStyle                   = TRTContextFirst
	DefaultDecodeFirstResponseTimeout         = 60 * time.Second
	DefaultDecodeResponseTimeout              = 0
	DefaultDecodeStreamIdleTimeout            = 120 * time.Second
	DefaultBucketServeMode                    = BucketServeThroughput

	DefaultCombinedPrefillBusy     = 8
	DefaultCombinedDecodeBusy      = 64
	DefaultCombinedIdleMaxInFlight = 0
	DefaultLocalPrefillMaxTokens   = 0
)

// DefaultPDOptions returns every knob at its default.
func DefaultPDOptions() PDOptions {
	return PDOptions{
		BucketServeMode:                    DefaultBucketServeMode,
		PrefillRequestTimeout:              DefaultPrefillRequestTimeout,
		PrefillScorePolicy:                 DefaultPrefillScorePolicy,
		TokenLoadKVWeight:                  DefaultTokenLoadKVWeight,
		TokenLoadRequestCost:               DefaultTokenLoadRequestCost,
		TokenLoadTTL:                       DefaultTokenLoadTTL,
		TokenLoadSessionTTL:                DefaultTokenLoadSessionTTL,
		TokenLoadMaxSessions:               DefaultTokenLoadMaxSessions,
		HybridCacheLoadFactor:              DefaultHybridCacheLoadFactor,
		MinMatchPct:                        DefaultMinMatchPct,
		DecodeTokenLoadOutputGrowth:        DefaultDecodeOutputGrowth,
		TokenLoadSharedLedger:              DefaultTokenLoadSharedLedger,
		DecodeScorePolicy:                  DefaultDecodeScorePolicy,
		KVConnectorType:                    DefaultKVConnectorType,
		PrefillLoadImbalanceMinSpread:      DefaultPrefillLoadImbalanceMinSpread,
		DecodeLoadImbalanceMinSpread:       DefaultDecodeLoadImbalanceMinSpread,
		DecodeThroughputImbalanceMinSpread: DefaultDecodeThroughputImbalanceMinSpread,
		DecodeScoreRatioThreshold:          DefaultDecodeScoreRatioThreshold,
		DecodeLBWeightRunning:              DefaultDecodeLBWeightRunning,
		DecodeLBWeightThroughput:           DefaultDecodeLBWeightThroughput,
		PDOptions:                          engines.PDOptions{TRTMachineID: DefaultTRTMachineID, TRTScheduleStyle: DefaultTRTScheduleStyle},
		StdDevFactor:                       DefaultStdDevFactor,
		DecodeFirstResponseTimeout:         DefaultDecodeFirstResponseTimeout,
		DecodeResponseTimeout:              DefaultDecodeResponseTimeout,
		DecodeStreamIdleTimeout:            DefaultDecodeStreamIdleTimeout,
		CombinedPrefillBusy:                DefaultCombinedPrefillBusy,
		CombinedDecodeBusy:                 DefaultCombinedDecodeBusy,
		CombinedIdleMaxInFlight:            DefaultCombinedIdleMaxInFlight,
		LocalPrefillMaxTokens:              DefaultLocalPrefillMaxTokens,
	}
}

// ErrInvalidPDOption wraps every error of Validate and Set.
var ErrInvalidPDOption = errors.New("route: invalid pd option")

// pdKnob is one row of the knob table that Validate and Set share, so a
// knob's name, its value and its rule sit in one place. ptr returns a
// pointer to the field: *bool, *int, *float64, *string or *time.Duration.
// check returns why a value is bad, or "".
type pdKnob struct {
	yaml  string
	ptr   func(o *PDOptions) any
	check func(o *PDOptions) string
}

func oneOf(v string, names ...string) string {
	for _, n := range names {
		if v == n {
			return ""
		}
	}
	return "is not one of " + strings.Join(names, ", ")
}

func positive[T int | float64 | time.Duration](v T) string {
	if v > 0 {
		return ""
	}
	return "must be positive"
}

func nonNegative[T int | float64 | time.Duration](v T) string {
	if v >= 0 {
		return ""
	}
	return "must not be negative"
}

func within(v, lo, hi float64) string {
	if v >= lo && v <= hi {
		return ""
	}
	return fmt.Sprintf("must be between %g and %g", lo, hi)
}

func noCheck(*PDOptions) string { return "" }

var pdKnobs = []pdKnob{
	{"prompt_length_bucketing",
		func(o *PDOptions) any { return &o.PromptLengthBucketing }, noCheck},
	{"bucket_serve",
		func(o *PDOptions) any { return &o.BucketServe },
		func(o *PDOptions) string {
			if o.BucketServe && !o.PromptLengthBucketing {
				return "needs prompt_length_bucketing on"
			}
			return ""
		}},
	{"bucket_serve_mode",
		func(o *PDOptions) any { return &o.BucketServeMode },
		func(o *PDOptions) string { return oneOf(o.BucketServeMode, BucketServeThroughput, BucketServeRPS) }},
	{"prefill_request_timeout",
		func(o *PDOptions) any { return &o.PrefillRequestTimeout },
		func(o *PDOptions) string { return positive(o.PrefillRequestTimeout) }},
	{"prefill_score_policy",
		func(o *PDOptions) any { return &o.PrefillScorePolicy },
		func(o *PDOptions) string {
			return oneOf(o.PrefillScorePolicy, PrefillPolicyPrefixCache, PrefillPolicyLeastRequest, PrefillPolicyConductor, PrefillPolicyTokenLoad, PrefillPolicyHybridCacheLoad)
		}},
	{"token_load_kv_weight",
		func(o *PDOptions) any { return &o.TokenLoadKVWeight },
		func(o *PDOptions) string { return positive(o.TokenLoadKVWeight) }},
	{"token_load_request_cost",
		func(o *PDOptions) any { return &o.TokenLoadRequestCost },
		func(o *PDOptions) string { return positive(o.TokenLoadRequestCost) }},
	{"token_load_ttl",
		func(o *PDOptions) any { return &o.TokenLoadTTL },
		func(o *PDOptions) string { return positive(o.TokenLoadTTL) }},
	{"token_load_session_ttl",
		func(o *PDOptions) any { return &o.TokenLoadSessionTTL },
		func(o *PDOptions) string { return nonNegative(o.TokenLoadSessionTTL) }},
	{"token_load_max_sessions",
		func(o *PDOptions) any { return &o.TokenLoadMaxSessions },
		func(o *PDOptions) string { return positive(o.TokenLoadMaxSessions) }},
	{"hybrid_cache_load_factor",
		func(o *PDOptions) any { return &o.HybridCacheLoadFactor },
		func(o *PDOptions) string { return within(o.HybridCacheLoadFactor, 0, 1) }},
	{"min_match_pct",
		func(o *PDOptions) any { return &o.MinMatchPct },
		func(o *PDOptions) string { return within(o.MinMatchPct, 0, 100) }},
	{"decode_token_load_output_growth",
		func(o *PDOptions) any { return &o.DecodeTokenLoadOutputGrowth }, noCheck},
	{"token_load_shared_ledger",
		func(o *PDOptions) any { return &o.TokenLoadSharedLedger }, noCheck},
	{"decode_score_policy",
		func(o *PDOptions) any { return &o.DecodeScorePolicy },
		func(o *PDOptions) string {
			return oneOf(o.DecodeScorePolicy, DecodePolicyLoadBalancing, DecodePolicyLeastRequest, DecodePolicyConductor, DecodePolicyTokenLoad)
		}},
	{"kv_connector_type",
		func(o *PDOptions) any { return &o.KVConnectorType },
		func(o *PDOptions) string { return oneOf(o.KVConnectorType, "shfs", "nixl") }},
	{"prefill_load_imbalance_min_spread",
		func(o *PDOptions) any { return &o.PrefillLoadImbalanceMinSpread },
		func(o *PDOptions) string { return positive(o.PrefillLoadImbalanceMinSpread) }},
	{"decode_load_imbalance_min_spread",
		func(o *PDOptions) any { return &o.DecodeLoadImbalanceMinSpread },
		func(o *PDOptions) string { return positive(o.DecodeLoadImbalanceMinSpread) }},
	{"decode_throughput_imbalance_min_spread",
		func(o *PDOptions) any { return &o.DecodeThroughputImbalanceMinSpread },
		func(o *PDOptions) string { return positive(o.DecodeThroughputImbalanceMinSpread) }},
	{"decode_score_ratio_threshold",
		func(o *PDOptions) any { return &o.DecodeScoreRatioThreshold },
		func(o *PDOptions) string {
			if o.DecodeScoreRatioThreshold >= 1 {
				return ""
			}
			return "must be at least 1 (a ratio of max to min)"
		}},
	{"decode_lb_weight_running",
		func(o *PDOptions) any { return &o.DecodeLBWeightRunning },
		func(o *PDOptions) string { return nonNegative(o.DecodeLBWeightRunning) }},
	{"decode_lb_weight_throughput",
		func(o *PDOptions) any { return &o.DecodeLBWeightThroughput },
		func(o *PDOptions) string {
			if why := nonNegative(o.DecodeLBWeightThroughput); why != "" {
				return why
			}
			if o.DecodeLBWeightThroughput == 0 && o.DecodeLBWeightRunning == 0 {
				return "and decode_lb_weight_running must not both be 0"
			}
			return ""
		}},
	{"trt_machine_id",
		func(o *PDOptions) any { return &o.TRTMachineID },
		func(o *PDOptions) string {
			if o.TRTMachineID >= 0 && o.TRTMachineID < engines.TRTMachineIDLimit {
				return ""
			}
			return fmt.Sprintf("must be in [0, %d) (a 10-bit field)", engines.TRTMachineIDLimit)
		}},
	{"trt_schedule_style",
		func(o *PDOptions) any { return &o.TRTScheduleStyle },
		func(o *PDOptions) string { return oneOf(o.TRTScheduleStyle, TRTContextFirst, TRTGenerationFirst) }},
	{"std_dev_factor",
		func(o *PDOptions) any { return &o.StdDevFactor },
		func(o *PDOptions) string { return nonNegative(o.StdDevFactor) }},
	{"decode_first_response_timeout",
		func(o *PDOptions) any { return &o.DecodeFirstResponseTimeout },
		func(o *PDOptions) string { return nonNegative(o.DecodeFirstResponseTimeout) }},
	{"decode_response_timeout",
		func(o *PDOptions) any { return &o.DecodeResponseTimeout },
		func(o *PDOptions) string { return nonNegative(o.DecodeResponseTimeout) }},
	{"decode_stream_idle_timeout",
		func(o *PDOptions) any { return &o.DecodeStreamIdleTimeout },
		func(o *PDOptions) string { return nonNegative(o.DecodeStreamIdleTimeout) }},
	{"combined_prefill_busy",
		func(o *PDOptions) any { return &o.CombinedPrefillBusy },
		func(o *PDOptions) string { return nonNegative(o.CombinedPrefillBusy) }},
	{"combined_decode_busy",
		func(o *PDOptions) any { return &o.CombinedDecodeBusy },
		func(o *PDOptions) string { return nonNegative(o.CombinedDecodeBusy) }},
	{"combined_idle_max_in_flight",
		func(o *PDOptions) any { return &o.CombinedIdleMaxInFlight },
		func(o *PDOptions) string { return nonNegative(o.CombinedIdleMaxInFlight) }},
	{"local_prefill_max_tokens",
		func(o *PDOptions) any { return &o.LocalPrefillMaxTokens },
		func(o *PDOptions) string { return nonNegative(o.LocalPrefillMaxTokens) }},
}

// KnobError is a knob Validate rejects: its YAML name, its value as the
// YAML shows it (strings and durations quoted), and why. It matches ErrInvalidPDOption.
type KnobError struct{ Knob, Value, Why string }

func (e *KnobError) Error() string {
	return fmt.Sprintf("%v: %s = %s %s", ErrInvalidPDOption, e.Knob, e.Value, e.Why)
}

// Unwrap makes errors.Is(err, ErrInvalidPDOption) hold.
func (e *KnobError) Unwrap() error { return ErrInvalidPDOption }

// knobValue is the value of the knob at p as the other config errors show
// theirs (yamlkeys.Quote).
func knobValue(p any) string { return yamlkeys.Quote(reflect.ValueOf(p).Elem().Interface()) }

// Validate rejects the first bad knob with a *KnobError, its YAML name
// and the value quoted. It never corrects a value, unlike AIBrix's
// gateway plugin, which keeps the default for an unknown bucket-serve mode
// or TRT schedule style: a typo should stop the start, not change the
// routing silently.
func (o PDOptions) Validate() error {
	for i := range pdKnobs {
		k := &pdKnobs[i]
		if why := k.check(&o); why != "" {
			return &KnobError{Knob: k.yaml, Value: knobValue(k.ptr(&o)), Why: why}
		}
	}
	return nil
}

// Set sets the knob of YAML name knob from text, as an environment
// variable writes it: booleans in strconv.ParseBool's forms, durations in
// seconds or as a Go duration, surrounding spaces ignored. An unknown knob
// or a value that does not parse is an error; ranges are Validate's job.
func (o *PDOptions) Set(knob, text string) error {
	for i := range pdKnobs {
		k := &pdKnobs[i]
		if k.yaml != knob {
			continue
		}
		s := strings.TrimSpace(text)
		var err error
		switch p := k.ptr(o).(type) {
		case *string:
			*p = s
		case *bool:
			*p, err = strconv.ParseBool(s)
		case *int:
			*p, err = strconv.Atoi(s)
		case *float64:
			*p, err = strconv.ParseFloat(s, 64)
		case *time.Duration:
			*p, err = parseSeconds(s)
		}
		if err != nil {
			return fmt.Errorf("%w: %s = %q does not parse: %v", ErrInvalidPDOption, knob, text, err)
		}
		return nil
	}
	return fmt.Errorf("%w: no knob %q", ErrInvalidPDOption, knob)
}

// parseSeconds reads a number of seconds, or a Go duration such as "1m30s".
func parseSeconds(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(f * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// routeOptions maps the knobs the existing scorers read onto Options.
func (o *PDOptions) routeOptions() Options {
	r := DefaultOptions()
	r.MinMatchPct = o.MinMatchPct
	r.StdDevFactor = o.StdDevFactor
	r.TokenLoadKVWeight = o.TokenLoadKVWeight
	r.HybridCacheLoadFactor = o.HybridCacheLoadFactor
	r.DecodeOutputGrowth = o.DecodeTokenLoadOutputGrowth
	return r
}

package config

import (
	"errors"
	"fmt"
	"strings"

	"pdlb/lb/route"
)

// AIBrix's names for what pdlb also reads, in one place, so a user moving
// from AIBrix's gateway plugin keeps their clients and settings: its
// session-key header and its AIBRIX_* environment variables. The
// model.aibrix.ai/* labels and annotations discovery reads are
// lb/discovery/spec's, beside the rest of the discovery vocabulary.

// HeaderAIBrixSessionKey is AIBrix's session-key header, an alias of
// x-session-key: the caller-owned key of session affinity and of the
// token ledger's session-delta charge.
const HeaderAIBrixSessionKey = "x-aibrix-session-key"

// aibrixEnv maps each AIBRIX_* variable to the pd knob it sets (its YAML
// name in route.PDOptions). Durations are in seconds, as AIBrix writes them.
var aibrixEnv = []struct{ env, knob string }{
	{"AIBRIX_PROMPT_LENGTH_BUCKETING", "prompt_length_bucketing"},
	{"AIBRIX_BUCKET_SERVE", "bucket_serve"},
	{"AIBRIX_BUCKET_SERVE_MODE", "bucket_serve_mode"},
	{"AIBRIX_PREFILL_REQUEST_TIMEOUT", "prefill_request_timeout"},
	{"AIBRIX_PREFILL_SCORE_POLICY", "prefill_score_policy"},
	{"AIBRIX_TOKEN_LOAD_KV_WEIGHT", "token_load_kv_weight"},
	{"AIBRIX_TOKEN_LOAD_REQUEST_COST", "token_load_request_cost"},
	{"AIBRIX_TOKEN_LOAD_TTL_SECONDS", "token_load_ttl"},
	{"AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS", "token_load_session_ttl"},
	{"AIBRIX_TOKEN_LOAD_MAX_SESSIONS", "token_load_max_sessions"},
	{"AIBRIX_HYBRID_CACHE_LOAD_FACTOR", "hybrid_cache_load_factor"},
	{"AIBRIX_MIN_MATCH_PCT", "min_match_pct"},
	{"AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH", "decode_token_load_output_growth"},
	{"AIBRIX_TOKEN_LOAD_SHARED_LEDGER", "token_load_shared_ledger"},
	{"AIBRIX_DECODE_SCORE_POLICY", "decode_score_policy"},
	{"AIBRIX_KV_CONNECTOR_TYPE", "kv_connector_type"},
	{"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD", "prefill_load_imbalance_min_spread"},
	{"AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD", "decode_load_imbalance_min_spread"},
	{"AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD", "decode_throughput_imbalance_min_spread"},
	{"AIBRIX_DECODE_SCORE_RATIO_THRESHOLD", "decode_score_ratio_threshold"},
	{"AIBRIX_DECODE_LB_WEIGHT_RUNNING", "decode_lb_weight_running"},
	{"AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT", "decode_lb_weight_throughput"},
	{"AIBRIX_TRT_MACHINE_ID", "trt_machine_id"},
	{"AIBRIX_TRT_SCHEDULE_STYLE", "trt_schedule_style"},
	{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "std_dev_factor"},
	{"AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT", "decode_first_response_timeout"},
	{"AIBRIX_DECODE_RESPONSE_TIMEOUT", "decode_response_timeout"},
	{"AIBRIX_DECODE_STREAM_IDLE_TIMEOUT", "decode_stream_idle_timeout"},
}

// ApplyEnv sets the pd section's knobs from the AIBRIX_* variables that
// lookup finds (pass os.LookupEnv). Load applies it before the file, so
// the file wins; a caller building a configuration without a file calls
// it after Default. A value that does not parse is an error naming the
// variable; ranges are Validate's.
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	for _, a := range aibrixEnv {
		v, found := lookup(a.env)
		if !found {
			continue
		}
		if err := c.PD.Set(a.knob, v); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, a.env, err)
		}
	}
	return nil
}

// withAlias names a pd knob that route rejected by its AIBRIX_* variable
// too, "knob (AIBRIX_KNOB) = value", so a user who set the variable
// recognises it.
func withAlias(err error) string {
	var k *route.KnobError
	if !errors.As(err, &k) {
		return err.Error()
	}
	for _, a := range aibrixEnv {
		if a.knob == k.Knob {
			return strings.Replace(err.Error(), k.Knob+" = ", k.Knob+" ("+a.env+") = ", 1)
		}
	}
	return err.Error()
}

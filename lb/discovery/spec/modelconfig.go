package spec

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Labels and annotations of AIBrix's gateway plugin, read as it reads them so its
// deployments are picked up unchanged.
const (
	// LabelModel names the model a pod serves (required).
	LabelModel = "model.aibrix.ai/name"
	// LabelPort is the port of the pod's OpenAI API (default 8000).
	LabelPort = "model.aibrix.ai/port"
	// LabelEngine is vllm (default), sglang or trtllm.
	LabelEngine = "model.aibrix.ai/engine"
	// LabelRole is "prefill", "decode", or anything else (or absent) for a
	// pod that runs both phases.
	LabelRole = "role-name"
	// LabelRoleset pairs prefill and decode pods.
	LabelRoleset = "roleset-name"
	// AnnotationBootstrapPort is an SGLang pod's PD bootstrap port (default
	// 8998); AIBrix calls it an annotation, and it is read from the labels
	// too where the annotation is absent.
	AnnotationBootstrapPort = "model.aibrix.ai/sglang-bootstrap-port"
	// AnnotationConfig holds the profiles JSON (ModelConfig).
	AnnotationConfig = "model.aibrix.ai/config"
	// AnnotationKVEventsPort is pdlb's own: the port of the pod's KV-event
	// publisher (vLLM's default is 5557); absent, the gateway learns the
	// pod's cache only from its own routing decisions.
	AnnotationKVEventsPort = "pdlb/kv-events-port"
	// AnnotationKVReplayPort is pdlb's own: the port of the pod's KV-event
	// replay socket, beside AnnotationKVEventsPort (default 5558).
	AnnotationKVReplayPort = "pdlb/kv-replay-port"
	// AnnotationDataParallelSize is pdlb's own: the engine ranks behind the
	// pod's API server (vLLM's --data-parallel-size, default 1); rank r
	// publishes its KV events on both ports + r.
	AnnotationDataParallelSize = "pdlb/data-parallel-size"
	// AnnotationDataParallelRouting is pdlb's own: the pod's
	// data_parallel_routing, "prefix" (default) or "engine".
	AnnotationDataParallelRouting = "pdlb/data-parallel-routing"
	// AnnotationLoRAAdapters is pdlb's own: the LoRA adapters the pod
	// serves from its start (its --lora-modules), "name" or "name=path",
	// comma-separated (config.ParseAdapters).
	AnnotationLoRAAdapters = "pdlb/lora-adapters"
)

// DefaultPodPort is the OpenAI API port of a pod without LabelPort (vLLM's
// default port).
const DefaultPodPort = 8000

// Roles, as pdlb names them; LabelRole values other than prefill and
// decode mean combined.
const (
	RoleCombined = "combined"
	RolePrefill  = "prefill"
	RoleDecode   = "decode"
)

// DefaultProfileName is the profile used when the config names no
// defaultProfile.
const DefaultProfileName = "default"

// Score policies a routingConfig may name (AIBrix).
var (
	PrefillScorePolicies = []string{"prefix_cache", "least_request", "conductor", "token_load", "hybrid_cache_load"}
	DecodeScorePolicies  = []string{"load_balancing", "least_request", "conductor", "token_load"}
)

// ModelConfig is the model.aibrix.ai/config annotation: named profiles of
// routing settings, one chosen per request (by the config-profile request
// header, else DefaultProfile). Unknown fields are ignored so annotations
// written for newer routers still parse.
type ModelConfig struct {
	// DefaultProfile names the profile of requests that name none or an
	// unknown one (default "default").
	DefaultProfile string `json:"defaultProfile"`
	// LockedRoutingStrategy, when set, is the routing strategy of every
	// request of the model; a routing-strategy request header cannot
	// override it.
	LockedRoutingStrategy string `json:"lockedRoutingStrategy"`
	// Profiles by name.
	Profiles map[string]Profile `json:"profiles"`
}

// Profile is one named set of routing settings.
type Profile struct {
	// RoutingStrategy is the strategy of the profile's requests, e.g. "pd",
	// "random", "least-request".
	RoutingStrategy string `json:"routingStrategy"`
	// RoutingConfig holds the strategy's settings.
	RoutingConfig RoutingConfig `json:"routingConfig"`
}

// RoutingConfig is a profile's routingConfig. The bucket bounds and
// Combined describe the pod that carries the annotation; the rest are
// settings of the profile's requests.
type RoutingConfig struct {
	// Combined marks a standard inference pod that runs both phases.
	Combined bool `json:"combined"`
	// PromptLenBucketMinLength and PromptLenBucketMaxLength bound the prompt
	// lengths (tokens, inclusive) the pod serves when bucketing is on; a
	// maximum of 0 means unlimited.
	PromptLenBucketMinLength int `json:"promptLenBucketMinLength"`
	PromptLenBucketMaxLength int `json:"promptLenBucketMaxLength"`
	// PromptLengthBucketing, when set, turns bucketing on or off for the
	// profile's requests.
	PromptLengthBucketing *bool `json:"promptLengthBucketing"`
	// BucketServe and BucketServeMode ("throughput" or "rps"), when set,
	// override adaptive bucket serving for the profile's requests.
	BucketServe     *bool  `json:"bucketServe"`
	BucketServeMode string `json:"bucketServeMode"`
	// PrefillScorePolicy is one of PrefillScorePolicies ("" keeps the
	// gateway's default, prefix_cache).
	PrefillScorePolicy string `json:"prefillScorePolicy"`
	// DecodeScorePolicy is one of DecodeScorePolicies ("" keeps the
	// gateway's default, load_balancing).
	DecodeScorePolicy string `json:"decodeScorePolicy"`
	// PD holds the prefill/decode thresholds of the profile's requests.
	PD PDKnobs `json:"pd"`
}

// PDKnobs are AIBrix's per-profile prefill/decode settings, each
// overriding the matching gateway setting (named in brackets) for the
// profile's requests only. Nil means unset: the gateway's value stands.
// Durations are in seconds, as the router's environment variables are.
type PDKnobs struct {
	PrefillRequestTimeout              *float64 `json:"prefillRequestTimeout"`              // s (AIBRIX_PREFILL_REQUEST_TIMEOUT, 30)
	PrefillLoadImbalanceMinSpread      *float64 `json:"prefillLoadImbalanceMinSpread"`      // requests (16)
	DecodeLoadImbalanceMinSpread       *float64 `json:"decodeLoadImbalanceMinSpread"`       // requests (16)
	DecodeThroughputImbalanceMinSpread *float64 `json:"decodeThroughputImbalanceMinSpread"` // tokens/s (2048)
	DecodeScoreRatioThreshold          *float64 `json:"decodeScoreRatioThreshold"`          // ratio (1.5)
	DecodeLBWeightRunning              *float64 `json:"decodeLBWeightRunning"`              // (1.0)
	DecodeLBWeightThroughput           *float64 `json:"decodeLBWeightThroughput"`           // (1.0)
	TokenLoadKVWeight                  *float64 `json:"tokenLoadKVWeight"`                  // (0.3)
	TokenLoadRequestCost               *float64 `json:"tokenLoadRequestCost"`               // tokens (3500)
	TokenLoadTTLSeconds                *float64 `json:"tokenLoadTTLSeconds"`                // s (3600)
	TokenLoadSessionTTLSeconds         *float64 `json:"tokenLoadSessionTTLSeconds"`         // s (1800); 0 turns session deltas off
	HybridCacheLoadFactor              *float64 `json:"hybridCacheLoadFactor"`              // 0..1 (0.5)
	MinMatchPct                        *float64 `json:"minMatchPct"`                        // 0..100 (0)
	DecodeAbortTimeout                 *float64 `json:"decodeAbortTimeout"`                 // s; 0 disables aborts
	DecodeAbortRetryDelay              *float64 `json:"decodeAbortRetryDelay"`              // s; 0 means one attempt
	DecodeFirstResponseTimeout         *float64 `json:"decodeFirstResponseTimeout"`         // s (60); 0 disables
	DecodeResponseTimeout              *float64 `json:"decodeResponseTimeout"`              // s (0, disabled)
	DecodeStreamIdleTimeout            *float64 `json:"decodeStreamIdleTimeout"`            // s (120); 0 disables
}

// ParseModelConfig parses and validates the annotation's JSON. Errors name
// the field by its JSON path and quote the value.
func ParseModelConfig(data []byte) (*ModelConfig, error) {
	var mc ModelConfig
	if err := json.Unmarshal(data, &mc); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, AnnotationConfig, err)
	}
	if err := mc.validate(); err != nil {
		return nil, err
	}
	return &mc, nil
}

// Profile returns the named profile; an empty or unknown name falls back to
// DefaultProfile, then to "default", as AIBrix's gateway plugin does. ok is false
// when none of them exists.
func (mc *ModelConfig) Profile(name string) (p Profile, ok bool) {
	for _, n := range []string{name, mc.DefaultProfile, DefaultProfileName} {
		if p, ok = mc.Profiles[n]; ok && n != "" {
			return p, true
		}
	}
	return Profile{}, false
}

func (mc *ModelConfig) validate() error {
	if mc.DefaultProfile != "" {
		if _, ok := mc.Profiles[mc.DefaultProfile]; !ok {
			return invalid("defaultProfile", mc.DefaultProfile, "names no profile")
		}
	}
	for name, p := range mc.Profiles {
		if err := p.RoutingConfig.validate("profiles." + name + ".routingConfig"); err != nil {
			return err
		}
	}
	return nil
}

func (rc *RoutingConfig) validate(field string) error {
	if rc.PromptLenBucketMinLength < 0 {
		return invalid(field+".promptLenBucketMinLength", rc.PromptLenBucketMinLength, "must not be negative")
	}
	if m := rc.PromptLenBucketMaxLength; m < 0 || (m > 0 && m < rc.PromptLenBucketMinLength) {
		return invalid(field+".promptLenBucketMaxLength", m, fmt.Sprintf("must be 0 (unlimited) or at least promptLenBucketMinLength (%d)", rc.PromptLenBucketMinLength))
	}
	switch rc.BucketServeMode {
	case "", "throughput", "rps":
	default:
		return invalid(field+".bucketServeMode", rc.BucketServeMode, "is not a mode (known: throughput, rps)")
	}
	if p := rc.PrefillScorePolicy; p != "" && !slices.Contains(PrefillScorePolicies, p) {
		return invalid(field+".prefillScorePolicy", p, fmt.Sprintf("is not a policy (known: %v)", PrefillScorePolicies))
	}
	if p := rc.DecodeScorePolicy; p != "" && !slices.Contains(DecodeScorePolicies, p) {
		return invalid(field+".decodeScorePolicy", p, fmt.Sprintf("is not a policy (known: %v)", DecodeScorePolicies))
	}
	k := &rc.PD
	// AIBrix's environment table: which knobs must be positive, which may
	// be 0 (0 disables), and the two bounded to a range.
	for _, c := range []struct {
		name     string
		v        *float64
		positive bool    // 0 is not allowed (else 0 disables or is a weight)
		max      float64 // 0: no upper bound
	}{
		{"prefillRequestTimeout", k.PrefillRequestTimeout, true, 0},
		{"prefillLoadImbalanceMinSpread", k.PrefillLoadImbalanceMinSpread, true, 0},
		{"decodeLoadImbalanceMinSpread", k.DecodeLoadImbalanceMinSpread, true, 0},
		{"decodeThroughputImbalanceMinSpread", k.DecodeThroughputImbalanceMinSpread, true, 0},
		{"decodeScoreRatioThreshold", k.DecodeScoreRatioThreshold, true, 0},
		{"decodeLBWeightRunning", k.DecodeLBWeightRunning, false, 0},
		{"decodeLBWeightThroughput", k.DecodeLBWeightThroughput, false, 0},
		{"tokenLoadKVWeight", k.TokenLoadKVWeight, true, 0},
		{"tokenLoadRequestCost", k.TokenLoadRequestCost, true, 0},
		{"tokenLoadTTLSeconds", k.TokenLoadTTLSeconds, true, 0},
		{"tokenLoadSessionTTLSeconds", k.TokenLoadSessionTTLSeconds, false, 0},
		{"hybridCacheLoadFactor", k.HybridCacheLoadFactor, false, 1},
		{"minMatchPct", k.MinMatchPct, false, 100},
		{"decodeAbortTimeout", k.DecodeAbortTimeout, false, 0},
		{"decodeAbortRetryDelay", k.DecodeAbortRetryDelay, false, 0},
		{"decodeFirstResponseTimeout", k.DecodeFirstResponseTimeout, false, 0},
		{"decodeResponseTimeout", k.DecodeResponseTimeout, false, 0},
		{"decodeStreamIdleTimeout", k.DecodeStreamIdleTimeout, false, 0},
	} {
		if c.v == nil {
			continue
		}
		v := *c.v
		switch {
		case c.positive && !(v > 0):
			return invalid(field+".pd."+c.name, v, "must be positive")
		case !(v >= 0):
			return invalid(field+".pd."+c.name, v, "must not be negative")
		case c.max > 0 && v > c.max:
			return invalid(field+".pd."+c.name, v, fmt.Sprintf("must be at most %g", c.max))
		}
	}
	return nil
}

package ledger

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults of every knob. The AIBRIX_* ones are AIBrix's ("Token Load
// Scoring Policy", "Hybrid Cache-Load Scoring Policy" and the gateway
// variable table); the shared-ledger timings are ours.
const (
	DefaultKVWeight              = 0.3
	DefaultRequestCost           = 3500
	DefaultTTLSeconds            = 3600
	DefaultSessionTTLSeconds     = 1800
	DefaultMaxSessions           = 100_000
	DefaultHybridCacheLoadFactor = 0.5
	DefaultMinMatchPct           = 0
	DefaultDecodeOutputGrowth    = true
	DefaultSharedLedger          = true
	DefaultSharedSyncIntervalMs  = 50
	DefaultSharedExpiryMs        = 2000
)

// Fixed by AIBrix rather than tunable: the janitor runs once a minute and
// drops a pod's counters once it sat at zero, untouched, for a minute; keys
// longer than 256 bytes never enter the session table.
const (
	JanitorInterval   = time.Minute
	IdleDropAfter     = time.Minute
	MaxSessionKeySize = 256
)

// Config holds the token-ledger knobs. Start from DefaultConfig, decode YAML
// over it, then Validate; the ledger never corrects a bad value.
type Config struct {
	// KVWeight weighs resident KV tokens against active prefill tokens in the
	// prefill score: active + KVWeight × kv (default 0.3; must be positive).
	// Read by the scorers (route.Options), kept here so one block configures
	// token_load.
	KVWeight float64 `yaml:"kv_weight"`
	// RequestCost is the fixed part of every prefill charge, in tokens: the
	// scheduling and KV-transfer work that does not scale with the prompt
	// (default 3500; must be positive). Decode charges have none.
	RequestCost int64 `yaml:"request_cost"`
	// TTLSeconds is the age after which a charge whose release never came is
	// force-released with a warning (default 3600; must be positive and
	// exceed the longest legitimate request).
	TTLSeconds int `yaml:"ttl_seconds"`
	// SessionTTLSeconds is how long a session's last prompt size is kept for
	// the session-delta rule (default 1800; 0 turns the rule off).
	SessionTTLSeconds int `yaml:"session_ttl_seconds"`
	// MaxSessions caps the session table (default 100000; must be positive);
	// new keys beyond it are charged without a delta.
	MaxSessions int `yaml:"max_sessions"`
	// HybridCacheLoadFactor is the discount a full prefix match applies to a
	// pod's load under hybrid_cache_load, 0..1 (default 0.5; 0 turns the
	// discount off). Read by the scorer.
	HybridCacheLoadFactor float64 `yaml:"hybrid_cache_load_factor"`
	// MinMatchPct is the prefix-match percentage below which a match counts
	// as none, both in the hybrid score and in the prefix-match charge rule,
	// 0..100 (default 0: off).
	MinMatchPct float64 `yaml:"min_match_pct"`
	// DecodeOutputGrowth adds the estimated output generated so far to the
	// decode token_load score (default true). Read by the scorer.
	DecodeOutputGrowth bool `yaml:"decode_output_growth"`
	// SharedLedger shares the ledger (decode and prefill charges, and the
	// pods' requests in flight and queued prefill tokens) across gateway
	// replicas when a Redis is configured (default true).
	SharedLedger bool `yaml:"shared_ledger"`
	// SharedSyncIntervalMs is how often the background loop publishes this
	// replica's load and reads the others' (milliseconds, default
	// 50; must be positive).
	SharedSyncIntervalMs int `yaml:"shared_sync_interval_ms"`
	// SharedExpiryMs is how long a replica's published charges outlive its
	// last publication, so a dead replica's load disappears (milliseconds,
	// default 2000; must exceed shared_sync_interval_ms).
	SharedExpiryMs int `yaml:"shared_expiry_ms"`
}

// DefaultConfig returns every knob at its default.
func DefaultConfig() Config {
	return Config{
		KVWeight:              DefaultKVWeight,
		RequestCost:           DefaultRequestCost,
		TTLSeconds:            DefaultTTLSeconds,
		SessionTTLSeconds:     DefaultSessionTTLSeconds,
		MaxSessions:           DefaultMaxSessions,
		HybridCacheLoadFactor: DefaultHybridCacheLoadFactor,
		MinMatchPct:           DefaultMinMatchPct,
		DecodeOutputGrowth:    DefaultDecodeOutputGrowth,
		SharedLedger:          DefaultSharedLedger,
		SharedSyncIntervalMs:  DefaultSharedSyncIntervalMs,
		SharedExpiryMs:        DefaultSharedExpiryMs,
	}
}

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("ledger: invalid config")

func invalid(field, env string, value any, why string) error {
	if env != "" {
		field += " (" + env + ")"
	}
	return fmt.Errorf("%w: %s = %q %s", ErrInvalid, field, fmt.Sprint(value), why)
}

// Validate rejects the first bad knob, naming its YAML field and AIBrix's
// variable and quoting the value.
func (c *Config) Validate() error {
	switch {
	case !(c.KVWeight > 0) || math.IsInf(c.KVWeight, 1):
		return invalid("kv_weight", "AIBRIX_TOKEN_LOAD_KV_WEIGHT", c.KVWeight, "must be a positive number")
	case c.RequestCost <= 0:
		return invalid("request_cost", "AIBRIX_TOKEN_LOAD_REQUEST_COST", c.RequestCost, "must be positive")
	case c.TTLSeconds <= 0:
		return invalid("ttl_seconds", "AIBRIX_TOKEN_LOAD_TTL_SECONDS", c.TTLSeconds, "must be positive")
	case c.SessionTTLSeconds < 0:
		return invalid("session_ttl_seconds", "AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS", c.SessionTTLSeconds, "must be positive, or 0 to turn the session-delta rule off")
	case c.MaxSessions <= 0:
		return invalid("max_sessions", "AIBRIX_TOKEN_LOAD_MAX_SESSIONS", c.MaxSessions, "must be positive")
	case !(c.HybridCacheLoadFactor >= 0 && c.HybridCacheLoadFactor <= 1):
		return invalid("hybrid_cache_load_factor", "AIBRIX_HYBRID_CACHE_LOAD_FACTOR", c.HybridCacheLoadFactor, "must be between 0 and 1")
	case !(c.MinMatchPct >= 0 && c.MinMatchPct <= 100):
		return invalid("min_match_pct", "AIBRIX_MIN_MATCH_PCT", c.MinMatchPct, "must be between 0 and 100")
	case c.SharedSyncIntervalMs <= 0:
		return invalid("shared_sync_interval_ms", "", c.SharedSyncIntervalMs, "must be positive")
	case c.SharedExpiryMs <= c.SharedSyncIntervalMs:
		return invalid("shared_expiry_ms", "", c.SharedExpiryMs, fmt.Sprintf("must exceed shared_sync_interval_ms (%d)", c.SharedSyncIntervalMs))
	}
	return nil
}

package config

import (
	"fmt"
	"net/url"
	"time"

	"pdlb/lb/admit"
	"pdlb/lb/plan"
)

// Defaults of the plan section beyond lb/plan's own.
const (
	DefaultPlanTPOTSLO        = admit.DefaultInteractiveTPOTSLO
	DefaultPlanDecodeMaxBatch = admit.DefaultDecodeMaxBatch
	DefaultPlanSwitchTimeout  = 10 * time.Minute
	DefaultPlanWebhookTimeout = 5 * time.Second
	DefaultPlanWebhookRetries = 3
)

// Plan configures the xPyD planner acting on the running fleet: every
// window it measures each model's load and its prefill and decode pods'
// speeds, decides the split of the model's prefill/decode pods (lb/plan),
// and has the actuators move pods between roles. Models without at least
// two prefill or decode pods are not planned. Replicas sharing a Redis
// (redis.address) add their counts up there, so every one measures the
// whole fleet's load; enable the planner on all of them, or the requests
// of those without it go uncounted. Only the one holding the plan lease
// in Redis runs the actuators.
type Plan struct {
	// Enabled turns the planning loop on (default false).
	Enabled bool `yaml:"enabled"`
	// WindowSec, DrainSec, WarmupSec, MinDwellSec and Hysteresis are the
	// planner's (lb/plan.Config; defaults 60, 10, 30, 180 and 0.05).
	// WarmupSec is also the warm-up switch_roles asks a pod for.
	WindowSec   float64 `yaml:"window_sec"`
	DrainSec    float64 `yaml:"drain_sec"`
	WarmupSec   float64 `yaml:"warmup_sec"`
	MinDwellSec float64 `yaml:"min_dwell_sec"`
	Hysteresis  float64 `yaml:"hysteresis"`
	// TPOTSLO is the time per output token, in seconds, under which a
	// decode pod's capacity is measured (default 0.1, admission's
	// interactive target); 0 means none (the whole batch counts).
	TPOTSLO float64 `yaml:"tpot_slo"`
	// DecodeMaxBatch is the most sequences a decode pod runs at once
	// (default 64), the cap of its capacity.
	DecodeMaxBatch int `yaml:"decode_max_batch"`
	// SwitchRoles moves pods between roles itself, through the simulated
	// engine's POST /admin/role, and re-roles them in the gateway (default
	// false). For the configured pods only: with discovery, the webhook's
	// controller owns the roles. For one replica only: the acting one
	// would re-role pods in its own pool, and the others keep routing to
	// them in their old roles, so it holds while several replicas plan.
	SwitchRoles bool `yaml:"switch_roles"`
	// SwitchTimeout bounds one switch of switch_roles, from taking the pods
	// out of routing to putting them back (default 10m).
	SwitchTimeout time.Duration `yaml:"switch_timeout"`
	// Webhook, when its URL is set, receives each model's desired split:
	// from the replica holding the plan lease, when replicas share a Redis.
	Webhook PlanWebhook `yaml:"webhook"`
}

// PlanWebhook is where the planner POSTs {"model","prefill","decode","reason"}
// when it decides to switch (lb/plan.Webhook).
type PlanWebhook struct {
	// URL is an http or https URL; empty turns the webhook off.
	URL string `yaml:"url"`
	// Timeout bounds one attempt (default 5s).
	Timeout time.Duration `yaml:"timeout"`
	// Retries is how often a failed attempt (transport error, 429, 5xx) is
	// repeated (default 3).
	Retries int `yaml:"retries"`
}

// DefaultPlan returns the plan section with every default, off.
func DefaultPlan() Plan {
	d := plan.DefaultConfig(0)
	return Plan{
		WindowSec: d.WindowSec, DrainSec: d.DrainSec, WarmupSec: d.WarmupSec, MinDwellSec: d.MinDwellSec, Hysteresis: d.Hysteresis,
		TPOTSLO: DefaultPlanTPOTSLO, DecodeMaxBatch: DefaultPlanDecodeMaxBatch, SwitchTimeout: DefaultPlanSwitchTimeout,
		Webhook: PlanWebhook{Timeout: DefaultPlanWebhookTimeout, Retries: DefaultPlanWebhookRetries},
	}
}

// PlannerConfig is the planner's configuration for a pool of total pods.
func (p Plan) PlannerConfig(total int) plan.Config {
	return plan.Config{Total: total, WindowSec: p.WindowSec, DrainSec: p.DrainSec, WarmupSec: p.WarmupSec,
		MinDwellSec: p.MinDwellSec, Hysteresis: p.Hysteresis}
}

// Validate checks the section, naming fields under "plan.".
func (p Plan) Validate() error {
	// The pool's size is each model's, known only at run time; the
	// smallest pool that can be planned stands in for it.
	if err := p.PlannerConfig(2).Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch {
	case !(p.TPOTSLO >= 0):
		return invalid("plan.tpot_slo", p.TPOTSLO, "must not be negative (0 means no target)")
	case p.DecodeMaxBatch < 1:
		return invalid("plan.decode_max_batch", p.DecodeMaxBatch, "must be at least 1")
	case p.SwitchTimeout <= 0:
		return invalid("plan.switch_timeout", p.SwitchTimeout, "must be positive")
	case p.Webhook.Timeout <= 0:
		return invalid("plan.webhook.timeout", p.Webhook.Timeout, "must be positive")
	case p.Webhook.Retries < 0:
		return invalid("plan.webhook.retries", p.Webhook.Retries, "must not be negative")
	}
	if p.Webhook.URL != "" {
		if u, err := url.Parse(p.Webhook.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return invalid("plan.webhook.url", p.Webhook.URL, "must be an http:// or https:// URL")
		}
	}
	return nil
}

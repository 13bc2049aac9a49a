package route

import (
	"errors"
	"fmt"

	"pdlb/engines"
)

// Per-model profiles (AIBrix, "Enable PD Routing" and "Config Profiles"):
// a model has named profiles, each with a routing strategy and PD options;
// a request picks a profile with the config-profile header (else the
// model's default profile) and may override the strategy with the
// routing-strategy header unless the model locks it.

// Request headers that steer the choice of profile and strategy.
const (
	HeaderRoutingStrategy = "routing-strategy"
	HeaderConfigProfile   = "config-profile"
)

// StrategyPD is the routing strategy that runs the PD cascade; every other
// strategy is a policy of the registry (Names) over the combined pods.
const StrategyPD = "pd"

// DefaultProfileName is the profile used when a model names none.
const DefaultProfileName = "default"

// PDProfile is one named profile of a model.
type PDProfile struct {
	// Name is what the config-profile header selects.
	Name string `yaml:"name"`
	// RoutingStrategy is "pd" or a registry policy name; "" leaves the
	// choice to the gateway's per-model policy.
	RoutingStrategy string `yaml:"routing_strategy"`
	// PD holds the cascade's knobs for this profile; start from
	// DefaultPDOptions (or the environment's) and override.
	PD PDOptions `yaml:"pd"`

	router *PDRouter
}

// ModelProfiles is a model's profile set. Freeze it once; Resolve is then
// safe for concurrent use and allocates nothing on success.
type ModelProfiles struct {
	// LockedRoutingStrategy, when set, is used for every request of the
	// model whatever the routing-strategy header says (AIBrix's
	// lockedRoutingStrategy).
	LockedRoutingStrategy string `yaml:"locked_routing_strategy"`
	// DefaultProfile names the profile of requests without (or with an
	// unknown) config-profile header (default "default", else the first).
	DefaultProfile string `yaml:"default_profile"`
	// Profiles lists the profiles.
	Profiles []PDProfile `yaml:"profiles"`
	// Engine is the engine of the model's prefill and decode pods ("" when
	// it has none): it says whether they serve a request that did not go
	// through their exchange (DecodeNeedsExchange) and what the exchange
	// carries (engines.Kind.ExchangesBatch).
	Engine engines.Kind `yaml:"-"`

	def      int
	policies []namedPolicy
}

type namedPolicy struct {
	name   string
	policy Policy
	cache  bool
}

// ErrUnknownStrategy is returned by Resolve for a routing-strategy header
// that names neither "pd" nor a registry policy.
var ErrUnknownStrategy = errors.New("route: unknown routing strategy")

// errProfiles wraps Freeze's errors.
var errProfiles = errors.New("route: invalid profiles")

// knownStrategy says whether s is "pd" or a registry policy.
func knownStrategy(s string) bool {
	if s == StrategyPD {
		return true
	}
	for _, r := range registry {
		if r.name == s {
			return true
		}
	}
	return false
}

// Routers lists the cascades of the profiles that route "pd", for the
// loop that rebuilds their bucket plans.
func (m *ModelProfiles) Routers() []*PDRouter {
	var out []*PDRouter
	for i := range m.Profiles {
		if r := m.Profiles[i].router; r != nil {
			out = append(out, r)
		}
	}
	return out
}

// DecodeNeedsExchange says the model's decode pods refuse a request that
// did not go through the exchange (engines.Kind.DecodeServesPlain): the
// cascades then never send one there whole, and LocalPrefillMaxTokens is
// ignored.
func (m *ModelProfiles) DecodeNeedsExchange() bool { return !m.Engine.DecodeServesPlain() }

// IgnoredLocalPrefill names the profiles whose LocalPrefillMaxTokens is
// ignored because the model's decode pods need the exchange.
func (m *ModelProfiles) IgnoredLocalPrefill() []string {
	var out []string
	for i := range m.Profiles {
		if m.DecodeNeedsExchange() && m.Profiles[i].PD.LocalPrefillMaxTokens > 0 {
			out = append(out, m.Profiles[i].Name)
		}
	}
	return out
}

// Freeze validates every profile, builds their PD routers and the
// registry's policies, and fixes the default profile.
func (m *ModelProfiles) Freeze() error {
	if len(m.Profiles) == 0 {
		return fmt.Errorf("%w: profiles must not be empty", errProfiles)
	}
	if m.LockedRoutingStrategy != "" && !knownStrategy(m.LockedRoutingStrategy) {
		return fmt.Errorf("%w: locked_routing_strategy = %q is not pd or a policy (%v)", errProfiles, m.LockedRoutingStrategy, Names())
	}
	m.def = -1
	want := m.DefaultProfile
	if want == "" {
		want = DefaultProfileName
	}
	for i := range m.Profiles {
		p := &m.Profiles[i]
		field := fmt.Sprintf("profiles[%d]", i)
		if p.Name == "" {
			return fmt.Errorf("%w: %s.name must not be empty", errProfiles, field)
		}
		for j := range i {
			if m.Profiles[j].Name == p.Name {
				return fmt.Errorf("%w: %s.name = %q repeats profiles[%d]", errProfiles, field, p.Name, j)
			}
		}
		if p.RoutingStrategy != "" && !knownStrategy(p.RoutingStrategy) {
			return fmt.Errorf("%w: %s.routing_strategy = %q is not pd or a policy (%v)", errProfiles, field, p.RoutingStrategy, Names())
		}
		r, err := NewPDRouter(p.PD)
		if err != nil {
			return fmt.Errorf("%s (profile %q): %w", field, p.Name, err)
		}
		r.needsExchange = m.DecodeNeedsExchange()
		p.router = r
		if p.Name == want {
			m.def = i
		}
	}
	if m.def < 0 {
		if m.DefaultProfile != "" {
			return fmt.Errorf("%w: default_profile = %q names no profile", errProfiles, m.DefaultProfile)
		}
		m.def = 0
	}
	m.policies = m.policies[:0]
	for _, r := range registry {
		m.policies = append(m.policies, namedPolicy{r.name, r.build(m.Profiles[m.def].PD.routeOptions()), r.cache})
	}
	return nil
}

// Resolved is the outcome of Resolve.
type Resolved struct {
	// Profile is the profile in force.
	Profile *PDProfile
	// Strategy is "pd", a policy name, or "" for the gateway's own
	// per-model policy.
	Strategy string
	// PD is the profile's cascade when Strategy is "pd".
	PD *PDRouter
	// Policy is the registry policy when Strategy names one, and
	// UsesCache says whether it reads prefix-cache matches (UsesCache).
	Policy    Policy
	UsesCache bool
}

// Resolve picks the profile (the config-profile header's, else the
// default) and the strategy: the locked one, else the routing-strategy
// header, else the profile's. Empty header values mean "absent".
func (m *ModelProfiles) Resolve(profileHeader, strategyHeader string) (Resolved, error) {
	p := &m.Profiles[m.def]
	for i := range m.Profiles {
		if profileHeader != "" && m.Profiles[i].Name == profileHeader {
			p = &m.Profiles[i]
			break
		}
	}
	strategy := p.RoutingStrategy
	switch {
	case m.LockedRoutingStrategy != "":
		strategy = m.LockedRoutingStrategy
	case strategyHeader != "":
		strategy = strategyHeader
	}
	res := Resolved{Profile: p, Strategy: strategy}
	switch strategy {
	case "":
	case StrategyPD:
		res.PD = p.router
	default:
		for i := range m.policies {
			if m.policies[i].name == strategy {
				res.Policy, res.UsesCache = m.policies[i].policy, m.policies[i].cache
				return res, nil
			}
		}
		return Resolved{}, fmt.Errorf("%w %q (known: pd, %v)", ErrUnknownStrategy, strategy, Names())
	}
	return res, nil
}

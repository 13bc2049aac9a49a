package config

import (
	"bytes"
	"cmp"
	"fmt"

	"gopkg.in/yaml.v3"

	"pdlb/engines"
	"pdlb/lb/route"
)

// Profile is one named routing profile of a model (AIBrix's config
// profiles): a request picks it with the config-profile header, else the
// model's default profile applies.
type Profile struct {
	// Name is what the config-profile header selects.
	Name string `yaml:"name"`
	// RoutingStrategy is "pd" or a policy name (default: the model's
	// routing_strategy).
	RoutingStrategy string `yaml:"routing_strategy"`
	// PD overrides knobs of the gateway's pd section for this profile only,
	// with the same names; the knobs it leaves out keep the pd section's
	// values (AIBrix: unset fields keep the environment default).
	PD yaml.Node `yaml:"pd"`
}

// firstPDPod is the first pod of model that plays the prefill or decode
// role, nil when none does.
func (c *Config) firstPDPod(model string) *Pod {
	for i := range c.Pods {
		p := &c.Pods[i]
		if p.Model == model && (p.Role == RolePrefill || p.Role == RoleDecode) {
			return p
		}
	}
	return nil
}

// PDEngines keeps, by model, the first prefill or decode pod Check saw,
// whose engine the model's other such pods must run: KV moves only between
// pods of one engine, and a decode leg may move to any decode pod of the
// model and the planner any pod to any roleset, so the rule is per model,
// not per roleset. Combined pods may run another engine.
type PDEngines map[string]Pod

// Check records p, a valid pod, or returns an error naming it as field
// when it plays prefill or decode for a model whose first such pod runs
// another engine.
func (e PDEngines) Check(field string, p Pod) error {
	if p.Role != RolePrefill && p.Role != RoleDecode {
		return nil
	}
	first, seen := e[p.Model]
	if !seen {
		e[p.Model] = p
		return nil
	}
	want, _ := engines.ParseKind(first.Engine)
	if got, _ := engines.ParseKind(p.Engine); got != want {
		return invalid(field+".engine", string(got), fmt.Sprintf("(%s pod %q of model %q) is not %s, the engine of its %s pod %q: KV moves only between pods of one engine (serve each engine as its own model; an alias may split the traffic)",
			p.Role, cmp.Or(p.Name, p.Address), p.Model, want, first.Role, cmp.Or(first.Name, first.Address)))
	}
	return nil
}

// Profiles builds and freezes model's profile set: its profiles over the
// pd section (one profile, "default", when it lists none), its locked
// strategy and default profile. An empty routing strategy means "pd" for a
// model with prefill or decode pods, else the model's own policy over its
// combined pods. The engine of its prefill and decode pods (one per model,
// PDEngines) is the profiles' (route.ModelProfiles.Engine). Call it on a
// validated configuration.
func (c *Config) Profiles(model string) (*route.ModelProfiles, error) {
	m := c.ModelFor(model)
	mp := &route.ModelProfiles{LockedRoutingStrategy: m.LockedRoutingStrategy, DefaultProfile: m.DefaultProfile}
	strategy := m.RoutingStrategy
	if p := c.firstPDPod(model); p != nil {
		if strategy == "" {
			strategy = route.StrategyPD
		}
		mp.Engine, _ = engines.ParseKind(p.Engine)
	}
	if len(m.Profiles) == 0 {
		mp.Profiles = []route.PDProfile{{Name: route.DefaultProfileName, RoutingStrategy: strategy, PD: c.PD}}
	}
	for i := range m.Profiles {
		p := &m.Profiles[i]
		rp := route.PDProfile{Name: p.Name, RoutingStrategy: p.RoutingStrategy, PD: c.PD}
		if rp.RoutingStrategy == "" {
			rp.RoutingStrategy = strategy
		}
		if err := decodeOverrides(&p.PD, &rp.PD); err != nil {
			return nil, fmt.Errorf("%w: model %q: profiles[%d].pd: %v", ErrInvalid, model, i, err)
		}
		mp.Profiles = append(mp.Profiles, rp)
	}
	if err := mp.Freeze(); err != nil {
		return nil, fmt.Errorf("%w: model %q: %s", ErrInvalid, model, withAlias(err))
	}
	return mp, nil
}

// decodeOverrides decodes node over o strictly: a knob name the pd section
// does not have is an error, as in the file itself.
func decodeOverrides(node *yaml.Node, o *route.PDOptions) error {
	if node.Kind == 0 {
		return nil
	}
	raw, err := yaml.Marshal(node)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	return dec.Decode(o)
}

package plan

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// Phase is a named period of steady load, as in the global-scheduling study's
// table. Its capacities may be left 0 for the caller to fill in (ReadPhases
// does not require them).
type Phase struct {
	Name   string `json:"name" yaml:"name"`
	Demand `yaml:",inline"`
}

// The global-scheduling study's capacities: prompt tokens per second one
// prefill instance computes, and tokens per second one decode instance
// outputs under the TPOT target.
const (
	SeedPrefillCap = 20000
	SeedDecodeCap  = 3000
)

// SeedPhases returns the global-scheduling study's three periods of a day
// (its PHASES), with its capacities.
func SeedPhases() []Phase {
	ph := func(name string, rate, isl, osl, hit float64) Phase {
		return Phase{name, Demand{Rate: rate, PromptTokens: isl, OutputTokens: osl, HitRate: hit, PrefillCap: SeedPrefillCap, DecodeCap: SeedDecodeCap}}
	}
	return []Phase{
		ph("chat", 100, 2000, 500, 0.6),
		ph("long-document summaries", 30, 16000, 300, 0.2),
		ph("coding agents", 25, 6000, 2000, 0.8),
	}
}

var errPhases = errors.New("plan: bad phases")

// ReadPhases reads a list of phases in YAML or JSON (JSON is YAML's flow
// style, so one parser reads both), a YAML block list or, on one line:
//
//	[{name: chat, rate: 100, isl: 2000, osl: 500, hit: 0.6},
//	 {name: summaries, rate: 30, isl: 16000, osl: 300, hit: 0.2, prefill_cap: 25000}]
//
// Unknown fields are errors. Each phase must have a name and a valid
// demand apart from its capacities, which may be 0 (absent) for the caller
// to default; a capacity given must be positive.
func ReadPhases(r io.Reader) ([]Phase, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var out []Phase
	if err := dec.Decode(&out); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %v", errPhases, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no phases", errPhases)
	}
	for i, p := range out {
		if p.Name == "" {
			return nil, fmt.Errorf("%w: phase %d has no name", errPhases, i+1)
		}
		// Validate with the capacities a caller would default to, so that
		// only capacities given and wrong are errors.
		d := p.Demand
		if d.PrefillCap == 0 {
			d.PrefillCap = 1
		}
		if d.DecodeCap == 0 {
			d.DecodeCap = 1
		}
		if err := d.Validate(); err != nil {
			return nil, fmt.Errorf("phase %q: %w", p.Name, err)
		}
	}
	return out, nil
}

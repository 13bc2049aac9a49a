package config

import (
	"errors"
	"strings"
	"testing"

	"pdlb/lb/route"
)

// TestAIBrixEnvTable: every AIBRIX_* variable sets a knob route knows, no
// knob has two variables, and a knob Validate rejects is named with its
// variable.
func TestAIBrixEnvTable(t *testing.T) {
	seen := map[string]string{}
	for _, a := range aibrixEnv {
		if !strings.HasPrefix(a.env, "AIBRIX_") {
			t.Errorf("%s is not an AIBRIX_* variable", a.env)
		}
		if prev, dup := seen[a.knob]; dup {
			t.Errorf("%s and %s both set %s", prev, a.env, a.knob)
		}
		seen[a.knob] = a.env
		o := route.DefaultPDOptions()
		if err := o.Set(a.knob, ""); err != nil && strings.Contains(err.Error(), "no knob") {
			t.Errorf("%s: %v", a.env, err)
		}
	}
	f := func(edit func(o *route.PDOptions), want string) {
		t.Helper()
		c := Default()
		c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001"}}
		edit(&c.PD)
		err := c.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate = %v, want %q", err, want)
		}
	}
	f(func(o *route.PDOptions) { o.MinMatchPct = 101 }, "pd: route: invalid pd option: min_match_pct (AIBRIX_MIN_MATCH_PCT) = 101 must be between 0 and 100")
	f(func(o *route.PDOptions) { o.CombinedDecodeBusy = -1 }, "combined_decode_busy = -1 must not be negative")
}

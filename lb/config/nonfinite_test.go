package config

import (
	"errors"
	"strings"
	"testing"
)

// TestValidateRejectsNonFinite: YAML spells NaN and infinity (.nan, .inf),
// and a range check written as "x < lo || x > hi" lets NaN through; an
// infinite weight or speed is no more a setting than a NaN one.
func TestValidateRejectsNonFinite(t *testing.T) {
	f := func(yml, wantInMsg string) {
		t.Helper()
		c := Default()
		err := c.UnmarshalYAML([]byte(yml))
		c.Provision()
		if err == nil {
			err = c.Validate()
		}
		if err == nil {
			t.Errorf("accepted:\n%s", yml)
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Errorf("error %q does not mention %q", err, wantInMsg)
		}
	}
	pod := "pods: [{model: m, address: '127.0.0.1:8001'}]\n"
	f("tracing: {sampler_ratio: .nan}\n"+pod, "tracing.sampler_ratio = NaN")
	f("upstream: {retry_budget: {percent: .nan}}\n"+pod, "upstream.retry_budget.percent = NaN")
	f("upstream: {first_byte: {factor: .nan}}\n"+pod, "upstream.first_byte.factor = NaN")
	f("pods: [{model: m, address: '127.0.0.1:8001', weight: .inf}]\n", "pods[0].weight = +Inf")
	f("pods: [{model: m, address: '127.0.0.1:8001', prefill_tokens_per_sec: .inf}]\n", "pods[0].prefill_tokens_per_sec = +Inf")
	f("aliases: [{name: a, targets: [{model: m, weight: .nan}]}]\n"+pod, "aliases[0].targets[0].weight = NaN")
	f("aliases: [{name: a, targets: [{model: m, weight: .inf}]}]\n"+pod, "aliases[0].targets[0].weight = +Inf")
}

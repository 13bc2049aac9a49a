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

// TestAdmissionErrorsNameTheirField: an admission error names the field
// as the config file spells it (admission.interactive.ttft_slo), not as
// the admit package's own Config does (classes.interactive.ttft_slo), a
// key the file has not got.
func TestAdmissionErrorsNameTheirField(t *testing.T) {
	pod := "pods: [{model: m, address: '127.0.0.1:8001'}]\n"
	for yml, want := range map[string]string{
		"admission: {interactive: {ttft_slo: -1}}\n": "admission.interactive.ttft_slo = -1",
		"admission: {batch: {tpot_slo: -0.5}}\n":     "admission.batch.tpot_slo = -0.5",
		"admission: {batch: {max_wait: .nan}}\n":     "admission.batch.max_wait = NaN",
		"admission: {defer_queue: -1}\n":             "admission.defer_queue = -1",
	} {
		c := Default()
		err := c.UnmarshalYAML([]byte(yml + pod))
		if err == nil {
			err = c.Validate()
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming %q", strings.TrimSpace(yml), err, want)
		}
	}
}

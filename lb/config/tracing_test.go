package config

import (
	"errors"
	"strings"
	"testing"
)

func TestTracingValidate(t *testing.T) {
	f := func(edit func(*Tracing), wantField string) {
		t.Helper()
		tr := DefaultTracing()
		edit(&tr)
		err := tr.Validate()
		if wantField == "" {
			if err != nil {
				t.Errorf("%+v: %v", tr, err)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantField) {
			t.Errorf("%+v: %v, want an error naming %s", tr, err, wantField)
		}
	}
	f(func(*Tracing) {}, "")
	f(func(t *Tracing) {
		t.Enabled, t.Endpoint, t.Protocol, t.Sampler, t.SamplerRatio = true, "http://collector:4318", "grpc", "parentbased_traceidratio", 0.01
	}, "")
	f(func(t *Tracing) { t.Endpoint = "collector:4318" }, `tracing.endpoint = "collector:4318"`)
	f(func(t *Tracing) { t.Protocol = "http/json" }, `tracing.protocol = "http/json"`)
	f(func(t *Tracing) { t.Sampler = "sometimes" }, `tracing.sampler = "sometimes"`)
	f(func(t *Tracing) { t.SamplerRatio = 1.5 }, "tracing.sampler_ratio = 1.5")
	f(func(t *Tracing) { t.ExplainHistory = 0 }, "tracing.explain_history = 0")
}

func TestTracingYAML(t *testing.T) {
	c := Default()
	err := c.UnmarshalYAML([]byte("tracing:\n  enabled: true\n  endpoint: http://jaeger:4318\n  sampler: traceidratio\n  sampler_ratio: 0.1\n  explain: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Tracing{Enabled: true, Endpoint: "http://jaeger:4318", Sampler: "traceidratio", SamplerRatio: 0.1, Explain: true, ExplainHistory: DefaultExplainHistory}
	if c.Tracing != want {
		t.Fatalf("%+v, want %+v", c.Tracing, want)
	}
}

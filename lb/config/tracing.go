package config

import (
	"net/url"
	"slices"

	"pdlb/internal/tracing"
)

// Defaults of the tracing section.
const (
	// DefaultServiceName is the service.name of the gateway's spans when
	// neither service_name nor OTEL_SERVICE_NAME names one.
	DefaultServiceName = "pdlb"
	// DefaultSamplerRatio is the share of traces a *traceidratio sampler
	// keeps, as OTEL_TRACES_SAMPLER_ARG's default.
	DefaultSamplerRatio = 1.0
	// DefaultExplainHistory is how many decisions per model GET
	// /admin/explain keeps.
	DefaultExplainHistory = 32
)

// Tracing configures OpenTelemetry tracing and the explanation of
// routing decisions. Every tracing field left empty defers to the OTEL_*
// variable of the same meaning, read when the gateway starts (`pdlb serve`
// and `pdlb demo` alike), then to the SDK's default.
type Tracing struct {
	// Enabled sends spans over OTLP (default false; OTEL_TRACES_EXPORTER=otlp
	// turns it on too).
	Enabled bool `yaml:"enabled"`
	// Endpoint is the collector's URL, "http://host:4318" (default
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// else localhost:4318, 4317 for gRPC); /v1/traces is appended for
	// http/protobuf when the URL has no path.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "http/protobuf" or "grpc" (default
	// OTEL_EXPORTER_OTLP_PROTOCOL, else "http/protobuf").
	Protocol string `yaml:"protocol"`
	// ServiceName is the spans' service.name (default OTEL_SERVICE_NAME,
	// else "pdlb").
	ServiceName string `yaml:"service_name"`
	// Sampler is one of OTel's samplers: always_on, always_off,
	// traceidratio, parentbased_always_on, parentbased_always_off,
	// parentbased_traceidratio (default OTEL_TRACES_SAMPLER, else
	// parentbased_always_on); SamplerRatio is the share a *traceidratio
	// sampler keeps, 0..1 (default 1).
	Sampler      string  `yaml:"sampler"`
	SamplerRatio float64 `yaml:"sampler_ratio"`
	// Explain lets every client ask for the explanation of its routing
	// decision with "x-pdlb-debug: explain" (default false: only holders
	// of the admin token may).
	Explain bool `yaml:"explain"`
	// ExplainHistory is how many recent decisions per model GET
	// /admin/explain shows (default 32).
	ExplainHistory int `yaml:"explain_history"`
}

// DefaultTracing is the tracing section's defaults.
func DefaultTracing() Tracing {
	return Tracing{SamplerRatio: DefaultSamplerRatio, ExplainHistory: DefaultExplainHistory}
}

// Settings is the section as internal/tracing takes it.
func (t Tracing) Settings() tracing.Settings {
	return tracing.Settings{Enabled: t.Enabled, Endpoint: t.Endpoint, Protocol: t.Protocol,
		ServiceName: t.ServiceName, Sampler: t.Sampler, Ratio: t.SamplerRatio}
}

// Validate checks the section.
func (t Tracing) Validate() error {
	if t.Endpoint != "" {
		if u, err := url.Parse(t.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return invalid("tracing.endpoint", t.Endpoint, "is not an http:// or https:// URL")
		}
	}
	if t.Protocol != "" && t.Protocol != tracing.ProtocolHTTP && t.Protocol != tracing.ProtocolGRPC {
		return invalid("tracing.protocol", t.Protocol, "is not an OTLP protocol (known: http/protobuf, grpc)")
	}
	if t.Sampler != "" && !slices.Contains(tracing.Samplers, t.Sampler) {
		return invalid("tracing.sampler", t.Sampler, "is not a sampler (known: always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)")
	}
	if !(t.SamplerRatio >= 0 && t.SamplerRatio <= 1) {
		return invalid("tracing.sampler_ratio", t.SamplerRatio, "must be from 0 to 1")
	}
	if t.ExplainHistory < 1 {
		return invalid("tracing.explain_history", t.ExplainHistory, "must be at least 1")
	}
	return nil
}

package tracing

import (
	"context"
	"errors"
	"testing"
)

// env is an environment lookup over m.
func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestStart(t *testing.T) {
	f := func(s Settings, vars map[string]string, wantOn bool, wantErr error) {
		t.Helper()
		p, err := Start(context.Background(), s, "svc", env(vars))
		if !errors.Is(err, wantErr) || (p != nil) != wantOn {
			t.Errorf("%+v %v: provider %v err %v; want on %v err %v", s, vars, p != nil, err, wantOn, wantErr)
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}
	f(Settings{}, nil, false, nil)
	f(Settings{}, map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false, nil)
	f(Settings{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, nil)
	f(Settings{Enabled: true, Endpoint: "http://127.0.0.1:1"}, nil, true, nil)
	f(Settings{Enabled: true, Protocol: ProtocolGRPC, Endpoint: "http://127.0.0.1:1"}, nil, true, nil)
	f(Settings{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, nil)
	// The traces' own variable wins over the general one.
	f(Settings{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, false, ErrSettings)
	f(Settings{Enabled: true, Sampler: "sometimes"}, nil, false, ErrSettings)
}

func TestSampler(t *testing.T) {
	for _, name := range Samplers {
		if _, err := Sampler(name, 0.5); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Sampler("parentbased_jaeger_remote", 1); !errors.Is(err, ErrSettings) {
		t.Errorf("unknown sampler: %v", err)
	}
}

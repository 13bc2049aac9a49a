package tracing

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
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

// TestInject: the traceparent Inject writes is the propagator's, sampled
// or not, and replaces a client's in either spelling; a span context
// with a tracestate sends that too.
func TestInject(t *testing.T) {
	ts, _ := trace.ParseTraceState("vendor=abc")
	for _, span := range []trace.Span{testSpan(0, trace.TraceState{}), testSpan(trace.FlagsSampled, trace.TraceState{}), testSpan(trace.FlagsSampled, ts)} {
		want := propagation.MapCarrier{}
		Propagator.Inject(trace.ContextWithSpan(context.Background(), span), want)
		for _, sent := range []string{"", "traceparent", "Traceparent"} {
			var h fasthttp.RequestHeader
			h.DisableNormalizing()
			if sent != "" {
				h.Set(sent, "00-11111111111111111111111111111111-2222222222222222-01")
			}
			Inject(span, &h)
			got := strings.Count(string(h.Header()), "raceparent: ")
			if string(h.Peek("traceparent")) != want["traceparent"] || got != 1 || string(h.Peek("tracestate")) != want["tracestate"] {
				t.Errorf("client's %q: got %q (%d fields), tracestate %q; want %q, %q", sent, h.Peek("traceparent"), got, h.Peek("tracestate"), want["traceparent"], want["tracestate"])
			}
		}
	}
}

// TestAppendFields: the lines AppendFields writes are the fields the
// propagator sets, and none for a context that is not valid.
func TestAppendFields(t *testing.T) {
	ts, _ := trace.ParseTraceState("vendor=abc")
	for _, span := range []trace.Span{testSpan(0, trace.TraceState{}), testSpan(trace.FlagsSampled, trace.TraceState{}), testSpan(trace.FlagsSampled, ts)} {
		want := propagation.MapCarrier{}
		Propagator.Inject(trace.ContextWithSpan(context.Background(), span), want)
		wantLines := "traceparent: " + want["traceparent"] + "\r\n"
		if want["tracestate"] != "" {
			wantLines += "tracestate: " + want["tracestate"] + "\r\n"
		}
		if got := AppendFields([]byte("x\r\n"), span); string(got) != "x\r\n"+wantLines {
			t.Errorf("appended %q, want %q", got, wantLines)
		}
	}
	if got := AppendFields(nil, trace.SpanFromContext(context.Background())); len(got) != 0 {
		t.Errorf("no context: appended %q", got)
	}
}

// testSpan is a span of a fixed trace, with flags and ts.
func testSpan(flags trace.TraceFlags, ts trace.TraceState) trace.Span {
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, TraceState: ts})
	return trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), sc))
}

package tracing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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

// TestSamplerFromEnv: with no sampler set, OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name it as the SDK reads them, and a value the
// SDK would log and replace is an error naming the variable.
func TestSamplerFromEnv(t *testing.T) {
	f := func(s Settings, vars map[string]string, want sdktrace.Sampler, wantErr string) {
		t.Helper()
		got, err := samplerOf(s, env(vars))
		switch {
		case wantErr != "":
			if !errors.Is(err, ErrSettings) || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("%+v %v: err %v, want one naming %s", s, vars, err, wantErr)
			}
		case err != nil || got.Description() != want.Description():
			t.Errorf("%+v %v: %v %v, want %s", s, vars, got, err, want.Description())
		}
	}
	ratio := func(name, arg string) map[string]string {
		return map[string]string{"OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": arg}
	}
	f(Settings{}, nil, sdktrace.ParentBased(sdktrace.AlwaysSample()), "")
	f(Settings{}, ratio(" ", ""), sdktrace.ParentBased(sdktrace.AlwaysSample()), "")
	f(Settings{}, ratio("always_off", "0.5"), sdktrace.NeverSample(), "")
	f(Settings{}, ratio("TraceIDRatio", " 0.25 "), sdktrace.TraceIDRatioBased(0.25), "")
	f(Settings{}, ratio("traceidratio", ""), sdktrace.TraceIDRatioBased(1), "")
	f(Settings{}, ratio("parentbased_traceidratio", "0.01"), sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01)), "")
	f(Settings{Sampler: "always_on"}, ratio("always_off", ""), sdktrace.AlwaysSample(), "")
	f(Settings{}, ratio("traceidratio", "1%"), nil, "OTEL_TRACES_SAMPLER_ARG")
	f(Settings{}, ratio("parentbased_traceidratio", "2"), nil, "OTEL_TRACES_SAMPLER_ARG")
	f(Settings{}, ratio("jaeger_remote", ""), nil, "OTEL_TRACES_SAMPLER")
}

// TestBegin: a span Begin starts, or drops, is decided as the SDK decides
// it for the same ids: a kept span is the SDK's, recording, with the ids
// the sampler was asked about, which its children do not share; a dropped
// one has the context the SDK's non-recording span would have.
func TestBegin(t *testing.T) {
	remote := func(flags trace.TraceFlags) context.Context {
		ts, _ := trace.ParseTraceState("vendor=abc")
		return trace.ContextWithRemoteSpanContext(context.Background(), testContext(flags, ts))
	}
	parents := map[string]context.Context{"none": context.Background(), "sampled": remote(trace.FlagsSampled), "unsampled": remote(0)}
	for _, name := range Samplers {
		sampler, _ := Sampler(name, 0.5)
		tr := NewProvider(sampler).Tracer("test")
		for pname, parent := range parents {
			kept := 0
			for range 200 {
				ctx, span, sc := tr.Begin(parent, "request", trace.SpanKindServer, time.Now())
				psc := trace.SpanContextFromContext(parent)
				if !sc.IsValid() || psc.IsValid() && sc.TraceID() != psc.TraceID() {
					t.Fatalf("%s, parent %s: span context %v", name, pname, sc)
				}
				want := sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: parent, TraceID: sc.TraceID(), Name: "request", Kind: trace.SpanKindServer})
				if (span != nil) != (want.Decision != sdktrace.Drop) || sc.IsSampled() != (want.Decision == sdktrace.RecordAndSample) {
					t.Fatalf("%s, parent %s: span %v, sampled %v; the sampler says %v for its trace", name, pname, span != nil, sc.IsSampled(), want.Decision)
				}
				if sc.TraceState().String() != want.Tracestate.String() {
					t.Fatalf("%s, parent %s: tracestate %q, want %q", name, pname, sc.TraceState(), want.Tracestate)
				}
				if span == nil {
					if ctx != parent {
						t.Fatalf("%s, parent %s: a dropped span changed the context", name, pname)
					}
					continue
				}
				kept++
				if !span.IsRecording() || !span.SpanContext().Equal(sc) || trace.SpanFromContext(ctx) != span {
					t.Fatalf("%s, parent %s: kept span %v recording %v, context %v", name, pname, span.SpanContext(), span.IsRecording(), sc)
				}
				_, child := tr.Start(ctx, "child")
				if child.SpanContext().TraceID() != sc.TraceID() || child.SpanContext().SpanID() == sc.SpanID() {
					t.Fatalf("%s, parent %s: child %v of %v", name, pname, child.SpanContext(), sc)
				}
				child.End()
				span.End()
			}
			if strings.Contains(name, "ratio") && pname == "none" && (kept < 40 || kept > 160) {
				t.Errorf("%s: kept %d of 200 at ratio 0.5", name, kept)
			}
		}
	}
}

// A span the sampler drops costs Begin no allocation.
func TestBeginDroppedAllocatesNothing(t *testing.T) {
	tr := NewProvider(sdktrace.NeverSample()).Tracer("test")
	start := time.Now()
	if n := testing.AllocsPerRun(100, func() { tr.Begin(context.Background(), "request", trace.SpanKindServer, start) }); n != 0 {
		t.Fatalf("%v allocations per dropped span, want 0", n)
	}
}

// TestInject: the traceparent Inject writes is the propagator's, sampled
// or not, and replaces a client's in either spelling; a span context
// with a tracestate sends that too.
func TestInject(t *testing.T) {
	ts, _ := trace.ParseTraceState("vendor=abc")
	for _, sc := range []trace.SpanContext{testContext(0, trace.TraceState{}), testContext(trace.FlagsSampled, trace.TraceState{}), testContext(trace.FlagsSampled, ts)} {
		want := propagation.MapCarrier{}
		Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), want)
		for _, sent := range []string{"", "traceparent", "Traceparent"} {
			var h fasthttp.RequestHeader
			h.DisableNormalizing()
			if sent != "" {
				h.Set(sent, "00-11111111111111111111111111111111-2222222222222222-01")
			}
			Inject(sc, &h)
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
	for _, sc := range []trace.SpanContext{testContext(0, trace.TraceState{}), testContext(trace.FlagsSampled, trace.TraceState{}), testContext(trace.FlagsSampled, ts)} {
		want := propagation.MapCarrier{}
		Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), want)
		wantLines := "traceparent: " + want["traceparent"] + "\r\n"
		if want["tracestate"] != "" {
			wantLines += "tracestate: " + want["tracestate"] + "\r\n"
		}
		if got := AppendFields([]byte("x\r\n"), sc); string(got) != "x\r\n"+wantLines {
			t.Errorf("appended %q, want %q", got, wantLines)
		}
	}
	if got := AppendFields(nil, trace.SpanContext{}); len(got) != 0 {
		t.Errorf("no context: appended %q", got)
	}
}

// testContext is a span context of a fixed trace, with flags and ts.
func testContext(flags trace.TraceFlags, ts trace.TraceState) trace.SpanContext {
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, TraceState: ts})
}

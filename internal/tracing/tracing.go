// Package tracing starts OpenTelemetry tracing for the gateway and the
// simulated pods alike: an OTLP exporter (HTTP or gRPC), a batching span
// processor, a sampler and the service's resource, as OTel users configure
// them. The SDK and the exporters read most OTEL_* variables themselves
// (endpoints, headers, timeouts, OTEL_TRACES_SAMPLER*, OTEL_SERVICE_NAME,
// OTEL_BSP_*); this package adds what they leave to the application:
// OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL.
package tracing

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Protocols of the OTLP exporter, as OTEL_EXPORTER_OTLP_PROTOCOL spells
// them.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Samplers, as OTEL_TRACES_SAMPLER names them.
var Samplers = []string{"always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}

// Settings are what a configuration says; empty fields leave the choice
// to the OTEL_* variables, then to the SDK's defaults.
type Settings struct {
	// Enabled turns tracing on; OTEL_TRACES_EXPORTER=otlp does too.
	Enabled bool
	// Endpoint is the collector's base URL ("http://host:4318"); an HTTP
	// exporter appends /v1/traces when the URL has no path.
	Endpoint string
	// Protocol is ProtocolHTTP or ProtocolGRPC.
	Protocol string
	// ServiceName is the resource's service.name.
	ServiceName string
	// Sampler is one of Samplers; Ratio is the ratio of the *traceidratio
	// ones (0..1).
	Sampler string
	Ratio   float64
}

// Provider is a running tracer provider. A nil *Provider is tracing off.
type Provider struct {
	tp      *sdktrace.TracerProvider
	sampler sdktrace.Sampler
}

// NewProvider is a provider of spans that sampler keeps, with opts (the
// exporter, the resource) and ids that Tracer.Begin can choose first.
func NewProvider(sampler sdktrace.Sampler, opts ...sdktrace.TracerProviderOption) *Provider {
	opts = append(opts, sdktrace.WithSampler(sampler), sdktrace.WithIDGenerator(idGenerator{}))
	return &Provider{tp: sdktrace.NewTracerProvider(opts...), sampler: sampler}
}

// ErrSettings wraps the errors of settings Start cannot use.
var ErrSettings = errors.New("tracing: invalid settings")

// on reports whether s, with the environment lookup reads, turns tracing
// on.
func on(s Settings, lookup func(string) (string, bool)) bool {
	v, _ := lookup("OTEL_TRACES_EXPORTER")
	return s.Enabled || v == "otlp"
}

// Start starts tracing as s and the environment say, under
// defaultService when neither names the service; nil when tracing is off.
func Start(ctx context.Context, s Settings, defaultService string, lookup func(string) (string, bool)) (*Provider, error) {
	if !on(s, lookup) {
		return nil, nil
	}
	sm, err := samplerOf(s, lookup)
	if err != nil {
		return nil, err
	}
	name := s.ServiceName
	if v, ok := lookup("OTEL_SERVICE_NAME"); name == "" && (!ok || v == "") {
		name = defaultService
	}
	res := resource.Default()
	if name != "" {
		if res, err = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName(name))); err != nil {
			return nil, err
		}
	}
	exp, err := exporter(ctx, s, lookup)
	if err != nil {
		return nil, err
	}
	return NewProvider(sm, sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// samplerOf is the sampler s names, else OTEL_TRACES_SAMPLER's (its
// ratio OTEL_TRACES_SAMPLER_ARG, 1 when unset), else the SDK's default,
// parentbased_always_on: the variables as the SDK reads them, but a value
// it would log and replace, or a NaN ratio, is an error here.
func samplerOf(s Settings, lookup func(string) (string, bool)) (sdktrace.Sampler, error) {
	if s.Sampler != "" {
		return Sampler(s.Sampler, s.Ratio)
	}
	v, _ := lookup("OTEL_TRACES_SAMPLER")
	name := strings.ToLower(strings.TrimSpace(v))
	if name == "" {
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	}
	ratio := 1.0
	if arg, _ := lookup("OTEL_TRACES_SAMPLER_ARG"); strings.HasSuffix(name, "traceidratio") && strings.TrimSpace(arg) != "" {
		r, err := strconv.ParseFloat(strings.TrimSpace(arg), 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return nil, fmt.Errorf("%w: OTEL_TRACES_SAMPLER_ARG %q is not a ratio from 0 to 1", ErrSettings, arg)
		}
		ratio = r
	}
	sm, err := Sampler(name, ratio)
	if err != nil {
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: %w", err)
	}
	return sm, nil
}

// exporter is the OTLP exporter of s's protocol, else the environment's
// (the traces' variable first), else HTTP.
func exporter(ctx context.Context, s Settings, lookup func(string) (string, bool)) (*otlptrace.Exporter, error) {
	proto := s.Protocol
	for _, env := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v, ok := lookup(env); proto == "" && ok {
			proto = v
		}
	}
	switch proto {
	case "", ProtocolHTTP:
		var opts []otlptracehttp.Option
		if s.Endpoint != "" {
			u, err := url.Parse(s.Endpoint)
			if err != nil {
				return nil, fmt.Errorf("%w: endpoint %q: %v", ErrSettings, s.Endpoint, err)
			}
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		}
		return otlptracehttp.New(ctx, opts...)
	case ProtocolGRPC:
		var opts []otlptracegrpc.Option
		if s.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(s.Endpoint))
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	return nil, fmt.Errorf("%w: protocol %q (known: %s, %s)", ErrSettings, proto, ProtocolHTTP, ProtocolGRPC)
}

// Sampler is the SDK's sampler called name (one of Samplers), ratio the
// share of traces a *traceidratio one keeps.
func Sampler(name string, ratio float64) (sdktrace.Sampler, error) {
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("%w: sampler %q (known: %v)", ErrSettings, name, Samplers)
}

// Tracer returns the named tracer; nil on a nil p.
func (p *Provider) Tracer(name string) *Tracer {
	if p == nil {
		return nil
	}
	return &Tracer{Tracer: p.tp.Tracer(name), sampler: p.sampler}
}

// Tracer is a provider's tracer that can decide a span's sampling before
// the SDK makes it (Begin): a request the sampler drops, most of them at
// a low ratio, then costs no span, context or option.
type Tracer struct {
	trace.Tracer
	sampler sdktrace.Sampler
}

// Begin starts a span called name of kind at start under parent's span
// context, unless the provider's sampler drops it: then it returns
// parent, no span, and the context the dropped span would have had,
// which still tells a pod not to sample. The decision and the ids are
// the SDK's own (newSpan's): the sampler is asked once here, and the
// span is then started with the ids it was asked about, so the SDK, which
// asks again, decides the same.
func (t *Tracer) Begin(parent context.Context, name string, kind trace.SpanKind, start time.Time) (context.Context, trace.Span, trace.SpanContext) {
	psc := trace.SpanContextFromContext(parent)
	ids := presetIDs{tid: psc.TraceID(), sid: newSpanID()}
	if !ids.tid.IsValid() {
		ids.tid = newTraceID()
	}
	r := t.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: parent, TraceID: ids.tid, Name: name, Kind: kind})
	if r.Decision == sdktrace.Drop {
		return parent, nil, trace.NewSpanContext(trace.SpanContextConfig{TraceID: ids.tid, SpanID: ids.sid,
			TraceFlags: psc.TraceFlags() &^ trace.FlagsSampled, TraceState: r.Tracestate})
	}
	_, span := t.Start(context.WithValue(parent, presetKey{}, ids), name, trace.WithSpanKind(kind), trace.WithTimestamp(start))
	// Children start from parent and the span, not from what Start
	// returned: the preset ids would name them too.
	return trace.ContextWithSpan(parent, span), span, span.SpanContext()
}

// presetIDs are the ids Begin chose for the span it starts, handed to
// idGenerator under presetKey in the context.
type presetIDs struct {
	tid trace.TraceID
	sid trace.SpanID
}

type presetKey struct{}

// idGenerator makes random ids from the runtime's per-thread generator
// (the SDK's default takes a lock for each), or gives the preset ones.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if p, ok := ctx.Value(presetKey{}).(presetIDs); ok {
		return p.tid, p.sid
	}
	return newTraceID(), newSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, tid trace.TraceID) trace.SpanID {
	if p, ok := ctx.Value(presetKey{}).(presetIDs); ok && p.tid == tid {
		return p.sid
	}
	return newSpanID()
}

// newTraceID and newSpanID are random and valid (not all zero).
func newTraceID() (id trace.TraceID) {
	for !id.IsValid() {
		binary.LittleEndian.PutUint64(id[:8], rand.Uint64())
		binary.LittleEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() (id trace.SpanID) {
	for !id.IsValid() {
		binary.LittleEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

// Shutdown sends the spans still batched and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}

// Propagator reads and writes W3C traceparent and tracestate.
var Propagator = propagation.TraceContext{}

// headers adapts a request's headers to propagation.TextMapCarrier.
type headers struct{ h *fasthttp.RequestHeader }

func (c headers) Get(k string) string { return string(c.h.Peek(k)) }
func (c headers) Keys() []string      { return nil }

// Set replaces the field k in whichever of the two usual spellings a
// client sent it ("traceparent", "Traceparent"): headers copied without
// normalizing keep the client's, and a pod must not find two.
func (c headers) Set(k, v string) {
	c.h.Del(k)
	c.h.Del(strings.ToUpper(k[:1]) + k[1:])
	c.h.Set(k, v)
}

// Extract is the span context the headers h carry on top of ctx.
func Extract(ctx context.Context, h *fasthttp.RequestHeader) context.Context {
	return Propagator.Extract(ctx, headers{h})
}

// Inject writes the span context sc into h as traceparent and tracestate.
// Every request to a pod carries one, sampled or not, so the usual one,
// without a tracestate, is written here as the propagator would, without
// the context and strings it builds per call.
func Inject(sc trace.SpanContext, h *fasthttp.RequestHeader) {
	if !sc.IsValid() {
		return
	}
	if sc.TraceState().Len() > 0 {
		Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), headers{h})
		return
	}
	var b [len("00-") + 2*len(trace.TraceID{}) + 1 + 2*len(trace.SpanID{}) + len("-00")]byte
	h.Del(traceparent)
	h.Del(traceparentTitle)
	h.SetBytesV(traceparent, appendTraceparent(b[:0], sc))
}

// AppendFields appends the span context sc as Inject writes it, as header
// lines each ending in CRLF: traceparent, then tracestate when the context
// has one; nothing for a context that is not valid.
func AppendFields(dst []byte, sc trace.SpanContext) []byte {
	if !sc.IsValid() {
		return dst
	}
	dst = appendTraceparent(append(dst, traceparent+": "...), sc)
	dst = append(dst, "\r\n"...)
	if ts := sc.TraceState(); ts.Len() > 0 {
		dst = append(append(append(dst, "tracestate: "...), ts.String()...), "\r\n"...)
	}
	return dst
}

// The W3C trace context's field, as the propagator spells it and as
// clients capitalize it.
const (
	traceparent      = "traceparent"
	traceparentTitle = "Traceparent"
)

// appendTraceparent appends sc as a version 00 traceparent: the trace
// and parent ids in lowercase hex, then the sampled flag alone.
func appendTraceparent(b []byte, sc trace.SpanContext) []byte {
	tid, sid := sc.TraceID(), sc.SpanID()
	b = hex.AppendEncode(append(b, "00-"...), tid[:])
	b = hex.AppendEncode(append(b, '-'), sid[:])
	return hex.AppendEncode(append(b, '-'), []byte{byte(sc.TraceFlags() & trace.FlagsSampled)})
}

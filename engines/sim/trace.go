package sim

import (
	"context"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"pdlb/internal/tracing"
)

// A pod with a Config.Tracer emits a span per generation request, as vLLM
// does with --otlp-traces-endpoint: "llm_request", continuing the
// caller's traceparent, with a child for a decode leg's KV pull and an
// event at the first token. A pod without one pays a nil check.

// legNames name the legs in spans.
var legNames = [...]string{legPlain: "plain", legPrefill: "prefill", legDecode: "decode"}

// genSpan is one request's span on the pod; nil traces nothing.
type genSpan struct {
	tracer trace.Tracer
	ctx    context.Context
	span   trace.Span
	first  bool
}

// startSpan opens the span of a request of prompt tokens on the pod,
// playing leg.
func (p *Pod) startSpan(ctx *fasthttp.RequestCtx, leg legKind, model string, prompt int) *genSpan {
	if p.cfg.Tracer == nil {
		return nil
	}
	parent := tracing.Extract(context.Background(), &ctx.Request.Header)
	c, s := p.cfg.Tracer.Start(parent, "llm_request", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		semconv.GenAIRequestModel(model), semconv.GenAIUsageInputTokens(prompt),
		attribute.String("sim.pod", p.cfg.Name), attribute.String("sim.role", p.cfg.Role), attribute.String("sim.leg", legNames[leg]),
		attribute.String("sim.engine", string(p.cfg.Engine))))
	return &genSpan{tracer: p.cfg.Tracer, ctx: c, span: s}
}

// step opens a child span; end it with the function returned.
func (g *genSpan) step(name string) func() {
	if g == nil {
		return func() {}
	}
	_, s := g.tracer.Start(g.ctx, name)
	return func() { s.End() }
}

// token notes that tokens were produced: the first one is an event.
func (g *genSpan) token() {
	if g == nil || g.first {
		return
	}
	g.first = true
	g.span.AddEvent("first_token", trace.WithTimestamp(time.Now()))
}

// end closes the span after n output tokens; reason is the finish reason,
// finishNone when the client left.
func (g *genSpan) end(n int, reason uint8) {
	if g == nil {
		return
	}
	g.span.SetAttributes(semconv.GenAIUsageOutputTokens(n))
	if reason == finishNone {
		g.span.SetStatus(codes.Error, "client left")
	}
	g.span.End()
}

package tracing

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkInject: a request to a pod gets its traceparent.
func BenchmarkInject(b *testing.B) {
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	span := trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})))
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	b.ReportAllocs()
	for b.Loop() {
		Inject(span, &h)
	}
}

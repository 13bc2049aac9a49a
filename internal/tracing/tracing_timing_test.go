package tracing

import (
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkInject: a request to a pod gets its traceparent.
func BenchmarkInject(b *testing.B) {
	sc := testContext(0, trace.TraceState{})
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	b.ReportAllocs()
	for b.Loop() {
		Inject(sc, &h)
	}
}

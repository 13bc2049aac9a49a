package gateway

import "testing"

// BenchmarkTraceHooks is every tracing hook of a plain streamed request
// (request span, pick, attempt with its traceparent, relay, first token,
// finish): off, and on with 1% and 100% of requests sampled (spans batched
// to an exporter that drops them).
func BenchmarkTraceHooks(b *testing.B) {
	for _, c := range []struct {
		name  string
		ratio float64
	}{{"off", -1}, {"sampled_1pct", 0.01}, {"sampled_100pct", 1}} {
		b.Run(c.name, func(b *testing.B) {
			g := hookGateway(b, nil)
			if c.ratio >= 0 {
				g.tracer = sampledTracer(b, c.ratio)
			}
			x, up := hookRequest(b, g)
			// Without a client's traceparent: the ratio decides.
			x.ctx.Request.Header.Del("traceparent")
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				hooks(g, x, up)
			}
		})
	}
}

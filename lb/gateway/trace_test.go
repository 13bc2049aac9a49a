package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"pdlb/internal/tracing"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// hookGateway is a gateway over two pods of model "m", without sockets,
// tracing with tracer (nil: off).
func hookGateway(tb testing.TB, tracer *tracing.Tracer) *Gateway {
	tb.Helper()
	cfg := config.Default()
	for i := range 2 {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	g, _ := bareGateway(tb, cfg, upstream.Dialer(nil))
	g.tracer = tracer
	g.explain = newExplainer("", false, config.DefaultExplainHistory)
	return g
}

// hookEvent is a token event as a pod streams it.
var hookEvent = openai.Event(`data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}` + "\n\n")

// hooks runs every tracing and explaining hook a plain streamed request
// meets, in order, on x (parsed, for model m, on request ctx).
func hooks(g *Gateway, x *completion, up *fasthttp.Request) {
	x.hdr.read(&x.ctx.Request.Header)
	x.explain = g.explain.asked(x.hdr[hdrDebug], x.hdr[hdrAdminToken])
	g.startTrace(x)
	start := x.tr.mark()
	x.pod = g.pick(x.m, x, "")
	g.observePick(x, start)
	x.tr.attempt(x.pod, 1)
	inject(x.tr.attemptContext(), up)
	x.tr.answered(nil)
	x.responding(x.pod)
	x.tr.event(hookEvent)
	x.tr.firstToken(time.Now())
	g.observeEnd(x, x.pod, fasthttp.StatusOK, nil)
	g.ledger.PrefillDone(x.ticket)
	g.ledger.Finish(x.ticket)
	x.looked, x.tried = false, x.tried[:0]
}

// hookRequest readies a completion as serveCompletion leaves it.
func hookRequest(tb testing.TB, g *Gateway) (*completion, *fasthttp.Request) {
	tb.Helper()
	x := acquireCompletion(time.Now())
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`)
	if err := x.req.Parse(openai.KindChat, body); err != nil {
		tb.Fatal(err)
	}
	x.g, x.ctx, x.m = g, &fasthttp.RequestCtx{}, g.pool.Load().Models[0]
	x.ctx.Request.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	x.ticket = ledger.Ticket{ID: 1}
	return x, fasthttp.AcquireRequest()
}

// With tracing off and no explanation asked for, the hooks allocate
// nothing: each is a nil check.
func TestHooksOffAllocateNothing(t *testing.T) {
	g := hookGateway(t, nil)
	x, up := hookRequest(t, g)
	if n := testing.AllocsPerRun(100, func() { hooks(g, x, up) }); n != 0 {
		t.Fatalf("%v allocations per request with tracing off, want 0", n)
	}
	if up.Header.Peek("traceparent") != nil {
		t.Fatal("a traceparent sent with tracing off")
	}
}

// With tracing on and the request not sampled, the pod still gets a
// traceparent that says so: the client's trace when it sent one, else a
// new one; without the client's, the hooks allocate nothing either.
func TestHooksUnsampledAllocateNothing(t *testing.T) {
	g := hookGateway(t, sampledTracer(t, 0))
	x, up := hookRequest(t, g)
	hooks(g, x, up)
	if tp := string(up.Header.Peek("traceparent")); len(tp) != 55 || tp[3:35] != "0af7651916cd43dd8448eb211c80319c" || tp[53:] != "00" {
		t.Fatalf("traceparent %q, want the client's trace, not sampled", tp)
	}
	x.ctx.Request.Header.Del("traceparent")
	if n := testing.AllocsPerRun(100, func() { hooks(g, x, up) }); n != 0 {
		t.Fatalf("%v allocations per unsampled request, want 0", n)
	}
	tp := string(up.Header.Peek("traceparent"))
	if len(tp) != 55 || tp[3:35] == "0af7651916cd43dd8448eb211c80319c" || tp[3:35] == strings.Repeat("0", 32) || tp[53:] != "00" {
		t.Fatalf("traceparent %q, want a new trace, not sampled", tp)
	}
}

// discard is a span exporter that drops everything.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// sampledTracer traces with ratio sampling, exporting to nowhere.
func sampledTracer(tb testing.TB, ratio float64) *tracing.Tracer {
	p := tracing.NewProvider(sdktrace.TraceIDRatioBased(ratio), sdktrace.WithBatcher(discard{}))
	tb.Cleanup(func() { p.Shutdown(context.Background()) })
	return p.Tracer("test")
}

// With tracing on, the pod's request carries the attempt's span, in the
// client's trace.
func TestHooksOnSendTraceparent(t *testing.T) {
	g := hookGateway(t, sampledTracer(t, 1))
	x, up := hookRequest(t, g)
	hooks(g, x, up)
	tp := string(up.Header.Peek("traceparent"))
	if len(tp) != 55 || tp[3:35] != "0af7651916cd43dd8448eb211c80319c" || tp[36:52] == "b7ad6b7169203331" || tp[53:] != "01" {
		t.Fatalf("traceparent %q, want the client's trace, a span of the gateway's, sampled", tp)
	}
}

func TestFinishReasons(t *testing.T) {
	f := func(in string, want ...string) {
		t.Helper()
		if got := appendFinishReasons(nil, []byte(in)); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
	f(`{"choices":[{"finish_reason":null}]}`)
	f(`{"choices":[{"finish_reason":"stop"}]}`, "stop")
	f(`{"choices":[{"finish_reason":"length"},{"finish_reason":"stop"}]}`, "length", "stop")
	f(`{"choices":[{"finish_reason":"len`)
}

func FuzzFinishReasons(f *testing.F) {
	f.Add([]byte(`{"choices":[{"finish_reason":"stop"}]}`))
	f.Add([]byte(`"finish_reason":"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range appendFinishReasons(nil, b) {
			if len(r) > len(b) {
				t.Fatalf("reason %q longer than its input", r)
			}
		}
	})
}

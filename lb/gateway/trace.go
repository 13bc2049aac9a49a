package gateway

import (
	"bytes"
	"context"
	"path"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"pdlb/internal/tracing"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// OpenTelemetry spans of a completion request. The request's span (GenAI
// semantic conventions, plus pdlb's own attributes) continues the
// client's traceparent; its children are the pick, an admission wait, each
// attempt on one pod (retries are siblings), a PD pair's prefill leg, KV
// handoff and decode leg (with its first token), and the relay. Every
// request to a pod carries the traceparent of the span that sent it, so
// the engine's spans (vLLM's --otlp-traces-endpoint, the sim pods') join
// the trace.
//
// The hooks on the request path are methods of reqTrace: with tracing off,
// or the request not sampled, each is a nil check.

// tracerName is the instrumentation scope of the gateway's spans.
const tracerName = "pdlb/lb/gateway"

// startObserving starts the tracer provider cfg.Tracing and the OTEL_*
// variables ask for (g.tracer stays nil when tracing is off) and the
// explainer.
func (g *Gateway) startObserving(lookup func(string) (string, bool)) error {
	p, err := tracing.Start(context.Background(), g.cfg.Tracing.Settings(), config.DefaultServiceName, lookup)
	if err != nil {
		return err
	}
	g.tracing, g.tracer = p, p.Tracer(tracerName)
	t := g.cfg.Tracing
	g.explain = newExplainer(g.cfg.Access.AdminToken, t.Explain, t.ExplainHistory)
	return nil
}

// stopTracing sends the spans still batched.
func (g *Gateway) stopTracing() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.tracing.Shutdown(ctx); err != nil {
		g.log.Warn("flushing spans", "err", err)
	}
}

// reqTrace is one request's spans; the zero value traces nothing. Only
// the request's own goroutine (or its relay's) touches it.
type reqTrace struct {
	// ctx carries root, the request's span, when rec: the sampler kept it.
	// sc is the request's span context, the root's or, not sampled, the
	// one it would have had, which still tells the pods not to sample;
	// zero when tracing is off. rec first: each relayed event reads it.
	rec    bool
	tracer *tracing.Tracer
	ctx    context.Context
	root   trace.Span
	sc     trace.SpanContext
	// The spans still open: sent, the attempt on one pod, a PD pair's legs and
	// the relay.
	sent, prefill, decode, relay trace.Span
	decodeStart                  time.Time
	// decodeHeadAt is when the decode leg's answer came in (decodeHead),
	// until the KV handoff is recorded (a concurrent prefill leg's end
	// may come later).
	decodeHeadAt time.Time
	// reasons are the answer's finish_reason values, in order.
	reasons []string
}

// startTrace opens x's request span, continuing the client's traceparent.
func (g *Gateway) startTrace(x *completion) {
	if g.tracer == nil {
		return
	}
	// The propagator's lookups, for the client's traceparent and then its
	// tracestate, are only worth it when the client sent one.
	parent := context.Background()
	if x.hdr[hdrTraceparent] != nil {
		parent = tracing.Extract(parent, &x.ctx.Request.Header)
	}
	ctx, span, sc := g.tracer.Begin(parent, "request", trace.SpanKindServer, x.start)
	x.tr = reqTrace{tracer: g.tracer, ctx: ctx, root: span, sc: sc, rec: span != nil && span.IsRecording(), reasons: x.tr.reasons[:0]}
	if !x.tr.rec {
		return
	}
	var op attribute.KeyValue
	switch x.req.Kind {
	case openai.KindChat:
		op = semconv.GenAIOperationNameChat
	case openai.KindCompletion:
		op = semconv.GenAIOperationNameTextCompletion
	case openai.KindResponses, openai.KindStored:
		// Not the stored response's id, which a path's base would be.
		op = semconv.GenAIOperationNameKey.String("responses")
	default:
		// The API's name: "embeddings" is GenAI's own.
		op = semconv.GenAIOperationNameKey.String(path.Base(string(x.ctx.Path())))
	}
	// GenAI's span name: the operation and the model.
	span.SetName(op.Value.AsString() + " " + string(x.req.Model))
	span.SetAttributes(op, semconv.GenAIRequestModel(string(x.req.Model)), semconv.GenAIUsageInputTokens(x.req.PromptTokens()),
		attribute.Bool("pdlb.stream", x.req.Stream), attribute.String("pdlb.policy", policyName(x)))
}

// policyName is how x is routed: "pd", or its policy's registry name.
func policyName(x *completion) string {
	if x.cascade != nil {
		return route.StrategyPD
	}
	if x.policy != nil {
		return route.PolicyName(x.policy)
	}
	return route.PolicyName(x.m.Policy)
}

// child starts a child span of the request's at start.
func (t *reqTrace) child(name string, kind trace.SpanKind, start time.Time, attrs ...attribute.KeyValue) trace.Span {
	_, s := t.tracer.Start(t.ctx, name, trace.WithSpanKind(kind), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	return s
}

// picked records x's pick, made since start (zero when not traced).
func (t *reqTrace) picked(x *completion, start time.Time) {
	if !t.rec {
		return
	}
	// One list, given at the start: each SetAttributes is a lock and a
	// grown slice of the span's.
	attrs := append(make([]attribute.KeyValue, 0, 7), attribute.Int("pdlb.candidates", len(x.cands)),
		attribute.Int("pdlb.cached_tokens", x.chosen.CachedTokens), attribute.Float64("pdlb.ttft.predicted_s", x.predictedTTFT))
	if x.pd != nil {
		attrs = append(attrs, attribute.String("pdlb.pd.kind", pdKindName(x.pd.Decision.Kind)))
		if x.pd.Pre != nil {
			attrs = append(attrs, attribute.String("pdlb.prefill_pod", x.pd.Pre.Config.Name))
		}
		if x.pd.Dec != nil {
			attrs = append(attrs, attribute.String("pdlb.decode_pod", x.pd.Dec.Config.Name))
		}
	}
	if x.pod != nil {
		attrs = append(attrs, attribute.String("pdlb.pod", x.pod.Config.Name))
	}
	t.child("pick", trace.SpanKindInternal, start, attrs...).End()
}

// mark is the time a traced step starts; zero when x is not traced.
func (t *reqTrace) mark() time.Time {
	if !t.rec {
		return time.Time{}
	}
	return time.Now()
}

// admitted records an admission wait that began at since and ended with
// f (nil: admitted).
func (t *reqTrace) admitted(since time.Time, f *failure) {
	if !t.rec {
		return
	}
	s := t.child("admission_wait", trace.SpanKindInternal, since)
	endWith(s, f)
}

// endWith ends s, marked an error with f's message when f is set.
func endWith(s trace.Span, f *failure) {
	if f != nil {
		s.SetStatus(codes.Error, f.E.Message)
	}
	s.End()
}

// attempt opens the span of an attempt on pod, when the request is
// sampled; the request to the pod carries attemptContext.
func (t *reqTrace) attempt(pod *pool.Pod, n int) {
	if !t.rec {
		return
	}
	t.endOpen(&t.sent, "superseded")
	t.sent = t.child("attempt", trace.SpanKindClient, time.Now(), attribute.String("pdlb.pod", pod.Config.Name),
		attribute.Int("pdlb.attempt", n), semconv.ServerAddress(pod.Config.Address))
}

// attemptContext is the span context an attempt's request to a pod
// carries: the attempt's, or, the request not sampled, the request's,
// which tells the pod not to sample it either; zero (not valid) with
// tracing off.
func (t *reqTrace) attemptContext() trace.SpanContext {
	if t.rec {
		return t.sent.SpanContext()
	}
	return t.sc
}

// inject writes sc (attemptContext, a leg's) into up; nothing with
// tracing off.
func inject(sc trace.SpanContext, up *fasthttp.Request) {
	tracing.Inject(sc, &up.Header)
}

// answered ends the attempt's span: its pod's answer's head is in (err
// nil), or it failed with err.
func (t *reqTrace) answered(err error) {
	if !t.rec || t.sent == nil {
		return
	}
	if err != nil {
		t.sent.RecordError(err)
		t.sent.SetStatus(codes.Error, err.Error())
	}
	t.sent.End()
	t.sent = nil
}

// endOpen ends *s, if open, as an error saying why, and clears it.
func (t *reqTrace) endOpen(s *trace.Span, why string) {
	if *s == nil {
		return
	}
	(*s).SetStatus(codes.Error, why)
	(*s).End()
	*s = nil
}

// leg opens the span of a PD pair's prefill leg (prefill) or decode leg
// on pod and sends its context in up. A leg already open of the same kind
// did not go through: its retry replaces it.
func (t *reqTrace) leg(up *fasthttp.Request, pod *pool.Pod, prefill bool, n int) {
	if !t.rec {
		inject(t.sc, up)
		return
	}
	name, open := "decode", &t.decode
	if prefill {
		name, open = "prefill", &t.prefill
	}
	t.endOpen(open, "retried")
	now := time.Now()
	*open = t.child(name, trace.SpanKindClient, now, attribute.String("pdlb.pod", pod.Config.Name),
		attribute.Int("pdlb.attempt", n), semconv.ServerAddress(pod.Config.Address))
	if !prefill {
		t.decodeStart = now
	}
	inject((*open).SpanContext(), up)
}

// prefillDone ends a sequential prefill leg at at.
func (t *reqTrace) prefillDone(at time.Time, cut bool) {
	if !t.rec || t.prefill == nil {
		return
	}
	if cut {
		t.prefill.SetStatus(codes.Error, "client left")
	}
	t.prefill.End(trace.WithTimestamp(at))
	t.prefill = nil
}

// decodeHead records the KV handoff: from the prefill leg's end to the
// decode leg's answer, now: a stream's first event (its head comes before
// the KV pull), a whole answer's head. A concurrent prefill leg may report
// its end later (it answers once the KV is picked up): prefillKnown then
// records the handoff.
func (t *reqTrace) decodeHead(prefillEnd time.Time) {
	if !t.rec {
		return
	}
	t.decodeHeadAt = time.Now()
	if !prefillEnd.IsZero() {
		t.prefillKnown(prefillEnd)
	}
}

// prefillKnown ends a concurrent prefill leg's span at its end, at, and
// records the KV handoff once the decode leg's head is in too: from at
// to the head, or nothing of length when the prefill answered after it.
func (t *reqTrace) prefillKnown(at time.Time) {
	if t.prefill != nil {
		t.prefill.End(trace.WithTimestamp(at))
		t.prefill = nil
	}
	if head := t.decodeHeadAt; !head.IsZero() {
		start := at
		if head.Before(at) {
			start = head
		}
		t.child("kv_handoff", trace.SpanKindInternal, start).End(trace.WithTimestamp(head))
		t.decodeHeadAt = time.Time{}
	}
}

// responding runs as pod's answer's head is in: a whole answer carries
// its explanation in a header, and the relay span opens.
func (x *completion) responding(pod *pool.Pod) {
	if x.explained != nil && !x.req.Stream {
		x.ctx.Response.Header.SetBytesV(headerExplain, explainJSON(x.explained))
		x.explained = nil
	}
	x.tr.relayStart(pod)
}

// relayStart opens the relay span.
func (t *reqTrace) relayStart(pod *pool.Pod) {
	if !t.rec {
		return
	}
	t.relay = t.child("relay", trace.SpanKindInternal, time.Now(), attribute.String("pdlb.pod", pod.Config.Name))
}

// firstToken records a decode leg's first token, at at.
func (t *reqTrace) firstToken(at time.Time) {
	if !t.rec || t.decode == nil {
		return
	}
	_, s := t.tracer.Start(trace.ContextWithSpan(t.ctx, t.decode), "first_token", trace.WithTimestamp(t.decodeStart))
	s.End(trace.WithTimestamp(at))
}

// event notes the finish reasons of a relayed SSE event.
func (t *reqTrace) event(ev openai.Event) {
	if !t.rec {
		return
	}
	t.reasons = appendFinishReasons(t.reasons, ev.Data())
}

var finishReasonKey = []byte(`"finish_reason":"`)

// appendFinishReasons appends every non-null finish_reason of a JSON
// answer or chunk b.
func appendFinishReasons(dst []string, b []byte) []string {
	for {
		i := bytes.Index(b, finishReasonKey)
		if i < 0 {
			return dst
		}
		b = b[i+len(finishReasonKey):]
		j := bytes.IndexByte(b, '"')
		if j < 0 {
			return dst
		}
		dst = append(dst, string(b[:j]))
		b = b[j:]
	}
}

// observeEnd ends x's spans as it is answered with status by pod (nil:
// no pod answered), and readies x's observations for the next request.
func (g *Gateway) observeEnd(x *completion, pod *pool.Pod, status int, e *openai.Error) {
	x.explain, x.explained = false, nil
	t := &x.tr
	if !t.rec {
		*t = reqTrace{reasons: t.reasons[:0]}
		x.predictedTTFT = 0
		return
	}
	why := "request ended"
	if e != nil {
		why = e.Message
	}
	if x.pd != nil && (t.prefill != nil || !t.decodeHeadAt.IsZero()) {
		if at := x.pd.PrefillEnd(); !at.IsZero() {
			t.prefillKnown(at)
		}
	}
	t.endOpen(&t.sent, why)
	t.endOpen(&t.prefill, why)
	if t.decode != nil {
		endWithStatus(t.decode, status, why)
	}
	if t.relay != nil {
		endWithStatus(t.relay, status, why)
	}
	r := t.root
	if !x.req.Stream && status == fasthttp.StatusOK {
		t.reasons = appendFinishReasons(t.reasons, x.ctx.Response.Body())
	}
	// One SetAttributes call, as in picked.
	attrs := append(make([]attribute.KeyValue, 0, 10), semconv.HTTPResponseStatusCode(status), attribute.Int("pdlb.attempts", x.attempts),
		attribute.Int("pdlb.cached_tokens", x.chosen.CachedTokens), attribute.Float64("pdlb.ttft.predicted_s", x.predictedTTFT))
	if pod != nil {
		attrs = append(attrs, attribute.String("pdlb.pod", pod.Config.Name), semconv.GenAIUsageOutputTokens(x.counted.Tokens()))
	}
	if x.pd != nil && x.pd.Pre != nil {
		attrs = append(attrs, attribute.String("pdlb.prefill_pod", x.pd.Pre.Config.Name))
	}
	if x.pd != nil && x.pd.Dec != nil {
		attrs = append(attrs, attribute.String("pdlb.decode_pod", x.pd.Dec.Config.Name))
	}
	if len(t.reasons) > 0 {
		attrs = append(attrs, semconv.GenAIResponseFinishReasons(t.reasons...))
	}
	if !x.times.first.IsZero() {
		attrs = append(attrs, attribute.Float64("pdlb.ttft_s", x.times.first.Sub(x.start).Seconds()))
	}
	r.SetAttributes(attrs...)
	endWithStatus(r, status, why)
	*t = reqTrace{reasons: t.reasons[:0]}
	x.predictedTTFT = 0
}

// endWithStatus ends s, an error unless status is a success.
func endWithStatus(s trace.Span, status int, why string) {
	if status >= 400 {
		s.SetStatus(codes.Error, why)
	}
	s.End()
}

// pdKindName names a PD decision's kind.
func pdKindName(k route.PDKind) string {
	switch k {
	case route.PDPair:
		return "pair"
	case route.PDLocal:
		return "local"
	}
	return "combined"
}

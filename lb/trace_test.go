package lb_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/internal/tracing"
	"pdlb/lb"
	"pdlb/lb/config"
)

// The tests below send the gateway's and the sim pods' spans to an OTLP/HTTP
// receiver that decodes the protobuf wire format, and check the trees.

// gotSpan is one span as the receiver decoded it.
type gotSpan struct {
	trace, id, parent string
	name, service     string
	kind              int32
	failed            bool
	start, end        uint64
	attrs             map[string]string
}

// otlpSink is an OTLP/HTTP trace receiver.
type otlpSink struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []gotSpan
}

func startSink(t *testing.T) *otlpSink {
	t.Helper()
	s := &otlpSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("OTLP export to %s as %q", r.URL.Path, r.Header.Get("Content-Type"))
			http.Error(w, "not OTLP/HTTP protobuf", http.StatusBadRequest)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			t.Errorf("OTLP export does not decode: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.add(&req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *otlpSink) add(req *coltracepb.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := attrMap(rs.Resource.GetAttributes())["service.name"]
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans = append(s.spans, gotSpan{
					trace: hex.EncodeToString(sp.TraceId), id: hex.EncodeToString(sp.SpanId), parent: hex.EncodeToString(sp.ParentSpanId),
					name: sp.Name, service: service, kind: int32(sp.Kind), failed: sp.Status.GetCode() == 2,
					start: sp.StartTimeUnixNano, end: sp.EndTimeUnixNano, attrs: attrMap(sp.Attributes),
				})
			}
		}
	}
}

// attrMap renders attributes as strings: arrays as [a b].
func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	var str func(v *commonpb.AnyValue) string
	str = func(v *commonpb.AnyValue) string {
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return x.StringValue
		case *commonpb.AnyValue_IntValue:
			return fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_DoubleValue:
			return fmt.Sprint(x.DoubleValue)
		case *commonpb.AnyValue_BoolValue:
			return fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_ArrayValue:
			var parts []string
			for _, e := range x.ArrayValue.Values {
				parts = append(parts, str(e))
			}
			return "[" + strings.Join(parts, " ") + "]"
		}
		return ""
	}
	for _, kv := range kvs {
		m[kv.Key] = str(kv.Value)
	}
	return m
}

// all is every span received so far.
func (s *otlpSink) all() []gotSpan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.spans)
}

// traceOf waits for a trace holding a span that match accepts and for
// its want spans, and returns them.
func (s *otlpSink) traceOf(t *testing.T, want int, match func(gotSpan) bool) []gotSpan {
	t.Helper()
	var tr []gotSpan
	testwait.For(t, fmt.Sprintf("a trace of %d spans", want), func() bool {
		all := s.all()
		for _, sp := range all {
			if match(sp) {
				tr = tr[:0]
				for _, o := range all {
					if o.trace == sp.trace {
						tr = append(tr, o)
					}
				}
				return len(tr) >= want
			}
		}
		return false
	})
	return tr
}

// listing renders a trace as an indented tree in start order.
func listing(tr []gotSpan) string {
	sort.Slice(tr, func(i, j int) bool { return tr[i].start < tr[j].start })
	ids := map[string]bool{}
	for _, s := range tr {
		ids[s.id] = true
	}
	var b strings.Builder
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		for _, s := range tr {
			if s.parent == parent || (depth == 0 && !ids[s.parent] && parent == "") {
				if depth == 0 && s.parent != parent && ids[s.parent] {
					continue
				}
				fmt.Fprintf(&b, "%s%-*s %-9s %8.3f ms\n", strings.Repeat("  ", depth), 28-2*depth, s.name, s.service, float64(s.end-s.start)/1e6)
				walk(s.id, depth+1)
			}
		}
	}
	walk("", 0)
	return b.String()
}

// tracedSim starts a sim pod that traces to sink.
func tracedSim(t *testing.T, sink *otlpSink, e pdEngine, name, role string) *sim.Pod {
	t.Helper()
	p, err := tracing.Start(context.Background(), tracing.Settings{Enabled: true, Endpoint: sink.srv.URL, ServiceName: "pdlb-sim"}, "", os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	return startSim(t, e, name, role, func(c *sim.Config) { c.Tracer = p.Tracer("sim") })
}

// tracedGateway starts a gateway over pods that traces to sink with
// sampler (empty: the default, parent-based always on).
func tracedGateway(t *testing.T, sink *otlpSink, pods []config.Pod, sampler string, edit func(*config.Config)) *lb.Server {
	t.Helper()
	return testGateway(t, pods, func(c *config.Config) {
		c.Tracing.Enabled, c.Tracing.Endpoint, c.Tracing.Sampler = true, sink.srv.URL, sampler
		if edit != nil {
			edit(c)
		}
	})
}

// postHeaders is postWith with headers from a map, for a 200 answer.
func postHeaders(t *testing.T, s *lb.Server, body string, h map[string]string) (*http.Response, string) {
	t.Helper()
	var pairs []string
	for k, v := range h {
		pairs = append(pairs, k, v)
	}
	resp, b := postWith(t, s, body, pairs...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp, b
}

// byName indexes a trace's spans by name and service.
func byName(t *testing.T, tr []gotSpan) map[string][]gotSpan {
	t.Helper()
	m := map[string][]gotSpan{}
	for _, s := range tr {
		m[s.service+"/"+s.name] = append(m[s.service+"/"+s.name], s)
	}
	return m
}

func one(t *testing.T, m map[string][]gotSpan, key string) gotSpan {
	t.Helper()
	if len(m[key]) != 1 {
		t.Fatalf("%d spans %s, want 1 (have %v)", len(m[key]), key, slices.Collect(mapKeys(m)))
	}
	return m[key][0]
}

func mapKeys(m map[string][]gotSpan) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func childOf(t *testing.T, c, p gotSpan) {
	t.Helper()
	if c.parent != p.id || c.trace != p.trace {
		t.Errorf("%s/%s is not a child of %s/%s", c.service, c.name, p.service, p.name)
	}
}

func TestTracePDRequest(t *testing.T) {
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) { testTracePDRequest(t, e) })
	}
}

func testTracePDRequest(t *testing.T, e pdEngine) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	sink := startSink(t)
	pre := tracedSim(t, sink, e, "pre", sim.RolePrefill)
	dec := tracedSim(t, sink, e, "dec", sim.RoleDecode)
	s := tracedGateway(t, sink, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, "", nil)

	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	body := `{"model":"m","messages":[{"role":"user","content":"tell me a story"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
	postHeaders(t, s, body, map[string]string{"traceparent": "00-" + traceID + "-" + parentID + "-01"})
	tr := sink.traceOf(t, 10, func(sp gotSpan) bool { return sp.trace == traceID })
	t.Logf("PD request's spans:\n%s", listing(tr))
	m := byName(t, tr)

	root := one(t, m, "pdlb/chat m")
	if root.parent != parentID {
		t.Errorf("request span's parent %q, want the client's %s", root.parent, parentID)
	}
	for k, want := range map[string]string{
		"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.response.finish_reasons": "[length]",
		"gen_ai.usage.output_tokens": "8", "pdlb.policy": "pd", "pdlb.prefill_pod": "pre", "pdlb.decode_pod": "dec",
		"pdlb.attempts": "1", "http.response.status_code": "200",
	} {
		if got := root.attrs[k]; got != want {
			t.Errorf("request span %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"gen_ai.usage.input_tokens", "pdlb.cached_tokens", "pdlb.ttft_s", "pdlb.ttft.predicted_s"} {
		if root.attrs[k] == "" {
			t.Errorf("request span lacks %s", k)
		}
	}
	for _, name := range []string{"pick", "prefill", "kv_handoff", "decode", "relay"} {
		childOf(t, one(t, m, "pdlb/"+name), root)
	}
	pick := one(t, m, "pdlb/pick")
	for k, want := range map[string]string{"pdlb.pd.kind": "pair", "pdlb.prefill_pod": "pre", "pdlb.decode_pod": "dec"} {
		if got := pick.attrs[k]; got != want {
			t.Errorf("pick span %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"pdlb.candidates", "pdlb.cached_tokens", "pdlb.ttft.predicted_s"} {
		if pick.attrs[k] == "" {
			t.Errorf("pick span lacks %s", k)
		}
	}
	prefill, decode := one(t, m, "pdlb/prefill"), one(t, m, "pdlb/decode")
	childOf(t, one(t, m, "pdlb/first_token"), decode)
	// The pods' spans continue the legs' contexts.
	var simPre, simDec gotSpan
	for _, sp := range m["pdlb-sim/llm_request"] {
		switch sp.attrs["sim.leg"] {
		case "prefill":
			simPre = sp
		case "decode":
			simDec = sp
		}
	}
	childOf(t, simPre, prefill)
	childOf(t, simDec, decode)
	if simPre.attrs["sim.pod"] != "pre" || simDec.attrs["sim.pod"] != "dec" {
		t.Errorf("pod spans from %q and %q", simPre.attrs["sim.pod"], simDec.attrs["sim.pod"])
	}
	pull := one(t, m, "pdlb-sim/kv_pull")
	childOf(t, pull, simDec)
	// The handoff ends as the decode leg's stream shows the KV arrived,
	// at its first event: the pod sent its head before the pull.
	if kv := one(t, m, "pdlb/kv_handoff"); kv.end < pull.end {
		t.Errorf("kv_handoff ends %v before the decode pod's kv_pull", time.Duration(pull.end-kv.end))
	}
}

func TestTraceRetriesAreSiblings(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	sink := startSink(t)
	dead := testnet.Refusing(t) // refuses: the request never reaches it, so it is retried
	live := tracedSim(t, sink, pdEngine{engine: engines.VLLM}, "live", sim.RoleCombined)
	s := tracedGateway(t, sink, []config.Pod{{Name: "dead", Model: "m", Address: dead}, {Name: "live", Model: "m", Address: live.Addr()}}, "", func(c *config.Config) {
		// Round robin sends the first request to the refusing pod.
		c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
		c.Health.Interval = time.Minute
	})
	postHeaders(t, s, chatBody, nil)
	tr := sink.traceOf(t, 7, func(sp gotSpan) bool { return sp.name == "chat m" && sp.attrs["pdlb.attempts"] == "2" })
	t.Logf("retried request's spans:\n%s", listing(tr))
	m := byName(t, tr)
	root := one(t, m, "pdlb/chat m")
	if root.parent != "" {
		t.Errorf("a request without traceparent has parent %s; want a new trace", root.parent)
	}
	attempts := m["pdlb/attempt"]
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	sort.Slice(attempts, func(i, j int) bool { return attempts[i].start < attempts[j].start })
	for i, want := range []struct {
		pod    string
		failed bool
	}{{"dead", true}, {"live", false}} {
		a := attempts[i]
		childOf(t, a, root)
		if a.attrs["pdlb.pod"] != want.pod || a.failed != want.failed || a.attrs["pdlb.attempt"] != fmt.Sprint(i+1) {
			t.Errorf("attempt %d: pod %s failed %v attempt %s; want %s, %v", i+1, a.attrs["pdlb.pod"], a.failed, a.attrs["pdlb.attempt"], want.pod, want.failed)
		}
	}
	childOf(t, one(t, m, "pdlb-sim/llm_request"), attempts[1])
	if root.attrs["pdlb.pod"] != "live" || root.attrs["gen_ai.response.finish_reasons"] == "" {
		t.Errorf("request span: pod %q finish reasons %q", root.attrs["pdlb.pod"], root.attrs["gen_ai.response.finish_reasons"])
	}
}

func TestTraceSamplingOffSendsNothing(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	sink := startSink(t)
	pod := tracedSim(t, sink, pdEngine{engine: engines.VLLM}, "p", sim.RoleCombined)
	s := tracedGateway(t, sink, podsOf("m", pod), "always_off", nil)
	// The pod is told the request is not sampled, so it keeps no span
	// either (its sampler follows its parent).
	for i := 0; i < 3; i++ {
		postHeaders(t, s, chatBody, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.Shutdown(ctx) // flushes whatever the gateway had
	time.Sleep(100 * time.Millisecond)
	if n := len(sink.all()); n != 0 {
		t.Fatalf("%d spans sent with sampling off", n)
	}
}

// The gateway sends an unsampled request's context to its pod: traceparent
// with the sampled flag clear.
func TestTraceUnsampledContextReachesPods(t *testing.T) {
	sink := startSink(t)
	var mu sync.Mutex
	var tp []string
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		mu.Lock()
		tp = append(tp, r.Header.Get("traceparent"))
		mu.Unlock()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	s := tracedGateway(t, sink, []config.Pod{{Model: "m", Address: pod}}, "always_off", nil)
	postHeaders(t, s, chatBody, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(tp) != 1 || !strings.HasPrefix(tp[0], "00-") || !strings.HasSuffix(tp[0], "-00") {
		t.Fatalf("pod got traceparent %q, want one with the sampled flag clear", tp)
	}
	if bytes.Contains([]byte(tp[0]), []byte("00000000000000000000000000000000")) {
		t.Fatalf("traceparent %q has no trace id", tp[0])
	}
}

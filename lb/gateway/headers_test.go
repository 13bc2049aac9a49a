package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"pdlb/lb/config"
	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/upstream"
)

func TestIsHopByHop(t *testing.T) {
	for _, h := range hopByHop {
		for _, k := range []string{string(h), strings.ToLower(string(h)), strings.ToUpper(string(h))} {
			if !isHopByHop([]byte(k)) {
				t.Errorf("%q is hop-by-hop", k)
			}
		}
	}
	for _, k := range []string{"", "X", "Content-Type", "Connections", "Authorization", "X-Request-Id", "Proxy-Authorization-X"} {
		if isHopByHop([]byte(k)) {
			t.Errorf("%q is not hop-by-hop", k)
		}
	}
}

func TestEachNominated(t *testing.T) {
	f := func(v string, want ...string) {
		t.Helper()
		var got []string
		eachNominated([]byte(v), func(name []byte) { got = append(got, string(name)) })
		if strings.Join(got, "|") != strings.Join(want, "|") || nominates([]byte(v)) != (len(want) > 0) {
			t.Errorf("%q nominates %q, want %q", v, got, want)
		}
	}
	f("")
	f("close")
	f("keep-alive, Upgrade")
	f("X-Hop", "X-Hop")
	f(" close ,\tX-A,, x-b ,", "X-A", "x-b")
	f("keep-alive,X-A,close,", "X-A")
}

// TestBuildUpstreamFromCopy checks what a copy of the client's header
// carries that is the client's connection's, not the pod's: its protocol
// version, Connection: close, the hop-by-hop names, Expect, Host.
func TestBuildUpstreamFromCopy(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: "127.0.0.1:10000"}}
	g, _ := bareGateway(t, cfg, upstream.Dialer(nil))
	const body = `{"model":"m"}`
	head := "POST /v1/chat/completions HTTP/1.0\r\nHost: lb.example\r\nConnection: close, X-Hop\r\nKeep-Alive: timeout=5\r\n" +
		"X-Hop: 1\r\nTe: trailers\r\nExpect: 100-continue\r\nx-pdlb-pod: p\r\nUser-Agent: sdk/1\r\nCookie: a=b\r\n" +
		"X-Request-Id: \r\nX-Request-Id: second\r\nX-Forwarded-For: 10.0.0.1\r\nX-Custom: kept\r\n" +
		"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 50000}, nil)
	var up fasthttp.Request
	g.buildUpstream(&ctx, &up, requestIDOf(nil, &ctx, req.Header.Peek(headerRequestID)), g.pool.Load().Pods[0])
	up.Header.SetHost("127.0.0.1:10000")
	up.Header.SetContentLength(len(up.Body()))
	got := string(up.Header.Header())
	for _, want := range []string{"POST /v1/chat/completions HTTP/1.1\r\n", "\r\nHost: 127.0.0.1:10000\r\n", "\r\nUser-Agent: sdk/1\r\n",
		"\r\nCookie: a=b\r\n", "\r\nX-Custom: kept\r\n", "\r\nContent-Type: application/json\r\n", "\r\nX-Forwarded-For: 10.0.0.1, 10.0.0.7\r\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("the pod's request lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"lb.example", "Connection", "Keep-Alive", "X-Hop", "Te:", "Expect", "x-pdlb", "X-Pdlb", "HTTP/1.0"} {
		if strings.Contains(got, not) {
			t.Errorf("the pod's request has %q:\n%s", not, got)
		}
	}
	// The first X-Request-Id was empty: one made up goes, not the second.
	if ids := strings.Count(got, "X-Request-Id:"); ids != 1 || strings.Contains(got, "second") {
		t.Errorf("want one X-Request-Id of the gateway's:\n%s", got)
	}
	if string(up.Body()) != body {
		t.Errorf("body %q", up.Body())
	}
}

// TestBuildUpstreamNominatedID: a client whose Connection names
// X-Request-Id still has its id reach the pod, the id the gateway
// answers and logs with.
func TestBuildUpstreamNominatedID(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: "127.0.0.1:10000"}}
	g, _ := bareGateway(t, cfg, upstream.Dialer(nil))
	for _, ids := range []string{"X-Request-Id: abc\r\n", "X-Request-Id: abc\r\nx-request-id: def\r\n"} {
		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: lb\r\nConnection: keep-alive, x-request-id\r\n" + ids + "Content-Length: 2\r\n\r\n{}"
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
			t.Fatal(err)
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, nil, nil)
		id := requestIDOf(nil, &ctx, req.Header.Peek(headerRequestID))
		var up fasthttp.Request
		g.buildUpstream(&ctx, &up, id, g.pool.Load().Pods[0])
		got := string(up.Header.Header())
		if string(id) != "abc" || strings.Count(strings.ToLower(got), "x-request-id:") != 1 || !strings.Contains(got, "X-Request-Id: abc\r\n") {
			t.Errorf("ids %q: the gateway's id %q; the pod's request:\n%s", ids, id, got)
		}
	}
}

// TestClientHeadersAsPeek: the one pass finds what Peek would, name by
// name: the first of its name, whatever the case, empty or not.
func TestClientHeadersAsPeek(t *testing.T) {
	head := "POST / HTTP/1.1\r\nHost: x\r\nx-priority: \r\nX-Priority: batch\r\nAUTHORIZATION: Bearer a\r\nAuthorization: Bearer b\r\n" +
		"X-Session-Key: s1\r\nx-aibrix-session-key: s2\r\nrouting-strategy: pd\r\nConfig-Profile: p\r\nX-Pdlb-Debug: 1\r\n" +
		"x-pdlb-admin-token: t\r\nX-Other: o\r\nx-api-key: k1\r\nX-API-KEY: k2\r\nContent-Length: 0\r\n\r\n"
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
		t.Fatal(err)
	}
	var h clientHeaders
	h.read(&req.Header)
	for i, name := range clientHeaderNames {
		if want := req.Header.PeekBytes(name); string(h[i]) != string(want) {
			t.Errorf("%s: %q, Peek %q", name, h[i], want)
		}
	}
	if string(h[hdrAuthorization]) != "Bearer a" || string(h[hdrSession]) != "s1" || string(h[hdrAPIKey]) != "k1" {
		t.Errorf("read %q", h)
	}
}

// TestAppendUpstreamAsBuild: the event loop's rendering of a request to
// a pod (appendUpstream) sends what buildUpstream's fasthttp request
// does, field for field (their order aside): for clients' headers with
// hop-by-hop and nominated fields (before and after their Connection
// header), X-Forwarded-For chains, several or empty X-Request-Ids,
// cookies, keys and trace contexts, with API keys and X-Forwarded-For on
// and off, and with the attempt's trace context sent or not.
func TestAppendUpstreamAsBuild(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	// q's API key replaces the client's Authorization and x-api-key.
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: "127.0.0.1:10000"},
		{Name: "q", Model: "m", Address: "127.0.0.1:10001", PodKey: config.PodKey{APIKey: "sk-pod"}}}
	g, snap := bareGateway(t, cfg, upstream.Dialer(nil))
	const body = `{"model":"m","messages":[]}`
	heads := []string{
		"Host: lb\r\nContent-Type: application/json\r\n",
		"Host: lb\r\n",
		"Host: lb.example\r\nConnection: close, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nTe: trailers\r\nExpect: 100-continue\r\n" +
			"x-pdlb-pod: p\r\nUser-Agent: sdk/1\r\nCookie: a=b\r\nCookie: c=d\r\nX-Request-Id: \r\nX-Request-Id: second\r\n" +
			"X-Forwarded-For: 10.0.0.1\r\nX-Custom: kept\r\nContent-Type: application/json\r\n",
		"Host: lb\r\nX-Hop: 1\r\nx-hop: 2\r\nX-Forwarded-For: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2, 10.0.0.3\r\n" +
			"Connection: keep-alive, x-hop , X-Forwarded-For\r\nX-Later: named\r\nConnection: x-later\r\n",
		"Host: lb\r\nConnection: x-request-id\r\nX-Request-Id: abc\r\nx-request-id: def\r\n",
		"Host: lb\r\nX-Request-Id: mine\r\nAuthorization: Bearer k\r\nx-api-key: k\r\nX-Api-Key-Other: kept\r\nProxy-Authorization: p\r\n",
		"Host: lb\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nAccept: */*\r\n",
		"Host: lb\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\ntracestate: client=1\r\n",
		"Host: lb\r\nTRACEPARENT: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00\r\nTraceState: client=1\r\nX-Custom: kept\r\n",
	}
	// The attempt's trace context: none (tracing off), one not valid, one
	// without a tracestate, one with.
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, _ := trace.ParseTraceState("pdlb=1")
	spans := []trace.Span{nil, trace.SpanFromContext(context.Background())}
	for _, ts := range []trace.TraceState{{}, state} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceState: ts})
		spans = append(spans, trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), sc)))
	}
	keys, err := limits.NewKeys([]limits.APIKey{{Name: "k", SHA256: limits.HashKey("k")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range snap.Pods {
		for _, authorize := range []bool{false, true} {
			for _, forward := range []bool{true, false} {
				g.keys.Store(nil)
				g.cfg.Upstream.XForwardedFor = forward
				if authorize {
					g.keys.Store(keys)
				}
				for i := range len(heads) * len(spans) {
					h := heads[i/len(spans)]
					var req fasthttp.Request
					whole := "POST /v1/chat/completions HTTP/1.1\r\n" + h + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
					if err := req.Read(bufio.NewReader(strings.NewReader(whole))); err != nil {
						t.Fatal(err)
					}
					var ctx fasthttp.RequestCtx
					ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 50000}, nil)
					x := &completion{g: g, ctx: &ctx, pod: pod, reqID: requestIDOf(nil, &ctx, req.Header.Peek(headerRequestID))}
					x.tr.root = spans[i%len(spans)]
					var up fasthttp.Request
					g.buildUpstream(&ctx, &up, x.reqID, pod)
					up.Header.SetHost(pod.Config.Address)
					inject(x.tr.attemptContext(), &up)
					built := (*frontend.FastRequest)(&up).AppendRequest(nil)
					rendered := x.AppendRequest(nil)
					if b, r := sentAs(t, built), sentAs(t, rendered); b != r {
						t.Errorf("authorize %v, forward %v, trace context %v, client's header\n%s\nbuilt:\n%s\nrendered:\n%s",
							authorize, forward, x.tr.root != nil, h, b, r)
					}
					if low := strings.ToLower(string(rendered)); pod.Auth() != nil && (strings.Count(low, "authorization:") != 1 ||
						!strings.Contains(string(rendered), "\r\nAuthorization: Bearer sk-pod\r\n") || strings.Contains(low, "x-api-key:")) {
						t.Errorf("client's header\n%s\nrendered for a pod with a key:\n%s", h, rendered)
					}
					// Into a buffer of room (an upstream connection's), a
					// request whose Connection nominates nothing allocates
					// nothing.
					if n := testing.AllocsPerRun(10, func() { rendered = x.AppendRequest(rendered[:0]) }); n != 0 && !strings.Contains(h, "Connection: ") &&
						(x.tr.root == nil || x.tr.root.SpanContext().TraceState().Len() == 0) {
						t.Errorf("client's header\n%s\nrendered with %.0f allocations", h, n)
					}
				}
			}
		}
	}
}

// sentAs is a request as its pod reads it: its request line, its header
// fields in sorted order, its body.
func sentAs(t *testing.T, wire []byte) string {
	t.Helper()
	var req fasthttp.Request
	req.Header.DisableNormalizing()
	br := bufio.NewReader(strings.NewReader(string(wire)))
	if err := req.Read(br); err != nil {
		t.Fatalf("%v:\n%q", err, wire)
	}
	if br.Buffered() > 0 {
		t.Fatalf("%d bytes past the request:\n%q", br.Buffered(), wire)
	}
	var fields []string
	for k, v := range req.Header.All() {
		fields = append(fields, string(k)+": "+string(v))
	}
	slices.Sort(fields)
	return fmt.Sprintf("%s %s %s\n%s\n\n%s", req.Header.Method(), req.Header.RequestURI(), req.Header.Protocol(), strings.Join(fields, "\n"), req.Body())
}

// FuzzAppendUpstream: whatever header a client's request that fasthttp
// takes carries, the event loop's rendering and buildUpstream's send a
// pod the same request, one that parses whole.
func FuzzAppendUpstream(f *testing.F) {
	f.Add("Host: lb\r\nContent-Type: application/json\r\n", true, true)
	f.Add("Host: lb\r\nConnection: keep-alive, x-a\r\nX-A: 1\r\nX-Forwarded-For: 10.0.0.1\r\nX-Request-Id: a\r\nx-request-id: b\r\n", false, true)
	f.Add("Host: lb\r\nCookie: a=b\r\nAuthorization: Bearer k\r\nTransfer-Encoding: chunked\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n", true, false)
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: "127.0.0.1:10000"}}
	g, snap := bareGateway(f, cfg, upstream.Dialer(nil))
	keys, err := limits.NewKeys([]limits.APIKey{{Name: "k", SHA256: limits.HashKey("k")}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, head string, authorize, forward bool) {
		const body = `{"model":"m"}`
		var req fasthttp.Request
		whole := "POST /v1/chat/completions HTTP/1.1\r\n" + head + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		br := bufio.NewReader(strings.NewReader(whole))
		if req.Read(br) != nil || br.Buffered() > 0 {
			return // not a request the front end takes whole
		}
		g.keys.Store(nil)
		g.cfg.Upstream.XForwardedFor = forward
		if authorize {
			g.keys.Store(keys)
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 50000}, nil)
		x := &completion{g: g, ctx: &ctx, pod: snap.Pods[0], reqID: requestIDOf(nil, &ctx, req.Header.Peek(headerRequestID))}
		var up fasthttp.Request
		g.buildUpstream(&ctx, &up, x.reqID, x.pod)
		up.Header.SetHost(x.pod.Config.Address)
		built := (*frontend.FastRequest)(&up).AppendRequest(nil)
		if b, r := sentAs(t, built), sentAs(t, x.AppendRequest(nil)); b != r {
			t.Errorf("client's header %q\nbuilt:\n%s\nrendered:\n%s", head, b, r)
		}
	})
}

// TestPathOf: pathOf answers what ctx.Path() would, for plain targets
// without parsing the URI and for every target Path decodes or normalises.
func TestPathOf(t *testing.T) {
	for _, target := range []string{
		"/v1/chat/completions", "/", "/v1/models/m", "/v1//chat/completions", "//v1/completions",
		"/v1/chat/completions?x=1", "/v1/chat/completions#f", "/v1/%63hat/completions", "/v1/./chat/completions",
		"/v1/x/../chat/completions", "/v1/chat/completions/.", "/v1/chat/completions/..", "/v1.0/models",
		"/v1/chat/completions%3Fx", "/a+b/c", "/v1/ch\xc3\xa4t", "http://lb.example/v1/completions", "*",
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetRequestURI(target)
		got := string(pathOf(&ctx))
		var ref fasthttp.RequestCtx
		ref.Request.Header.SetRequestURI(target)
		if want := string(ref.Path()); got != want {
			t.Errorf("pathOf(%q) = %q, want ctx.Path()'s %q", target, got, want)
		}
	}
}

package gateway

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
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
	g.buildUpstream(&ctx, &up, requestIDOf(nil, &ctx, req.Header.Peek(headerRequestID)))
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
		g.buildUpstream(&ctx, &up, id)
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

package gateway

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/limits"
	"pdlb/lb/upstream"

	"github.com/valyala/fasthttp"
)

// BenchmarkHeaders is the header work of one proxied request: the
// upstream request's headers from the client's (request: buildUpstream,
// as a worker sends it; rendered: appendUpstream, the event loop's whole
// request with its body), and the client's answer head from the pod's
// (answerHead). The client is wrk's benchmark request or the OpenAI
// Python SDK's; the pod is vLLM's uvicorn.
func BenchmarkHeaders(b *testing.B) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}}
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: "127.0.0.1:10000"}}
	g, snap := bareGateway(b, cfg, upstream.Dialer(nil))
	body := strings.Repeat("x", 1024)
	clients := map[string]string{
		"wrk": "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\nContent-Length: 1024\r\n\r\n",
		"openai-python": "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n" +
			"Accept: application/json\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.54.4\r\nX-Stainless-Lang: python\r\n" +
			"X-Stainless-Package-Version: 1.54.4\r\nX-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n" +
			"X-Stainless-Runtime-Version: 3.12.3\r\nAuthorization: Bearer sk-test\r\nX-Stainless-Async: false\r\nX-Stainless-Retry-Count: 0\r\n" +
			"Content-Length: 1024\r\n\r\n",
	}
	const pod = "HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 1024\r\ncontent-type: application/json\r\n\r\n"
	for name, head := range clients {
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(strings.NewReader(head + body))); err != nil {
			b.Fatal(err)
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 50000}, nil)
		b.Run(name+"/request", func(b *testing.B) {
			var up fasthttp.Request
			var id []byte
			b.ReportAllocs()
			for b.Loop() {
				up.Reset()
				id = requestIDOf(id[:0], &ctx, nil)
				g.buildUpstream(&ctx, &up, id, snap.Pods[0])
			}
		})
		b.Run(name+"/rendered", func(b *testing.B) {
			x := completion{g: g, ctx: &ctx, pod: snap.Pods[0]}
			var out []byte
			b.ReportAllocs()
			for b.Loop() {
				x.reqID = requestIDOf(x.reqID[:0], &ctx, nil)
				out = x.AppendRequest(out[:0])
			}
		})
		var resp fasthttp.Response
		if err := resp.Header.Read(bufio.NewReader(strings.NewReader(pod))); err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/answer", func(b *testing.B) {
			x := completion{g: g}
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				answerHead(&ctx, &resp, &x, "p")
			}
		})
		// With a key's requests and tokens limits: its six rate-limit
		// fields, made at admission.
		b.Run(name+"/answer-keyed", func(b *testing.B) {
			x := completion{g: g, rateHead: keyedDecision(b).AppendHeaders(nil, limits.OpenAI)}
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				answerHead(&ctx, &resp, &x, "p")
			}
		})
	}
}

// keyedDecision is the admission of a request of 100 tokens by a key with
// requests and tokens limits.
func keyedDecision(b *testing.B) limits.Decision {
	keys, err := limits.NewKeys([]limits.APIKey{{Name: "k", SHA256: limits.HashKey("sk-k"), RequestsPerMinute: 600, TokensPerMinute: 100_000}})
	if err != nil {
		b.Fatal(err)
	}
	k, _ := keys.Lookup([]byte("Bearer sk-k"), nil)
	return k.Admit(time.Now(), 100)
}

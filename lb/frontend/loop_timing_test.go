package frontend

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// upstreamRequest builds a request to a pod as the gateway does: the
// client's headers less hop-by-hop ones, its 1 KB body, the pod's address
// in the Host header.
func upstreamRequest() *fasthttp.Request {
	req := new(fasthttp.Request)
	req.Header.DisableNormalizing()
	req.UseHostHeader = true
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI("/v1/chat/completions")
	for _, kv := range [][2]string{
		{"User-Agent", "wrk"}, {"Content-Type", "application/json"}, {"Accept", "*/*"},
		{"X-Forwarded-For", "127.0.0.1"}, {"X-Request-Id", "0f3a9c1e5b7d2a4c-00000001"},
	} {
		req.Header.Add(kv[0], kv[1])
	}
	req.SetBodyRaw(bytes.Repeat([]byte("x"), 1024))
	req.Header.SetHost("127.0.0.1:8000")
	return req
}

func TestRender(t *testing.T) {
	want := "POST /v1/chat/completions HTTP/1.1\r\nUser-Agent: wrk\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n" +
		"Content-Length: 1024\r\nAccept: */*\r\nX-Forwarded-For: 127.0.0.1\r\nX-Request-Id: 0f3a9c1e5b7d2a4c-00000001\r\n\r\n" +
		string(bytes.Repeat([]byte("x"), 1024))
	f := func(name string, build func() *fasthttp.Request) {
		t.Helper()
		var uc upConn
		uc.out = (*FastRequest)(build()).AppendRequest(uc.out[:0])
		if got := string(uc.out); got != want {
			t.Errorf("%s: rendered\n%q\nwant\n%q", name, got, want)
		}
		var fromWrite bytes.Buffer
		if _, err := build().WriteTo(&fromWrite); err != nil {
			t.Fatal(err)
		}
		if got := string(uc.out); got != fromWrite.String() {
			t.Errorf("%s: rendered\n%q\nRequest.Write sends\n%q", name, got, fromWrite.String())
		}
	}
	f("Host header", upstreamRequest)
	f("host of the URI", func() *fasthttp.Request {
		req := upstreamRequest()
		req.UseHostHeader = false
		req.Header.SetHost("")
		req.SetHost("127.0.0.1:8000")
		return req
	})
}

// BenchmarkRender is what a request to a pod costs from its target and
// host to its bytes: the gateway's steps of each attempt and Send's
// rendering, with the pod's address set in the Host header (as the gateway
// does) or as the host of the request's URI.
func BenchmarkRender(b *testing.B) {
	f := func(name string, setHost func(req *fasthttp.Request)) {
		b.Run(name, func(b *testing.B) {
			req := upstreamRequest()
			var uc upConn
			b.ReportAllocs()
			for b.Loop() {
				req.SetRequestURI("/v1/chat/completions")
				setHost(req)
				uc.out = (*FastRequest)(req).AppendRequest(uc.out[:0])
			}
		})
	}
	f("Host header", func(req *fasthttp.Request) { req.Header.SetHost("127.0.0.1:8000") })
	f("host of the URI", func(req *fasthttp.Request) {
		req.UseHostHeader = false
		req.Header.SetHost("")
		req.SetHost("127.0.0.1:8000")
	})
}

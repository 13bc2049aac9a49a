package frontend

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// upstreamRequest builds a request to a pod as the gateway does: the
// client's headers less hop-by-hop ones, its 1 KB body, the pod's address.
func upstreamRequest() *fasthttp.Request {
	req := new(fasthttp.Request)
	req.Header.DisableNormalizing()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	for _, kv := range [][2]string{
		{"User-Agent", "wrk"}, {"Content-Type", "application/json"}, {"Accept", "*/*"},
		{"X-Forwarded-For", "127.0.0.1"}, {"X-Request-Id", "0f3a9c1e5b7d2a4c-00000001"},
	} {
		req.Header.Add(kv[0], kv[1])
	}
	req.SetBodyRaw(bytes.Repeat([]byte("x"), 1024))
	req.SetHost("127.0.0.1:8000")
	return req
}

func TestRender(t *testing.T) {
	var uc upConn
	uc.render(upstreamRequest())
	want := "POST /v1/chat/completions HTTP/1.1\r\nUser-Agent: wrk\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n" +
		"Content-Length: 1024\r\nAccept: */*\r\nX-Forwarded-For: 127.0.0.1\r\nX-Request-Id: 0f3a9c1e5b7d2a4c-00000001\r\n\r\n" +
		string(bytes.Repeat([]byte("x"), 1024))
	if got := string(uc.out); got != want {
		t.Fatalf("rendered\n%q\nwant\n%q", got, want)
	}
	var fromWrite bytes.Buffer
	if _, err := upstreamRequest().WriteTo(&fromWrite); err != nil {
		t.Fatal(err)
	}
	if got := string(uc.out); got != fromWrite.String() {
		t.Fatalf("rendered\n%q\nRequest.Write sends\n%q", got, fromWrite.String())
	}
}

// BenchmarkRender is Send's rendering of a request to a pod.
func BenchmarkRender(b *testing.B) {
	req := upstreamRequest()
	var uc upConn
	b.ReportAllocs()
	for b.Loop() {
		uc.render(req)
	}
}

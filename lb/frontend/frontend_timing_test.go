package frontend_test

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/lb/frontend"
)

// completion1KB is a 1 KB non-streaming chat completion request, and
// answer1KB the answer the benchmark handler gives it.
var (
	completion1KB = `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"` + string(bytes.Repeat([]byte("lorem "), 155)) + `"}]}`
	answer1KB     = []byte(`{"id":"cmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		string(bytes.Repeat([]byte("ipsum "), 150)) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":230,"completion_tokens":64}}`)
)

func answer(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBody(answer1KB)
}

// BenchmarkFrontend: keep-alive clients on loopback POST a 1 KB completion
// and read its 1 KB answer, through each front end with the same handler,
// and on gnet with the handler run on the event loop (Handler.OnLoop, as
// the gateway runs it). The clients share the machine's cores with the
// server; allocs/op counts the whole process, clients included (they
// allocate nothing warm).
func BenchmarkFrontend(b *testing.B) {
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(completion1KB)) + "\r\n\r\n" + completion1KB)
	for _, name := range append(frontEnds, "gnet-loop") {
		b.Run(name, func(b *testing.B) {
			h := frontend.Handler{Serve: answer, Error: writeFrontError}
			fe := name
			if name == "gnet-loop" {
				fe, h.OnLoop = frontend.NameGNet, true
			}
			addr := serve(b, fe, h)
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				var resp fasthttp.Response
				for pb.Next() {
					if _, err := c.Write(req); err != nil {
						b.Error(err)
						return
					}
					if err := resp.Read(br); err != nil || resp.StatusCode() != 200 || len(resp.Body()) != len(answer1KB) {
						b.Errorf("%v: %d, %d bytes", err, resp.StatusCode(), len(resp.Body()))
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

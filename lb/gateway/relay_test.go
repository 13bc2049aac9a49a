package gateway

import (
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
)

// TestFailedStreamTeachesNoSpeed: a streamed request whose pod answers
// with an error at once never had a first token, so it times no prefill:
// the pod's learned speed stays as it was, as for a PD prefill leg that
// failed (TestPDFailedPrefillTeachesNoSpeed).
func TestFailedStreamTeachesNoSpeed(t *testing.T) {
	g, m := inMemoryGateway(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetBodyString(`{"error":{"message":"This model's maximum context length is 16 tokens.","type":"BadRequestError","param":null,"code":400}}`)
	}, nil, config.Pod{Name: "p", Model: "m", Address: "127.0.0.1:10001"})
	x, ctx := startLongStream(t, g, m)
	pod := m.Pods[0]
	speed := pod.Speed.TokensPerSec()
	g.advance(x)
	if ctx.Response.StatusCode() != fasthttp.StatusBadRequest {
		t.Fatalf("status %d (%s), want the pod's 400", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if got := pod.Speed.TokensPerSec(); got != speed {
		t.Fatalf("a stream refused at once taught the pod a prefill speed of %.0f tokens/s (was %.0f)", got, speed)
	}
}

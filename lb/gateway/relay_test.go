package gateway

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/openai"
)

// TestFailedStreamTeachesNoSpeed: a streamed request whose pod answers
// with an error at once never had a first token, so it times no prefill:
// the pod's learned speed stays as it was, as for a PD prefill leg that
// failed (TestPDFailedPrefillTeachesNoSpeed).
func TestFailedStreamTeachesNoSpeed(t *testing.T) {
	ln := fasthttputil.NewInmemoryListener()
	defer ln.Close()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetBodyString(`{"error":{"message":"This model's maximum context length is 16 tokens.","type":"BadRequestError","param":null,"code":400}}`)
	}}
	go func() { _ = srv.Serve(ln) }()
	dial := func(string, time.Duration) (net.Conn, error) { return ln.Dial() }
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: "127.0.0.1:10001"}}
	g, m := testGateway(t, cfg, dial, nil)
	x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
	body := `{"model":"m","prompt":"` + strings.Repeat("a long prompt to prefill ", 400) + `","stream":true}`
	if err := x.req.Parse(openai.KindCompletion, []byte(body)); err != nil {
		t.Fatal(err)
	}
	ctx.Request.SetBodyString(body)
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

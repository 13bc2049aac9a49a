package gateway

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/pd"
	"pdlb/lb/route"
)

// TestPDAnswerLeavesTheCompletion: a PD attempt that answers the client
// finishes its completion, which goes back to its pool; the stages must
// not touch it after that (another request may hold it by then). Both
// of the cascade's kinds that answer inside the attempt are played: a
// pair and the decode pod alone.
func TestPDAnswerLeavesTheCompletion(t *testing.T) {
	ln := fasthttputil.NewInmemoryListener()
	defer ln.Close()
	// The prefill pod answers with KV parameters, the decode pod with the
	// completion.
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if bytes.Contains(ctx.PostBody(), []byte(`"do_remote_decode":true`)) {
			ctx.SetBodyString(`{"kv_transfer_params":{"remote_engine_id":"e"}}`)
			return
		}
		ctx.SetBodyString(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}`)
	}}
	go func() { _ = srv.Serve(ln) }()
	dial := func(string, time.Duration) (net.Conn, error) { return ln.Dial() }
	for _, kind := range []route.PDKind{route.PDPair, route.PDLocal} {
		cfg := config.Default()
		cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
		cfg.Pods = []config.Pod{
			{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
			{Name: "dec", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
		}
		g, m := testGateway(t, cfg, dial, nil)
		opts := route.DefaultPDOptions()
		if kind == route.PDLocal {
			opts.LocalPrefillMaxTokens = 1 << 20
		}
		r, err := route.NewPDRouter(opts)
		if err != nil {
			t.Fatal(err)
		}
		x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
		ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
		x.cascade = r
		g.advance(x)
		if ctx.Response.StatusCode() != 200 || g.inFlight.Load() != 0 {
			t.Fatalf("kind %d: status %d (%s), %d in flight", kind, ctx.Response.StatusCode(), ctx.Response.Body(), g.inFlight.Load())
		}
		if pre := string(ctx.Response.Header.Peek(pd.HeaderPrefillPod)); (pre == "pre") != (kind == route.PDPair) ||
			string(ctx.Response.Header.Peek(pd.HeaderDecodePod)) != "dec" {
			t.Fatalf("kind %d: answered by prefill pod %q, decode pod %q", kind, pre, ctx.Response.Header.Peek(pd.HeaderDecodePod))
		}
		// releaseCompletion left it at stagePick; a stage written after
		// the answer would show.
		if x.stage != stagePick || x.req != nil {
			t.Errorf("kind %d: the completion was touched after it was released: stage %d", kind, x.stage)
		}
	}
}

package gateway

import (
	"errors"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
)

func TestFailureMayRetry(t *testing.T) {
	pod := &pool.Pod{}
	f := func(name string, fl *failure, want bool) {
		t.Helper()
		if got := fl.MayRetry(); got != want {
			t.Errorf("%s: mayRetry = %v, want %v", name, got, want)
		}
	}
	g := &Gateway{}
	refused := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	f("dial refused", g.podFailure(pod, refused, 0), true)
	f("reset after sending", g.podFailure(pod, errors.New("connection reset by peer"), 0), false)
	f("no free connections", g.podFailure(pod, fasthttp.ErrNoFreeConns, 0), true)
	f("no pod to blame", answer(openai.NoHealthyPod([]byte("m"))), false)
	f("client left", fail.ClientLeft, false)
	f("pod answered", &failure{E: openai.UpstreamError("boom"), Pod: pod, Sent: true}, false)
}

func TestWriteFailure(t *testing.T) {
	f := func(fl *failure, status int, retryAfter, pdHeader string) {
		t.Helper()
		var ctx fasthttp.RequestCtx
		writeFailure(&ctx, fl)
		h := &ctx.Response.Header
		if ctx.Response.StatusCode() != status || string(h.Peek("Retry-After")) != retryAfter ||
			string(h.Peek(pd.HeaderPrefillError)) != pdHeader || string(h.ContentType()) != "application/json" {
			t.Errorf("%+v: status %d, Retry-After %q, %s %q; want %d, %q, %q", fl, ctx.Response.StatusCode(),
				h.Peek("Retry-After"), pd.HeaderPrefillError, h.Peek(pd.HeaderPrefillError), status, retryAfter, pdHeader)
		}
		if want := string(fl.E.AppendJSON(nil)); string(ctx.Response.Body()) != want {
			t.Errorf("body %s, want %s", ctx.Response.Body(), want)
		}
	}
	f(answer(openai.ModelNotFound([]byte("m"))), 404, "", "")
	f(&failure{E: openai.Overloaded("busy"), RetryAfter: 3}, 429, "3", "")
	f(&failure{E: &openai.Error{Status: 500, Type: openai.TypeServer, Message: "boom"}, PDHeader: pd.HeaderPrefillError}, 500, "", "true")
}

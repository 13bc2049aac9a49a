package gateway

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
)

// TestPodFailureReason: an attempt is retryable for the reason it got no
// byte of its pod's answer, and only then.
func TestPodFailureReason(t *testing.T) {
	pod := &pool.Pod{}
	f := func(name string, fl *failure, want fail.Reason) {
		t.Helper()
		if fl.Reason != want || fl.MayRetry() != (want != fail.Began) {
			t.Errorf("%s: reason %q, MayRetry %v; want %q", name, fl.Reason, fl.MayRetry(), want)
		}
	}
	g := &Gateway{}
	refused := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	f("dial refused", g.podFailure(pod, refused, 0), fail.Refused)
	f("no free connections", g.podFailure(pod, fasthttp.ErrNoFreeConns, 0), fail.Refused)
	f("closed before the answer", g.podFailure(pod, fasthttp.ErrConnectionClosed, 0), fail.Reset)
	f("no byte in time", g.podFailure(pod, fasthttp.ErrTimeout, time.Second), fail.Timeout)
	f("closed mid-answer", g.podFailure(pod, io.ErrUnexpectedEOF, 0), fail.Began)
	f("stalled mid-answer", g.podFailure(pod, frontend.ErrAnswerStalled, time.Second), fail.Began)
	f("read error mid-answer", g.podFailure(pod, errors.New("connection reset by peer"), 0), fail.Began)
	f("answer too large", g.podFailure(pod, fasthttp.ErrBodyTooLarge, 0), fail.Began)
	f("pod answered", &failure{E: openai.UpstreamError("boom"), Pod: pod}, fail.Began)
	if answer(openai.NoHealthyPod([]byte("m"))).MayRetry() || fail.ClientLeft.MayRetry() {
		t.Error("a failure with no pod to blame may be retried")
	}
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

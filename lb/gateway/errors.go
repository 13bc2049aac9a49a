package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// failure is how the gateway ends a request with an error of its own: the
// client's status and OpenAI error body, the headers that go with them,
// and what the retry decision needs. Every error the request path answers
// with is one, and writeFailure is the one place that writes it.
type failure struct {
	// e is the status and body the client gets.
	e *openai.Error
	// retryAfter is the Retry-After header in seconds; 0 sends none.
	retryAfter int
	// pdHeader is the x-error-pd-* header naming the PD leg that failed
	// ("" for none), which tells a gateway's PD failure from a 5xx the
	// decode pod sent itself. A stream already under way cannot carry it.
	pdHeader string
	// pod is the pod whose attempt failed (nil: no pod is to blame), and
	// sent whether it may have received the request.
	pod  *pool.Pod
	sent bool
}

func (f *failure) Error() string { return f.e.Message }

// mayRetry reports whether another pod may take the request after f: a
// pod failed it without receiving it, so no pod has started work on it.
// Whether retries are left is the caller's budget.
func (f *failure) mayRetry() bool { return f.pod != nil && !f.sent }

// answer is a failure that is only the client's answer: the request's own
// fault, or the gateway's, with no pod to blame.
func answer(e *openai.Error) *failure { return &failure{e: e} }

// writeFailure answers ctx's client with f.
func writeFailure(ctx *fasthttp.RequestCtx, f *failure) {
	if f.retryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	if f.pdHeader != "" {
		ctx.Response.Header.Set(f.pdHeader, "true")
	}
	ctx.SetStatusCode(f.e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(f.e.AppendJSON(nil))
}

// statusClientClosed is counted for a client that went away mid-stream
// (nginx's 499).
const statusClientClosed = 499

// errClientLeft ends a request whose client closed its connection while a
// worker served it; it is counted, never written.
var errClientLeft = answer(&openai.Error{Status: statusClientClosed, Type: openai.TypeServer, Message: "The client closed its connection."})

// errShuttingDown ends the streams still running when a shutdown's grace
// period is over.
var errShuttingDown = errors.New("lb: the gateway is shutting down")

// podFailure is the failure of an attempt on pod that ended in err, an
// I/O error of the call; within is the bound that passed, should err be a
// timeout.
func (g *Gateway) podFailure(pod *pool.Pod, err error, within time.Duration) *failure {
	return &failure{e: g.upstreamError(err, within), pod: pod, sent: !upstream.NotSent(err)}
}

// upstreamError is the client's error for a call to a pod that failed
// with err; within is the bound that passed, should err be a timeout.
func (g *Gateway) upstreamError(err error, within time.Duration) *openai.Error {
	if errors.Is(err, errShuttingDown) {
		return &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
			Message: "The gateway is shutting down; retry the request."}
	}
	if pool.IsTimeout(err) {
		return openai.UpstreamTimeout(within)
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		return openai.UpstreamError(fmt.Sprintf("its answer is over upstream.max_response_bytes (%d bytes)", g.cfg.Upstream.MaxResponseBytes))
	}
	if errors.Is(err, fasthttp.ErrNoFreeConns) {
		return &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
			Message: fmt.Sprintf("Every connection the gateway may open to the inference server is busy (upstream.max_conns_per_pod: %d); retry the request.", g.cfg.Upstream.MaxConnsPerPod)}
	}
	if errors.Is(err, limits.ErrOutOfFDs) {
		return &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
			Message: fmt.Sprintf("The gateway is at its open-files limit (%d) and cannot open a connection to the inference server; retry the request.", g.fds.Limit())}
	}
	return openai.UpstreamError(err.Error())
}

// isFault reports whether a pod's answer with status is its failure: a 5xx
// but 503, which SGLang answers when its waiting queue is full
// (--max-queued-requests), and engines while they shut down. That is load
// shed at admission, and counting it would eject a fleet pod by pod under
// a burst.
func isFault(status int) bool {
	return status >= 500 && status != fasthttp.StatusServiceUnavailable
}

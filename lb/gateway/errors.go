package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
)

// failure is the request path's one error type (lb/fail), by the name
// the gateway's code uses; writeFailure is the one place that writes it.
type failure = fail.Failure

// answer is a failure that is only the client's answer: the request's own
// fault, or the gateway's, with no pod to blame.
func answer(e *openai.Error) *failure { return &failure{E: e} }

// writeFailure answers ctx's client with f.
func writeFailure(ctx *fasthttp.RequestCtx, f *failure) {
	if f.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	if f.PDHeader != "" {
		ctx.Response.Header.Set(f.PDHeader, "true")
	}
	if f.E.Status == fasthttp.StatusUnauthorized {
		// A 401 must name the scheme it wants (RFC 9110 11.6.1); the
		// gateway's are its API keys' alone.
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="pdlb"`)
	}
	ctx.SetStatusCode(f.E.Status)
	ctx.SetContentType("application/json")
	if openai.MessagesPath(ctx.Path()) {
		ctx.SetBody(openai.AppendMessagesError(nil, f.E))
		return
	}
	ctx.SetBody(f.E.AppendJSON(nil))
}

// errShuttingDown ends the streams still running when a shutdown's grace
// period is over.
var errShuttingDown = errors.New("lb: the gateway is shutting down")

// shuttingDown answers a request the shutdown's grace ended before it
// had its answer: neither its pod's failure nor its model's, so it is not
// retried, nor moved to a fallback model (fallBackFrom).
var shuttingDown = answer(&openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
	Message: "The gateway is shutting down; retry the request."})

// podFailure is the failure of an attempt on pod that ended in err, an
// I/O error of the call; within is the bound that passed, should err be a
// timeout.
func (g *Gateway) podFailure(pod *pool.Pod, err error, within time.Duration) *failure {
	if errors.Is(err, frontend.ErrAborted) {
		// No pod's: the shutdown's grace ended the call (a PD leg's,
		// whose failure the exchange may mark as the leg's).
		return &failure{E: shuttingDown.E}
	}
	return &failure{E: g.upstreamError(err, within), Pod: pod, Reason: fail.ReasonOf(err)}
}

// podUnavailable is the failure of an attempt pod answered 503.
func podUnavailable(pod *pool.Pod) *failure {
	return &failure{E: openai.Overloaded("pod " + pod.Config.Name + " answered 503"), Pod: pod, Reason: fail.Unavailable}
}

// upstreamError is the client's error for a call to a pod that failed
// with err; within is the bound that passed, should err be a timeout.
func (g *Gateway) upstreamError(err error, within time.Duration) *openai.Error {
	if errors.Is(err, errShuttingDown) {
		return shuttingDown.E
	}
	if pool.IsTimeout(err) {
		return openai.UpstreamTimeout(within)
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		return openai.UpstreamError(fmt.Sprintf("its answer is over upstream.max_response_bytes (%d bytes)", g.cfg.Upstream.MaxResponseBytes))
	}
	if frontend.HeadTooLarge(err) {
		// fasthttp's message quotes the head, which is the pod's business.
		return openai.UpstreamError(fmt.Sprintf("its answer's header is over max_header_bytes (%d bytes)", g.cfg.MaxHeaderBytes))
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

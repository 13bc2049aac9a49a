// Package fail is the request path's one error type: how the gateway ends
// a request with an error of its own, shared by the gateway (lb/gateway)
// and the prefill/decode exchange (lb/pd).
package fail

import (
	"errors"

	"github.com/valyala/fasthttp"

	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// Failure is the client's status and OpenAI error body, the headers that
// go with them, and what the retry decision needs. Every error the request
// path answers with is one.
type Failure struct {
	// E is the status and body the client gets.
	E *openai.Error
	// RetryAfter is the Retry-After header in seconds; 0 sends none.
	RetryAfter int
	// PDHeader is the x-error-pd-* header naming the PD leg that failed
	// ("" for none), which tells a gateway's PD failure from a 5xx the
	// decode pod sent itself. A stream already under way cannot carry it.
	PDHeader string
	// Pod is the pod whose attempt failed (nil: no pod is to blame), and
	// Reason how, when nothing of its answer reached the gateway: the
	// request may go to another pod. Began (empty) says its answer had begun.
	Pod    *pool.Pod
	Reason Reason
}

// Reason is how a pod failed an attempt before the first byte of its
// answer: a completion has no effect until it answers, so another pod may
// take the request. It names the series of pdlb_upstream_retries_total.
type Reason string

const (
	// Began: bytes of the pod's answer came, so the attempt is not retried.
	Began Reason = ""
	// Refused: the connection was refused or never made; the pod never
	// received the request.
	Refused Reason = "refused"
	// Reset: the pod closed or reset the connection before any byte of
	// its answer, as the request was written or after.
	Reset Reason = "reset"
	// Timeout: no byte of the answer came within the response timeout.
	Timeout Reason = "timeout"
	// Hung: no byte of the answer came by the first-byte deadline drawn
	// from the predicted time to first token (upstream.first_byte).
	Hung Reason = "hung"
	// Down: no byte of the answer came before health checks found the pod
	// dead (upstream.ErrPodDown).
	Down Reason = "down"
	// Unavailable: the pod answered 503 (load shed, or shutting down),
	// which the gateway holds and has not relayed.
	Unavailable Reason = "503"
	// NotFound: the pod answered 404 for a stored response it does not
	// hold, and the request sought it on the next pod: no retry, so no
	// series of pdlb_upstream_retries_total; the access log lists it.
	NotFound Reason = "404"
	// Fault: the pod answered a 5xx but 503 during the search for a
	// stored response, which went on to the next pod as after NotFound;
	// the access log lists it.
	Fault Reason = "5xx"
)

func (f *Failure) Error() string { return f.E.Message }

// MayRetry reports whether another pod may take the request after f: a
// pod failed it before any byte of its answer came back. Whether the
// reason is one to retry, and whether retries are left, is the caller's.
func (f *Failure) MayRetry() bool { return f.Pod != nil && f.Reason != Began }

// ReasonOf is how err, an attempt's I/O error, failed before the first
// byte of the pod's answer, or Began when bytes of it came (or the failure
// is the gateway's). Both transports end an exchange without a byte with
// fasthttp.ErrConnectionClosed (closed or reset) or fasthttp.ErrTimeout,
// the event loop's also with upstream.ErrPodDown, the pods' clients also
// with the request's failed write (upstream.WriteFailed);
// their errors once bytes came are others (io.ErrUnexpectedEOF,
// frontend.ErrAnswerStalled, a body read's own error).
func ReasonOf(err error) Reason {
	switch {
	case errors.Is(err, upstream.ErrPodDown):
		return Down
	case upstream.NotSent(err):
		return Refused
	case errors.Is(err, fasthttp.ErrConnectionClosed), upstream.WriteFailed(err):
		return Reset
	case errors.Is(err, fasthttp.ErrTimeout):
		return Timeout
	}
	return Began
}

// StatusClientClosed is counted for a client that went away mid-stream
// (nginx's 499).
const StatusClientClosed = 499

// ClientLeft ends a request whose client closed its connection while a
// worker served it; it is counted, never written.
var ClientLeft = &Failure{E: &openai.Error{Status: StatusClientClosed, Type: openai.TypeServer, Message: "The client closed its connection."}}

// IsFault reports whether a pod's answer with status is its failure: a 5xx
// but 503, which SGLang answers when its waiting queue is full
// (--max-queued-requests), and engines while they shut down. That is load
// shed at admission, and counting it would eject a fleet pod by pod under
// a burst.
func IsFault(status int) bool {
	return status >= 500 && status != fasthttp.StatusServiceUnavailable
}

// Package fail is the request path's one error type: how the gateway ends
// a request with an error of its own, shared by the gateway (lb/gateway)
// and the prefill/decode exchange (lb/pd).
package fail

import (
	"github.com/valyala/fasthttp"

	"pdlb/lb/openai"
	"pdlb/lb/pool"
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
	// Sent whether it may have received the request.
	Pod  *pool.Pod
	Sent bool
}

func (f *Failure) Error() string { return f.E.Message }

// MayRetry reports whether another pod may take the request after f: a
// pod failed it without receiving it, so no pod has started work on it.
// Whether retries are left is the caller's budget.
func (f *Failure) MayRetry() bool { return f.Pod != nil && !f.Sent }

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

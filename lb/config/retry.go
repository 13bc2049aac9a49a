package config

import (
	"slices"
	"strconv"
	"time"
)

// Retry says which failed attempts go to another pod (up to
// upstream.retries), how many retries the fleet may carry at once, and
// when a pod that sends nothing counts as hung. Its fields sit in the
// upstream section.
type Retry struct {
	// On lists the failures before the first byte of a pod's answer that
	// are retried on another pod: "refused" (the connection was refused or
	// never made), "reset" (closed or reset after the request was
	// written), "timeout" (no byte within response_timeout, by the
	// first-byte deadline, or before health checks found the pod dead), "503" (the pod shed the request); "none" alone
	// turns retries off (default [refused, reset, timeout]). A completion
	// has no effect on a pod until it answers, so what got no byte back is
	// safe to send again; a 503 is an engine shedding load (SGLang's full
	// queue, a pod draining), which a client told Retry-After should see
	// unless the operator asks otherwise. Nothing is retried once a byte
	// reached the client.
	On []string `yaml:"retry_on"`
	// Budget bounds the retries in flight.
	Budget RetryBudget `yaml:"retry_budget"`
	// FirstByte is the hedging deadline of a pod's first answer byte.
	FirstByte FirstByte `yaml:"first_byte"`
}

// RetryBudget is Envoy's retry budget: the requests retrying at once are
// at most Percent of the requests in flight, or MinRetries, whichever is
// more, so a fleet-wide failure does not double the load on the pods.
// Requests moved off a pod that health checks found dead while they
// waited for its first byte count in it but are never refused. A retry
// over the budget waits up to 250 ms for a place freed by a retry that
// worked (a pod's answer began), so one pod's burst of failures moves on
// while the other pods answer, or until its failed pod is found out (a
// health check, or a refused connection), when it goes on over the budget;
// under a fleet-wide failure of pods that still answer their checks none
// of these comes and it is refused.
type RetryBudget struct {
	// Percent of the requests in flight that may be retrying (default 20).
	Percent float64 `yaml:"percent"`
	// MinRetries may retry whatever the share (default 3), so a gateway
	// with few requests in flight can still retry one.
	MinRetries int `yaml:"min_retries"`
}

// FirstByte is the deadline of a pod's first answer byte: Factor times
// the request's predicted time to it, plus Floor, capped by the response
// timeout. Past it the attempt is given up (its connection is closed, so
// the engine aborts the request), counted against the pod as a failure,
// and retried as a "timeout", when another pod is available then and the
// retry budget has room; else it waits on for the pod's answer, up to the
// response timeout. The predicted time is the time to first
// token for a stream (whose first byte is its first event's: engines send
// its head before the prefill) and to the whole answer otherwise, which
// needs the request's max_tokens.
type FirstByte struct {
	// Factor is k (default 0: no first-byte deadline).
	Factor float64 `yaml:"factor"`
	// Floor is added to k × the prediction (default 2s): a prediction is
	// off by the pod's queue at the moment it is made.
	Floor time.Duration `yaml:"floor"`
}

// Retry defaults.
const (
	DefaultRetryBudgetPercent = 20
	DefaultRetryMinRetries    = 3
	DefaultFirstByteFloor     = 2 * time.Second
)

// Names of upstream.retry_on.
const (
	RetryOnRefused = "refused"
	RetryOnReset   = "reset"
	RetryOnTimeout = "timeout"
	RetryOn503     = "503"
	RetryOnNone    = "none"
)

// DefaultRetry is the upstream section's retry defaults.
func DefaultRetry() Retry {
	return Retry{
		On:        []string{RetryOnRefused, RetryOnReset, RetryOnTimeout},
		Budget:    RetryBudget{Percent: DefaultRetryBudgetPercent, MinRetries: DefaultRetryMinRetries},
		FirstByte: FirstByte{Floor: DefaultFirstByteFloor},
	}
}

// RetriesOn reports whether retry_on lists name.
func (r *Retry) RetriesOn(name string) bool { return slices.Contains(r.On, name) }

// Validate checks the retry fields.
func (r *Retry) Validate() error {
	for i, on := range r.On {
		switch on {
		case RetryOnRefused, RetryOnReset, RetryOnTimeout, RetryOn503:
		case RetryOnNone:
			if len(r.On) > 1 {
				return invalid("upstream.retry_on", r.On, `lists "none" with other reasons`)
			}
		default:
			return invalid("upstream.retry_on["+strconv.Itoa(i)+"]", on, "is not refused, reset, timeout, 503 or none")
		}
	}
	if !(r.Budget.Percent > 0 && r.Budget.Percent <= 100) {
		return invalid("upstream.retry_budget.percent", r.Budget.Percent, "must be in (0, 100]")
	}
	if r.Budget.MinRetries < 0 {
		return invalid("upstream.retry_budget.min_retries", r.Budget.MinRetries, "must not be negative")
	}
	if !(r.FirstByte.Factor >= 0) {
		return invalid("upstream.first_byte.factor", r.FirstByte.Factor, "must not be negative")
	}
	if r.FirstByte.Floor < 0 {
		return invalid("upstream.first_byte.floor", r.FirstByte.Floor, "must not be negative")
	}
	if r.FirstByte.Factor > 0 && !r.RetriesOn(RetryOnTimeout) {
		return invalid("upstream.first_byte.factor", r.FirstByte.Factor, `needs "timeout" in upstream.retry_on: a hung pod's request goes to another pod as a timeout`)
	}
	return nil
}

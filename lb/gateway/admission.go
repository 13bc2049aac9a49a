package gateway

import (
	"strconv"
	"time"

	"pdlb/lb/admit"
	"pdlb/lb/fail"
	"pdlb/lb/openai"
)

// deferPoll is how often a deferred request looks whether it is the oldest
// of its model's in the queue and its prediction has cleared. The queue is
// bounded, so the polling is too.
const deferPoll = 5 * time.Millisecond

// admitNow asks the admission controller about x once, with the
// predictions ttft and tpot made at since: wait reports that x was deferred
// (queued: awaitAdmission waits for it), else f is nil to admit x or the
// rejection to answer. A decision on a fallback model replaces the
// rejection x had on the model before it (x.rejected). A deferred request
// waits in its model's lane: one model's overload delays no other's.
func (g *Gateway) admitNow(x *completion, since, ttft, tpot float64) (wait bool, f *failure) {
	v := g.admit.Judge(x.class, x.m.Name, x.ticket.ID, since, ttft, tpot)
	x.rejected = v.Action == admit.Reject
	switch v.Action {
	case admit.Admit:
		return false, nil
	case admit.Reject:
		return false, g.reject(x, ttft, tpot, 0, v.RetryAfter)
	}
	return true, nil
}

// admitWait is a deferral: when it began, and the predictions it was
// deferred on.
type admitWait struct{ since, ttft, tpot float64 }

// awaitAdmission waits for a deferred x, placed by the router, until a
// prediction clears (nil), its class's max wait runs out or its wait alone
// passes its TTFT target, which no prediction can then meet (a 429), or
// the shutdown's grace does. predict returns the predictions for the current
// placement from the pods' live queues; replace, if set, places x anew
// once it is the oldest of its model's in the queue (a combined pod may
// be picked again; a PD pair keeps its pods, whose queues drain). repick
// says the fleet changed since x was placed: x is to pick again on it,
// and wait on in its place.
func (g *Gateway) awaitAdmission(x *completion, w admitWait, predict func() (ttft, tpot float64), replace func()) (f *failure, repick bool) {
	since, ttft, tpot := w.since, w.ttft, w.tpot
	c := g.admit.Config().Classes[x.class]
	maxWait := min(c.MaxWait, c.TTFTSLO)
	for {
		time.Sleep(deferPoll)
		if f := g.interrupted(x); f != nil {
			// Its slot goes to a request someone still waits for.
			g.admit.Withdraw(x.ticket.ID)
			return f, false
		}
		now := g.clock()
		if now-since > maxWait {
			g.admit.Withdraw(x.ticket.ID)
			x.rejected = true
			return g.reject(x, ttft, tpot, now-since, 1), false
		}
		if !g.admit.First(x.ticket.ID) {
			continue
		}
		if g.pool.Load() != x.snap {
			return nil, true
		}
		if replace != nil {
			replace()
		}
		ttft, tpot = predict()
		if g.admit.Retry(x.ticket.ID, now, ttft, tpot) {
			return nil, false
		}
	}
}

// interrupted is why x, waiting on a worker (for admission, for a place
// in the retry budget), is to wait no more: its client left, or the
// shutdown's grace is over; nil for neither.
func (g *Gateway) interrupted(x *completion) *failure {
	switch {
	case x.clientLeft():
		return fail.ClientLeft
	case g.aborting.Load():
		return shuttingDown
	}
	return nil
}

// reject is the 429 of a request admission sheds after it waited (s) in
// the deferral queue, saying which prediction, its wait counted, missed
// its class's target, or that its wait ran out behind earlier requests
// for its model.
func (g *Gateway) reject(x *completion, ttft, tpot, waited float64, retryAfter int) *failure {
	c := g.admit.Config().Classes[x.class]
	secs := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "s" }
	class := " target of class " + x.class.String()
	var why string
	switch {
	case waited+ttft > c.TTFTSLO:
		why = "predicted time to first token " + secs(waited+ttft)
		if waited > 0 {
			why += " (" + secs(waited) + " of it waiting for admission)"
		}
		why += " exceeds the " + strconv.FormatFloat(c.TTFTSLO, 'f', -1, 64) + "s" + class
	case c.TPOTSLO > 0 && tpot > c.TPOTSLO:
		why = "predicted time per output token " + strconv.FormatFloat(tpot*1000, 'f', 1, 64) +
			" ms exceeds the " + strconv.FormatFloat(c.TPOTSLO*1000, 'f', -1, 64) + " ms" + class
	default:
		why = "it waited " + secs(waited) + " for admission, the max wait of class " + x.class.String() +
			", behind earlier requests for model " + x.m.Name
	}
	return &failure{E: openai.Overloaded(why), RetryAfter: retryAfter}
}

// clock is the admission controller's time: seconds since the gateway
// started.
func (g *Gateway) clock() float64 { return time.Since(g.epoch).Seconds() }

// classOf reads the priority class of a request; an unknown one is a 400
// naming the header.
func classOf(v []byte) (admit.Class, *openai.Error) {
	if len(v) == 0 {
		return admit.Interactive, nil
	}
	c, err := admit.ParseClass(string(v))
	if err != nil {
		return 0, &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: headerPriority,
			Code: openai.CodeInvalidValue, Message: "header " + headerPriority + ": " + err.Error()}
	}
	return c, nil
}

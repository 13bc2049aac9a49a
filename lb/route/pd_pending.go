package route

import "sync/atomic"

// PendingDecode counts the requests routed to one decode pod whose decode
// leg has not yet seen response headers: the gap between a pick and the
// moment the pod's own running count (scraped once a second) can show the
// request. Without it, every pick within one scrape sees the same numbers
// and lands on the same pod. The cascade reads it through
// PDCandidate.Pending (fast path, scoring, cold start).
//
// The pool keeps one per decode pod for the pod's lifetime; the zero value
// is ready. All methods are safe for concurrent use.
type PendingDecode struct{ n atomic.Int32 }

// Pick records one more pending decode on the pod. The caller calls it on
// the decode pod of a decision at once, before any I/O, so the next
// decision sees it, and keeps the ticket until the decode leg's headers
// arrive or the exchange fails, whichever is first.
func (p *PendingDecode) Pick() PendingTicket {
	p.n.Add(1)
	return PendingTicket{p}
}

// Load returns the pending count.
func (p *PendingDecode) Load() int {
	if p == nil {
		return 0
	}
	return int(p.n.Load())
}

// PendingTicket undoes one Pick. Its zero value is a no-op.
type PendingTicket struct{ p *PendingDecode }

// Done takes the pick back: call it when the decode leg's response headers
// arrive, or when the exchange ends without them (prefill failed, client
// gone, watchdog). Only the first Done of a ticket counts, so the error
// paths may call it again without driving the count below the truth. A
// ticket is owned by one request's goroutine.
func (t *PendingTicket) Done() {
	if t.p != nil {
		t.p.n.Add(-1)
		t.p = nil
	}
}

package pd

import (
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/fail"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// prefillGrace is how long a concurrent decode leg's answer waits for
// the prefill leg's outcome, unless the engine's server would wait for
// it (engines.Protocol.AwaitsPrefill) and the answer is a stream's 200.
const prefillGrace = 250 * time.Millisecond

// runConcurrent sends both legs at once and waits for the one that
// settles the request: the decode leg's headers (its answer; a stream's
// first event), or a failed prefill leg, or the watchdog.
func (c *Call) runConcurrent(up *fasthttp.Request) *fail.Failure {
	l := AcquireLink()
	c.link = l
	l.Dec.Store(c.Dec)
	// The prefill leg's goroutine takes the prefill pod off the request:
	// the relay must not account for it again.
	uncached, ticket := c.host.HandOver()
	// Each leg owns a copy of its body: the request may go back to its
	// pool while a leg still runs.
	up.SetBody(c.preBody)
	l.Hold()
	l.PreCut = make(chan struct{})
	go l.prefill(concurrentPrefill{
		fleet: c.fleet, pre: c.Pre, seqs: c.seqs, up: up, timeout: c.Opts.PrefillRequestTimeout, uncached: uncached, ticket: ticket,
		proto: c.proto, ex: c.ex, metrics: c.Metrics, limit: c.watchdogLimit(), start: c.legsStart,
		gone: c.gone, drop: l.PreCut,
	})
	resp := c.sendConcurrentDecode()
	var watchdog <-chan time.Time
	preDone := l.PreDone
	for {
		select {
		case f := <-preDone:
			preDone = nil
			if f != nil {
				c.abandonDecode(resp)
				return c.prefillFailed(f)
			}
			if limit := c.watchdogLimit(); limit > 0 {
				t := time.NewTimer(time.Until(c.firstBy(limit)))
				defer t.Stop()
				watchdog = t.C
			}
		case err := <-l.DecDone:
			if err == nil && preDone != nil {
				// A decode leg whose KV never came fails too, with an
				// error status or, past a stream's head, an error event:
				// when the prefill leg fails within moments, it names the
				// cause. A 200 waits for the prefill leg's outcome itself
				// where the engine's server relays nothing before it; an
				// error status never does: its pod takes no KV, so a
				// prefill leg that waits for the pickup would not end. The
				// prefill leg's own timeout, or the client's leaving,
				// ends the wait.
				var grace <-chan time.Time
				if resp.StatusCode() != fasthttp.StatusOK || !c.proto.AwaitsPrefill() {
					grace = time.After(prefillGrace)
				}
				select {
				case f := <-preDone:
					preDone = nil
					if f != nil {
						c.dropDecode(resp, true)
						return c.prefillFailed(f)
					}
				case <-grace:
					if resp.StatusCode() != fasthttp.StatusOK {
						c.abandonPrefill()
					}
				}
			}
			if err == nil {
				c.Ticket.Done()
				l.SetDecConn(upstream.ConnOf(resp))
				if l.PreErr.Load() != nil {
					// The prefill leg failed before the connection was
					// known: cut it now, the relay reports the failure.
					l.WithDecConn(func(conn *upstream.Conn) { _ = conn.Close() })
				}
				c.respond(resp, l.First[:l.FirstN])
				return nil
			}
			fasthttp.ReleaseResponse(resp)
			c.Dec.Release(c.seqs)
			if c.moveDecode(c.Dec, err) {
				l.Dec.Store(c.Dec)
				resp = c.sendConcurrentDecode()
				continue
			}
			// The prefill leg waits for a pickup that will not come.
			c.abandonPrefill()
			return c.dropPair(nil, c.decodeFailure(err))
		case <-watchdog:
			c.abandonDecode(resp)
			c.watched = true
			return c.dropPair(nil, c.decodeFailure(fasthttp.ErrTimeout))
		case <-c.gone:
			// Both pods drop the request where the protocol can say so.
			c.abandonDecode(resp)
			Abort(c.proto, &c.ex, c.Pre)
			Abort(c.proto, &c.ex, c.Dec)
			return c.dropPair(nil, fail.ClientLeft)
		}
	}
}

// sendConcurrentDecode starts the decode leg on the pair's decode pod in
// its own goroutine and returns the response it fills.
func (c *Call) sendConcurrentDecode() *fasthttp.Response {
	l := c.link
	up, resp := c.host.Upstream(c.Dec), fasthttp.AcquireResponse()
	up.SetBody(c.decBody)
	// Streamed even for a whole answer: the watchdog times its reads.
	resp.StreamBody = true
	c.Dec.Acquire(c.seqs)
	l.DecState.Store(DecPending)
	l.Hold()
	l.Cut = make(chan struct{})
	go l.decode(c.fleet, l.Cut, c.Dec, c.seqs, up, resp, c.decodeHeadersBy(), c.firstOf(l.First[:]))
	return resp
}

// prefillFailed ends the pair whose prefill leg failed with f (a
// concurrent decode leg given up already): the prefill pod is ruled out
// for the retry when f allows one.
func (c *Call) prefillFailed(f *fail.Failure) *fail.Failure {
	if f.MayRetry() {
		c.host.Tried(c.Pre)
	}
	return c.dropPair(nil, f)
}

// abandonDecode gives up a concurrent decode leg the request no longer
// waits for: its goroutine cleans up when it returns, or, if it already
// delivered, the caller's goroutine does here.
func (c *Call) abandonDecode(resp *fasthttp.Response) {
	l := c.link
	if l.DecState.CompareAndSwap(DecPending, DecAbandoned) {
		close(l.Cut)
		return
	}
	c.dropDecode(resp, <-l.DecDone == nil)
}

// dropDecode releases a concurrent decode leg's response that was
// delivered to the request, which will not relay it; answered: its head
// came, and its stream is closed.
func (c *Call) dropDecode(resp *fasthttp.Response, answered bool) {
	if answered {
		upstream.CloseStream(resp, ErrAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	c.Dec.Release(c.seqs)
}

// abandonPrefill gives up the prefill leg whose KV no decode leg will
// take: its pod drops the request (the abort call, else the closed
// connection) at once, rather than hold it and the pod's counts until
// PrefillRequestTimeout, and the leg counts nothing against the pod
// (prefill). Only the request's goroutine closes PreCut: a second call
// does nothing.
func (c *Call) abandonPrefill() {
	l := c.link
	select {
	case <-l.PreCut:
		return
	default:
	}
	close(l.PreCut)
	if l.PrefillEnd.Load() == 0 && l.PreErr.Load() == nil {
		// Still running: a leg that ended has nothing left to abort.
		Abort(c.proto, &c.ex, c.Pre)
	}
}

// concurrentPrefill is what a concurrent prefill leg's goroutine needs;
// it touches nothing of the request itself.
type concurrentPrefill struct {
	fleet    Fleet
	pre      *pool.Pod
	seqs     int // the request's, counted on pre
	up       *fasthttp.Request
	timeout  time.Duration
	uncached int64
	ticket   ledger.Ticket // a copy: it releases this attempt's charge only
	proto    engines.Protocol
	ex       engines.Exchange
	metrics  *Metrics
	limit    time.Duration
	start    time.Time
	gone     <-chan struct{} // the client's, for Send
	drop     <-chan struct{} // closed when the request gives the leg up
}

// prefill runs the prefill leg of a concurrent exchange and reports it on
// l.PreDone: nil for success, else the client's error, after aborting the
// decode leg. A leg the request gave up (drop) reports nothing.
func (l *Link) prefill(c concurrentPrefill) {
	defer l.Release()
	resp := fasthttp.AcquireResponse()
	_, err := c.fleet.Send(c.gone, c.drop, c.pre, c.up, resp, time.Now().Add(c.timeout), nil)
	fasthttp.ReleaseRequest(c.up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		l.Buf = append(l.Buf[:0], resp.Body()...)
	}
	fasthttp.ReleaseResponse(resp)
	end := time.Now()
	if err == nil {
		// Only an answer times the prefill, as in runSequential.
		c.metrics.Prefill.Update(end.Sub(c.start).Seconds())
	}
	c.pre.AddQueuedPrefill(-c.uncached)
	c.pre.Release(c.seqs)
	c.fleet.ReleasePrefill(c.ticket)
	select {
	case <-c.drop:
		// Given up by the request, which no longer waits for it: the cut
		// is not the pod's failure, and the decode leg, if one is
		// relayed, is not this leg's to cut. A leg that failed before the
		// cut (a refused dial) failed the pod all the same, and counts.
		if err != nil && err != upstream.ErrCut {
			c.fleet.CallFailed(c.pre, err)
		}
		return
	default:
	}
	f := prefillFailure(c.fleet, c.pre, status, l.Buf, err, c.timeout)
	if f == nil {
		l.PrefillEnd.Store(end.UnixNano())
		if c.limit > 0 {
			// Tighten the deadline of a decode answer that is already being
			// relayed (a race with the relay's own setting only leaves the
			// looser bound).
			l.WithDecConn(func(conn *upstream.Conn) {
				if !l.Started.Load() {
					_ = conn.SetReadDeadline(end.Add(c.limit))
				}
			})
		}
	} else {
		l.PreErr.Store(f)
		Abort(c.proto, &c.ex, l.Dec.Load())
		l.WithDecConn(func(conn *upstream.Conn) { _ = conn.Close() })
	}
	l.PreDone <- f
}

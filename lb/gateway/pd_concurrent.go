package gateway

import (
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/frontend"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// runConcurrent sends both legs at once and waits for the one that
// settles the request: the decode leg's headers (its answer), or a failed
// prefill leg, or the watchdog.
func (g *Gateway) runConcurrent(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, up *fasthttp.Request) *failure {
	p := x.pd
	l := pd.AcquireLink[failure]()
	p.link = l
	// The prefill leg's goroutine takes the prefill pod off the request:
	// the relay must not account for it again.
	x.firstSeen = true
	// Each leg owns a copy of its body: the request may go back to its
	// pool while a leg still runs.
	up.SetBody(p.preBody)
	l.Hold()
	go g.concurrentPrefill(l, concurrentPrefill{
		pre: p.pre, dec: p.dec, up: up, timeout: p.opts.PrefillRequestTimeout, uncached: x.uncached, ticket: x.ticket,
		proto: p.proto, ex: p.ex, metrics: p.metrics, limit: g.watchdogLimit(x), start: p.legsStart,
		gone: frontend.ClientGone(ctx),
	})
	resp := g.sendConcurrentDecode(ctx, x, l)
	var watchdog <-chan time.Time
	preDone := l.PreDone
	for {
		select {
		case f := <-preDone:
			preDone = nil
			if f != nil {
				g.abandonDecode(l, p.dec, resp)
				if f.mayRetry() {
					x.tried = append(x.tried, p.pre.ID)
				}
				return g.dropPair(x, nil, f)
			}
			if limit := g.watchdogLimit(x); limit > 0 {
				t := time.NewTimer(time.Until(p.firstBy(limit)))
				defer t.Stop()
				watchdog = t.C
			}
		case err := <-l.DecDone:
			if err == nil && resp.StatusCode() != fasthttp.StatusOK && preDone != nil {
				// A decode leg whose KV never came fails too: when the
				// prefill leg fails within moments, it names the cause.
				select {
				case f := <-preDone:
					preDone = nil
					if f != nil {
						upstream.CloseStream(resp, pd.ErrAbandoned)
						fasthttp.ReleaseResponse(resp)
						p.dec.Release()
						if f.mayRetry() {
							x.tried = append(x.tried, p.pre.ID)
						}
						return g.dropPair(x, nil, f)
					}
				case <-time.After(prefillGrace):
				}
			}
			if err == nil {
				p.ticket.Done()
				l.SetDecConn(upstream.ConnOf(resp))
				if l.PreErr.Load() != nil {
					// The prefill leg failed before the connection was
					// known: cut it now, the relay reports the failure.
					l.WithDecConn(func(c *upstream.Conn) { _ = c.Close() })
				}
				g.respondPD(ctx, x, m, resp)
				return nil
			}
			fasthttp.ReleaseResponse(resp)
			p.dec.Release()
			g.callFailed(p.dec, err)
			x.tried = append(x.tried, p.dec.ID)
			if g.tryAgain(x, g.podFailure(p.dec, err, g.responseTimeout(x.req.Stream))) && g.moveDecode(m, x) {
				resp = g.sendConcurrentDecode(ctx, x, l)
				continue
			}
			// The prefill leg waits for a pickup that will not come.
			pd.Abort(p.proto, &p.ex, p.pre)
			return g.dropPair(x, nil, g.decodeFailure(x, err))
		case <-watchdog:
			g.abandonDecode(l, p.dec, resp)
			p.watched = true
			return g.dropPair(x, nil, g.decodeFailure(x, fasthttp.ErrTimeout))
		case <-frontend.ClientGone(ctx):
			// Both pods drop the request where the protocol can say so.
			g.abandonDecode(l, p.dec, resp)
			pd.Abort(p.proto, &p.ex, p.pre)
			pd.Abort(p.proto, &p.ex, p.dec)
			return g.dropPair(x, nil, errClientLeft)
		}
	}
}

// sendConcurrentDecode starts the decode leg on the pair's decode pod in
// its own goroutine and returns the response it fills.
func (g *Gateway) sendConcurrentDecode(ctx *fasthttp.RequestCtx, x *completion, l *pd.Link[failure]) *fasthttp.Response {
	p := x.pd
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	g.buildUpstream(ctx, up)
	up.SetHost(p.dec.Config.Address)
	up.SetBody(p.decBody)
	// Streamed even for a whole answer: the watchdog times its reads.
	resp.StreamBody = true
	p.dec.Acquire()
	l.DecState.Store(pd.DecPending)
	l.Hold()
	l.Cut = make(chan struct{})
	go l.Decode(l.Cut, p.dec, up, resp, g.decodeHeadersBy(x))
	return resp
}

// abandonDecode gives up a concurrent decode leg the request no longer
// waits for: its goroutine cleans up when it returns, or, if it already
// delivered, the caller's goroutine does here.
func (g *Gateway) abandonDecode(l *pd.Link[failure], dec *pool.Pod, resp *fasthttp.Response) {
	if l.DecState.CompareAndSwap(pd.DecPending, pd.DecAbandoned) {
		close(l.Cut)
		return
	}
	if err := <-l.DecDone; err == nil {
		upstream.CloseStream(resp, pd.ErrAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	dec.Release()
}

// concurrentPrefill is what a concurrent prefill leg's goroutine needs;
// it touches nothing of the request itself.
type concurrentPrefill struct {
	pre, dec *pool.Pod
	up       *fasthttp.Request
	timeout  time.Duration
	uncached int64
	ticket   ledger.Ticket // a copy, valid since the first Charge
	proto    engines.Protocol
	ex       engines.Exchange
	metrics  *pd.Metrics
	limit    time.Duration
	start    time.Time
	gone     <-chan struct{} // the client's, for upstream.Do
}

// concurrentPrefill runs the prefill leg of a concurrent exchange and
// reports it on l.PreDone: nil for success, else the client's error, after
// aborting the decode leg.
func (g *Gateway) concurrentPrefill(l *pd.Link[failure], c concurrentPrefill) {
	defer l.Release()
	resp := fasthttp.AcquireResponse()
	err := upstream.Do(c.gone, c.pre.Client, c.up, resp, time.Now().Add(c.timeout))
	fasthttp.ReleaseRequest(c.up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		l.Buf = append(l.Buf[:0], resp.Body()...)
	}
	fasthttp.ReleaseResponse(resp)
	end := time.Now()
	c.metrics.Prefill.Update(end.Sub(c.start).Seconds())
	c.pre.AddQueuedPrefill(-c.uncached)
	c.pre.Release()
	g.ledger.PrefillDone(c.ticket)
	f := g.prefillFailure(c.pre, status, l.Buf, err, c.timeout)
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
		pd.Abort(c.proto, &c.ex, c.dec)
		l.WithDecConn(func(conn *upstream.Conn) { _ = conn.Close() })
	}
	l.PreDone <- f
}

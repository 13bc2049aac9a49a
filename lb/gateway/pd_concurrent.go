package gateway

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/frontend"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// runConcurrent sends both legs at once and waits for the one that
// settles the request: the decode leg's headers (its answer), or a failed
// prefill leg, or the watchdog.
func (g *Gateway) runConcurrent(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, up *fasthttp.Request) *failure {
	p := x.pd
	l := acquireLink()
	p.link = l
	// The prefill leg's goroutine takes the prefill pod off the request:
	// the relay must not account for it again.
	x.firstSeen = true
	// Each leg owns a copy of its body: the request may go back to its
	// pool while a leg still runs.
	up.SetBody(p.preBody)
	l.refs.Add(1)
	go g.concurrentPrefill(l, concurrentPrefill{
		pre: p.pre, dec: p.dec, up: up, timeout: p.opts.PrefillRequestTimeout, uncached: x.uncached, ticket: x.ticket,
		proto: p.proto, ex: p.ex, metrics: p.metrics, limit: g.watchdogLimit(x), start: p.legsStart,
		gone: frontend.ClientGone(ctx),
	})
	resp := g.sendConcurrentDecode(ctx, x, l)
	var watchdog <-chan time.Time
	preDone := l.preDone
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
		case err := <-l.decDone:
			if err == nil && resp.StatusCode() != fasthttp.StatusOK && preDone != nil {
				// A decode leg whose KV never came fails too: when the
				// prefill leg fails within moments, it names the cause.
				select {
				case f := <-preDone:
					preDone = nil
					if f != nil {
						upstream.CloseStream(resp, errAbandoned)
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
				l.setDecConn(upstream.ConnOf(resp))
				if l.preErr.Load() != nil {
					// The prefill leg failed before the connection was
					// known: cut it now, the relay reports the failure.
					l.withDecConn(func(c *upstream.Conn) { _ = c.Close() })
				}
				g.respondPD(ctx, x, m, resp)
				return nil
			}
			fasthttp.ReleaseResponse(resp)
			p.dec.Release()
			g.callFailed(p.dec, err)
			x.tried = append(x.tried, p.dec.ID)
			if g.tryAgain(x, g.podFailure(p.dec, err, 0)) && g.moveDecode(m, x) {
				resp = g.sendConcurrentDecode(ctx, x, l)
				continue
			}
			// The prefill leg waits for a pickup that will not come.
			g.abortLeg(p.proto, &p.ex, p.pre)
			return g.dropPair(x, nil, g.decodeFailure(x, err))
		case <-watchdog:
			g.abandonDecode(l, p.dec, resp)
			p.watched = true
			return g.dropPair(x, nil, g.decodeFailure(x, fasthttp.ErrTimeout))
		case <-frontend.ClientGone(ctx):
			// Both pods drop the request where the protocol can say so.
			g.abandonDecode(l, p.dec, resp)
			g.abortLeg(p.proto, &p.ex, p.pre)
			g.abortDecode(p.proto, &p.ex, p.dec)
			return g.dropPair(x, nil, errClientLeft)
		}
	}
}

// sendConcurrentDecode starts the decode leg on the pair's decode pod in
// its own goroutine and returns the response it fills.
func (g *Gateway) sendConcurrentDecode(ctx *fasthttp.RequestCtx, x *completion, l *pdLink) *fasthttp.Response {
	p := x.pd
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	g.buildUpstream(ctx, up)
	up.SetHost(p.dec.Config.Address)
	up.SetBody(p.decBody)
	// Streamed even for a whole answer: the watchdog times its reads.
	resp.StreamBody = true
	p.dec.Acquire()
	l.decState.Store(decPending)
	l.refs.Add(1)
	l.cut = make(chan struct{})
	go l.decode(l.cut, p.dec, up, resp, g.decodeHeadersBy(x))
	return resp
}

// abandonDecode gives up a concurrent decode leg the request no longer
// waits for: its goroutine cleans up when it returns, or, if it already
// delivered, the caller's goroutine does here.
func (g *Gateway) abandonDecode(l *pdLink, dec *pool.Pod, resp *fasthttp.Response) {
	if l.decState.CompareAndSwap(decPending, decAbandoned) {
		close(l.cut)
		return
	}
	if err := <-l.decDone; err == nil {
		upstream.CloseStream(resp, errAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	dec.Release()
}

// errAbandoned closes a decode leg nobody reads.
var errAbandoned = errors.New("gateway: pd decode leg abandoned")

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
	metrics  *pdMetrics
	limit    time.Duration
	start    time.Time
	gone     <-chan struct{} // the client's, for doWatched
}

// concurrentPrefill runs the prefill leg of a concurrent exchange and
// reports it on l.preDone: nil for success, else the client's error, after
// aborting the decode leg.
func (g *Gateway) concurrentPrefill(l *pdLink, c concurrentPrefill) {
	defer l.release()
	resp := fasthttp.AcquireResponse()
	err := upstream.Do(c.gone, c.pre.Client, c.up, resp, time.Now().Add(c.timeout))
	fasthttp.ReleaseRequest(c.up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		l.buf = append(l.buf[:0], resp.Body()...)
	}
	fasthttp.ReleaseResponse(resp)
	end := time.Now()
	c.metrics.prefill.Update(end.Sub(c.start).Seconds())
	c.pre.AddQueuedPrefill(-c.uncached)
	c.pre.Release()
	g.ledger.PrefillDone(c.ticket)
	f := g.prefillFailure(c.pre, status, l.buf, err, c.timeout)
	if f == nil {
		l.prefillEnd.Store(end.UnixNano())
		if c.limit > 0 {
			// Tighten the deadline of a decode answer that is already being
			// relayed (a race with the relay's own setting only leaves the
			// looser bound).
			l.withDecConn(func(conn *upstream.Conn) {
				if !l.started.Load() {
					_ = conn.SetReadDeadline(end.Add(c.limit))
				}
			})
		}
	} else {
		l.preErr.Store(f)
		g.abortLeg(c.proto, &c.ex, c.dec)
		l.withDecConn(func(conn *upstream.Conn) { _ = conn.Close() })
	}
	l.preDone <- f
}

// abortLeg tells pod to drop the exchange's request where the protocol has
// a call for it (SGLang's /abort_request), in the background.
func (g *Gateway) abortLeg(proto engines.Protocol, ex *engines.Exchange, pod *pool.Pod) {
	path, body := proto.Abort(nil, ex)
	if path == "" {
		return // closing the connection is the abort
	}
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(path)
		req.SetHost(pod.Config.Address)
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		// What the pod answers changes nothing.
		_ = pod.Client.DoTimeout(req, resp, abortTimeout)
	}()
}

// abortDecode is abortLeg on the decode pod.
func (g *Gateway) abortDecode(proto engines.Protocol, ex *engines.Exchange, dec *pool.Pod) {
	g.abortLeg(proto, ex, dec)
}

// Hand-over states of a concurrent decode leg's response.
const (
	decPending int32 = iota
	decDelivered
	decAbandoned
)

// pdLink is what a concurrent exchange's legs share with the request while
// they run beside it: the request's own state may return to its pool
// before a leg ends, so the legs touch only this. It is reference counted;
// the last holder returns it to its pool.
type pdLink struct {
	refs atomic.Int32
	// prefillEnd is when the prefill leg succeeded (unix nanoseconds, 0
	// before); preErr its failure, for the relay's error event.
	prefillEnd atomic.Int64
	preErr     atomic.Pointer[failure]
	// started: the decode stream's first chunk arrived.
	started atomic.Bool
	// decState hands the decode leg's response over; decDone carries its
	// outcome, preDone the prefill leg's (nil: success).
	decState atomic.Int32
	decDone  chan error
	preDone  chan *failure
	// cut gives up the decode leg in flight (abandonDecode closes it):
	// its connection is closed, which is how a decode pod that waits for
	// KV that will not come learns to stop.
	cut chan struct{}
	// mu guards decConn, the decode leg's connection while the request
	// relays it: a failed prefill leg closes it, and it must not outlive
	// the request (the client pool reuses connections).
	mu      sync.Mutex
	decConn *upstream.Conn
	// buf holds the prefill leg's answer.
	buf []byte
}

var linkPool = sync.Pool{New: func() any {
	return &pdLink{decDone: make(chan error, 1), preDone: make(chan *failure, 1)}
}}

// acquireLink returns a link held once, by the request.
func acquireLink() *pdLink {
	l := linkPool.Get().(*pdLink)
	l.refs.Store(1)
	return l
}

func (l *pdLink) release() {
	if l.refs.Add(-1) != 0 {
		return
	}
	l.prefillEnd.Store(0)
	l.preErr.Store(nil)
	l.started.Store(false)
	l.decConn = nil
	select {
	case <-l.preDone:
	default:
	}
	select {
	case <-l.decDone:
	default:
	}
	linkPool.Put(l)
}

func (l *pdLink) setDecConn(c *upstream.Conn) {
	l.mu.Lock()
	l.decConn = c
	l.mu.Unlock()
}

func (l *pdLink) withDecConn(f func(*upstream.Conn)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.decConn != nil {
		f(l.decConn)
	}
}

// decode runs a concurrent decode leg until its response headers and
// delivers them, or cleans up after a request that left.
func (l *pdLink) decode(cut <-chan struct{}, dec *pool.Pod, up *fasthttp.Request, resp *fasthttp.Response, by time.Time) {
	defer l.release()
	err := upstream.Do(cut, dec.Client, up, resp, by)
	fasthttp.ReleaseRequest(up)
	if l.decState.CompareAndSwap(decPending, decDelivered) {
		l.decDone <- err
		return
	}
	if err == nil {
		upstream.CloseStream(resp, errAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	dec.Release()
}

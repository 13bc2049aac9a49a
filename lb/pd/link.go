package pd

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// ErrAbandoned closes a decode leg nobody reads.
var ErrAbandoned = errors.New("pd: decode leg abandoned")

// Hand-over states of a concurrent decode leg's response.
const (
	DecPending int32 = iota
	DecDelivered
	DecAbandoned
)

// Link is what a concurrent exchange's legs share with the request while
// they run beside it: the request's own state may return to its pool
// before a leg ends, so the legs touch only this. It is reference counted
// (AcquireLink, Hold, Release); the last holder returns it to its pool.
type Link struct {
	refs atomic.Int32
	// PrefillEnd is when the prefill leg succeeded (unix nanoseconds, 0
	// before); PreErr its failure, for the relay's error event.
	PrefillEnd atomic.Int64
	PreErr     atomic.Pointer[fail.Failure]
	// Started: the decode stream's first chunk arrived.
	Started atomic.Bool
	// DecState hands the decode leg's response over; DecDone carries its
	// outcome, PreDone the prefill leg's (nil: success).
	DecState atomic.Int32
	DecDone  chan error
	PreDone  chan *fail.Failure
	// Cut gives up the decode leg in flight (the request closes it when
	// it abandons the leg): its connection is closed, which is how a
	// decode pod that waits for KV that will not come learns to stop.
	Cut chan struct{}
	// PreCut gives up the prefill leg in flight: the request closes it
	// when the leg's KV has no decode leg left to take it.
	PreCut chan struct{}
	// Dec is the decode pod the decode leg went to last (it moves off a
	// pod that refused it), which a failed prefill leg aborts.
	Dec atomic.Pointer[pool.Pod]
	// mu guards decConn, the decode leg's connection while the request
	// relays it: a failed prefill leg closes it, and it must not outlive
	// the request (the client pool reuses connections).
	mu      sync.Mutex
	decConn *upstream.Conn
	// Buf holds the prefill leg's answer.
	Buf []byte
	// First holds the decode leg's stream's first body bytes (FirstN),
	// which its goroutine reads before DecDone.
	First  [1]byte
	FirstN int
}

var linkPool = sync.Pool{New: func() any {
	return &Link{DecDone: make(chan error, 1), PreDone: make(chan *fail.Failure, 1)}
}}

// AcquireLink returns a link held once, by the request.
func AcquireLink() *Link {
	l := linkPool.Get().(*Link)
	l.refs.Store(1)
	return l
}

// Hold adds a holder: a leg's goroutine, which Releases it when it ends.
func (l *Link) Hold() { l.refs.Add(1) }

// Release drops a holder; the last one returns l to its pool.
func (l *Link) Release() {
	if l.refs.Add(-1) != 0 {
		return
	}
	l.PrefillEnd.Store(0)
	l.PreErr.Store(nil)
	l.Started.Store(false)
	l.Dec.Store(nil)
	l.decConn = nil
	select {
	case <-l.PreDone:
	default:
	}
	select {
	case <-l.DecDone:
	default:
	}
	linkPool.Put(l)
}

// SetDecConn records the decode leg's connection while the request relays
// it (nil once the relay is over).
func (l *Link) SetDecConn(c *upstream.Conn) {
	l.mu.Lock()
	l.decConn = c
	l.mu.Unlock()
}

// WithDecConn calls f with the decode leg's connection, if one is
// recorded, holding it there until f returns.
func (l *Link) WithDecConn(f func(*upstream.Conn)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.decConn != nil {
		f(l.decConn)
	}
}

// decode runs a concurrent decode leg until its response headers (and
// first's bytes) and delivers them, or cleans up after a request that
// left, taking its seqs off dec.
func (l *Link) decode(fl Fleet, cut <-chan struct{}, dec *pool.Pod, seqs int, up *fasthttp.Request, resp *fasthttp.Response, by time.Time, first []byte) {
	defer l.Release()
	var err error
	l.FirstN, err = fl.Send(cut, nil, dec, up, resp, by, first)
	fasthttp.ReleaseRequest(up)
	if l.DecState.CompareAndSwap(DecPending, DecDelivered) {
		l.DecDone <- err
		return
	}
	if err == nil {
		upstream.CloseStream(resp, ErrAbandoned)
	}
	fasthttp.ReleaseResponse(resp)
	dec.Release(seqs)
}

package frontend

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/cpu"
	"pdlb/internal/spares"
	"pdlb/lb/evloop"

	"pdlb/lb/upstream"
)

// Serving on the event loop. A request handed to a worker goroutine costs
// two thread handoffs, and a worker that waits for its pod parks and is
// woken by the runtime's poller; an event-driven proxy (nginx, HAProxy)
// spends neither. A handler that sets Handler.OnLoop is run on the gnet
// loop itself for a request that arrives on an otherwise idle connection;
// it forwards the request with Loop.Send over an upstream connection
// registered on the same loop and answers from Answered, or relays the
// answer's stream from there (loop_relay.go), so a request and its answer
// cross no thread. What must block (a prefill/decode exchange, an admission wait)
// moves to a worker with Loop.Detach.

// Loop is the event loop a request is served on, as LoopOf returns it.
type Loop struct{ gc *gconn }

// Task is the rest of a request moved off the loop: Run serves it on a
// worker goroutine, which then writes ctx's response as it would Serve's.
type Task interface{ Run() }

// Done receives the end of a Send, on the loop, with the request
// served on the loop again: it may answer, Detach, or Send anew.
type Done interface{ Answered(err error) }

// Hedger is a Done that decides, as Upstream.FirstByte passes with no
// byte of the answer, whether the exchange is given up then (true) or
// waits on to Upstream.Timeout (false): the retry that giving up was for
// may have no place by then. A Done that is no Hedger is given up.
type Hedger interface{ GiveUp() bool }

// LoopOf returns the loop ctx is served on, nil when ctx is served on a
// goroutine that may block (fasthttp's, a gnet worker).
func LoopOf(ctx *fasthttp.RequestCtx) *Loop {
	gc, ok := ctx.Conn().(*gconn)
	if !ok || gc.cur != ctx {
		return nil
	}
	return &gc.loop
}

// TakeSpare returns a value the loop's requests gave back with
// GiveSpare, the last first, nil if none: the handler's own per-request
// state (one kind of it), reused on the loop without a sync.Pool's locked
// operations. On the loop only; one not taken for a tick is left to the
// collector.
func (l *Loop) TakeSpare() any {
	v, _ := l.gc.ls.spare.Take()
	return v
}

// GiveSpare keeps v for the loop's next TakeSpare; false when the loop
// keeps its most already, and v is the caller's to pool. On the loop only.
func (l *Loop) GiveSpare(v any) bool { return l.gc.ls.spare.Give(v) }

// Lane numbers l's loop among the front end's: requests served on one
// loop share a lane.
func (l *Loop) Lane() uint8 { return l.gc.ls.lane }

// ClientGone returns a channel that is closed once the client of ctx has
// closed its connection, for a request served on a worker that waits (an
// admission deferral, a prefill/decode exchange). On gnet, whose loop
// watches every connection; nil (never ready) on fasthttp, which reads
// nothing while a handler runs: there a client's leaving shows only when
// its answer is written, or to a request that watches it (WatchClient).
func ClientGone(ctx *fasthttp.RequestCtx) <-chan struct{} {
	if st, ok := ctx.Conn().(*h2Stream); ok {
		return st.gone()
	}
	gc, ok := ctx.Conn().(*gconn)
	if !ok {
		return nil
	}
	gc.mu.Lock()
	defer gc.mu.Unlock()
	return gc.gone.get(gc.left)
}

// ClientAddr is the address ctx's client connected from, IPv4 as such;
// false when its connection has none (a pipe's, a test's). An event
// loop's connection works it out once, not at every request.
func ClientAddr(ctx *fasthttp.RequestCtx) (netip.AddrPort, bool) {
	if gc, ok := ctx.Conn().(*gconn); ok {
		return gc.client, gc.client.IsValid()
	}
	return addrPort(ctx.RemoteAddr())
}

// addrPort is a's address and port, IPv4 as such, when a is TCP's.
func addrPort(a net.Addr) (netip.AddrPort, bool) {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := t.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// Detach moves the rest of the request to a worker: when the handler (or
// Answered) returns, t runs on a worker goroutine.
func (l *Loop) Detach(t Task) { l.gc.task = t }

// Upstream is where and how Send reaches a pod.
type Upstream struct {
	Addr string
	// DialTimeout bounds dialing a new connection; Timeout the wait for
	// the whole response (for a stream, its header and first body bytes);
	// Keepalive how long the connection may then idle before it is
	// closed.
	DialTimeout, Timeout, Keepalive time.Duration
	// MaxConns caps this front end's open connections to Addr.
	MaxConns int
	// MaxBody caps a whole answer's body (0: no cap); past it the exchange
	// ends with fasthttp.ErrBodyTooLarge. A streamed answer has none.
	MaxBody int
	// FirstByte, when set and shorter than Timeout, bounds the wait for
	// the answer's first byte (a stream's first body byte: engines send
	// its head before the prefill): past it the exchange ends with
	// fasthttp.ErrTimeout, as past Timeout without a byte, unless done,
	// a Hedger, says to wait on.
	FirstByte time.Duration
	// Down, when set, holds when (mono.Now) the pod was last found dead
	// (pool.Pod.DownAt): an exchange sent before then with no byte of its
	// answer yet ends with upstream.ErrPodDown at the next sweep.
	Down *atomic.Int64
	// Head, when set, takes the answer's header lines as the pod sent
	// them, and the response's header then holds only its status, framing
	// and Connection: close (upstream.AnswerHead).
	Head *upstream.AnswerHead
}

// Request is a request Send sends: AppendRequest appends it whole, head
// and body, as it goes to the pod, its target and Host header included.
type Request interface{ AppendRequest(dst []byte) []byte }

// FastRequest is a fasthttp request as Send sends it.
type FastRequest fasthttp.Request

// AppendRequest appends r as upstream.AppendRequest renders it.
func (r *FastRequest) AppendRequest(dst []byte) []byte {
	return upstream.AppendRequest(dst, (*fasthttp.Request)(r))
}

// Send sends req to the pod at u.Addr over an idle keep-alive
// connection of this loop, or a new one dialed while fewer than u.MaxConns
// connections of this front end are open to it. At that cap it returns
// fasthttp.ErrNoFreeConns, as the pods' clients do, and sends nothing.
// Otherwise done gets, on the loop, nil once resp holds the whole
// response, or the error: the dial's; fasthttp.ErrTimeout when no byte of
// it came within u.Timeout (or u.FirstByte); upstream.ErrPodDown when none
// had come as u.Down passed the time it was sent; ErrAnswerStalled when it
// began but was not whole within u.Timeout; fasthttp.ErrConnectionClosed
// (no byte of it came) or io.ErrUnexpectedEOF when the pod closed the
// connection first (a kept one closed before a byte came sends the
// request again on a new one first: redial; fasthttp.ErrNoFreeConns at
// u.MaxConns); ErrClientGone when the client closed its connection first,
// which closes the pod's too (that is how a pod learns to stop working on
// it, as behind nginx). With stream, a 200 answer ends the exchange once
// its first body bytes are in (before them, the head alone counts as no
// byte): Answered starts its Relay. req is rendered
// before Send returns, and may then change; resp is the exchange's until
// done.
func (l *Loop) Send(u Upstream, stream bool, req Request, resp *fasthttp.Response, done Done) error {
	gc := l.gc
	ls := gc.ls
	now := ls.clock()
	idle := ls.idleOf(u.Addr)
	uc := take(idle, now)
	if uc == nil {
		n := gc.s.upstreamCount(u.Addr)
		if !reserveConn(n, u.MaxConns) {
			return fasthttp.ErrNoFreeConns
		}
		uc = &upConn{ls: ls, addr: u.Addr, kept: idle, count: n}
		uc.open(u.DialTimeout)
	}
	uc.dialTimeout, uc.maxConns = u.DialTimeout, u.MaxConns
	uc.out = req.AppendRequest(uc.out[:0])
	uc.need, uc.got, uc.headIn, uc.clientGone, uc.reused = 0, false, false, false, uc.c != nil
	if uc.c != nil {
		// A write that fails closes the connection, and the loop runs
		// OnClose inside the write, while the exchange is not the
		// connection's yet (done is set below): the pod closed it as it
		// idled, and a new connection carries the request.
		if _, err := uc.c.Write(uc.out); err != nil && !uc.redial() {
			return fasthttp.ErrNoFreeConns
		}
	}
	uc.gc, uc.resp, uc.done, uc.stream = gc, resp, done, stream
	gc.up = uc
	// now, not after the write: an exchange the pod was found dead
	// during is given up too. The deadlines run from now too, not from
	// the clock's coarse copy, which lags by up to a sweep's period (a
	// second before the first exchange): they would come that much early.
	uc.sentAt, uc.down = now, u.Down
	uc.deadline = now + int64(u.Timeout)
	if u.FirstByte > 0 && u.FirstByte < u.Timeout {
		uc.firstBy = now + int64(u.FirstByte)
		gc.s.noteTimeout(u.FirstByte)
	} else {
		uc.firstBy = uc.deadline
	}
	uc.keepalive = int64(u.Keepalive)
	uc.maxBody = u.MaxBody
	uc.head = u.Head
	gc.s.noteTimeout(u.Timeout)
	gc.s.noteTimeout(u.Keepalive)
	return nil
}

// reserveConn counts a connection about to be dialed in n, a pod's count
// of open connections, unless limit are open already.
func reserveConn(n *atomic.Int32, limit int) bool {
	if n.Add(1) > int32(limit) {
		n.Add(-1)
		return false
	}
	return true
}

// upstreamCount is addr's count of open upstream connections, across loops.
func (s *GNet) upstreamCount(addr string) *atomic.Int32 {
	if n, ok := s.upstreams.Load(addr); ok {
		return n.(*atomic.Int32)
	}
	n, _ := s.upstreams.LoadOrStore(addr, new(atomic.Int32))
	return n.(*atomic.Int32)
}

// noteTimeout makes the sweep frequent enough for timeout: a tenth of it,
// between 10 ms and tick.
func (s *GNet) noteTimeout(timeout time.Duration) {
	every := min(max(timeout/10, 10*time.Millisecond), tick)
	for {
		cur := s.sweepEvery.Load()
		if cur != 0 && cur <= int64(every) {
			return
		}
		if s.sweepEvery.CompareAndSwap(cur, int64(every)) {
			return
		}
	}
}

// loopState is one event loop's upstream connections; only that loop
// touches it.
type loopState struct {
	s  *GNet
	el *evloop.Loop
	// idle holds the keep-alive connections waiting, by address; a list
	// is kept by pointer, which each of its connections holds: a request
	// takes one with a lookup, and parks it with none.
	idle  map[string]*[]*upConn
	conns []*upConn // every upstream connection, for the sweep
	sweep func()
	// p parses the requests and answers read on the loop, one at a
	// time: no parse calls out before it returns.
	p *parser
	// ctxs are the request contexts the loop's requests gave back, spare
	// the handler's own per-request values (Loop.TakeSpare).
	ctxs  spares.List[*fasthttp.RequestCtx]
	spare spares.List[any]
	// lane numbers the loop among the front end's (wrapping past 255).
	lane uint8
	// serving counts the loop's requests between parsing and their last
	// byte written (GNet.serving sums them): a counter a loop, on a line
	// of its own, so that the loops do not pass one between their cores
	// twice a request. Workers add to it too.
	_       cpu.CacheLinePad
	serving atomic.Int64
	_       cpu.CacheLinePad
	// turnNow is the clock's reading in the loop's turn numbered turn
	// (see clock; not GNet.now, the coarse copy the ticks keep).
	turnNow int64
	turn    uint64
	// gather is where the loop's relays gather a chunk (StreamWriter.loop),
	// written and emptied before the loop turns to another connection.
	gather []byte
}

// maxLoopCtxBody bounds the body buffers a context the loop keeps may
// hold (bytes): the pool's go at a collection, the loop's would stay.
const maxLoopCtxBody = 64 << 10

// takeCtx is acquireCtx on the loop.
func (ls *loopState) takeCtx() *fasthttp.RequestCtx {
	if ctx, ok := ls.ctxs.Take(); ok {
		return ctx
	}
	return acquireCtx()
}

// giveCtx is releaseCtx on the loop.
func (ls *loopState) giveCtx(ctx *fasthttp.RequestCtx) {
	ctx.Request.ReleaseBody(maxLoopCtxBody)
	ctx.Response.ReleaseBody(maxLoopCtxBody)
	resetCtx(ctx)
	if !ls.ctxs.Give(ctx) {
		ctxPool.Put(ctx)
	}
}

// parser is the loop's parser, made on first use.
func (ls *loopState) parser() *parser {
	if ls.p == nil {
		ls.p = &parser{br: bufio.NewReaderSize(nil, ls.s.o.MaxHeaderBytes)}
	}
	return ls.p
}

// serving counts the requests between parsing and their last byte
// written, on every loop.
func (s *GNet) serving() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(0)
	for _, ls := range s.loops {
		n += ls.serving.Load()
	}
	return n
}

// loopOf returns el's state, made on first use.
func (s *GNet) loopOf(el *evloop.Loop) *loopState {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.loops[el]
	if ls == nil {
		ls = &loopState{lane: uint8(len(s.loops)), s: s, el: el, idle: make(map[string]*[]*upConn), gather: make([]byte, 0, streamBufferBytes)}
		ls.sweep = ls.sweepConns
		s.loops[el] = ls
	}
	return ls
}

// idleOf returns the loop's list of idle connections to addr, made on
// first use.
func (ls *loopState) idleOf(addr string) *[]*upConn {
	list := ls.idle[addr]
	if list == nil {
		list = new([]*upConn)
		ls.idle[addr] = list
	}
	return list
}

// take returns an idle connection of list, the latest one parked (its
// socket is the warmest), or nil. One idle past its keep-alive is closed
// instead, and the older ones with it: the sweep that closes them runs on
// the clock's ticks, which may lag (the first one after the loops start
// comes up to a tick later), and a request must not go out on a
// connection its pod may have closed. now and idleSince are read off the
// loop's clock (ls.clock), not its coarse copy.
func take(list *[]*upConn, now int64) *upConn {
	if len(*list) == 0 {
		return nil
	}
	idle := *list
	uc := idle[len(idle)-1]
	if now-uc.idleSince > uc.keepalive {
		for i, old := range idle {
			_ = old.c.Close() // OnClose forgets it
			idle[i] = nil
		}
		*list = idle[:0]
		return nil
	}
	idle[len(idle)-1] = nil
	*list = idle[:len(idle)-1]
	return uc
}

// clock reads the clock once a turn of the loop, at its first use: one
// read a batch of events instead of several a request. The reading is
// late by at most the turn's work (microseconds, a few milliseconds under
// the heaviest batch), which timeouts of seconds do not feel. On the loop.
func (ls *loopState) clock() int64 {
	if t := ls.el.Turn(); t != ls.turn {
		ls.turn, ls.turnNow = t, ls.s.o.clock()
	}
	return ls.turnNow
}

// park keeps uc for the next exchange to its pod. Its idle time is read
// off the loop's clock: take must not count it shorter than the pod does
// by more than a turn, nor, off the coarse copy, up to a tick longer.
func (ls *loopState) park(uc *upConn) {
	uc.idleSince = ls.clock()
	*uc.kept = append(*uc.kept, uc)
}

// forget drops a closed connection from the loop's lists.
func (ls *loopState) forget(uc *upConn) {
	list := uc.kept
	for i, v := range *list {
		if v == uc {
			*list = append((*list)[:i], (*list)[i+1:]...)
			break
		}
	}
	for i, v := range ls.conns {
		if v == uc {
			last := len(ls.conns) - 1
			ls.conns[i], ls.conns[last] = ls.conns[last], nil
			ls.conns = ls.conns[:last]
			break
		}
	}
	uc.count.Add(-1)
}

// sweepConns, on the loop, times out exchanges past their deadline,
// closes connections idle too long and trims the loop's contexts and
// outbound buffers.
func (ls *loopState) sweepConns() {
	now := ls.s.now.Load()
	ls.ctxs.Trim(now, int64(tick), func(ctx *fasthttp.RequestCtx) { ctxPool.Put(ctx) })
	ls.spare.Trim(now, int64(tick), func(any) {})
	ls.el.TrimSpares(now, int64(tick))
	for _, uc := range ls.conns {
		switch {
		case uc.c == nil:
		case (uc.sink != nil || uc.done != nil) && ls.s.aborting.Load():
			uc.aborted = true
			_ = uc.c.Close()
		case uc.done != nil && !uc.got && now > uc.firstBy && now <= uc.deadline && !giveUp(uc.done):
			uc.firstBy = uc.deadline
		case uc.done != nil && (now > uc.deadline || !uc.got && now > uc.firstBy),
			uc.sink != nil && ls.s.expired(uc.fed, uc.idle, now):
			uc.timedOut = true
			_ = uc.c.Close() // on a later turn of the loop: OnClose ends the exchange
		case uc.done != nil && !uc.got && uc.down != nil && uc.down.Load() > uc.sentAt:
			uc.podDown = true
			_ = uc.c.Close()
		case uc.done == nil && uc.sink == nil && now-uc.idleSince > uc.keepalive:
			_ = uc.c.Close()
		}
	}
}

// giveUp says whether d's exchange is given up at its first-byte deadline
// (Hedger).
func giveUp(d Done) bool {
	h, ok := d.(Hedger)
	return !ok || h.GiveUp()
}

// upConn is a keep-alive connection to a pod, on one loop, carrying one
// exchange at a time.
type upConn struct {
	ls    *loopState
	addr  string
	kept  *[]*upConn    // the loop's idle connections to addr (idleOf)
	count *atomic.Int32 // addr's open connections
	c     *evloop.Conn  // nil while dialing

	// The exchange in flight (done nil: none). Its times, as every time
	// of upConn's, are on the front end's clock (Options.clock).
	gc       *gconn
	resp     *fasthttp.Response
	done     Done
	deadline int64 // the whole answer's (Upstream.Timeout)
	firstBy  int64 // the first byte's deadline (Upstream.FirstByte)
	sentAt   int64 // compared with down
	down     *atomic.Int64
	out      []byte
	need     int // bytes the response needs before a reparse (0: unknown)
	// gathered holds a whole answer with a chunked body, from when its
	// header showed it until it ends (nil otherwise): see read.
	gathered   []byte
	got        bool // bytes of the response arrived (a stream's: of its body)
	headIn     bool // a stream's head arrived, parsed and consumed
	timedOut   bool // the sweep closed it
	podDown    bool // the sweep closed it: its pod was found dead (Upstream.Down)
	aborted    bool // the sweep closed it: AbortRelays (the exchange's too)
	clientGone bool // the client left: abandon closed it
	stream     bool // a 200 answer is relayed (see loop_relay.go)
	// reused: the exchange went out on a kept connection, which the pod
	// may have closed as the request came (redial).
	reused      bool
	dialTimeout time.Duration // Upstream.DialTimeout of the exchange in flight
	maxConns    int           // Upstream.MaxConns of the exchange in flight

	// The relay of a streamed answer (sink nil: none): the body decoder's
	// state, the stream's writer, the wait allowed for each next byte, and
	// when the last came (or the relay began), off the coarse clock.
	sink       Sink
	idle       time.Duration
	fed        int64
	w          StreamWriter
	state      int
	remain     int
	closeAfter bool // the pod answered Connection: close

	idleSince int64                // when it was parked
	keepalive int64                // nanoseconds it may idle (Upstream.Keepalive)
	maxBody   int                  // Upstream.MaxBody of the exchange in flight
	head      *upstream.AnswerHead // Upstream.Head of the exchange in flight
}

// open starts a new connection for uc, counted in uc.count already; the
// exchange set on uc by then goes out once it is open (opened).
func (uc *upConn) open(timeout time.Duration) {
	uc.c, uc.reused = nil, false
	uc.ls.conns = append(uc.ls.conns, uc)
	go uc.dial(timeout)
}

// redial sends the exchange again on a new connection to the same pod,
// after the kept one it went out on closed before a byte of the answer
// came: the pod closed it as it idled, as the request was on its way, so
// it never took the request (a browser, nginx and Go's net/http send it
// again too). Not a retry: nothing of the pod's failed. False when the
// pod's connections are at Upstream.MaxConns.
func (uc *upConn) redial() bool {
	if !reserveConn(uc.count, uc.maxConns) {
		return false
	}
	uc.open(uc.dialTimeout)
	return true
}

// dial connects on a goroutine of its own and enrolls the connection on
// the loop, whose OnOpen sends the request; a failed dial ends the
// exchange on the loop.
func (uc *upConn) dial(timeout time.Duration) {
	err := uc.ls.s.o.FDs.DialThen(uc.addr, timeout, func(c net.Conn) error {
		// Enroll keeps a copy of c's socket and closes c; it returns
		// after OnOpen ran, or with why it could not.
		return uc.ls.el.Enroll(c, uc)
	})
	if err == nil {
		return
	}
	if xerr := uc.ls.el.Execute(func() {
		uc.ls.forget(uc)
		if uc.clientGone {
			err = ErrClientGone
		}
		uc.finish(err)
	}); xerr != nil && uc.ls.s.o.Log != nil {
		// The loop is gone (shutdown): so is the client's connection.
		uc.ls.s.o.Log.Debug("frontend: upstream dial result dropped", "pod", uc.addr, "err", err)
	}
}

// opened is OnOpen of a dialed connection: the request waiting for it goes
// out as OnOpen's answer, so a write that fails closes it after OnOpen. A
// request whose client left while it dialed is not sent.
func (uc *upConn) opened(c *evloop.Conn) ([]byte, evloop.Action) {
	uc.c = c
	switch {
	case uc.clientGone:
		return nil, evloop.Close
	case uc.done == nil:
		return nil, evloop.None
	}
	return uc.out, evloop.None
}

// closing reports whether a close of ours is on its way (Conn.Close runs
// it on a later turn of the loop): an answer that came first is taken, but the
// connection must not be parked, or the close would end the next
// exchange on it.
func (uc *upConn) closing() bool { return uc.timedOut || uc.podDown || uc.clientGone }

// abandon ends the exchange in flight because its client left: closing
// the connection tells the pod to stop (OnClose ends the exchange with
// ErrClientGone); one still dialing is closed once open.
func (uc *upConn) abandon() {
	uc.clientGone = true
	if uc.c != nil {
		_ = uc.c.Close()
	}
}

// read parses the response of the exchange in flight once it is whole.
func (uc *upConn) read() evloop.Action {
	if uc.sink != nil {
		return uc.feed()
	}
	c := uc.c
	n := c.InboundBuffered()
	if uc.done == nil {
		// Bytes nobody asked for: the connection is out of step.
		return evloop.Close
	}
	if n == 0 || n < uc.need {
		return evloop.None
	}
	uc.got = true
	if uc.headIn {
		return uc.handOff()
	}
	var buf []byte
	if uc.gathered != nil {
		// A chunked answer has no length to wait for, and parsing it
		// whole at every read cost the square of its size: a 32 MiB answer held
		// the loop and its clients 3.5 s. Its bytes are gathered here as
		// they come and parsed when they may end it.
		b, _ := c.Next(n)
		uc.gathered = append(uc.gathered, b...)
		if uc.maxBody > 0 && len(uc.gathered) > 2*uc.maxBody+gatherSlack {
			// Far past the cap, framing included: no need to parse it.
			uc.gathered = nil
			uc.finish(fasthttp.ErrBodyTooLarge)
			return evloop.Close
		}
		if !bytes.HasSuffix(uc.gathered, crlf2) {
			return evloop.None
		}
		buf = uc.gathered
	} else {
		buf, _ = c.Peek(n)
	}
	used, err := uc.parse(buf, false)
	switch {
	case err == errGather && uc.gathered == nil:
		b, _ := c.Next(n)
		uc.gathered = append(make([]byte, 0, 2*n), b...)
		return evloop.None
	case err == errGather || err == errNeedMore:
		return evloop.None
	}
	rest := len(buf) - used
	if uc.gathered != nil {
		uc.gathered = nil
	} else {
		_, _ = c.Discard(used)
		rest = c.InboundBuffered()
	}
	if err == errStreamHead {
		if rest == 0 && (uc.state != bodyFixed || uc.remain > 0) {
			// Engines send a stream's head before its prefill: its
			// first byte is its first body byte, not yet here.
			uc.got, uc.headIn = false, true
			return evloop.None
		}
		return uc.handOff()
	}
	if err != nil {
		uc.finish(err)
		return evloop.Close
	}
	keep := !uc.resp.ConnectionClose() && rest == 0 && !uc.closing()
	if keep {
		uc.ls.park(uc)
	}
	uc.finish(nil)
	if !keep {
		return evloop.Close
	}
	return evloop.None
}

// parse reads the whole response at the head of buf into uc.resp:
// errNeedMore when it is not all there yet. eof: the pod closed after
// buf, which ends a body without a length.
func (uc *upConn) parse(buf []byte, eof bool) (int, error) {
	s := uc.ls.s
	p := uc.ls.parser()
	resp := uc.resp
	resp.Reset()
	var err error
	h, plain := upstream.PlainHead{}, false
	if uc.head != nil {
		// A head longer than the parser's buffer goes to fasthttp, which
		// refuses it, as it refuses one that arrives in pieces.
		h, plain = upstream.ScanHead(buf)
		plain = plain && h.N <= s.o.MaxHeaderBytes
	}
	if plain {
		h.Into(resp, uc.head)
		p.src = peekReader{b: buf[h.N:], eof: eof}
		p.br.Reset(&p.src)
	} else {
		if uc.head != nil {
			uc.head.Raw = false
		}
		p.src = peekReader{b: buf, eof: eof}
		p.br.Reset(&p.src)
		if err = upstream.ReadHead(&resp.Header, p.br); err == upstream.ErrTooManyInterim {
			return 0, err
		}
	}
	if err == nil && uc.stream && resp.StatusCode() == fasthttp.StatusOK {
		uc.startBody(resp.Header.ContentLength())
		uc.closeAfter = resp.ConnectionClose()
		return p.consumed(buf), errStreamHead
	}
	headed := err == nil
	if code := resp.StatusCode(); headed && (code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified) {
		// No body, whatever the header says (RFC 9112 6.3): one waited
		// for would hold the exchange until its timeout.
		return p.consumed(buf), nil
	}
	if headed {
		cl := resp.Header.ContentLength()
		if uc.maxBody > 0 && cl > uc.maxBody {
			// Refused before it is buffered.
			return 0, fasthttp.ErrBodyTooLarge
		}
		if cl >= 0 && len(buf) < p.consumed(buf)+cl {
			uc.need = p.consumed(buf) + cl
			return 0, errNeedMore
		}
		if plain && cl >= 0 && !resp.StreamBody {
			// Whole in buf (checked above): copied once, not through
			// the reader's buffer first.
			resp.SetBody(buf[h.N : h.N+cl])
			return h.N + cl, nil
		}
		// The body follows the header just read, which is not read
		// again (as fasthttp's whole read would).
		err = resp.ReadBody(p.br, uc.maxBody)
		if err == nil && cl == -1 {
			err = resp.Header.ReadTrailer(p.br)
		}
	}
	if err != nil && p.src.short && err != fasthttp.ErrBodyTooLarge {
		if headed && resp.Header.ContentLength() == -1 {
			return 0, errGather
		}
		return 0, errNeedMore
	}
	if err != nil && !headed && !HeadTooLarge(err) {
		err = upstream.ErrPodHead
	}
	return p.consumed(buf), err
}

// HeadTooLarge reports whether err is fasthttp's for a head (a request's
// or a pod's answer's) over its buffer, or an HTTP/2 request's header
// list over MaxHeaderBytes; fasthttp's error types do not unwrap, hence
// As on the concrete type. A function of its own: the target errors.As
// fills escapes, and declared in parse it was an allocation at every
// answer.
func HeadTooLarge(err error) bool {
	if err == errHeaderList {
		return true
	}
	var small *fasthttp.ErrSmallBuffer
	return errors.As(err, &small)
}

// errGather: a whole answer's header is in, and its chunked body is not
// all there yet (read gathers it).
var errGather = errors.New("frontend: a chunked answer's body is not all there")

// crlf2 ends a chunked body: its last chunk, then its trailers if any,
// then an empty line. gatherSlack is room over twice the body cap for the
// header and the chunks' framing.
var crlf2 = []byte("\r\n\r\n")

const gatherSlack = 64 << 10

// closed is OnClose: an exchange in flight ends with the reason.
func (uc *upConn) closed() {
	uc.ls.forget(uc)
	if uc.sink != nil {
		uc.relayClosed()
		return
	}
	if uc.done == nil {
		return
	}
	err := fasthttp.ErrConnectionClosed
	switch {
	case uc.clientGone:
		err = ErrClientGone
	case uc.aborted:
		err = ErrAborted
	case uc.timedOut && uc.got:
		err = ErrAnswerStalled
	case uc.timedOut:
		err = fasthttp.ErrTimeout
	case uc.podDown && !uc.got:
		err = upstream.ErrPodDown
	case uc.got:
		err = io.ErrUnexpectedEOF
		if done, perr := uc.untilClose(); done {
			err = perr
		}
	case uc.reused && !uc.headIn:
		// Not once a stream's head came: the pod took the request.
		if uc.redial() {
			return
		}
		err = fasthttp.ErrNoFreeConns
	}
	uc.finish(err)
}

// untilClose reads, in OnClose, an answer with neither a length nor
// chunks, whose body the pod's close ends (RFC 9112 6.3): done when the
// bytes buffered hold it, with err nil or fasthttp.ErrBodyTooLarge.
func (uc *upConn) untilClose() (done bool, err error) {
	if uc.gathered != nil {
		return false, nil // chunked
	}
	buf, _ := uc.c.Peek(uc.c.InboundBuffered())
	_, err = uc.parse(buf, true)
	return err == nil || err == fasthttp.ErrBodyTooLarge, err
}

// ErrAnswerStalled ends an exchange whose answer began but was not whole
// within Upstream.Timeout; fasthttp.ErrTimeout says no byte of it came.
var ErrAnswerStalled = fmt.Errorf("frontend: the pod's answer stopped coming: %w", os.ErrDeadlineExceeded)

// errStreamHead: the header of an answer to relay is in.
var errStreamHead = errors.New("frontend: a streamed answer's header")

// handOff ends the exchange once its streamed answer's head and first
// body bytes are in: Answered starts the relay, which takes the body
// from here.
func (uc *upConn) handOff() evloop.Action {
	gc, done := uc.gc, uc.done
	uc.resp, uc.done = nil, nil
	gc.up = nil
	gc.relaying = uc
	done.Answered(nil)
	if uc.sink == nil {
		// The handler answered otherwise; the body is not read.
		gc.relaying, uc.gc = nil, nil
		gc.afterLoop()
		gc.resume()
		return evloop.Close
	}
	return uc.feed()
}

// finish hands the exchange's end to its request, on the loop, and lets
// the client's connection go on.
func (uc *upConn) finish(err error) {
	gc, done := uc.gc, uc.done
	uc.gc, uc.resp, uc.done = nil, nil, nil
	gc.up = nil
	done.Answered(err)
	gc.afterLoop()
	gc.resume()
}

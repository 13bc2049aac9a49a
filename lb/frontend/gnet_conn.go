package frontend

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"io"
	"log"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"pdlb/lb/evloop"

	"pdlb/lb/upstream"
)

// A gnet front end connection's life. The event loop parses complete requests out of
// the inbound buffer and queues them; one worker goroutine per busy
// connection serves the queue in order, so responses leave in request order
// (pipelining), and exits when the queue is empty. A streamed response is
// written by a goroutine of its own, which owns the queue from then on (see
// gconn.stream). The queue's owner writes with AsyncWritev and waits for
// the loop's callback before the next write, so the bytes it hands over
// (response headers, the handler's body, a stream writer's pooled buffer)
// go to the socket without a copy of ours, and at most maxOutbound bytes
// wait in the loop's outbound buffer: past that the writer stays blocked until
// the client reads, which in turn blocks the stream writer and so the
// upstream reads.

// Limits of one connection.
const (
	// maxQueued is how many parsed requests wait for the worker; the loop
	// stops parsing (the bytes stay buffered) until it drains them.
	maxQueued = 16
	// maxOutbound is how many response bytes may wait in the loop's
	// outbound buffer for a slow client before the writer blocks.
	maxOutbound = 64 << 10
	// maxPoll is the longest wait between two checks of whether a blocked
	// writer's client has read enough; the loop reports no drained buffer, so
	// the writer asks the loop again with Wake, backing off from 1 ms.
	maxPoll = 20 * time.Millisecond
)

var (
	errNeedMore = errors.New("frontend: request incomplete")
	errBareLF   = errors.New("a line of the request head ends in a bare LF, not CRLF")
	// errNotConn answers a handler that reads or writes the connection
	// itself: on gnet the loop and the worker own its bytes.
	errNotConn = errors.New("frontend: the gnet front end owns the connection's bytes")
	// errWriteStalled closes a connection whose client read nothing for
	// IdleTimeout while a response waited.
	errWriteStalled = errors.New("frontend: client stopped reading")

	continueLine = []byte("HTTP/1.1 100 Continue\r\n\r\n")
	lastChunk    = []byte("0\r\n\r\n")
	crlf         = []byte("\r\n")
)

type gconn struct {
	s             *GNet
	c             *evloop.Conn
	local, remote net.Addr
	client        netip.AddrPort // remote's, worked out once (ClientAddr)

	// Owned by the event loop.
	next      *fasthttp.RequestCtx // parsed into; kept while incomplete
	need      int                  // bytes the head request needs before a reparse (0: unknown)
	scanned   chunkScan            // the head request's chunked body, as far as scanned
	continued bool                 // 100 Continue queued for the head request
	stopped   bool                 // no more requests: Connection: close, a parse error, Shutdown
	refused   bool                 // over its address's cap, answered 429 (refuse.go)
	closed    bool                 // OnClose ran
	lingered  int                  // bytes discarded while lingering (linger.go)
	sniffed   bool                 // its first bytes are not HTTP/2's preface (h2c.go)
	handed    bool                 // h2c: the HTTP/2 server took it with its place under the cap
	tls       *loopTLS             // nil: plain (gnet_tls.go)
	// stalled: the writer waits until OutboundBuffered() <= stallLimit.
	stalled    bool
	stallLimit int

	// Serving on the loop (see loop.go): the request served there, nil
	// when none; the task it moved to a worker; the pod's connection of
	// its Send in flight, nil when none. Only while no worker runs.
	ls       *loopState
	loop     Loop
	cur      *fasthttp.RequestCtx
	task     Task
	up       *upConn
	relaying *upConn // the pod's connection of a stream relayed on the loop
	lchunks  loopChunks

	// Read by OnTick's idle sweep.
	// lastRead is when (the coarse clock) the last traffic came, or the
	// last answer ended: a connection's idle time runs from both.
	lastRead atomic.Int64
	// partial: some of a request came (on TLS, maybe only part of a
	// record); fresh: nothing came yet on this new connection, which owes
	// its first request within ReadTimeout too. dueSince is since when a
	// request is due (the connection's open, the first byte, or the end of
	// the answer before it), read off the clock: its coarse copy lags by
	// up to a tick, more than a ReadTimeout may be, and a request would be
	// cut before its time. ReadTimeout
	// bounds a request's whole reading, however its bytes trickle in, as
	// fasthttp's does (nginx's client_header_timeout); IdleTimeout the
	// wait for one to begin.
	partial, fresh atomic.Bool
	dueSince       atomic.Int64
	// unread: read left bytes of a request it could not parse yet, which
	// a shutdown lets come whole and answers (unlike a connection that
	// sent nothing, a TLS handshake, or a stopped one's discarded bytes).
	unread atomic.Bool
	// pending is the outbound bytes the loop last saw waiting for the
	// client, after a write or a look: a writer waiting on them (wait)
	// and the idle sweep (checkIdle) take a change for progress.
	pending   atomic.Int64
	checkIdle func()      // checkIdleOnLoop, bound once
	busy      atomic.Bool // a worker runs; changed under mu
	held      atomic.Bool // a request is served on the loop
	// lingerSince is when the connection began to linger, 0 if it does
	// not (linger.go); set on the loop.
	lingerSince atomic.Int64

	mu     sync.Mutex
	queue  []queued
	paused bool     // parsing stopped on a full queue; the worker wakes the loop
	left   bool     // closed, or failed, for the workers (ClientGone)
	gone   goneChan // ClientGone's; fired by leave
	onCut  cutters  // ClientCut's watchers, cut by leave

	// Owned by the queue's owner: the worker, or a stream's goroutine.
	wrote   chan error // one result per AsyncWritev
	written evloop.Callback
	drained evloop.Callback
	timer   *time.Timer
	failed  bool   // a write failed: the rest of the queue is dropped
	out     []byte // response header block
	// The pod's header lines PassHead gave passFor's answer; set on the
	// loop while the request is served there, read when it is rendered.
	pass     []byte
	passFor  *fasthttp.RequestCtx
	head     []byte   // a stream's header block, sent with its first chunk
	raw      bool     // the stream goes out unframed, ended by the close (HTTP/1.0)
	bodyless bool     // the stream answers HEAD: its header alone goes out
	iov      [][]byte // what the next AsyncWritev sends
	size     [20]byte // a chunk's size line
	chunks   chunkWriter
}

// queued is a parsed request, a parse error to answer (ctx then holds what
// was parsed), or, with ctx nil, a 100 Continue to send. A request begun on
// the loop comes with the task that finishes it, or, with served, answered
// already; with written too, its answer, the connection's last, was
// written and is draining (writeLast).
type queued struct {
	ctx     *fasthttp.RequestCtx
	err     error
	task    Task
	served  bool
	written bool
}

func newGConn(s *GNet, c *evloop.Conn) *gconn {
	gc := &gconn{s: s, c: c, local: c.LocalAddr(), remote: c.RemoteAddr(), wrote: make(chan error, 1)}
	gc.client, _ = addrPort(gc.remote)
	now := s.o.clock()
	gc.lastRead.Store(now)
	// A new connection owes its first request within ReadTimeout, as on
	// fasthttp (nginx's client_header_timeout), not the keep-alive idle
	// time.
	gc.fresh.Store(true)
	gc.dueSince.Store(now)
	// Bound once: a method value made per write would allocate.
	gc.written = func(c *evloop.Conn, err error) { gc.settle(c, err, maxOutbound) }
	gc.checkIdle = gc.checkIdleOnLoop
	gc.drained = func(c *evloop.Conn, err error) { gc.settle(c, err, 0) }
	gc.chunks.gc = gc
	gc.loop.gc = gc
	gc.lchunks.gc = gc
	return gc
}

// arrived marks a request due once bytes come to a connection that had
// none due; on the loop, before read.
func (gc *gconn) arrived() {
	if gc.partial.Load() || gc.c.InboundBuffered() == 0 {
		return
	}
	if gc.fresh.Load() {
		gc.fresh.Store(false) // due since the connection opened
	} else {
		gc.dueSince.Store(gc.ls.clock())
	}
	gc.partial.Store(true)
}

// answered restarts the connection's clocks at the end of an answer: its
// idle time, and the reading time of a request that came before it ended
// (one that comes after starts its own, in arrived).
func (gc *gconn) answered() {
	refresh(&gc.lastRead, gc.s.now.Load())
	if gc.partial.Load() {
		gc.dueSince.Store(gc.s.o.clock())
	}
}

// refresh stores v in a unless a holds it already: where each request
// passes and the value mostly stands (the coarse clock, an empty outbound
// buffer), a load instead of the store's xchg, a full barrier on amd64.
func refresh(a *atomic.Int64, v int64) {
	if a.Load() != v {
		a.Store(v)
	}
}

// read parses and queues every complete request buffered; on the loop.
func (gc *gconn) read() evloop.Action {
	c, parsed := gc.c, false
	for {
		n := gc.inbound()
		if gc.stopped {
			gc.discard()
			break
		}
		if n == 0 || n < gc.need || gc.cur != nil || gc.relaying != nil || !gc.room() {
			break
		}
		ctx, used, err := gc.parse(gc.peek(n))
		if err == errNeedMore {
			break
		}
		gc.consume(used)
		gc.need, gc.scanned, gc.continued, parsed = 0, chunkScan{}, false, true
		if err != nil || ctx.Request.ConnectionClose() || gc.s.shutdown.Load() {
			gc.stopped = true
		}
		gc.ls.serving.Add(1)
		if err == nil && gc.s.h.OnLoop && !gc.busy.Load() && c.OutboundBuffered() <= maxOutbound {
			gc.serveOnLoop(ctx)
			continue
		}
		gc.enqueue(queued{ctx: ctx, err: err})
	}
	n := gc.inbound()
	if parsed {
		if n > 0 {
			gc.dueSince.Store(gc.ls.clock())
		}
		gc.partial.Store(n > 0)
	}
	if gc.unread.Load() != (n > 0) {
		gc.unread.Store(n > 0)
	}
	// A client pipelining past a full queue: what it sent beyond one
	// largest request is refused.
	if n > gc.s.o.MaxHeaderBytes+gc.s.o.MaxBodyBytes+maxOutbound {
		return evloop.Close
	}
	return evloop.None
}

// serveOnLoop runs the handler on the loop for a request that arrived on a
// connection no worker serves (so nothing is queued before it).
func (gc *gconn) serveOnLoop(ctx *fasthttp.RequestCtx) {
	gc.cur = ctx
	gc.held.Store(true)
	ctx.Init2(gc, ctxLogger, false)
	gc.s.h.Serve(ctx)
	gc.afterLoop()
}

// afterLoop settles the request served on the loop once its handler or an
// Answered returned: an exchange still out waits; a detached task, or
// an answer that must close the connection or stream, goes to a worker;
// any other answer is written here.
func (gc *gconn) afterLoop() {
	ctx := gc.cur
	if gc.up != nil || gc.relaying != nil {
		return
	}
	gc.cur = nil
	// Stamped before it looks idle: an exchange longer than IdleTimeout
	// must not have the connection closed at the next tick.
	gc.answered()
	gc.held.Store(false)
	resp := &ctx.Response
	switch {
	case gc.task != nil:
		t := gc.task
		gc.task = nil
		gc.enqueue(queued{ctx: ctx, task: t})
	case resp.IsBodyStream():
		// A stream's writes wait for the client, on a worker.
		gc.enqueue(queued{ctx: ctx, served: true})
	case gc.last(ctx):
		gc.writeLast(ctx)
	default:
		if !gc.closed {
			gc.renderWhole(ctx)
			if err := gc.writev(gc.iov); err != nil {
				_ = gc.c.Close()
			}
		}
		gc.doneOnLoop(ctx)
	}
}

// writeLast writes the connection's last answer on the loop, then lets
// the connection linger (linger.go) once the loop holds none of it: at
// once when the socket took it all, as it mostly does; else a worker
// waits for the rest to drain, since the loop drops what the socket does
// not take as it closes.
// Handing the answer to a worker instead cost four thread handoffs per
// connection (to the worker, its write, the write's callback, the close).
func (gc *gconn) writeLast(ctx *fasthttp.RequestCtx) {
	gc.stopped = true
	if gc.closed {
		gc.doneOnLoop(ctx)
		return
	}
	ctx.Response.SetConnectionClose()
	gc.renderWhole(ctx)
	switch err := gc.writev(gc.iov); {
	case err != nil:
		_ = gc.c.Close()
	case gc.c.OutboundBuffered() == 0 && (gc.tls == nil || gc.tls.queued.Load() == 0):
		gc.lingerOrClose()
	default:
		gc.stalled, gc.stallLimit = true, 0
		gc.enqueue(queued{ctx: ctx, served: true, written: true})
		return
	}
	gc.doneOnLoop(ctx)
}

// resume parses what the client sent while its request was served on the
// loop; Send's end calls it, from the upstream connection's event.
func (gc *gconn) resume() {
	if gc.cur == nil && gc.relaying == nil && !gc.closed && gc.read() == evloop.Close {
		_ = gc.c.Close()
	}
}

// room reports whether the queue takes another request.
func (gc *gconn) room() bool {
	gc.mu.Lock()
	gc.paused = len(gc.queue) >= maxQueued
	gc.mu.Unlock()
	return !gc.paused
}

func (gc *gconn) enqueue(q queued) {
	gc.mu.Lock()
	gc.queue = append(gc.queue, q)
	start := !gc.busy.Load()
	gc.busy.Store(true)
	gc.mu.Unlock()
	if start {
		gc.s.workers.run(gc)
		gc.c.EventLoop().Yield()
	}
}

// parser reads one request out of the loop's bytes. fasthttp's parser asks
// its bufio.Reader for more until the request is complete; src answers
// errNeedMore past the end of what arrived and remembers it did, so any
// error after that means "incomplete", whichever way fasthttp wrapped it.
type parser struct {
	src peekReader
	br  *bufio.Reader
}

type peekReader struct {
	b     []byte
	short bool
	// eof: the peer closed after b, which then ends a body that runs
	// until the close.
	eof bool
}

func (r *peekReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		if r.eof {
			return 0, io.EOF
		}
		r.short = true
		return 0, errNeedMore
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// consumed is how many bytes of buf the parser used.
func (p *parser) consumed(buf []byte) int { return len(buf) - len(p.src.b) - p.br.Buffered() }

// parse reads the request at the head of buf: errNeedMore when it is not
// all there yet, else the request and the bytes it took, with the error of
// a request that cannot be served.
func (gc *gconn) parse(buf []byte) (*fasthttp.RequestCtx, int, error) {
	p := gc.ls.parser()
	p.src = peekReader{b: buf}
	p.br.Reset(&p.src)
	if gc.next == nil {
		gc.next = gc.ls.takeCtx() // reset as it was released (resetCtx)
	} else {
		gc.next.Request.Reset() // what a read of part of it parsed
	}
	req := &gc.next.Request

	err := req.Header.Read(p.br)
	// A head fasthttp took whole is checked too: its lines may end in one.
	// Refused, it comes to the error handler unread, as any head fasthttp
	// refuses (its fields are a reading of a framing pdlb does not take).
	if (err == nil || p.src.short) && bareLF(buf) {
		req.Header.Reset()
		err, p.src.short = errBareLF, false
	}
	if err == nil {
		head := p.consumed(buf)
		cl := req.Header.ContentLength()
		switch {
		case cl > gc.s.o.MaxBodyBytes:
			err = fasthttp.ErrBodyTooLarge
		case req.MayContinue() && !gc.continued && len(buf) == head && (cl > 0 || cl == -1):
			// The client waits for the go-ahead, which must follow the
			// responses to the requests before it; a request without a
			// body has none to send, and no reparse would come for it.
			gc.continued = true
			gc.enqueue(queued{})
			return nil, 0, errNeedMore
		case cl >= 0 && len(buf) < head+cl:
			gc.need = head + cl
			return nil, 0, errNeedMore
		case cl == -1 && gc.chunksDue(buf, head):
			return nil, 0, errNeedMore
		default:
			err = req.ContinueReadBody(p.br, gc.s.o.MaxBodyBytes, false)
		}
	}
	if err != nil && p.src.short {
		return nil, 0, errNeedMore
	}
	ctx := gc.next
	gc.next = nil
	return ctx, p.consumed(buf), err
}

// bareLF reports whether a line of the request head at the start of buf
// (up to the blank line that ends it, or all of buf while none does) ends
// in a bare LF. fasthttp's parser takes one for a line's end once a CRLF
// CRLF comes, even one past the head (in its body, in a request pipelined
// behind), and else waits for that CRLF CRLF until the read timeout.
func bareLF(buf []byte) bool {
	began := false // past the blank lines a request line may follow
	for at := 0; ; {
		i := bytes.IndexByte(buf[at:], '\n')
		switch {
		case i < 0:
			return false
		case i == 0 || buf[at+i-1] != '\r':
			return true
		case i == 1 && began:
			return false // the blank line that ends the head
		}
		began = began || i > 1
		at += i + 1
	}
}

// chunksDue says the chunked body in buf is plainly not whole yet, and
// sets need to the length to wait for (chunkScan.need).
func (gc *gconn) chunksDue(buf []byte, head int) bool {
	gc.need = gc.scanned.need(buf, head, gc.s.o.MaxBodyBytes)
	return gc.need > 0
}

// chunkScan is how far the chunked body of the request at the head of the
// buffer has been scanned: at, the start of the next chunk's size line;
// body, the bytes of the chunks before it. Zero: not scanned yet.
type chunkScan struct{ at, body int }

// need scans the chunked body in buf (its head head bytes long) from
// where the last scan stopped, past every chunk wholly there, so that a
// body that comes in many reads is parsed once it may be whole, not again
// at each read (each parse decodes it from its start). It returns the
// length buf must reach before the next scan is worth it; 0 when the body
// may be whole or is not plainly well formed (the last chunk, a size line
// other than 1-15 hex digits with an optional extension and CRLF, data
// without its CRLF, more than max bytes in all): the parser says then.
func (s *chunkScan) need(buf []byte, head, max int) int {
	s.at = cmp.Or(s.at, head)
	for {
		lf := bytes.IndexByte(buf[s.at:], '\n')
		line := buf[s.at:]
		if lf >= 0 {
			line = line[:lf]
		}
		size, ok := chunkSize(line, lf >= 0)
		switch {
		case !ok:
			return 0
		case lf < 0:
			return len(buf) + 1
		case size == 0 || size > max-s.body:
			return 0
		}
		end := s.at + lf + 1 + size + 2 // the data and its CRLF
		if end > len(buf) {
			return end
		}
		if buf[end-2] != '\r' || buf[end-1] != '\n' {
			return 0
		}
		s.at, s.body = end, s.body+size
	}
}

// chunkSize reads a chunk's size line, without its LF: 1-15 hex digits,
// an optional extension (";" and anything but CR), then CR. A line not
// whole yet is ok while it may still become such a line.
func chunkSize(line []byte, whole bool) (size int, ok bool) {
	digits := 0
	for ; digits < len(line) && digits < 16; digits++ {
		v := hexValue(line[digits])
		if v < 0 {
			break
		}
		size = size<<4 | v
	}
	if digits > 15 || digits == 0 && (whole || len(line) > 0) {
		return 0, false
	}
	rest := line[digits:]
	if n := len(rest); n > 0 && rest[n-1] == '\r' {
		rest = rest[:n-1]
	} else if whole {
		return 0, false
	}
	if len(rest) > 0 && rest[0] != ';' || bytes.IndexByte(rest, '\r') >= 0 {
		return 0, false
	}
	return size, true
}

// hexValue is c's value as a hex digit, -1 when it is not one.
func hexValue(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// work serves the queue in order until it is empty or a stream takes it
// over (see stream).
func (gc *gconn) work() {
	for {
		q, ok := gc.take()
		if !ok {
			return
		}
		if q.ctx == nil {
			if !gc.failed {
				gc.iov = append(gc.iov[:0], continueLine)
				gc.fail(gc.flush(false))
			}
			continue
		}
		if !gc.failed {
			if gc.serve(q) {
				return
			}
		} else if q.task != nil || q.served {
			gc.end(q)
		}
		gc.done(q)
	}
}

// take removes the queue's head, or marks the connection idle when the
// queue is empty.
func (gc *gconn) take() (queued, bool) {
	gc.mu.Lock()
	if len(gc.queue) == 0 {
		gc.idle()
		return queued{}, false
	}
	q := gc.queue[0]
	n := copy(gc.queue, gc.queue[1:])
	gc.queue[n] = queued{}
	gc.queue = gc.queue[:n]
	gc.mu.Unlock()
	return q, true
}

// rest marks the connection idle if its queue is empty and reports whether
// it did.
func (gc *gconn) rest() bool {
	gc.mu.Lock()
	if len(gc.queue) > 0 {
		gc.mu.Unlock()
		return false
	}
	gc.idle()
	return true
}

// idle, with mu held and the queue empty, marks the connection idle and
// unlocks mu, waking the loop if it stopped parsing for a full queue.
func (gc *gconn) idle() {
	// Its idle time runs from here, not from its last request's arrival.
	gc.answered()
	gc.busy.Store(false)
	wake := gc.paused
	gc.mu.Unlock()
	if wake {
		_ = gc.c.Wake(nil)
	}
}

// end ends, on a connection whose write failed (or whose last answer
// went), a request its handler began: the queue's other requests are
// dropped, but a task it detached or a stream it started holds what the
// request took (an in-flight slot, a pod's charge), which only its end
// gives back. The task runs with its client gone (so a pod call is cut at
// once), the stream's writer into a writer that fails; nothing is
// written, so nothing waits on the connection's write results.
func (gc *gconn) end(q queued) {
	gc.leave()
	if q.task != nil {
		q.task.Run()
	}
	if body, ok := q.ctx.Response.BodyStream().(streamBody); ok {
		_, _ = body.WriteTo(failedWriter{net.ErrClosed})
	}
}

// leave tells the workers the client is gone (ClientGone): it closed the
// connection, or a write failed and nothing more can reach it.
func (gc *gconn) leave() {
	gc.mu.Lock()
	if !gc.left {
		gc.left = true
		gc.gone.fire()
		gc.onCut.cut()
	}
	gc.mu.Unlock()
}

// Watch is ClientCut's for gc.
func (gc *gconn) Watch(w upstream.Cutter) {
	gc.mu.Lock()
	if gc.left {
		gc.mu.Unlock()
		w.Cut()
		return
	}
	gc.onCut.add(w)
	gc.mu.Unlock()
}

func (gc *gconn) Unwatch(w upstream.Cutter) {
	gc.mu.Lock()
	gc.onCut.remove(w)
	gc.mu.Unlock()
}

// done releases a served request.
func (gc *gconn) done(q queued) {
	releaseCtx(q.ctx)
	gc.ls.serving.Add(-1)
}

// doneOnLoop is done for a request served on the loop, whose context the
// loop keeps for its next.
func (gc *gconn) doneOnLoop(ctx *fasthttp.RequestCtx) {
	gc.ls.giveCtx(ctx)
	gc.ls.serving.Add(-1)
}

// fail closes the connection after a failed write; the requests still
// queued are dropped (work).
func (gc *gconn) fail(err error) {
	if err != nil {
		gc.failed = true
		_ = gc.c.Close()
	}
}

// ctxLogger is what RequestCtx.Logger writes to, as on fasthttp's server.
var ctxLogger fasthttp.Logger = log.Default()

// serve runs the handler and writes its response. A response that is a
// StreamWriter's stream is written by a goroutine of its own (see stream),
// and serve reports it handed the queue over.
func (gc *gconn) serve(q queued) bool {
	ctx := q.ctx
	if q.written {
		gc.wrapUp(gc.wait(), true)
		return false
	}
	switch {
	case q.task != nil:
		q.task.Run()
	case q.served:
	case q.err != nil:
		ctx.Init2(gc, ctxLogger, false)
		gc.s.h.Error(ctx, q.err)
	default:
		ctx.Init2(gc, ctxLogger, false)
		gc.s.h.Serve(ctx)
	}
	resp := &ctx.Response
	last := q.err != nil || gc.last(ctx)
	if last || resp.IsBodyStream() && !ctx.Request.Header.IsHTTP11() {
		// HTTP/1.0 has no chunked framing: its stream ends with the
		// connection (startChunked).
		last = true
		resp.SetConnectionClose()
	}
	if _, ok := resp.BodyStream().(streamBody); ok {
		go gc.stream(q, last)
		return true
	}
	var err error
	if resp.IsBodyStream() {
		err = gc.writeStream(ctx, last)
	} else {
		err = gc.writeWhole(ctx, last)
	}
	gc.wrapUp(err, last)
	return false
}

// last reports whether ctx's response is the connection's last. An
// HTTP/1.0 request closes unless it says keep-alive (fasthttp's
// ConnectionClose says so).
func (gc *gconn) last(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.ConnectionClose() || ctx.Response.ConnectionClose() || gc.s.shutdown.Load()
}

// stream writes a StreamWriter's stream, then serves the rest of the queue
// on a worker. A stream waits for its pod's next event nearly all its life,
// thousands at once, so what it holds meanwhile is kept small:
//   - its own goroutine: a worker's stack grew to the handler's depth
//     (8 KiB), while one that only relays stays at a few KiB;
//   - no request context: the stream writer must not touch ctx (as with
//     fasthttp's SetBodyStreamWriter), so once the response header is
//     rendered the context (request, response, their headers: about 3 KiB)
//     goes back to the pool.
//
// Measured (bench/sse, 4,000 streams): 7.9 KiB of stack per stream on the
// worker, 4.0 on its own goroutine.
func (gc *gconn) stream(q queued, last bool) {
	body := q.ctx.Response.BodyStream().(streamBody)
	gc.startChunked(q.ctx)
	releaseCtx(q.ctx)
	_, err := body.WriteTo(&gc.chunks)
	gc.wrapUp(gc.endChunked(err, last), last)
	gc.ls.serving.Add(-1)
	if !gc.rest() {
		gc.s.workers.run(gc)
	}
}

// wrapUp closes the connection after a failed write or its last response.
func (gc *gconn) wrapUp(err error, last bool) {
	gc.fail(err)
	if err == nil && last {
		gc.failed = true
		gc.closeLast()
	}
}

func (gc *gconn) writeWhole(ctx *fasthttp.RequestCtx, last bool) error {
	gc.renderWhole(ctx)
	return gc.flush(last)
}

// renderWhole puts ctx's whole response, header block and body, in gc.iov.
func (gc *gconn) renderWhole(ctx *fasthttp.RequestCtx) {
	resp := &ctx.Response
	body := resp.Body()
	resp.Header.SetContentLength(len(body))
	if ctx.IsHead() {
		body = nil
	}
	if !resp.ConnectionClose() && !ctx.Request.Header.IsHTTP11() {
		// An HTTP/1.0 client keeps the connection only when told so.
		resp.Header.Set(fasthttp.HeaderConnection, "keep-alive")
	}
	gc.appendHead(ctx)
	gc.iov = append(gc.iov[:0], gc.out, body)
}

// writeStream sends a chunked response whose body is any other stream
// than a StreamWriter's (fasthttp's own SetBodyStreamWriter, which runs its
// writer in a goroutine of its own behind a pipe), copied chunk by chunk.
func (gc *gconn) writeStream(ctx *fasthttp.RequestCtx, last bool) error {
	resp := &ctx.Response
	gc.startChunked(ctx)
	err := gc.copyStream(resp.BodyStream())
	// Tells a stream writer still running that the client is gone.
	_ = resp.CloseBodyStream()
	return gc.endChunked(err, last)
}

// startChunked renders ctx's header block, which goes out with the first
// chunk: chunked, or for HTTP/1.0 unframed; and notes whether the body
// goes out at all (not for HEAD).
func (gc *gconn) startChunked(ctx *fasthttp.RequestCtx) {
	gc.raw, gc.bodyless = !ctx.Request.Header.IsHTTP11(), ctx.IsHead()
	if gc.raw {
		setUnframed(&ctx.Response.Header)
	} else {
		ctx.Response.Header.SetContentLength(-1)
	}
	gc.appendHead(ctx)
	gc.head = gc.out
}

// endChunked sends the last chunk of a stream that ended with err (nil: the
// whole body was sent).
func (gc *gconn) endChunked(err error, last bool) error {
	if err != nil {
		return err
	}
	gc.iov = append(gc.iov[:0], gc.head)
	if !gc.raw && !gc.bodyless {
		gc.iov = append(gc.iov, lastChunk)
	}
	gc.head = nil
	return gc.flush(last)
}

var copyBufs = sync.Pool{New: func() any { return new([streamBufferBytes]byte) }}

func (gc *gconn) copyStream(r io.Reader) error {
	buf := copyBufs.Get().(*[streamBufferBytes]byte)
	defer copyBufs.Put(buf)
	for {
		n, err := r.Read(buf[:])
		if n > 0 {
			if _, werr := gc.chunks.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// chunkWriter frames what a stream writer flushes as one HTTP chunk.
type chunkWriter struct{ gc *gconn }

func (w *chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	gc := w.gc
	switch {
	case gc.bodyless:
		if gc.head == nil {
			return len(p), nil
		}
		gc.iov = append(gc.iov[:0], gc.head)
	case gc.raw:
		gc.iov = append(gc.iov[:0], gc.head, p)
	default:
		size := strconv.AppendInt(gc.size[:0], int64(len(p)), 16)
		size = append(size, crlf...)
		gc.iov = append(gc.iov[:0], gc.head, size, p, crlf)
	}
	gc.head = nil
	if err := gc.flush(false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush hands gc.iov to the loop and waits until the loop wrote it or
// copied it into the outbound buffer, and that buffer is below its bound:
// maxOutbound, or empty for the last response before a close (the loop
// drops what it cannot write at once when it closes).
func (gc *gconn) flush(last bool) error {
	cb := gc.written
	if last {
		cb = gc.drained
	}
	if err := gc.asyncWritev(gc.iov, cb); err != nil {
		return err
	}
	return gc.wait()
}

func (gc *gconn) wait() error {
	poll := time.Millisecond
	var waited time.Duration // without progress
	last := gc.pending.Load()
	for {
		if gc.timer == nil {
			gc.timer = time.NewTimer(poll)
		} else {
			gc.timer.Reset(poll)
		}
		select {
		case err := <-gc.wrote:
			gc.timer.Stop()
			return err
		case <-gc.timer.C:
			if p := gc.pending.Load(); p != last {
				// The client took some of what waits: a slow reader,
				// not a stalled one.
				last, waited = p, 0
			}
			if waited += poll; waited > gc.s.o.IdleTimeout {
				return errWriteStalled
			}
			// OnTraffic checks the outbound buffer.
			_ = gc.c.Wake(nil)
			poll = min(2*poll, maxPoll)
		}
	}
}

// settle runs on the loop after an AsyncWritev: it releases the writer, or
// marks it stalled while more than limit bytes wait for the client.
func (gc *gconn) settle(c *evloop.Conn, err error, limit int) {
	if err == nil && gc.closed {
		err = net.ErrClosed
	}
	n := c.OutboundBuffered()
	if err == nil && n > limit {
		gc.stalled, gc.stallLimit = true, limit
		return
	}
	gc.pending.Store(int64(n)) // the idle sweep's baseline
	gc.wrote <- err
	c.EventLoop().Yield()
}

var ctxPool = sync.Pool{New: func() any { return new(fasthttp.RequestCtx) }}

func acquireCtx() *fasthttp.RequestCtx { return ctxPool.Get().(*fasthttp.RequestCtx) }

func releaseCtx(ctx *fasthttp.RequestCtx) {
	resetCtx(ctx)
	ctxPool.Put(ctx)
}

func resetCtx(ctx *fasthttp.RequestCtx) {
	_ = ctx.Response.CloseBodyStream()
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.ResetUserValues()
}

// gconn is the net.Conn a RequestCtx reports (its addresses); the bytes
// belong to the loop and the worker.
var _ net.Conn = (*gconn)(nil)

func (gc *gconn) Read([]byte) (int, error)         { return 0, errNotConn }
func (gc *gconn) Write([]byte) (int, error)        { return 0, errNotConn }
func (gc *gconn) Close() error                     { return gc.c.Close() }
func (gc *gconn) LocalAddr() net.Addr              { return gc.local }
func (gc *gconn) RemoteAddr() net.Addr             { return gc.remote }
func (gc *gconn) SetDeadline(time.Time) error      { return nil }
func (gc *gconn) SetReadDeadline(time.Time) error  { return nil }
func (gc *gconn) SetWriteDeadline(time.Time) error { return nil }

// Package upstream is the gateway's side of its connections to pods: a
// connection that redials a pod that closed it while it idled, finds its
// way back from a response (ConnOf), and a call that may be cut while it
// waits (Do, DoCut).
package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"pdlb/internal/mono"
	"pdlb/internal/rawio"
	"pdlb/lb/limits"
	"pdlb/lb/pool"
)

// fasthttp's client sets a connection's read deadline once per request, from
// the request timeout, and leaves it there while the caller streams the body.
// A stream outlives any sensible response timeout, so the relay must own the
// deadline once the headers are in: it moves it forward by the idle timeout
// before every read.
//
// The client does not hand out its connections, but it does record the
// connection's LocalAddr on the response. Conn returns a LocalAddr
// that points back at itself, which lets the relay find the connection of a
// response without any table.
//
// Nor does the client look at a kept connection before it sends on it. A
// pod that closed one while it idled (a crash, a restart, a keep-alive
// shorter than upstream.keepalive_timeout) would get the request written
// into the void and the client would answer 502 ("closed connection before
// returning the first response byte"), though the pod never saw it. So the
// first write of each request on a kept connection first peeks at the
// socket; a pod's close (or bytes nobody asked for) there makes the
// connection dial the pod again and send on the new socket. A pod that is
// gone refuses that dial, which the gateway retries on another pod. A close
// that comes after the peek, crossing the request on the wire, fails the
// call before a byte of the answer came: DoCut then sends it again (Stale).
// A watched call (DoCut's, which sends again so) skips the peek, a system
// call a request, on a connection whose pod answered within peekAfter:
// no pod closes such a one as idle, or sends it what nobody asked for (a
// 408) before its idle timeout.
//
// A plain connection holds the last write of a request (at most maxHeld
// bytes) until its caller reads the answer, and that read writes it and
// waits for the answer in one step (sendThenRead): a read of its own
// right after the request would find nothing yet, a system call a call.
//
// A pod dialed with TLS has the TLS session inside the Conn, over its
// socket: the peek looks at the socket under it, where a pod's close
// (close_notify, then the end of the stream) or any record nobody asked
// for waits unread, and a new socket gets a handshake of its own.
type Conn struct {
	cur   atomic.Pointer[podSocket]
	local connAddr
	// What a new socket is dialed with.
	fds     *limits.FDs
	addr    string
	timeout time.Duration
	tls     *tls.Config // nil: plain
	// kept: a response was read, so the next write starts a request on a
	// kept connection; answeredAt: when (mono.Now) that response's first
	// bytes came; sendsAgain: the request about to go out is sent again
	// should the connection prove Stale (watchedBody.begin). They, and
	// writeDeadline, belong to the goroutine that has the connection from
	// the client's pool.
	kept, sendsAgain bool
	answeredAt       int64
	writeDeadline    time.Time
	// sentKept: the request last written went out on a kept socket and
	// no byte has come back since; stale: that socket then failed as a
	// pod's close fails it (Stale). The same goroutine's as kept.
	sentKept, stale bool
	// hook, when set, runs before each read of the socket; the same
	// goroutine's as kept (SetReadHook).
	hook ReadHook
	// held is the last bytes of the request written, sent by the read of
	// its answer (sendThenRead); nil when none wait. They live in
	// heldBuf, kept for the next request (at most maxHeld bytes). The
	// same goroutine's as kept.
	held, heldBuf []byte
	// heldIO is sendThenRead's state for heldStep, and heldFn that
	// method's value, made once.
	heldIO struct {
		p      []byte
		off, n int
		err    error
	}
	heldFn func(fd uintptr) bool
	closed atomic.Bool
}

// A ReadHook is told before each read of a Conn's socket, which is when
// its reader has used up every byte that came before: a relay sends its
// client what those bytes made there, so events that came together leave
// together, and moves its idle deadline only when it may wait. An error
// fails that read.
type ReadHook interface{ BeforeRead() error }

// SetReadHook sets (nil: clears) what c's reads tell first. Called by the
// goroutine that has c from the client's pool, which clears it before
// giving c back.
func (c *Conn) SetReadHook(h ReadHook) { c.hook = h }

// podSocket is one socket of an Conn.
type podSocket struct {
	// The socket: deadlines and the peek act on it directly.
	net.Conn
	// rw carries the requests and answers: the socket, or tls over it
	// (under is then the socket as tls writes it).
	rw    io.ReadWriter
	tls   *tls.Conn
	under *tlsSocket
	raw   syscall.RawConn
	// peekFn is peek as a value made once, so a peek allocates nothing;
	// peek's error and buffer.
	peekFn func(fd uintptr)
	peekE  syscall.Errno
	peekB  [1]byte
	// readBy and writeBy are the deadlines last set on the socket.
	readBy, writeBy deadline
}

// deadline is a socket deadline as last set: when it fires, on the
// monotonic clock (mono, so a step of the wall clock moves nothing), and
// whether one is set. mu makes setting and recording one step: a PD call
// tightens the read deadline of a decode answer its relay is reading.
type deadline struct {
	mu    sync.Mutex
	armed bool
	at    time.Duration
}

// set sets the deadline to t with set, or leaves it where it is when
// that is no earlier than t and no later by more than a 64th of the time
// to t. fasthttp's client moves both deadlines at every request, each
// move a change to a timer in the runtime's poller; set, a deadline is
// placed that 64th late, so the requests that follow mostly fit under
// it. A timeout fires at most that late.
func (d *deadline) set(t time.Time, set func(time.Time) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var at time.Duration
	if t.IsZero() {
		if !d.armed {
			return nil
		}
	} else {
		// As the runtime places it: now on its clock, plus t.Sub(now),
		// which is monotonic when t has a monotonic reading and wall
		// time when it does not (time.Unix).
		now := time.Now()
		until := t.Sub(now)
		slack := max(until/64, 0)
		at = addSat(time.Duration(mono.Of(now)), until)
		if d.armed && d.at >= at && d.at <= addSat(at, slack) {
			return nil
		}
		t, at = t.Add(slack), addSat(at, slack)
	}
	if err := set(t); err != nil {
		return err
	}
	d.armed, d.at = !t.IsZero(), at
	return nil
}

// addSat is a+b, held at the largest duration rather than wrapping (a
// deadline centuries away).
func addSat(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func (s *podSocket) setReadDeadline(t time.Time) error {
	return s.readBy.set(t, s.Conn.SetReadDeadline)
}

func (s *podSocket) setWriteDeadline(t time.Time) error {
	return s.writeBy.set(t, s.Conn.SetWriteDeadline)
}

// dialSocket dials a pod through fds, and makes the TLS handshake
// within timeout when tc is set.
func dialSocket(fds *limits.FDs, addr string, timeout time.Duration, tc *tls.Config) (*podSocket, error) {
	c, err := fds.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		_ = c.Close()
		return nil, fmt.Errorf("pod connection %T has no socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	s := &podSocket{Conn: c, rw: c, raw: raw}
	s.peekFn = s.peek
	if tc != nil {
		s.under = &tlsSocket{Conn: c, raw: raw}
		t := tls.Client(s.under, tc)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := t.HandshakeContext(ctx); err != nil {
			_ = c.Close()
			// A dial error: nothing was sent, another pod may be tried.
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: c.RemoteAddr(), Err: fmt.Errorf("TLS handshake with the pod failed: %w", err)}
		}
		s.rw, s.tls = t, t
	}
	return s, nil
}

// Close closes the socket, a TLS session's after its close_notify alert:
// RFC 8446 6.1 requires one, and a pod's TLS library may take a close
// without it for a failed connection (OpenSSL 3: "unexpected eof while
// reading").
func (s *podSocket) Close() error {
	if s.tls == nil {
		return s.Conn.Close()
	}
	s.under.closing.Store(true)
	return s.tls.Close()
}

// tlsSocket is the socket under a pod's TLS session. Once the session
// closes, a write (its close_notify alert) goes out only if the socket's
// buffer has room for it at once: crypto/tls would wait up to 5 s, and a
// pod that stopped reading must not hold up a cut.
type tlsSocket struct {
	net.Conn
	raw     syscall.RawConn
	closing atomic.Bool
}

func (s *tlsSocket) Write(p []byte) (int, error) {
	if !s.closing.Load() {
		return s.Conn.Write(p)
	}
	var n int
	var err error
	if cerr := s.raw.Write(func(fd uintptr) bool {
		// The socket is non-blocking: a full buffer answers EAGAIN.
		n, err = syscall.Write(int(fd), p)
		return true
	}); cerr != nil {
		return 0, cerr
	}
	if n = max(n, 0); n < len(p) && err == nil {
		err = io.ErrShortWrite // the alert went out in part: no use to the pod
	}
	return n, err
}

// peerDone reports whether the pod closed the socket or sent bytes no
// request asked for: either way it is no use for the next request.
func (s *podSocket) peerDone() bool {
	// Only "nothing to read yet" (EAGAIN) means the socket is as it was
	// left: end of stream, bytes, or a reset do not.
	return s.raw.Control(s.peekFn) != nil || s.peekE != syscall.EAGAIN
}

// peek is recv(MSG_PEEK|MSG_DONTWAIT) of one byte, made directly: it never
// blocks, and the library's Recvfrom allocates a socket address per call.
func (s *podSocket) peek(fd uintptr) {
	_, _, s.peekE = syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&s.peekB[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
}

// connAddr is a net.Addr that knows its connection.
type connAddr struct {
	net.Addr
	conn *Conn
}

func (c *Conn) LocalAddr() net.Addr  { return &c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.cur.Load().RemoteAddr() }

func (c *Conn) Read(p []byte) (int, error) {
	if c.hook != nil {
		if err := c.hook.BeforeRead(); err != nil {
			return 0, err
		}
	}
	var n int
	var err error
	if s := c.cur.Load(); c.held != nil {
		n, err = c.sendThenRead(s, p)
	} else {
		n, err = s.rw.Read(p)
	}
	if n > 0 {
		if !c.kept {
			c.answeredAt = mono.Now()
		}
		c.kept, c.sentKept = true, false
	} else {
		c.failed(err)
	}
	return n, err
}

// failed marks c Stale when err, which failed a request sent on a kept
// socket or the read of its answer before a byte came, is the pod's
// close; it returns err.
func (c *Conn) failed(err error) error {
	if err != nil && c.sentKept {
		c.stale = closedByPeer(err)
	}
	return err
}

func (c *Conn) Write(p []byte) (int, error) {
	s, err := c.startWrite()
	if err != nil {
		return 0, err
	}
	if s.tls == nil && len(p) <= maxHeld {
		c.held = append(c.heldBuf[:0], p...)
		c.heldBuf = c.held
		return len(p), nil
	}
	n, err := s.rw.Write(p)
	return n, c.failed(err)
}

// writeRequest renders up (AppendRequest) and writes it as Write would,
// rendered where Write would have copied it to when it is held.
func (c *Conn) writeRequest(up *fasthttp.Request) error {
	s, err := c.startWrite()
	if err != nil {
		return err
	}
	b := AppendRequest(c.heldBuf[:0], up)
	if s.tls == nil && len(b) <= maxHeld {
		c.held, c.heldBuf = b, b
		return nil
	}
	if cap(b) <= maxHeld {
		c.heldBuf = b
	}
	_, err = s.rw.Write(b)
	return c.failed(err)
}

// startWrite readies c for a write: a kept socket the pod is done with
// is dialed again first, and bytes an earlier write held go out. It
// returns the socket the write goes to.
func (c *Conn) startWrite() (*podSocket, error) {
	s := c.cur.Load()
	if c.kept {
		c.sentKept = true
		if !(c.sendsAgain && mono.Now()-c.answeredAt < int64(peekAfter)) && s.peerDone() {
			var err error
			if s, err = c.redial(s); err != nil {
				return nil, err
			}
			c.sentKept = false
		}
	}
	c.kept, c.sendsAgain = false, false
	if err := c.sendHeld(s); err != nil {
		return nil, c.failed(err)
	}
	return s, nil
}

// maxHeld is the most bytes of a write a plain Conn holds back for the
// read of the answer (sendThenRead): fasthttp's client writes a request
// through a 4 KB buffer, and a body past it in one piece.
const maxHeld = 16 << 10

// sendHeld writes the bytes a write held back, if any, waiting for room
// on the socket as a write does.
func (c *Conn) sendHeld(s *podSocket) error {
	b := c.held
	if b == nil {
		return nil
	}
	c.held = nil
	_, err := s.rw.Write(b)
	return err
}

// sendThenRead writes the bytes the request's last write held back, then
// waits for the answer and reads it into p. Done as a plain write and
// read, the read would come before the pod could answer, a system call
// that only ever says EAGAIN before the runtime's poller waits; within
// one RawRead the poller's readiness is reset before the write, so the
// answer's arrival, however soon, wakes the wait. When the socket takes
// only part of the bytes, the rest is written as a write waits for room,
// and the read follows as a plain one.
func (c *Conn) sendThenRead(s *podSocket, p []byte) (int, error) {
	h := &c.heldIO
	h.p, h.off, h.n, h.err = p, 0, 0, nil
	rerr := s.raw.Read(c.heldFn)
	n, err, b := h.n, h.err, c.held
	h.p = nil
	sent := h.off == len(b)
	if rerr == nil && err == nil && !sent {
		c.held = b[h.off:]
		if err = c.sendHeld(s); err != nil {
			return 0, err
		}
		return s.rw.Read(p)
	}
	c.held = nil
	switch {
	case rerr != nil:
		// The deadline, or a Close: as a read fails then.
		if oe, ok := rerr.(*net.OpError); ok {
			oe.Op, oe.Source = "read", s.LocalAddr()
		}
		err = rerr
	case err != io.EOF && err != nil:
		// A system call's error, wrapped as net wraps it.
		op := "read"
		if !sent {
			op = "write"
		}
		err = &net.OpError{Op: op, Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: os.NewSyscallError(op, err)}
	}
	return n, err
}

// heldStep is sendThenRead's step, called with the socket until it says
// done: the held bytes' write first (done when the socket took only part
// of them), then the read of the answer once the pod sent one. Made a
// method value once per Conn, so the exchange allocates nothing.
func (c *Conn) heldStep(fd uintptr) bool {
	h := &c.heldIO
	if b := c.held; h.off < len(b) {
		m, err := rawio.Send(int(fd), b[h.off:])
		switch {
		case err == syscall.EAGAIN:
			return true
		case err != nil:
			h.err = err
			return true
		}
		h.off += m
		return h.off < len(b)
	}
	m, err := rawio.Recv(int(fd), h.p)
	switch {
	case err == syscall.EAGAIN:
		return false
	case err != nil:
		h.err = err
	case m == 0 && len(h.p) > 0:
		h.err = io.EOF
	default:
		h.n = m
	}
	return true
}

// peekAfter is how long after a pod's answer began a watched call's
// request goes out on its connection unlooked-at. The engines' HTTP
// servers close a connection as idle after 5 s (uvicorn's
// timeout_keep_alive, under vLLM, SGLang and TensorRT-LLM alike).
const peekAfter = time.Second

// Stale reports whether the last request on c went out on a kept
// connection that then failed as the pod's close fails it (end of stream,
// reset, broken pipe) before a byte of an answer came: the pod closed it
// as it idled, the close crossing the request, and never took the request.
func (c *Conn) Stale() bool { return c.stale }

// closedByPeer says err is how a socket fails once its peer closed it.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// redial replaces the socket old, which the pod is done with, by a new one.
// Its error wraps the dial's (the request went nowhere: NotSent): wrapped,
// because fasthttp turns an error that says Timeout() itself into its
// ErrTimeout, which would hide the dial.
func (c *Conn) redial(old *podSocket) (*podSocket, error) {
	_ = old.Close()
	s, err := dialSocket(c.fds, c.addr, c.timeout, c.tls)
	if err != nil {
		return nil, fmt.Errorf("the pod closed a kept connection, and dialing it again failed: %w", err)
	}
	if !c.writeDeadline.IsZero() {
		_ = s.setWriteDeadline(c.writeDeadline)
	}
	c.cur.Store(s)
	// A Close while this dialed closed old; it must close s too.
	if c.closed.Load() {
		_ = s.Close()
		return nil, net.ErrClosed
	}
	return s, nil
}

// Close may come from another goroutine (a client that left, a leg given
// up) while the connection's own redials.
func (c *Conn) Close() error {
	c.closed.Store(true)
	return c.cur.Load().Close()
}

// Deadlines are set by the goroutine that has the connection, and may
// fire a 64th of their distance late (deadline.set).
func (c *Conn) SetDeadline(t time.Time) error {
	c.writeDeadline = t
	s := c.cur.Load()
	return errors.Join(s.setReadDeadline(t), s.setWriteDeadline(t))
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.cur.Load().setReadDeadline(t)
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.writeDeadline = t
	return c.cur.Load().setWriteDeadline(t)
}

// Dialer dials pods through fds (nil: no guard) and wraps the
// connections.
func Dialer(fds *limits.FDs) pool.DialFunc {
	return func(addr string, timeout time.Duration, tc *tls.Config) (net.Conn, error) {
		s, err := dialSocket(fds, addr, timeout, tc)
		if err != nil {
			return nil, err
		}
		uc := &Conn{fds: fds, addr: addr, timeout: timeout, tls: tc}
		uc.heldFn = uc.heldStep
		uc.cur.Store(s)
		uc.local = connAddr{Addr: s.LocalAddr(), conn: uc}
		return uc, nil
	}
}

// ConnOf returns the connection a response was read from, nil if it did not
// come through dialUpstream.
func ConnOf(resp *fasthttp.Response) *Conn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.conn
	}
	return nil
}

// A Cut is how a call learns it is given up (its client left, its pod was
// found dead). Watch arranges for c.Cut to run once the call is cut (at
// once if it is already), on whichever goroutine cuts it; Unwatch undoes
// that, though c.Cut may still run while or after it returns (DoCut's
// then does nothing). Watchers are kept by identity, so a call costs no
// allocation. A nil Cut never cuts.
type Cut interface {
	Watch(c Cutter)
	Unwatch(c Cutter)
}

// Cutter is what a Cut cuts: an alias, so packages below this one (the
// pool) can watch for calls without importing it.
type Cutter = interface{ Cut() }

// ChanCut is the Cut of a channel that is closed when the call is cut: a
// goroutine per watch waits on it. A nil channel is a nil Cut.
func ChanCut(ch <-chan struct{}) Cut { return ChansCut(ch, nil) }

// ChansCut is ChanCut of two channels, either of which cuts the call; a
// nil one never does.
func ChansCut(ch, or <-chan struct{}) Cut {
	if ch == nil && or == nil {
		return nil
	}
	return &chanCut{ch: ch, or: or}
}

type chanCut struct {
	ch, or <-chan struct{}
	mu     sync.Mutex
	stops  map[Cutter]chan struct{}
}

func (k *chanCut) Watch(c Cutter) {
	stop := make(chan struct{})
	k.mu.Lock()
	if k.stops == nil {
		k.stops = map[Cutter]chan struct{}{}
	}
	k.stops[c] = stop
	k.mu.Unlock()
	go func() {
		select {
		case <-k.ch:
			c.Cut()
		case <-k.or:
			c.Cut()
		case <-stop:
		}
	}()
}

func (k *chanCut) Unwatch(c Cutter) {
	k.mu.Lock()
	stop := k.stops[c]
	delete(k.stops, c)
	k.mu.Unlock()
	if stop != nil {
		close(stop)
	}
}

// DoCut is client.DoDeadline for a call that may be given up while a
// goroutine waits for the pod's answer: any of cuts (frontend.ClientCut,
// nil where the front end cannot tell; a request giving its leg up; the
// pod found dead) closes the pod's connection, which is how an engine
// learns to abort a request, and the call returns ErrCut. fasthttp's
// client cannot cancel a call, and does not say which connection it took.
//
// The connection is a pooled keep-alive one, so the cut must never reach
// it once it is back in the pool, serving another request. A whole answer
// (resp.StreamBody unset) is read by callWhole, which holds the connection
// until the watch ended. A stream is taken from fasthttp's client, which
// keeps the connection the call's until its body stream is closed, after
// DoDeadline has returned and the watch has ended; the request's body,
// handed over as a stream, learns which connection the client took as the
// client writes it (ConnOf: the response records the connection before
// the request goes out). Either way the state's compare-and-swap decides
// which of the two, the cut or the answer, came first.
//
// The answer's header is due by headBy (at the latest deadline), the rest
// of a whole answer by deadline: a header that is late fails with
// fasthttp.ErrTimeout, and the connection is closed, which aborts the
// request on the engine. head, when set, takes a whole answer's plain
// header lines (callWhole). With first, a streamed 200 answer's first body
// bytes are due by headBy too, and read into first (n of them): engines
// send a stream's head before its prefill (vLLM's and TensorRT-LLM's
// OpenAI servers), so the head alone says nothing of its first token. A
// stream with none by then fails as one without a head would,
// fasthttp.ErrTimeout (fasthttp.ErrConnectionClosed when the pod closed
// first), while the caller could still try another pod.
func DoCut(client *fasthttp.HostClient, up *fasthttp.Request, resp *fasthttp.Response, head *AnswerHead, headBy, deadline time.Time, first []byte, cuts ...Cut) (int, error) {
	if !headBy.Before(deadline) {
		headBy = deadline
	}
	if !resp.StreamBody {
		return 0, callWhole(client, up, resp, head, headBy, deadline, cuts)
	}
	if len(up.Body()) == 0 || !slices.ContainsFunc(cuts, func(c Cut) bool { return c != nil }) {
		err := doKept(client, up, resp, headBy)
		if err != nil {
			return 0, err
		}
		return readFirst(resp, first, headBy)
	}
	return doWatched(cuts, client, up, resp, headBy, first)
}

// doKept is client.DoDeadline, made again while it fails on a kept
// connection the pod closed as the request came (Conn.Stale): the pod
// never took it, so the call is the same call, not a retry. Each such
// connection leaves the pool, so the calls are as many as it held.
func doKept(client *fasthttp.HostClient, up *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	for {
		if err := client.DoDeadline(up, resp, deadline); !sentStale(err, resp) {
			return err
		}
	}
}

// sentStale says err ended a call on a kept connection its pod had closed
// (Conn.Stale).
func sentStale(err error, resp *fasthttp.Response) bool {
	c := ConnOf(resp)
	return err != nil && c != nil && c.Stale()
}

// doWatched is DoCut's call of up, whose body is not empty, while cuts
// are watched, through the read of the answer's first body bytes into
// first; the answer is taken as a stream.
func doWatched(cuts []Cut, client *fasthttp.HostClient, up *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, first []byte) (int, error) {
	body := up.Body()
	// Handing the body over as a stream would recycle the request's body
	// buffer; with KeepBodyBuffer it is only truncated, so body's bytes
	// stay put: nothing writes the request's body while the call runs.
	keep := up.KeepBodyBuffer
	up.KeepBodyBuffer = true
	w := &watchedBody{resp: resp, body: body}
	w.watchAll(cuts)
	// A call cut as it was watched (its client left already) is not made:
	// fasthttp would dial, then see the cut only as it reads the body.
	err := ErrCut
	for w.state.Load() == watching {
		// As doKept; the body is read anew, and records its new
		// connection (begin).
		w.off = 0
		up.SetBodyStream(w, len(body))
		if err = client.DoDeadline(up, resp, deadline); !sentStale(err, resp) {
			break
		}
	}
	var n int
	if err == nil {
		n, err = readFirst(resp, first, deadline)
	}
	w.unwatch(cuts)
	// The stream is spent: a retry on another pod sends the same bytes.
	up.SetBodyRaw(w.body)
	up.KeepBodyBuffer = keep
	if !w.answered() {
		// The connection is closed, or closing: whatever came is cut.
		if err == nil {
			CloseStream(resp, ErrCut)
		}
		return 0, ErrCut
	}
	return n, err
}

// readFirst reads the first body bytes of resp, a 200 answer taken as a
// stream, into first (none: nothing to read) by deadline. An answer
// without any closes its stream.
func readFirst(resp *fasthttp.Response, first []byte, deadline time.Time) (int, error) {
	if len(first) == 0 || resp.StatusCode() != fasthttp.StatusOK {
		return 0, nil
	}
	if c := ConnOf(resp); c != nil {
		_ = c.SetReadDeadline(deadline)
	}
	n, err := resp.BodyStream().Read(first)
	if n > 0 || err == nil || err == io.EOF {
		// An empty body ends at once; its relay reads io.EOF again.
		return n, nil
	}
	CloseStream(resp, err)
	switch {
	case pool.IsTimeout(err):
		return 0, fasthttp.ErrTimeout
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		// As the event loop's exchange ends when the pod closes then.
		return 0, fasthttp.ErrConnectionClosed
	}
	return 0, err
}

// ErrCut is DoCut's error for a call given up (cut closed) before the pod
// answered.
var ErrCut = errors.New("upstream: the call was cut")

// ErrPodDown ends an attempt given up while it waited for the first byte
// of an answer, because health checks found its pod dead.
var ErrPodDown = errors.New("upstream: health checks found the pod down before it answered")

// States of a watchedBody.
const (
	watching int32 = iota
	left           // cut: the connection is closed
	answered       // DoDeadline returned first
)

// watchedBody is a request body that records the connection it is
// written to, for DoCut.
type watchedBody struct {
	watch
	resp *fasthttp.Response
	body []byte
	off  int
}

func (w *watchedBody) Read(p []byte) (int, error) {
	if err := w.begin(); err != nil {
		return 0, err
	}
	n := copy(p, w.body[w.off:])
	w.off += n
	if w.off == len(w.body) {
		return n, io.EOF
	}
	return n, nil
}

// WriteTo writes the rest of the body in one Write: fasthttp copies a
// stream without one in 4 KB pieces, a write to the pod each once the
// request's buffer fills.
func (w *watchedBody) WriteTo(dst io.Writer) (int64, error) {
	if err := w.begin(); err != nil {
		return 0, err
	}
	n, err := dst.Write(w.body[w.off:])
	w.off += n
	return int64(n), err
}

// begin records, before the body's first byte goes, the connection it
// goes on, and fails it when the call was cut before.
func (w *watchedBody) begin() error {
	if w.off > 0 {
		return nil
	}
	c := ConnOf(w.resp)
	if c == nil {
		if w.state.Load() == left {
			return ErrCut
		}
		return nil
	}
	if !w.on(c) {
		return ErrCut
	}
	// doWatched sends a Stale call again.
	c.sendsAgain = true
	return nil
}

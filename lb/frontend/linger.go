package frontend

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Lingering close, as nginx's lingering_close: a connection the server
// closes after its last answer (413 for a body over the limit, 431, 400,
// 408, a Connection: close) may still be receiving what the client sends,
// typically the body the answer refused. Closing a socket with unread data
// makes the kernel send a reset, and a client that writes its whole body
// before reading (Python's http.client and urllib) then gets ECONNRESET
// instead of the answer. So the server half-closes instead (shutdown
// SHUT_WR once the answer is out: the client reads the answer and EOF),
// reads and discards what still comes, and closes once the client closes,
// or after a bound.
const (
	// lingerTime bounds a connection's whole linger (nginx's
	// lingering_time, default 30s).
	lingerTime = 30 * time.Second
	// lingerTimeout closes a lingering connection whose client sent
	// nothing for this long (nginx's lingering_timeout, default 5s).
	lingerTimeout = 5 * time.Second
	// lingerBytes is the most a lingering connection discards before it
	// is closed: well above the largest body a client may mean to send
	// (MaxBodyBytes' default is 4 MiB), far below what lingerTime at line
	// rate would cost.
	lingerBytes = 64 << 20
	// maxLingering is how many connections one front end lets linger at
	// once; past it, a connection is closed at once, as before.
	maxLingering = 1024
)

// lingering counts and bounds one front end's lingering connections. The
// zero value is ready.
type lingering struct {
	n atomic.Int32

	// The fasthttp front end's lingering connections, so Shutdown can
	// end them (gnet's are among its loops' connections).
	mu      sync.Mutex
	conns   map[*lingerConn]struct{}
	stopped bool
}

// take reserves a lingering slot; false when all are taken.
func (l *lingering) take() bool {
	if l.n.Add(1) > maxLingering {
		l.n.Add(-1)
		return false
	}
	return true
}

func (l *lingering) release() { l.n.Add(-1) }

// On gnet, a connection lingers once its last answer has left the loop's
// buffer (writeLast on the loop, flush on a worker): the loop half-closes
// the socket and its read discards what comes (the connection is
// stopped). OnTraffic counts the bytes, OnTick's sweep enforces the
// times, and OnClose gives the slot back.

// closeLast ends a connection after its last answer; from the worker.
func (gc *gconn) closeLast() {
	err := gc.c.EventLoop().Execute(gc.lingerOrClose)
	if err != nil {
		_ = gc.c.Close()
	}
}

// lingerOrClose lets the connection linger when a slot is free, else
// closes it; on the loop.
func (gc *gconn) lingerOrClose() {
	if !gc.s.linger.take() {
		_ = gc.c.Close()
		return
	}
	gc.startLinger()
}

// startLinger half-closes the connection and lets it linger; on the loop,
// holding a slot.
func (gc *gconn) startLinger() {
	if gc.closed {
		gc.s.linger.release()
		return
	}
	gc.stopped = true
	if gc.tls != nil {
		gc.tls.closeNotify()
	}
	if err := unix.Shutdown(gc.c.Fd(), unix.SHUT_WR); err != nil {
		gc.s.linger.release()
		_ = gc.c.Close()
		return
	}
	now := gc.s.now.Load()
	gc.lingerSince.Store(now)
	gc.lastRead.Store(now)
	// What arrived while the answer was written is discarded now: no
	// request of it will be read (a shutdown waits on none).
	gc.discard()
	gc.unread.Store(false)
}

// discard drops the inbound bytes of a stopped connection (a TLS one's
// undecrypted), counting a lingering one's against lingerBytes; on the
// loop.
func (gc *gconn) discard() {
	n := gc.c.InboundBuffered()
	_, _ = gc.c.Discard(n)
	if t := gc.tls; t != nil {
		n += len(t.plain) - t.off
		t.off = len(t.plain)
		t.settle()
	}
	if gc.lingerSince.Load() == 0 {
		return
	}
	if gc.lingered += n; gc.lingered > lingerBytes {
		_ = gc.c.Close()
	}
}

// lingerOver reports whether a lingering connection is past its bounds at
// now (read off the clock); false for one that does not linger. Both
// stamps are coarse.
func (gc *gconn) lingerOver(now int64) bool {
	since := gc.lingerSince.Load()
	return since != 0 && (gc.s.expired(since, lingerTime, now) || gc.s.expired(gc.lastRead.Load(), lingerTimeout, now))
}

// lingerClosed gives back a lingering connection's slot; from OnClose.
func (gc *gconn) lingerClosed() {
	if gc.lingerSince.Swap(0) != 0 {
		gc.s.linger.release()
	}
}

// On fasthttp, the connection's Close lingers when the last thing the
// server did on it was to write: an answer, then the close. A Close while
// a read waits (an idle keep-alive connection, a client that never sent a
// byte) closes at once.

// lingerListener wraps a TCP listener's connections in lingerConn.
type lingerListener struct {
	net.Listener
	l *lingering
}

func (ln *lingerListener) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	return &lingerConn{TCPConn: tc, l: ln.l}, nil
}

// lingerConn is a server's connection that lingers on Close after an
// answer, and that a request may watch for its client's leaving
// (WatchClient). Reads and writes come from the connection's serving
// goroutine; Close may come from any.
type lingerConn struct {
	*net.TCPConn
	l        *lingering
	answered atomic.Bool // the last read or write begun was a write
	closed   atomic.Bool
	w        watcher
}

func (c *lingerConn) Read(b []byte) (int, error) {
	c.unwatch(true)
	c.answered.Store(false)
	return c.TCPConn.Read(b)
}

func (c *lingerConn) Write(b []byte) (int, error) {
	n, err := c.TCPConn.Write(b)
	if n > 0 {
		c.answered.Store(true)
	}
	return n, err
}

func (c *lingerConn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	c.unwatch(false)
	if !c.answered.Load() || !c.l.add(c) {
		return c.TCPConn.Close()
	}
	go c.linger()
	return nil
}

// add registers a lingering connection; false when it must close at once.
func (l *lingering) add(c *lingerConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || !l.take() {
		return false
	}
	if l.conns == nil {
		l.conns = make(map[*lingerConn]struct{})
	}
	l.conns[c] = struct{}{}
	return true
}

// stop closes the lingering connections and lets no more linger.
func (l *lingering) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	for c := range l.conns {
		// Its linger's read fails and closes it.
		_ = c.SetReadDeadline(time.Now())
	}
}

// linger half-closes the connection, discards what the client still
// sends until it closes or a bound is reached, then closes.
func (c *lingerConn) linger() {
	defer func() {
		_ = c.TCPConn.Close()
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		c.l.release()
	}()
	if c.CloseWrite() != nil {
		return
	}
	buf := copyBufs.Get().(*[streamBufferBytes]byte)
	defer copyBufs.Put(buf)
	end := time.Now().Add(lingerTime)
	for read := 0; read <= lingerBytes; {
		if !c.arm(end) {
			return
		}
		n, err := c.TCPConn.Read(buf[:])
		if err != nil {
			return
		}
		read += n
	}
}

// arm sets the read deadline of the linger's next read, under the lock
// stop takes, so a stop never misses a read; false once stopped.
func (c *lingerConn) arm(end time.Time) bool {
	deadline := time.Now().Add(lingerTimeout)
	if deadline.After(end) {
		deadline = end
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return !c.l.stopped && c.SetReadDeadline(deadline) == nil
}

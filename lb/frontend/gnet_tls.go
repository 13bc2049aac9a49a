package frontend

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/lb/evloop"
)

// TLS on the gnet front end. The loops accept a TLS connection as a plain
// one; its handshake (a few hundred microseconds of public-key work that
// would stall every other connection of the loop) runs on a goroutine of
// its own, which reads what the loop hands it (handshakeFeed) and writes
// with AsyncWrite. Then a client that negotiated h2 leaves the loop for
// the HTTP/2 server, on a duplicate of the socket (as h2c's connections
// do); one that speaks HTTP/1.1 stays, and from then on the loop decrypts
// its records into the bytes it parses, and encrypts what it or a worker
// writes, with the tls.Conn the handshake made. That tls.Conn reads and
// writes a loopWire, whose bytes come and go through the feed during the
// handshake, the loop's buffers after it, or the duplicate socket for h2.

// loopTLS is a gnet connection's TLS state.
type loopTLS struct {
	tc *tls.Conn
	w  *loopWire

	// mu orders encryption with sending: records must reach the socket in
	// the order they were sealed, and the loop and a worker both write.
	// The loop holds it to decrypt too (a read may answer with a record).
	mu sync.Mutex
	// queued counts AsyncWrites of sealed records not yet done; the loop
	// writes directly only when none is (else it queues behind them).
	// Raised under mu, lowered on the loop.
	queued atomic.Int32
	flat   []byte // what one write seals, its iov joined: one record, not one per slice

	// On the loop: decrypted bytes, plain[off:] not parsed yet, in the
	// pooled buffer held (put back whole, so the pool allocates nothing).
	plain []byte
	off   int
	held  *[]byte

	// On the loop: the records that arrived whole, and how many of them
	// the tls.Conn has decrypted at least (exact once synced, from the
	// first Read that found no whole record on). pull reads while one
	// waits, not on to the Read that says none does: that call costs
	// crypto/tls an allocation and a record's parse.
	frames recordFrames
	used   int64
	synced bool
}

// recordFrames counts the whole TLS records in a connection's bytes as
// they arrive: a 5-byte header (type, version, length), then length
// bytes.
type recordFrames struct {
	whole int64
	head  int // header bytes of the current record seen, up to 5
	size  int // its length, as far as the header came
	left  int // its bytes still to come, once the header is whole
}

func (f *recordFrames) scan(b []byte) {
	for len(b) > 0 {
		if f.head < recordHeaderLen {
			if f.head >= recordHeaderLen-2 {
				f.size = f.size<<8 | int(b[0])
			}
			f.head++
			b = b[1:]
			if f.head == recordHeaderLen {
				f.left, f.size = f.size, 0
			}
		} else {
			n := min(f.left, len(b))
			f.left -= n
			b = b[n:]
		}
		if f.head == recordHeaderLen && f.left == 0 {
			f.whole++
			f.head = 0
		}
	}
}

// recordHeaderLen is a TLS record header's size.
const recordHeaderLen = 5

// loopWire is the net.Conn under a gnet connection's tls.Conn. It has
// three lives, each switched to on the loop while the handshake's
// goroutine waits: the handshake (feed), HTTP/1.1 on the loop (enrolled:
// Read gives what the loop put in in and then says it would block, Write
// collects sealed records in out for the loop or a worker to send), and
// h2 on a duplicate socket (nc, which first gives what the feed still
// held).
type loopWire struct {
	c        *evloop.Conn
	feed     handshakeFeed
	started  bool // the handshake's goroutine runs; on the loop
	enrolled bool
	in, out  []byte
	nc       net.Conn
}

func (w *loopWire) Read(p []byte) (int, error) {
	switch {
	case w.enrolled:
		if len(w.in) == 0 {
			return 0, errWouldBlock
		}
		n := copy(p, w.in)
		w.in = w.in[n:]
		return n, nil
	case w.nc != nil:
		return w.nc.Read(p)
	}
	return w.feed.read(p)
}

func (w *loopWire) Write(p []byte) (int, error) {
	switch {
	case w.enrolled:
		w.out = append(w.out, p...)
		return len(p), nil
	case w.nc != nil:
		return w.nc.Write(p)
	}
	w.feed.answer()
	// The loop writes it after the call returns, and crypto/tls reuses p.
	return len(p), w.c.AsyncWrite(bytes.Clone(p), nil)
}

// Close closes the connection; the loop's close writes what AsyncWrite
// queued first.
func (w *loopWire) Close() error {
	if w.nc != nil {
		return w.nc.Close()
	}
	return w.c.Close()
}

func (w *loopWire) LocalAddr() net.Addr  { return w.c.LocalAddr() }
func (w *loopWire) RemoteAddr() net.Addr { return w.c.RemoteAddr() }

// Deadlines are the duplicate socket's for h2; the handshake has its
// timer, and the loop its timeouts (crypto/tls sets one around
// close_notify).
func (w *loopWire) SetDeadline(t time.Time) error {
	if w.nc != nil {
		return w.nc.SetDeadline(t)
	}
	return nil
}

func (w *loopWire) SetReadDeadline(t time.Time) error {
	if w.nc != nil {
		return w.nc.SetReadDeadline(t)
	}
	return nil
}

func (w *loopWire) SetWriteDeadline(t time.Time) error {
	if w.nc != nil {
		return w.nc.SetWriteDeadline(t)
	}
	return nil
}

// handshakeFeed carries what a connection sends during its handshake
// from the loop to the handshake's goroutine.
type handshakeFeed struct {
	mu       sync.Mutex
	buf      []byte
	closed   bool
	answered bool          // the server sent its flight: the client's Finished, then its data, may come
	more     chan struct{} // holds one wake-up when buf grew or closed
}

// push adds what arrived and reports whether it may wait: before the
// server's flight, up to before bytes (a ClientHello); after it, up to
// after, as the client may send its data right behind its Finished and
// it waits until the handshake's goroutine has read the Finished and the
// loop took the connection back; on the loop.
func (f *handshakeFeed) push(b []byte, before, after int) bool {
	f.mu.Lock()
	f.buf = append(f.buf, b...)
	limit := before
	if f.answered {
		limit = after
	}
	ok := len(f.buf) <= limit
	f.mu.Unlock()
	f.wake()
	return ok
}

// answer notes the server's flight; on the handshake's goroutine.
func (f *handshakeFeed) answer() {
	f.mu.Lock()
	f.answered = true
	f.mu.Unlock()
}

// close makes read return io.EOF once buf is empty; from OnClose.
func (f *handshakeFeed) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wake()
}

func (f *handshakeFeed) wake() {
	select {
	case f.more <- struct{}{}:
	default:
	}
}

// read waits for bytes; on the handshake's goroutine.
func (f *handshakeFeed) read(p []byte) (int, error) {
	for {
		f.mu.Lock()
		if len(f.buf) > 0 {
			n := copy(p, f.buf)
			f.buf = f.buf[n:]
			f.mu.Unlock()
			return n, nil
		}
		closed := f.closed
		f.mu.Unlock()
		if closed {
			return 0, io.EOF
		}
		<-f.more
	}
}

// rest takes what the handshake left unread; on the loop, after it.
func (f *handshakeFeed) rest() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buf
	f.buf = nil
	return b
}

// errWouldBlock is a temporary net.Error: crypto/tls keeps a partial
// record it was given and reads on at its next Read, where any other error
// would end the connection.
var errWouldBlock net.Error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "frontend: TLS record incomplete" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

// plainBufs holds decrypted-bytes buffers while no request is partly
// buffered, so an idle connection keeps none.
var plainBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxRecord is the most plaintext one TLS record carries.
const maxRecord = 16 << 10

// startTLS gives a new connection its TLS state; from OnOpen. Its
// handshake starts with its first bytes (handshaking): a goroutine
// started now would only wait for them. Until then the idle sweep holds
// the connection to ReadTimeout, as a plain one before its first request.
func (s *GNet) startTLS(gc *gconn) {
	w := &loopWire{c: gc.c, feed: handshakeFeed{more: make(chan struct{}, 1)}}
	gc.tls = &loopTLS{tc: tls.Server(w, s.tls), w: w}
	// Its h2 comes by ALPN: the cleartext preface is plain HTTP on the
	// TLS port, which the handshake refuses.
	gc.sniffed = true
}

// handshaking feeds b, which arrived before the loop took gc back from
// its handshake, to the handshake, and starts it on the first; on the
// loop. Before the server's flight a client may send a request's worth;
// after it, what a lingering connection would discard (lingerBytes): a
// client may send its request and body right behind its Finished (a body
// over MaxBodyBytes too, which the loop, once it has the connection,
// answers 413 and discards), and those bytes wait only until the
// handshake's goroutine reads the Finished, which junk fails at once.
func (s *GNet) handshaking(gc *gconn, b []byte) evloop.Action {
	w := gc.tls.w
	gc.tls.frames.scan(b)
	if !w.feed.push(b, s.o.MaxHeaderBytes+s.o.MaxBodyBytes+maxOutbound, lingerBytes) {
		return evloop.Close
	}
	if !w.started {
		w.started = true
		s.workers.run((*tlsHandshake)(gc))
	}
	// The handshake's goroutine, started or fed.
	gc.c.EventLoop().Yield()
	return evloop.None
}

// tlsHandshake is a connection whose handshake a worker runs: a goroutine
// kept has grown its stack to crypto/tls's depth already, where a new one
// per connection grew it again each time.
type tlsHandshake gconn

func (h *tlsHandshake) work() {
	gc := (*gconn)(h)
	gc.s.handshake(gc)
}

// handshake runs gc's TLS handshake within ReadTimeout, then hands the
// connection to the loop (HTTP/1.1) or the HTTP/2 server (h2).
func (s *GNet) handshake(gc *gconn) {
	t := gc.tls
	limit := time.AfterFunc(s.o.ReadTimeout, func() { _ = gc.c.Close() })
	err := t.tc.Handshake()
	limit.Stop()
	if err != nil {
		refuseHandshake(t.w, err)
		return
	}
	h2 := t.tc.ConnectionState().NegotiatedProtocol == protoH2
	// HTTP/1.1 is the loop's from the task on, and nothing waits for it
	// here; h2 comes back for the HTTP/2 server.
	var done chan error
	if h2 {
		done = make(chan error, 1)
	}
	err = gc.c.EventLoop().Execute(func() {
		err := s.handshaken(gc, h2)
		if done != nil {
			done <- err
		}
	})
	if err == nil && done != nil {
		// A task queued as the engine stops is never run.
		select {
		case err = <-done:
		case <-s.stopped:
			err = net.ErrClosed
		}
	}
	if err != nil {
		_ = gc.c.Close()
		return
	}
	if h2 {
		s.serveH2(gc.remote, t.tc, t.w.nc, false)
	}
}

// handshaken switches gc's wire from the feed, on the loop: an h2
// connection to a duplicate of its socket, which the loop then closes its
// own descriptor of; an HTTP/1.1 one to the loop's buffers, whose bytes
// it then parses (what the handshake's last read took beyond it, sent
// with the client's Finished, included).
func (s *GNet) handshaken(gc *gconn, h2 bool) error {
	if gc.closed {
		return net.ErrClosed
	}
	w := gc.tls.w
	early := w.feed.rest()
	if h2 {
		nc, err := s.dupConn(gc.c)
		if err != nil {
			return err
		}
		w.nc = &prefixedConn{Conn: nc, early: early}
		// At once (OnClose gives the connection's place under the
		// per-address cap back before the HTTP/2 server takes it again).
		_ = gc.c.EventLoop().Close(gc.c)
		return nil
	}
	w.enrolled, w.in = true, early
	_ = gc.c.Wake(nil)
	return nil
}

// pull decrypts raw, what arrived; on the loop. An error (the client's
// close_notify, a bad record) ends the connection once what was decrypted
// before it is parsed.
func (t *loopTLS) pull(raw []byte) error {
	t.frames.scan(raw)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.w.in) > 0 {
		// The feed's rest, left by handshaken.
		raw = append(t.w.in, raw...)
	}
	t.w.in = raw
	var err error
	// A Read takes what the wire holds whole (up to the room crypto/tls
	// gives it), and decrypts one record or more; the rest of a partial
	// record goes in with the Read that then finds no whole one.
	for err == nil && (!t.synced || t.used < t.frames.whole || len(t.w.in) > 0) {
		if t.plain == nil {
			t.held = plainBufs.Get().(*[]byte)
			t.plain = *t.held
		}
		if t.off > 0 && cap(t.plain)-len(t.plain) < maxRecord {
			n := copy(t.plain, t.plain[t.off:])
			t.plain, t.off = t.plain[:n], 0
		}
		t.plain = slices.Grow(t.plain, maxRecord)
		var n int
		n, err = t.tc.Read(t.plain[len(t.plain):cap(t.plain)])
		t.plain = t.plain[:len(t.plain)+n]
		if err == nil {
			t.used++
		}
	}
	t.w.in = nil
	if serr := t.send(nil); serr != nil {
		return serr
	}
	if errors.Is(err, errWouldBlock) {
		// Every whole record is decrypted, and the wire is empty.
		t.used, t.synced = t.frames.whole, true
		return nil
	}
	return err
}

// settle gives the decrypted-bytes buffer back once every byte in it was
// parsed; on the loop.
func (t *loopTLS) settle() {
	if t.plain == nil || t.off < len(t.plain) {
		return
	}
	if cap(t.plain) <= 4*maxRecord {
		*t.held = t.plain[:0]
		plainBufs.Put(t.held)
	}
	t.plain, t.held, t.off = nil, nil, 0
}

// write seals iov as one record (or as many as its size needs) and sends
// it: from the loop with cb nil, else from the queue's owner, cb called on
// the loop once it took the bytes.
func (t *loopTLS) write(iov [][]byte, cb evloop.Callback) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flat = t.flat[:0]
	for _, b := range iov {
		t.flat = append(t.flat, b...)
	}
	if _, err := t.tc.Write(t.flat); err != nil {
		return err
	}
	return t.send(cb)
}

// send hands the records sealed since the last send to the loop, with mu
// held: written at once on the loop when nothing is queued before them,
// else queued.
func (t *loopTLS) send(cb evloop.Callback) error {
	out := t.w.out
	if cb == nil {
		if len(out) == 0 {
			return nil
		}
		if t.queued.Load() == 0 {
			// The loop copies what the socket does not take now.
			t.w.out = out[:0]
			_, err := t.w.c.Write(out)
			return err
		}
	}
	// The records go out after the callback, so they need a buffer of
	// their own.
	t.w.out = nil
	t.queued.Add(1)
	return t.w.c.AsyncWrite(out, func(c *evloop.Conn, err error) {
		t.queued.Add(-1)
		if cb != nil {
			cb(c, err)
		}
	})
}

// closeNotify seals TLS's close_notify and sends it; on the loop, before
// a half-close.
func (t *loopTLS) closeNotify() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tc.CloseWrite() == nil {
		_ = t.send(nil)
	}
}

// The bytes a gconn parses and writes: the loop's, or through its TLS.

// inbound is how many bytes wait to be parsed.
func (gc *gconn) inbound() int {
	if gc.tls != nil {
		return len(gc.tls.plain) - gc.tls.off
	}
	return gc.c.InboundBuffered()
}

// peek returns the n bytes waiting, left in place.
func (gc *gconn) peek(n int) []byte {
	if t := gc.tls; t != nil {
		return t.plain[t.off : t.off+n]
	}
	buf, _ := gc.c.Peek(n)
	return buf
}

// consume drops n parsed bytes.
func (gc *gconn) consume(n int) {
	if gc.tls != nil {
		gc.tls.off += n
		return
	}
	_, _ = gc.c.Discard(n)
}

// writev writes iov; on the loop.
func (gc *gconn) writev(iov [][]byte) error {
	var err error
	if gc.tls != nil {
		err = gc.tls.write(iov, nil)
	} else {
		_, err = gc.c.Writev(iov)
	}
	refresh(&gc.pending, int64(gc.c.OutboundBuffered())) // the idle sweep's baseline
	return err
}

// asyncWritev hands iov to the loop, cb called there once written.
func (gc *gconn) asyncWritev(iov [][]byte, cb evloop.Callback) error {
	if gc.tls != nil {
		return gc.tls.write(iov, cb)
	}
	return gc.c.AsyncWritev(iov, cb)
}

package frontend

import (
	"crypto/tls"
	"errors"
	"io"
	"iter"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/lb/evloop"
)

// TLS on the gnet front end. The loops accept a TLS connection as a plain
// one; its handshake runs on the loop, as nginx's and HAProxy's do, in a
// coroutine (iter.Pull) that the loop resumes with the bytes that came
// (handshakeFeed) and that yields back when it needs more: crypto/tls's
// blocking Handshake, with no goroutine to wake and no handoff between
// threads. Then a client that negotiated h2 leaves the loop for the
// HTTP/2 server, on a duplicate of the socket (as h2c's connections do);
// one that speaks HTTP/1.1 stays, and from then on the loop decrypts its
// records into the bytes it parses, and encrypts what it or a worker
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
// three lives, each switched to on the loop between two resumptions of
// the handshake: the handshake (feed), HTTP/1.1 on the loop (enrolled:
// Read gives what the loop put in in and then says it would block, Write
// collects sealed records in out for the loop or a worker to send), and
// h2 on a duplicate socket (nc, which first gives what the feed still
// held).
type loopWire struct {
	c        *evloop.Conn
	feed     handshakeFeed
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
	// The handshake's flight, on the loop (which copies what the socket
	// does not take now).
	if _, err := w.c.Write(p); err != nil {
		return 0, err
	}
	return len(p), nil
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
// timer (handshakeFeed.limit), and the loop its timeouts (crypto/tls sets
// one around close_notify).
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

// handshakeFeed carries what a connection sends during its handshake to
// the handshake's coroutine, and holds the coroutine; on the loop, all of
// it (the coroutine runs there while the loop waits for it to yield).
// crypto/tls holds the tls.Conn's handshake mutex across a yield: until
// the handshake ends, nothing on the loop may call a method of it that
// takes the mutex (ConnectionState, Read, Write), or the loop would wait
// for itself.
type handshakeFeed struct {
	buf    []byte
	closed bool

	// resume runs the handshake until it waits for bytes (true) or ends
	// (false; err is then its outcome); nil before the first bytes came
	// and after it ended. stop ends a waiting one (its read says EOF);
	// running says it runs now, when OnClose must not stop it but leave
	// it to see closed. limit closes the connection at ReadTimeout.
	resume  func() (struct{}, bool)
	stop    func()
	yield   func(struct{}) bool
	running bool
	err     error
	limit   *time.Timer
}

// close makes read return io.EOF once buf is empty, and ends a handshake
// that waits; from OnClose.
func (f *handshakeFeed) close() {
	f.closed = true
	if f.limit != nil {
		f.limit.Stop()
	}
	if f.stop != nil && !f.running {
		f.stop()
	}
}

// read gives what came, or yields to the loop until more does; in the
// handshake's coroutine.
func (f *handshakeFeed) read(p []byte) (int, error) {
	for len(f.buf) == 0 {
		if f.closed || !f.yield(struct{}{}) {
			return 0, io.EOF
		}
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	return n, nil
}

// rest takes what the handshake left unread, after it.
func (f *handshakeFeed) rest() []byte {
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
// handshake starts with its first bytes (handshaking). Until then the
// idle sweep holds the connection to ReadTimeout, as a plain one before
// its first request.
func (s *GNet) startTLS(gc *gconn) {
	w := &loopWire{c: gc.c}
	gc.tls = &loopTLS{tc: tls.Server(w, s.tls), w: w}
	// Its h2 comes by ALPN: the cleartext preface is plain HTTP on the
	// TLS port, which the handshake refuses.
	gc.sniffed = true
}

// handshaking feeds b, which arrived before the loop took gc back from
// its handshake, to the handshake, starts it on the first and runs it
// until it waits for more or ends; on the loop. The handshake takes what
// came at once (crypto/tls reads it whole, and bounds a handshake
// message), so no more than a read's bytes wait in the feed. Once it
// ends, gc goes to the HTTP/2 server, on a goroutine of its own, or is
// the loop's for HTTP/1.1, which then parses what came behind the
// client's Finished.
func (s *GNet) handshaking(gc *gconn, b []byte) evloop.Action {
	t := gc.tls
	f := &t.w.feed
	t.frames.scan(b)
	f.buf = append(f.buf, b...)
	if f.resume == nil {
		f.limit = time.AfterFunc(s.o.ReadTimeout, func() { _ = gc.c.Close() })
		f.resume, f.stop = iter.Pull(func(yield func(struct{}) bool) {
			f.yield = yield
			f.err = t.tc.Handshake()
		})
	}
	f.running = true
	_, waits := f.resume()
	f.running = false
	if waits {
		return evloop.None
	}
	f.limit.Stop()
	f.resume, f.stop, f.yield = nil, nil, nil
	switch {
	case gc.closed:
		return evloop.None
	case f.err != nil:
		refuseHandshake(t.w, f.err)
		return evloop.Close
	}
	h2 := t.tc.ConnectionState().NegotiatedProtocol == protoH2
	if err := s.handshaken(gc, h2); err != nil {
		return evloop.Close
	}
	if h2 {
		go s.serveH2(gc.remote, t.tc, t.w.nc, false)
		return evloop.None
	}
	return s.tlsTraffic(gc, nil)
}

// handshaken switches gc's wire from the feed, on the loop: an h2
// connection to a duplicate of its socket, which the loop then closes its
// own descriptor of; an HTTP/1.1 one to the loop's buffers, with what the
// handshake's last read took beyond it (sent with the client's Finished)
// in first.
func (s *GNet) handshaken(gc *gconn, h2 bool) error {
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
	refresh(&gc.pending, int64(gc.c.Backlog())) // the idle sweep's baseline; no send now
	return err
}

// asyncWritev hands iov to the loop, cb called there once written.
func (gc *gconn) asyncWritev(iov [][]byte, cb evloop.Callback) error {
	if gc.tls != nil {
		return gc.tls.write(iov, cb)
	}
	return gc.c.AsyncWritev(iov, cb)
}

package frontend

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// TLS on the gnet front end. The loops accept a TLS connection as a plain
// one, and it leaves its loop at once for the handshake: a few hundred
// microseconds of public-key work that, on a loop, would stall every other
// connection of that loop. The handshake runs on a goroutine of its own
// over a duplicate of the socket on Go's poller (as h2c's connections do).
// A client that negotiated h2 stays there, with the HTTP/2 server; one
// that speaks HTTP/1.1 is enrolled back on the loop, which from then on
// decrypts its records into the bytes it parses, and encrypts what it or
// a worker writes, with the tls.Conn the handshake made: that tls.Conn
// reads and writes a loopWire, which is the socket during the handshake
// and gnet's buffers after it.

// loopTLS is an enrolled connection's TLS state.
type loopTLS struct {
	tc *tls.Conn
	w  *loopWire
	c  gnet.Conn

	// mu orders encryption with sending: records must reach the socket in
	// the order they were sealed, and the loop and a worker both write.
	// The loop holds it to decrypt too (a read may answer with a record).
	mu sync.Mutex
	// queued counts AsyncWrites of sealed records not yet done; the loop
	// writes directly only when none is (else it queues behind them).
	// Raised under mu, lowered on the loop.
	queued atomic.Int32
	flat   []byte // what one write seals, its iov joined: one record, not one per slice

	// On the loop: decrypted bytes, plain[off:] not parsed yet.
	plain []byte
	off   int
}

// loopWire is the net.Conn under an enrolled connection's tls.Conn.
// Until enrolled it is the socket; after, Read gives what the loop put in
// in and then says it would block, and Write collects sealed records in
// out for the loop or the worker to send.
type loopWire struct {
	net.Conn
	enrolled bool
	in, out  []byte
}

func (w *loopWire) Read(p []byte) (int, error) {
	if !w.enrolled {
		return w.Conn.Read(p)
	}
	if len(w.in) == 0 {
		return 0, errWouldBlock
	}
	n := copy(p, w.in)
	w.in = w.in[n:]
	return n, nil
}

func (w *loopWire) Write(p []byte) (int, error) {
	if !w.enrolled {
		return w.Conn.Write(p)
	}
	w.out = append(w.out, p...)
	return len(p), nil
}

// Deadlines are the socket's during the handshake; once enrolled, the
// loop's timeouts apply (crypto/tls sets one around close_notify).
func (w *loopWire) SetDeadline(t time.Time) error {
	if w.enrolled {
		return nil
	}
	return w.Conn.SetDeadline(t)
}

func (w *loopWire) SetWriteDeadline(t time.Time) error {
	if w.enrolled {
		return nil
	}
	return w.Conn.SetWriteDeadline(t)
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

// acceptTLS takes a TLS connection off its loop for the handshake; from
// OnOpen, which then closes gnet's descriptor. The connection keeps its
// place under the per-address cap through the handshake.
func (s *GNet) acceptTLS(c gnet.Conn) gnet.Action {
	nc, err := dupConn(c.Fd())
	if err != nil {
		s.logDebug("frontend: TLS connection not taken over", err)
		if s.o.Conns != nil {
			s.o.Conns.Release(c.RemoteAddr())
		}
		return gnet.Close
	}
	go s.handshake(nc, c.EventLoop(), c.RemoteAddr())
	return gnet.Close
}

// handshake runs nc's TLS handshake, then serves it: h2 on the HTTP/2
// server, HTTP/1.1 enrolled on el.
func (s *GNet) handshake(nc net.Conn, el gnet.EventLoop, remote net.Addr) {
	w := &loopWire{Conn: nc}
	tc := serverHandshake(w, nc, s.tls, s.o.ReadTimeout)
	enrolled := false
	defer func() {
		if !enrolled && s.o.Conns != nil {
			s.o.Conns.Release(remote)
		}
	}()
	switch {
	case tc == nil:
		return
	case tc.ConnectionState().NegotiatedProtocol == protoH2:
		s.h2.serve(tc)
		_ = nc.Close()
		return
	}
	// Once Enroll took nc, gnet keeps a copy of the socket and closes nc;
	// OnOpen (enrolledTLS) gives the connection its gconn, which from then
	// on holds its place under the cap.
	res, err := el.Enroll(gnet.NewContext(context.Background(), &loopTLS{tc: tc, w: w}), nc)
	if err != nil {
		_ = nc.Close()
		return
	}
	enrolled = (<-res).Err == nil
}

// enrolledTLS is OnOpen of a connection back from its handshake: it
// switches the wire to the loop's buffers, and parses at once what the
// handshake's last read took beyond it (a request sent with the client's
// Finished).
func (s *GNet) enrolledTLS(c gnet.Conn, t *loopTLS) (gnet.Action, *gconn) {
	t.c = c
	t.w.enrolled = true
	gc := newGConn(s, c)
	gc.tls, gc.sniffed = t, true
	if s.h.OnLoop {
		gc.ls = s.loopOf(c.EventLoop())
	}
	if s.shutdown.Load() {
		return gnet.Close, gc
	}
	_ = c.Wake(nil)
	return gnet.None, gc
}

// pull decrypts what arrived; on the loop. An error (the client's
// close_notify, a bad record) ends the connection once what was decrypted
// before it is parsed.
func (t *loopTLS) pull() error {
	raw, _ := t.c.Next(-1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.w.in = raw
	if t.plain == nil {
		t.plain = *plainBufs.Get().(*[]byte)
	}
	var err error
	for err == nil {
		if t.off > 0 && cap(t.plain)-len(t.plain) < maxRecord {
			n := copy(t.plain, t.plain[t.off:])
			t.plain, t.off = t.plain[:n], 0
		}
		t.plain = slices.Grow(t.plain, maxRecord)
		var n int
		n, err = t.tc.Read(t.plain[len(t.plain):cap(t.plain)])
		t.plain = t.plain[:len(t.plain)+n]
	}
	t.w.in = nil
	if serr := t.send(nil); serr != nil {
		return serr
	}
	if errors.Is(err, errWouldBlock) {
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
		b := t.plain[:0]
		plainBufs.Put(&b)
	}
	t.plain, t.off = nil, 0
}

// write seals iov as one record (or as many as its size needs) and sends
// it: from the loop with cb nil, else from the queue's owner, cb called on
// the loop once gnet took the bytes.
func (t *loopTLS) write(iov [][]byte, cb gnet.AsyncCallback) error {
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

// send hands the records sealed since the last send to gnet, with mu
// held: written at once on the loop when nothing is queued before them,
// else queued.
func (t *loopTLS) send(cb gnet.AsyncCallback) error {
	out := t.w.out
	if cb == nil {
		if len(out) == 0 {
			return nil
		}
		if t.queued.Load() == 0 {
			// gnet copies what the socket does not take now.
			t.w.out = out[:0]
			_, err := t.c.Write(out)
			return err
		}
	}
	// The records go out after the callback, so they need a buffer of
	// their own.
	t.w.out = nil
	t.queued.Add(1)
	return t.c.AsyncWrite(out, func(c gnet.Conn, err error) error {
		t.queued.Add(-1)
		if cb != nil {
			return cb(c, err)
		}
		return nil
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

// The bytes a gconn parses and writes: gnet's, or through its TLS.

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
	if gc.tls != nil {
		return gc.tls.write(iov, nil)
	}
	_, err := gc.c.Writev(iov)
	return err
}

// asyncWritev hands iov to the loop, cb called there once written.
func (gc *gconn) asyncWritev(iov [][]byte, cb gnet.AsyncCallback) error {
	if gc.tls != nil {
		return gc.tls.write(iov, cb)
	}
	return gc.c.AsyncWritev(iov, cb)
}

// serverHandshake runs the server side of a TLS handshake on w, whose
// socket is raw, within timeout; nil when it failed (raw is then closed,
// a plain-HTTP client answered first).
func serverHandshake(w, raw net.Conn, cfg *tls.Config, timeout time.Duration) *tls.Conn {
	tc := tls.Server(w, cfg)
	_ = raw.SetDeadline(time.Now().Add(timeout))
	if err := tc.Handshake(); err != nil {
		refuseHandshake(raw, err)
		return nil
	}
	_ = raw.SetDeadline(time.Time{})
	return tc
}

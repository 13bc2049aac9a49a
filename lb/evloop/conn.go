package evloop

import (
	"io"
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"pdlb/internal/rawio"
)

// Conn is a connection on a loop. Its methods are the loop's to call,
// from the Handler or a task, except AsyncWrite, AsyncWritev, Wake, Close
// and EventLoop, which any goroutine may call.
type Conn struct {
	loop          *Loop
	fd            int
	local, remote net.Addr
	ctx           any
	opened        bool // between OnOpen and OnClose
	accepted      bool // by the loop's listener; not enrolled
	shared        bool // Dup made a duplicate of the socket
	// pend: out holds bytes written this turn, which the loop's ring
	// sends with the others' at the turn's end (flushPending).
	pend bool

	// The bytes that arrived and are not consumed yet are cur, in the
	// loop's buffer during the OnTraffic of the read that brought them,
	// or in, in store, the connection's own buffer; one of them is empty.
	cur, in, store []byte
	// out[outOff:] waits for the socket to take it (EPOLLOUT), or for the
	// turn's end (pend).
	out    []byte
	outOff int
}

// Fd is the connection's socket, with what was written sent first (as
// far as it takes it): a caller's own calls on it come after.
func (c *Conn) Fd() int {
	c.sendPending()
	return c.fd
}

// Context is what SetContext set (for an enrolled connection, what
// Enroll was given).
func (c *Conn) Context() any { return c.ctx }

// SetContext keeps ctx with the connection.
func (c *Conn) SetContext(ctx any) { c.ctx = ctx }

// LocalAddr is the listener's address, or the enrolled socket's.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// EventLoop is the loop the connection is on.
func (c *Conn) EventLoop() *Loop { return c.loop }

// Dup returns a duplicate of the socket (close-on-exec), which outlives
// the connection's close; on the loop.
func (c *Conn) Dup() (int, error) {
	c.sendPending()
	fd, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err == nil {
		c.shared = true
	}
	return fd, err
}

// SetLinger sets SO_LINGER: 0 resets the connection as it closes.
func (c *Conn) SetLinger(sec int) error {
	c.sendPending()
	return unix.SetsockoptLinger(c.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: int32(sec)})
}

// InboundBuffered is how many bytes arrived and wait.
func (c *Conn) InboundBuffered() int { return len(c.in) + len(c.cur) }

// held is the bytes waiting.
func (c *Conn) held() []byte {
	if len(c.in) > 0 {
		return c.in
	}
	return c.cur
}

// Peek returns the first n bytes waiting (n <= 0: all of them), left in
// place; io.ErrShortBuffer if fewer wait. They stay valid until the
// callback returns: they may be in the loop's read buffer, which the
// loop's next read of any connection reuses.
func (c *Conn) Peek(n int) ([]byte, error) {
	b := c.held()
	if n <= 0 {
		n = len(b)
	}
	if n > len(b) {
		return nil, io.ErrShortBuffer
	}
	return b[:n:n], nil
}

// Next is Peek, the bytes consumed.
func (c *Conn) Next(n int) ([]byte, error) {
	b, err := c.Peek(n)
	if err == nil {
		c.skip(len(b))
	}
	return b, err
}

// Discard consumes n bytes (n <= 0, or more than wait: all of them) and
// says how many.
func (c *Conn) Discard(n int) (int, error) {
	if held := c.InboundBuffered(); n <= 0 || n > held {
		n = held
	}
	c.skip(n)
	return n, nil
}

// maxStore is the largest buffer of its own a connection keeps once it
// holds no bytes: past a read's worth, it was a burst's.
const maxStore = readSize

func (c *Conn) skip(n int) {
	if len(c.in) == 0 {
		c.cur = c.cur[n:]
		return
	}
	if c.in = c.in[n:]; len(c.in) == 0 {
		if cap(c.store) > maxStore {
			c.store = nil
		}
		c.in = c.store[:0]
	}
}

// keep moves what OnTraffic left in the loop's buffer to c's own.
func (c *Conn) keep() {
	c.store = append(c.store[:0], c.cur...)
	c.in = c.store
}

// room makes room for n bytes after those c holds.
func (c *Conn) room(n int) {
	if cap(c.in)-len(c.in) >= n {
		return
	}
	store := c.store[:cap(c.store)]
	if len(store)-len(c.in) < n {
		store = make([]byte, max(2*len(store), len(c.in)+n))
	}
	held := copy(store, c.in) // may overlap: copy moves
	c.store, c.in = store[:0], store[:held]
}

// Backlog is how many bytes wait to go out: those the turn's end sends
// too, and it sends none now (OutboundBuffered does).
func (c *Conn) Backlog() int { return len(c.out) - c.outOff }

// OutboundBuffered is how many bytes wait for the socket to take them:
// those it had no room for, after an attempt to send what this turn wrote.
func (c *Conn) OutboundBuffered() int {
	c.sendPending()
	return len(c.out) - c.outOff
}

// Write writes b, queueing what the socket does not take now: it goes out
// when the socket has room, before anything written after it. An error
// closes the connection (OnClose runs first). With a ring, b (up to 16
// KiB, to a connection with nothing waiting) is copied and goes out with
// the turn's other writes at its end, where an error closes the
// connection instead.
func (c *Conn) Write(b []byte) (int, error) {
	if !c.opened {
		return 0, net.ErrClosed
	}
	if c.outOff < len(c.out) {
		c.queue(b)
		return len(b), nil
	}
	if c.loop.defers(len(b)) {
		c.out = append(c.loop.takeOut(), b...)
		c.loop.pend(c)
		return len(b), nil
	}
	n, err := rawio.Send(c.fd, b)
	if err = c.sent(err); err != nil {
		return 0, err
	}
	if n < len(b) {
		c.out = append(c.out, b[n:]...)
		c.watchOut()
	}
	return len(b), nil
}

// Writev is Write of bs's buffers in order, with one sendmsg.
func (c *Conn) Writev(bs [][]byte) (int, error) {
	if !c.opened {
		return 0, net.ErrClosed
	}
	total := 0
	for _, b := range bs {
		total += len(b)
	}
	if c.outOff < len(c.out) {
		c.queue(bs...)
		return total, nil
	}
	if c.loop.defers(total) {
		c.out = c.loop.takeOut()
		c.queue(bs...)
		c.loop.pend(c)
		return total, nil
	}
	n, err := rawio.Sendv(c.fd, bs, &c.loop.vec)
	if err = c.sent(err); err != nil {
		return 0, err
	}
	if n == total {
		return total, nil
	}
	for _, b := range bs {
		if n >= len(b) {
			n -= len(b)
			continue
		}
		c.out = append(c.out, b[n:]...)
		n = 0
	}
	c.watchOut()
	return total, nil
}

// queue appends bs to the bytes waiting. Where they do not fit, the
// bytes sent already go first: the waiting ones move to the front (in
// place when the sent ones are at least half) so that a queue that never
// empties does not keep all it ever held.
func (c *Conn) queue(bs ...[]byte) {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	if c.outOff > 0 && len(c.out)+n > cap(c.out) {
		waiting := c.out[c.outOff:]
		out := c.out[:0]
		if 2*c.outOff < len(c.out) || len(waiting)+n > cap(c.out) {
			out = make([]byte, 0, 2*(len(waiting)+n))
		}
		c.out, c.outOff = append(out, waiting...), 0
	}
	for _, b := range bs {
		c.out = append(c.out, b...)
	}
}

// sendPending sends what c's out holds for the turn's end now, as a
// Write without the ring would have.
func (c *Conn) sendPending() {
	if !c.pend {
		return
	}
	c.pend = false
	n, err := rawio.Send(c.fd, c.out[c.outOff:])
	c.outOff += n
	c.settle(err)
}

// settle settles a send of out's waiting bytes that counted what it
// took in outOff, or failed with err: the rest waits for EPOLLOUT.
func (c *Conn) settle(err error) {
	switch {
	case c.sent(err) != nil:
	case c.outOff < len(c.out):
		c.watchOut()
	default:
		c.drained()
	}
}

// sent closes c on a send's error, which it returns; EAGAIN is none.
func (c *Conn) sent(err error) error {
	if err == nil || err == unix.EAGAIN {
		return nil
	}
	err = os.NewSyscallError("write", err)
	c.loop.close(c, err)
	return err
}

// watchOut asks for EPOLLOUT, bytes having just been queued.
func (c *Conn) watchOut() {
	if err := c.loop.ctl(unix.EPOLL_CTL_MOD, c.fd, unix.EPOLLIN|unix.EPOLLOUT); err != nil {
		c.loop.close(c, os.NewSyscallError("epoll_ctl", err))
	}
}

// drained empties the outbound queue, which the socket took; its buffer
// goes back to the loop, so that a connection that waits keeps none.
func (c *Conn) drained() {
	c.loop.giveOut(c.out)
	c.out, c.outOff = nil, 0
}

// AsyncWrite writes b on the loop, then calls cb (if not nil) there. b
// must stay untouched until then.
func (c *Conn) AsyncWrite(b []byte, cb Callback) error {
	return c.loop.trigger(task{kind: taskWrite, c: c, b: b, cb: cb})
}

// AsyncWritev is AsyncWrite of bs's buffers.
func (c *Conn) AsyncWritev(bs [][]byte, cb Callback) error {
	return c.loop.trigger(task{kind: taskWritev, c: c, bs: bs, cb: cb})
}

// Wake runs OnTraffic on the loop, then cb (if not nil).
func (c *Conn) Wake(cb Callback) error {
	return c.loop.trigger(task{kind: taskWake, c: c, cb: cb})
}

// Close closes the connection on a later turn of its loop.
func (c *Conn) Close() error {
	return c.loop.trigger(task{kind: taskClose, c: c})
}

// A task is work for the loop from another goroutine (or from a callback
// that must not run it at once).
type task struct {
	kind taskKind
	c    *Conn
	fn   func()
	b    []byte
	bs   [][]byte
	cb   Callback
	done chan error // taskEnroll's answer
}

type taskKind uint8

const (
	taskRun taskKind = iota
	taskWrite
	taskWritev
	taskWake
	taskClose
	taskEnroll
	taskStop
)

// trigger queues t and wakes the loop, unless it was woken already and
// has not yet found the queue empty.
func (l *Loop) trigger(t task) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return ErrStopped
	}
	l.tasks = append(l.tasks, t)
	if !l.woken {
		l.woken = true
		// Under mu: the loop closes the eventfd only once stopped is
		// set. It cannot block (non-blocking, and a counter that would
		// take 2^64 writes to fill).
		one := uint64(1)
		_, _, _ = unix.RawSyscall(unix.SYS_WRITE, uintptr(l.wakeFD), uintptr(unsafe.Pointer(&one)), 8)
	}
	return nil
}

// chores runs the tasks queued; true if more came meanwhile, which the
// loop runs after its next look at the sockets, so that a stream of
// tasks does not keep it from them.
func (l *Loop) chores() bool {
	l.mu.Lock()
	l.running, l.tasks = l.tasks, l.running[:0]
	l.mu.Unlock()
	for i := range l.running {
		l.running[i].do(l)
		l.running[i] = task{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.tasks) == 0 {
		l.woken = false
		return false
	}
	return true
}

func (t *task) do(l *Loop) {
	switch t.kind {
	case taskRun:
		t.fn()
	case taskWrite, taskWritev:
		err := net.ErrClosed
		if t.c.opened {
			if t.kind == taskWrite {
				_, err = t.c.Write(t.b)
			} else {
				_, err = t.c.Writev(t.bs)
			}
		}
		if t.cb != nil {
			t.cb(t.c, err)
		}
	case taskWake:
		err := net.ErrClosed
		if t.c.opened {
			err = nil
			if l.e.h.OnTraffic(t.c) == Close {
				l.close(t.c, nil)
			}
		}
		if t.cb != nil {
			t.cb(t.c, err)
		}
	case taskClose:
		l.close(t.c, nil)
	case taskEnroll:
		t.done <- l.register(t.c)
	case taskStop:
		l.done = true
	}
}

// refuse answers a task the stopped loop will not run.
func (t *task) refuse() {
	switch t.kind {
	case taskWrite, taskWritev, taskWake:
		if t.cb != nil {
			t.cb(t.c, net.ErrClosed)
		}
	case taskRun:
		// Execute said nil: the func runs, with the loop's connections
		// closed by now.
		t.fn()
	case taskEnroll:
		_ = unix.Close(t.c.fd)
		t.done <- ErrStopped
	}
}

// tcpAddr is sa as a net.Addr.
func tcpAddr(sa unix.Sockaddr) net.Addr {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]), Port: sa.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]), Port: sa.Port}
	}
	return &net.TCPAddr{}
}

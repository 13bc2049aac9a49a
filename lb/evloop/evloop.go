// Package evloop runs the gnet front end's event loops: one goroutine per
// loop, each with its own epoll instance, eventfd for tasks and
// SO_REUSEPORT listener, which accepts, reads and writes its connections
// and calls the Handler for each event. Its API follows gnet's (v2), which
// the front end ran on before: connection buffers read with Peek, Next and
// Discard, writes that queue what the socket did not take, AsyncWrite and
// Wake from other goroutines, tasks with Execute, sockets dialed elsewhere
// enrolled on a loop.
//
// What it does differently is how a loop waits. A loop that holds
// connections it accepted waits in epoll_pwait as a raw system call, which keeps its P
// and skips the runtime's entersyscall and exitsyscall: the runtime's
// monitor neither hands the P off while the loop waits nor, when every P
// went idle, polls every 20 µs after the next system call wakes it; and
// nothing yields after a batch, where gnet's Gosched woke a spinning
// thread each time a P was idle. The loop still yields when a signal ends
// the wait (the monitor's and the collector's preemption), and the caller
// must leave Ps for goroutines: GOMAXPROCS above the loops that hold
// accepted connections. A loop with none (idle, or holding only enrolled
// ones, which wait for a client's request) waits as any system call does
// and lends its P to goroutines.
//
// And how it reads and writes: where the kernel has io_uring, a turn's
// reads (one for each connection its wait found readable) go to the
// kernel in one io_uring_enter, and so do its writes, at its end
// (internal/rawio's Ring); a turn with one of either makes the plain
// call.
package evloop

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"pdlb/internal/rawio"
	"pdlb/internal/spares"
)

// Action is what a Handler asks of the loop after an event.
type Action int

const (
	// None keeps the connection.
	None Action = iota
	// Close closes it (OnClose runs) before the loop goes on.
	Close
)

// Handler handles a loop's events; every method but OnBoot and OnTick
// runs on the connection's loop, one event at a time.
type Handler interface {
	// OnBoot runs once, before the loops start.
	OnBoot(*Engine)
	// OnOpen runs for a connection accepted or enrolled; out, if any, is
	// written to it first.
	OnOpen(c *Conn) (out []byte, a Action)
	// OnTraffic runs when bytes arrived (they wait in the connection's
	// buffer) and when Wake asks.
	OnTraffic(c *Conn) Action
	// OnClose runs once as the connection closes; err is why, nil when
	// the Handler or the engine closed it.
	OnClose(c *Conn, err error)
	// OnTick runs on a goroutine of its own, first once every loop
	// listens, then after the delay it returns.
	OnTick() time.Duration
}

// An AcceptWatcher is a Handler told, on the loop, of each accept the
// kernel refused for want of descriptors or memory (err): the loop then
// leaves its listener alone for pause, and the connection waits in the
// listen queue meanwhile.
type AcceptWatcher interface {
	OnAcceptPause(err error, pause time.Duration)
}

// Callback runs on the loop when an AsyncWrite, AsyncWritev or Wake is
// done; err is net.ErrClosed on a connection closed before.
type Callback func(c *Conn, err error)

// ErrStopped is the answer to a call made to a loop that stopped.
var ErrStopped = errors.New("evloop: the engine stopped")

// Engine is the loops that Run started.
type Engine struct {
	h       Handler
	loops   []*Loop
	conns   atomic.Int32
	errOnce sync.Once
	err     error
	ringErr error // why the loops make their calls one by one; nil: in rings
}

// Options are Run's.
type Options struct {
	// Loops is how many loops serve the address.
	Loops int
	// NoRing makes each send and receive a system call of its own. Else,
	// where the kernel has io_uring (5.18 or later, not turned off), a
	// loop reads every connection its wait found ready with one call, and
	// what a turn wrote goes out with one more at its end.
	NoRing bool
}

// ErrNoRing is Engine.Ring's answer when Options.NoRing was set.
var ErrNoRing = errors.New("evloop: io_uring turned off")

// Run binds addr (an IP literal and port) with o.Loops loops and serves
// h until Stop, or until a loop fails; it returns the failure, nil after
// Stop.
func Run(h Handler, addr string, o Options) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return fmt.Errorf("evloop: listen address %q: %w", addr, err)
	}
	e := &Engine{h: h}
	if o.NoRing {
		e.ringErr = ErrNoRing
	}
	for i := range o.Loops {
		l, err := newLoop(e, ap)
		if err != nil {
			for _, l := range e.loops {
				l.closeFDs()
			}
			return fmt.Errorf("evloop: loop %d on %s: %w", i, addr, err)
		}
		e.loops = append(e.loops, l)
	}
	h.OnBoot(e)
	var wg sync.WaitGroup
	for _, l := range e.loops {
		wg.Go(l.run)
	}
	ticking, ticked := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ticked)
		e.tick(ticking)
	}()
	wg.Wait()
	close(ticking)
	<-ticked // no OnTick runs once Run returned
	return e.err
}

// tick runs OnTick until stop closes.
func (e *Engine) tick(stop <-chan struct{}) {
	t := time.NewTimer(e.h.OnTick())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			t.Reset(e.h.OnTick())
		}
	}
}

// Stop asks every loop to close its connections and listener and return;
// Run returns once they have.
func (e *Engine) Stop() {
	for _, l := range e.loops {
		_ = l.trigger(task{kind: taskStop})
	}
}

// fail stops the engine with err, the first of them Run returns.
func (e *Engine) fail(err error) {
	e.errOnce.Do(func() { e.err = err })
	e.Stop()
}

// Ring says whether the loops batch their sends and receives with
// io_uring: nil when they do, else why not (ErrNoRing, or the kernel's
// refusal). From OnBoot on.
func (e *Engine) Ring() error { return e.ringErr }

// CountConnections is how many connections the loops hold, enrolled ones
// included.
func (e *Engine) CountConnections() int { return int(e.conns.Load()) }

// Loop is one event loop. Its connections, buffers and listener are
// touched only by its goroutine; other goroutines reach it through tasks.
type Loop struct {
	e      *Engine
	ep     int // epoll instance
	wakeFD int // eventfd, written when tasks wait
	ln     int // the SO_REUSEPORT listener; -1 once closed
	local  net.Addr
	// conns are the open connections, by descriptor; accepted counts
	// those the listener gave.
	conns    []*Conn
	accepted int
	// buf is where a read lands when the connection holds no bytes
	// already; OnTraffic then sees it in place.
	buf []byte
	vec []unix.Iovec // Writev's scratch
	// ring, where the kernel has io_uring, sends what the turn wrote in
	// one call at its end: pending are the connections with bytes for it,
	// in the order they were written; flushing is flushPending's scratch.
	ring              *rawio.Ring
	pending, flushing []*Conn
	// reading are the connections with bytes to read this turn, for
	// readBatch; readOf its scratch.
	reading []*Conn
	readOf  []int
	// outs are drained outbound queues' buffers, for the next writes.
	outs   spares.List[[]byte]
	events []unix.EpollEvent
	done   bool // a stop task ran
	idle   int  // raw waits in a row the monitor's preemption ended
	turn   uint64
	yield  bool // Yield: the loop yields its P before it next waits

	mu sync.Mutex
	// tasks wait for the loop; woken: the eventfd was written for them
	// and the loop did not yet find the queue empty. stopped: the loop
	// returned, and takes no more.
	tasks   []task
	woken   bool
	stopped bool
	running []task // the loop's, swapped with tasks
}

// readSize is a loop's read buffer: the most a read takes at once.
const readSize = 64 << 10

// batchSize is a loop's read buffer with a ring, which the reads of a
// batch share: readSize each for four, minRead each for sixteen.
const batchSize = 256 << 10

func newLoop(e *Engine, ap netip.AddrPort) (*Loop, error) {
	l := &Loop{e: e, ep: -1, wakeFD: -1, ln: -1, buf: make([]byte, readSize), events: make([]unix.EpollEvent, 128)}
	var err error
	if e.ringErr == nil {
		// After one loop's refusal the others do not ask.
		if l.ring, e.ringErr = rawio.NewRing(len(l.events)); l.ring != nil {
			l.buf = make([]byte, batchSize)
		}
	}
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	if l.wakeFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		l.closeFDs()
		return nil, err
	}
	if l.ln, err = listen(ap); err == nil {
		// Edge-triggered: each write to the eventfd is an event, and the
		// counter (2^64 writes) need not be read back.
		err = errors.Join(l.ctl(unix.EPOLL_CTL_ADD, l.wakeFD, unix.EPOLLIN|unix.EPOLLET),
			l.ctl(unix.EPOLL_CTL_ADD, l.ln, unix.EPOLLIN))
	}
	if err != nil {
		l.closeFDs()
		return nil, err
	}
	sa, err := unix.Getsockname(l.ln)
	if err != nil {
		l.closeFDs()
		return nil, err
	}
	l.local = tcpAddr(sa)
	return l, nil
}

// listen opens a listener on ap beside the other loops' (SO_REUSEPORT),
// with SO_REUSEADDR (a restart does not wait out the TIME_WAIT of the
// connections the last run closed first) and TCP_NODELAY, which the
// connections it accepts inherit.
func listen(ap netip.AddrPort) (int, error) {
	var sa unix.Sockaddr
	family := unix.AF_INET6
	if ap.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, err
	}
	err = errors.Join(unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1),
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1),
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1))
	if err == nil && family == unix.AF_INET6 && ap.Addr().IsUnspecified() {
		// "[::]:port" takes IPv4 clients too, as Go's listeners do,
		// whatever net.ipv6.bindv6only says.
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}
	if err == nil {
		err = unix.Bind(fd, sa)
	}
	if err == nil {
		err = unix.Listen(fd, unix.SOMAXCONN)
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func (l *Loop) ctl(op, fd int, events uint32) error {
	return unix.EpollCtl(l.ep, op, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

// closeFDs closes the loop's own descriptors.
func (l *Loop) closeFDs() {
	if l.ring != nil {
		l.ring.Close()
		l.ring = nil
	}
	for _, fd := range []int{l.ln, l.wakeFD, l.ep} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	l.ln = -1
}

func (l *Loop) run() {
	defer l.exit()
	// more: tasks are left from the last round, run after a look at the
	// sockets that does not wait.
	more := false
	for !l.done {
		timeout := -1
		if more {
			timeout = 0
		}
		n, err := l.wait(timeout)
		if err != nil {
			l.e.fail(fmt.Errorf("evloop: epoll_wait: %w", err))
			return
		}
		chores := more
		for i := range n {
			ev := &l.events[i]
			switch fd := int(ev.Fd); {
			case fd == l.wakeFD:
				chores = true
			case fd == l.ln:
				if err := l.accept(); err != nil {
					l.e.fail(err)
					return
				}
			case fd < len(l.conns) && l.conns[fd] != nil:
				l.serve(l.conns[fd], ev.Events)
			}
			// Else the event is for a connection an earlier one of the
			// batch closed: nothing is left to act on.
		}
		l.readBatch()
		more = chores && l.chores()
		l.flushPending()
		if l.yield && !more {
			l.yield = false
			runtime.Gosched()
		}
	}
}

// maxDeferred is the most a write leaves for the turn's end; a larger
// one is sent at once, as the socket takes it, not copied whole first.
const maxDeferred = 16 << 10

// defers says whether a write of n bytes to a connection with none
// waiting goes out at the turn's end.
func (l *Loop) defers(n int) bool { return l.ring != nil && n <= maxDeferred }

// takeOut is an empty buffer for a connection's outbound queue: one a
// drained queue gave back, else nil (append makes one).
func (l *Loop) takeOut() []byte {
	b, _ := l.outs.Take()
	return b
}

// giveOut keeps a drained queue's buffer for takeOut, unless it is past a
// deferred write's size (a backlog's): up to spares.Max of them, 4 MiB,
// until TrimSpares lets go of those a burst left unused.
func (l *Loop) giveOut(b []byte) {
	if b != nil && cap(b) <= maxDeferred {
		l.outs.Give(b[:0])
	}
}

// TrimSpares lets go of the outbound buffers the loop kept and did not
// take since the last trim, once every period of now's clock (the
// caller's, as spares.List.Trim); on the loop.
func (l *Loop) TrimSpares(now, every int64) { l.outs.Trim(now, every, func([]byte) {}) }

// pend has c's out sent at the turn's end.
func (l *Loop) pend(c *Conn) {
	c.pend = true
	l.pending = append(l.pending, c)
}

// flushPending sends what the turn wrote, a ring's batch at a time; what
// a socket does not take waits for EPOLLOUT, and a send's error closes
// its connection, whose OnClose may write to others: they go in the next
// batch.
func (l *Loop) flushPending() {
	for len(l.pending) > 0 {
		if len(l.pending) == 1 {
			// One send costs more through the ring than as sendto.
			c := l.pending[0]
			l.pending[0], l.pending = nil, l.pending[:0]
			c.sendPending()
			continue
		}
		l.flushing, l.pending = l.pending, l.flushing[:0]
		sent := l.flushing[:0] // those whose out is in the batch, in its order
		for i, c := range l.flushing {
			if c.pend && c.opened {
				c.pend = false
				l.ring.Send(c.fd, c.out[c.outOff:])
				sent = append(sent, c)
			}
			if l.ring.Len() < l.ring.Cap() && i < len(l.flushing)-1 {
				continue
			}
			res := l.ring.Submit()
			// Every count first: an error's OnClose may close another
			// of the batch, which then sends only what is left.
			for j, r := range res {
				sent[j].outOff += r.N
			}
			for j, r := range res {
				if c := sent[j]; c.opened {
					c.settle(r.Err)
				}
			}
			sent = sent[:0]
		}
		clear(l.flushing)
	}
}

// Yield makes the loop yield its P before it next waits; on the loop,
// after it readied a goroutine (a channel send, a job for a worker). The
// runtime puts that goroutine next on the loop's P, and a loop that
// blocked holding the P would leave it for another thread to take, after
// a wake-up and a 3 µs pause to be sure the P is not about to run it;
// yielded, the P runs it at once.
func (l *Loop) Yield() { l.yield = true }

// wait waits up to timeout milliseconds (-1: no limit) for events: as a
// raw system call while the loop holds accepted connections (see the
// package comment), else as the runtime's syscall, which lends the P to
// goroutines while it blocks. The runtime's monitor preempts a goroutine
// every 10 ms it runs without a reschedule, which ends a raw wait with
// EINTR, busy or not; two in a row with no event between mean the loop
// idled a whole period, and it waits plainly until the next event, so
// that an idle loop with connections open neither takes a signal every
// 10 ms nor keeps its P.
func (l *Loop) wait(timeout int) (int, error) {
	for {
		var n int
		var err error
		raw := l.accepted > 0 && l.idle < 2
		if raw {
			r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), uintptr(timeout), 0, 0)
			n = int(r)
			if errno != 0 {
				err = errno
			}
		} else {
			n, err = unix.EpollWait(l.ep, l.events, timeout)
		}
		if err == unix.EINTR {
			if raw {
				l.idle++
			}
			// The raw call has no preemption point: this is one.
			runtime.Gosched()
			continue
		}
		l.idle = 0
		l.turn++
		return n, err
	}
}

// Turn counts the loop's waits that returned: all that runs on the loop
// between two of them (a batch of events, the tasks) is one turn. From
// 1; on the loop.
func (l *Loop) Turn() uint64 { return l.turn }

// accept takes a connection waiting on the listener: one an event, as
// the listener is level-triggered and what is left comes back, where a
// loop until EAGAIN would spend a failed call on nearly every accept.
func (l *Loop) accept() error {
	fd, sa, err := unix.Accept4(l.ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	switch err {
	case nil:
	case unix.EAGAIN, unix.EINTR, unix.ECONNABORTED, unix.ECONNRESET:
		// Taken by another loop's listener, or reset while it waited in
		// the queue.
		return nil
	case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM:
		// Out of descriptors or memory: leave the connections in the
		// queue, and stop watching the listener (level-triggered, it
		// would spin) for a while.
		l.pauseAccept()
		if w, ok := l.e.h.(AcceptWatcher); ok {
			w.OnAcceptPause(err, acceptPause)
		}
		return nil
	default:
		return fmt.Errorf("evloop: accept on %s: %w", l.local, err)
	}
	// A connection epoll would not take (ENOSPC: fs.epoll.max_user_watches)
	// is closed, and the loop goes on with the others.
	_ = l.register(&Conn{loop: l, fd: fd, local: l.local, remote: tcpAddr(sa), accepted: true})
	return nil
}

// acceptPause is how long a loop that ran out of descriptors leaves its
// listener before it tries again.
const acceptPause = 10 * time.Millisecond

func (l *Loop) pauseAccept() {
	if err := l.ctl(unix.EPOLL_CTL_MOD, l.ln, 0); err != nil {
		return
	}
	time.AfterFunc(acceptPause, func() {
		_ = l.Execute(func() {
			if l.ln >= 0 && !l.done {
				_ = l.ctl(unix.EPOLL_CTL_MOD, l.ln, unix.EPOLLIN)
			}
		})
	})
}

// register adds c to the loop and opens it: OnOpen, its out written.
func (l *Loop) register(c *Conn) error {
	if err := l.ctl(unix.EPOLL_CTL_ADD, c.fd, unix.EPOLLIN); err != nil {
		_ = unix.Close(c.fd)
		return fmt.Errorf("evloop: epoll_ctl add: %w", err)
	}
	if c.fd >= len(l.conns) {
		// Past the old length nothing was ever stored: nil.
		l.conns = slices.Grow(l.conns, c.fd+1-len(l.conns))[:c.fd+1]
	}
	l.conns[c.fd] = c
	if c.accepted {
		l.accepted++
	}
	l.e.conns.Add(1)
	c.opened = true
	out, act := l.e.h.OnOpen(c)
	if len(out) > 0 && c.opened {
		_, _ = c.Write(out)
	}
	if act == Close {
		l.close(c, nil)
	}
	return nil
}

// serve handles epoll's events for c: it writes what waits first (a
// client that stopped reading gets nothing more read from it ahead of
// what it owes), then reads, or with a ring has readBatch read once the
// turn's events are all seen.
func (l *Loop) serve(c *Conn, events uint32) {
	if events&(unix.EPOLLOUT|unix.EPOLLERR) != 0 && c.outOff < len(c.out) {
		l.flush(c)
	}
	if events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) != 0 && c.opened {
		if l.ring != nil {
			l.reading = append(l.reading, c)
			return
		}
		l.read(c)
	}
}

// minRead is the least room a read into a connection's own buffer has.
const minRead = 16 << 10

// read reads what arrived on c once (the loop is level-triggered: what is
// left comes back) and hands it to OnTraffic: in place in the loop's
// buffer when c held nothing before, else after what c held.
func (l *Loop) read(c *Conn) {
	var n int
	var err error
	if len(c.in) == 0 {
		n, err = rawio.Recv(c.fd, l.buf[:readSize])
		c.cur = l.buf[:n]
	} else {
		c.room(minRead)
		n, err = rawio.Recv(c.fd, c.in[len(c.in):cap(c.in)])
		c.in = c.in[:len(c.in)+n]
	}
	l.received(c, n, err)
}

// readBatch reads what arrived on the connections serve listed, a ring's
// batch at a time into slices of the loop's buffer, then hands each its
// bytes in the order of their events, as read does: in place when it
// held nothing before, else copied after what it held. One whose read
// found it closed (an earlier OnTraffic of the batch closed it) is
// skipped, its bytes dropped.
func (l *Loop) readBatch() {
	for start := 0; start < len(l.reading); {
		batch := l.reading[start:min(len(l.reading), start+min(l.ring.Cap(), len(l.buf)/minRead))]
		start += len(batch)
		if len(batch) == 1 {
			// One read costs more through the ring than as recvfrom.
			if c := batch[0]; c.opened {
				l.read(c)
			}
			continue
		}
		size := min(readSize, len(l.buf)/len(batch))
		read := l.readOf[:0]
		for i, c := range batch {
			// Open now, none of the batch's handlers having run: the
			// descriptor is c's, not a new connection's.
			if c.opened {
				l.ring.Recv(c.fd, l.buf[i*size:(i+1)*size])
				read = append(read, i)
			}
		}
		for j, r := range l.ring.Submit() {
			i := read[j]
			c := batch[i]
			if !c.opened {
				continue
			}
			got := l.buf[i*size : i*size+r.N]
			if len(c.in) == 0 {
				c.cur = got
			} else {
				c.room(len(got))
				c.in = append(c.in, got...)
			}
			l.received(c, r.N, r.Err)
		}
		l.readOf = read
	}
	clear(l.reading)
	l.reading = l.reading[:0]
}

// received hands c what a read of n bytes (or err) left in c.cur or
// c.in.
func (l *Loop) received(c *Conn, n int, err error) {
	switch {
	case err == unix.EAGAIN:
		c.cur = nil
		return
	case err != nil:
		c.cur = nil
		l.close(c, fmt.Errorf("read: %w", err))
		return
	case n == 0:
		c.cur = nil
		l.close(c, io.EOF)
		return
	}
	if l.e.h.OnTraffic(c) == Close {
		c.cur = nil
		l.close(c, nil)
		return
	}
	if len(c.cur) > 0 && c.opened {
		c.keep()
	}
	c.cur = nil
}

// flush writes c's queued bytes; on EPOLLOUT.
func (l *Loop) flush(c *Conn) {
	n, err := rawio.Send(c.fd, c.out[c.outOff:])
	switch {
	case err == unix.EAGAIN:
		return
	case err != nil:
		l.close(c, fmt.Errorf("write: %w", err))
		return
	}
	if c.outOff += n; c.outOff < len(c.out) {
		return
	}
	c.drained()
	if err := l.ctl(unix.EPOLL_CTL_MOD, c.fd, unix.EPOLLIN); err != nil {
		l.close(c, fmt.Errorf("epoll_ctl mod: %w", err))
	}
}

// close closes c, once: OnClose, then what waits to be written goes out
// as far as the socket takes it now.
func (l *Loop) close(c *Conn, err error) {
	if !c.opened {
		return
	}
	c.opened, c.pend = false, false // what waits goes out below
	l.conns[c.fd] = nil
	if c.accepted {
		l.accepted--
	}
	l.e.conns.Add(-1)
	l.e.h.OnClose(c, err)
	for c.outOff < len(c.out) {
		n, err := rawio.Send(c.fd, c.out[c.outOff:])
		if err != nil {
			break
		}
		c.outOff += n
	}
	if c.shared {
		// A duplicate of the socket (Dup) would keep it registered past
		// the close; without one, the close takes it off.
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, c.fd, nil)
	}
	_ = unix.Close(c.fd)
	c.in, c.store, c.out, c.outOff = nil, nil, nil, 0
}

// Close closes c now; on c's loop.
func (l *Loop) Close(c *Conn) error {
	l.close(c, nil)
	return nil
}

// exit closes what the loop holds, once it stopped, and answers the
// tasks that came too late.
func (l *Loop) exit() {
	for _, c := range l.conns {
		if c != nil {
			l.close(c, nil)
		}
	}
	l.mu.Lock()
	l.stopped = true
	late := l.tasks
	l.tasks = nil
	l.mu.Unlock()
	l.closeFDs() // no trigger writes to the eventfd now
	for _, t := range late {
		t.refuse()
	}
	l.e.Stop() // a loop that failed stops the others
}

// Execute runs fn on the loop, after what it was given before.
func (l *Loop) Execute(fn func()) error {
	return l.trigger(task{kind: taskRun, fn: fn})
}

// Enroll hands nc's socket to the loop, as a connection with context ctx
// (a duplicate of the descriptor: nc is closed), and returns once OnOpen
// ran, or with why it could not.
func (l *Loop) Enroll(nc net.Conn, ctx any) error {
	defer nc.Close()
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return fmt.Errorf("evloop: a %T has no socket to enroll", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	fd := -1
	if cerr := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("evloop: dup: %w", err)
	}
	done := make(chan error, 1)
	c := &Conn{loop: l, fd: fd, local: nc.LocalAddr(), remote: nc.RemoteAddr(), ctx: ctx}
	if err := l.trigger(task{kind: taskEnroll, c: c, done: done}); err != nil {
		_ = unix.Close(fd)
		return err
	}
	return <-done
}

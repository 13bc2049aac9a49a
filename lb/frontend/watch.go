package frontend

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"pdlb/internal/mono"
	"pdlb/lb/upstream"
)

// Watching a fasthttp client. fasthttp reads nothing of a connection while
// its handler runs, so a client that leaves shows only when its answer is
// written. A request that waits long on work its client's leaving should
// cut (a prefill/decode exchange) asks for a watch: a goroutine waits in
// the runtime's poller for the socket to change and asks the kernel
// whether the client has closed its side, consuming nothing. The watch
// ends before fasthttp uses the connection's reads again (the next
// request's deadline, a read, Close), and the read deadline it lifted is
// put back first.

// WatchClient is ClientGone for a request that may wait long on work the
// client's leaving should cut; on fasthttp, which has no such signal of
// its own, it starts a watch of the client's connection, which lasts
// until fasthttp reads the connection again or closes it. Its channel is
// closed once the client has closed or reset the connection, or shut down
// its sending side (gnet closes such a connection too); bytes the client
// sends meanwhile (a pipelined request) stay for fasthttp. Nil where the
// connection is none of the front ends' own.
func WatchClient(ctx *fasthttp.RequestCtx) <-chan struct{} {
	if gone := ClientGone(ctx); gone != nil {
		return gone
	}
	if c := lingerConnOf(ctx.Conn()); c != nil {
		return c.watch()
	}
	return nil
}

// lingerConnOf is the fasthttp front end's own connection under c's
// wrappers (TLS, the per-address limits, h2c's sniffed preface); nil for
// any other connection.
func lingerConnOf(c net.Conn) *lingerConn {
	for {
		switch w := c.(type) {
		case *lingerConn:
			return w
		case *prefixedConn:
			c = w.Conn
		case interface{ NetConn() net.Conn }: // TLS's, the limits'
			c = w.NetConn()
		default:
			return nil
		}
	}
}

// clientWatch is one watch of a connection.
type clientWatch struct {
	gone chan struct{} // closed when the client left
	done chan struct{} // closed when the watch's goroutine returned
}

// watcher is what a lingerConn keeps of its watch.
type watcher struct {
	mu  sync.Mutex // held while a watch starts or ends
	cur atomic.Pointer[clientWatch]
	// readBy is the last read deadline set through the connection, on
	// mono's clock so a step of the wall clock moves nothing (0: none;
	// no deadline falls at the process's start). A watch lifts it and
	// its end puts it back.
	readBy atomic.Int64
}

// watch starts a watch of c, or joins the one under way, and returns its
// channel; nil when the socket cannot be watched.
func (c *lingerConn) watch() <-chan struct{} {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	if w := c.w.cur.Load(); w != nil {
		return w.gone
	}
	rc, err := c.TCPConn.SyscallConn()
	if err != nil {
		return nil
	}
	// The deadline fasthttp set to read the request would end the watch
	// of a longer wait.
	if c.TCPConn.SetReadDeadline(time.Time{}) != nil {
		return nil
	}
	w := &clientWatch{gone: make(chan struct{}), done: make(chan struct{})}
	c.w.cur.Store(w)
	go w.run(rc)
	return w.gone
}

// run waits until the client has left, or the watch is ended (a read
// deadline in the past) or the connection closed.
func (w *clientWatch) run(rc syscall.RawConn) {
	defer close(w.done)
	if rc.Read(func(fd uintptr) bool { return peerClosed(int(fd)) }) == nil {
		close(w.gone)
	}
}

// unwatch ends c's watch, if one runs, and returns once its goroutine
// has; restore puts back the read deadline the watch lifted.
func (c *lingerConn) unwatch(restore bool) {
	if c.w.cur.Load() == nil {
		return
	}
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	w := c.w.cur.Load()
	if w == nil {
		return
	}
	// A deadline in the past wakes the watch's wait in the poller.
	_ = c.TCPConn.SetReadDeadline(time.Unix(1, 0))
	<-w.done
	c.w.cur.Store(nil)
	if restore {
		var by time.Time
		if n := c.w.readBy.Load(); n != 0 {
			by = mono.Time(n)
		}
		_ = c.TCPConn.SetReadDeadline(by)
	}
}

// setReadBy ends c's watch before a read deadline t is set, and records
// t for the next watch's end.
func (c *lingerConn) setReadBy(t time.Time) {
	c.unwatch(false)
	var n int64
	if !t.IsZero() {
		n = mono.Of(t)
	}
	c.w.readBy.Store(n)
}

func (c *lingerConn) SetReadDeadline(t time.Time) error {
	c.setReadBy(t)
	return c.TCPConn.SetReadDeadline(t)
}

func (c *lingerConn) SetDeadline(t time.Time) error {
	c.setReadBy(t)
	return c.TCPConn.SetDeadline(t)
}

// goneChan is ClientGone's channel of a connection or an HTTP/2 stream,
// made on first use (few requests wait on it), under its owner's lock.
type goneChan struct{ ch chan struct{} }

// get returns the channel, closed already when the client is gone.
func (g *goneChan) get(gone bool) <-chan struct{} {
	if g.ch == nil {
		g.ch = make(chan struct{})
		if gone {
			close(g.ch)
		}
	}
	return g.ch
}

// fire closes the channel, if one was made; once, as the client leaves.
func (g *goneChan) fire() {
	if g.ch != nil {
		close(g.ch)
	}
}

// cutters is who a client's leaving cuts (ClientCut's watchers), under
// the lock of the connection they watch. A request watches one call at a
// time, so buf holds it without an allocation.
type cutters struct {
	list []upstream.Cutter
	buf  [1]upstream.Cutter
}

func (cs *cutters) add(w upstream.Cutter) {
	if cs.list == nil {
		cs.list = cs.buf[:0]
	}
	cs.list = append(cs.list, w)
}

func (cs *cutters) remove(w upstream.Cutter) {
	cs.list = slices.DeleteFunc(cs.list, func(h upstream.Cutter) bool { return h == w })
}

// cut cuts every watcher, once: none is left.
func (cs *cutters) cut() {
	for _, w := range cs.list {
		w.Cut()
	}
	cs.list = nil
}

// peerClosed reports whether the client of socket fd has closed or reset
// the connection, or shut down its sending side: POLLRDHUP tells so even
// while bytes it sent before wait unread (a pipelined request, TLS's
// close_notify alert), which a peek at the socket would take for a client
// still there.
func peerClosed(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
}

package limits

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/internal/mono"
)

// Conns counts client connections by address and enforces ConnLimits. A
// front end that accepts from a net.Listener gets everything by serving on
// Wrap(ln); an event-loop front end without one (gnet) calls Acquire when a
// connection opens and Release when it closes, and keeps its own idle
// timer. Safe for concurrent use.
type Conns struct {
	limits ConnLimits
	mu     sync.Mutex
	// perIP holds the open connections of each client address that has
	// any; an address leaves the map with its last connection, so the map
	// is as large as the set of connected clients.
	perIP   map[netip.Addr]int
	open    atomic.Int64
	refused atomic.Uint64
}

// NewConns returns the counter of validated limits.
func NewConns(l ConnLimits) *Conns {
	return &Conns{limits: l, perIP: map[netip.Addr]int{}}
}

// clientOf is the address a connection counts against: the IP, with IPv6
// addresses cut to their /64 since one host is routinely given a whole /64
// and could otherwise open its cap on each of 2^64 addresses. The zero Addr
// (not an IP connection) is never capped.
func clientOf(remote net.Addr) netip.Addr {
	var ip netip.Addr
	switch a := remote.(type) {
	case *net.TCPAddr:
		ip = a.AddrPort().Addr().Unmap()
	case nil:
		return ip
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return ip
		}
		ip = ap.Addr().Unmap()
	}
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return ip
}

// Acquire counts a new connection from remote and reports whether it is
// within the per-IP cap; a false answer counted nothing, and the caller
// closes the connection.
func (cs *Conns) Acquire(remote net.Addr) bool {
	if ip := clientOf(remote); cs.limits.MaxConnsPerIP > 0 && ip.IsValid() {
		cs.mu.Lock()
		n := cs.perIP[ip]
		if n >= cs.limits.MaxConnsPerIP {
			cs.mu.Unlock()
			cs.refused.Add(1)
			return false
		}
		cs.perIP[ip] = n + 1
		cs.mu.Unlock()
	}
	cs.open.Add(1)
	return true
}

// Release uncounts a connection Acquire accepted.
func (cs *Conns) Release(remote net.Addr) {
	if ip := clientOf(remote); cs.limits.MaxConnsPerIP > 0 && ip.IsValid() {
		cs.mu.Lock()
		if n := cs.perIP[ip]; n > 1 {
			cs.perIP[ip] = n - 1
		} else {
			delete(cs.perIP, ip)
		}
		cs.mu.Unlock()
	}
	cs.open.Add(-1)
}

// Open is the number of connections counted now.
func (cs *Conns) Open() int64 { return cs.open.Load() }

// Refused is the number of connections refused by the per-IP cap so far.
func (cs *Conns) Refused() uint64 { return cs.refused.Load() }

// Wrap returns ln with the limits applied: Accept answers a connection
// over its address's cap with refusal (nil: none) and closes it, and goes
// on accepting (see refusing). Accepted connections count until closed,
// and each read or write gets a deadline no later than IdleTimeout from
// its start.
func (cs *Conns) Wrap(ln net.Listener, refusal []byte) net.Listener {
	return &refusing{Listener: ln, admit: cs.admit, refusal: refusal}
}

// admit counts c and wraps it with the idle limit, or refuses it.
func (cs *Conns) admit(c net.Conn) (net.Conn, bool) {
	if !cs.Acquire(c.RemoteAddr()) {
		return nil, false
	}
	w := &conn{Conn: c, cs: cs}
	w.read.caller.Store(mono.Never)
	w.written.caller.Store(mono.Never)
	w.read.armed.Store(mono.Never)
	w.written.armed.Store(mono.Never)
	return w, true
}

// refusing is a listener whose Accept answers the connections admit
// refuses with refusal, closes them and goes on to the next: the kernel
// completed the handshake before anything could look at a connection. How
// the close goes is the wrapped listener's (the front ends' linger, so the
// client reads the answer). Without a refusal, or when it cannot be
// written at once, SO_LINGER 0 makes the close a reset, which frees the
// socket at once instead of holding it in TIME_WAIT. failed, if set, is
// told of each accept that failed.
type refusing struct {
	net.Listener
	admit   func(net.Conn) (net.Conn, bool)
	refusal []byte
	failed  func(error)
}

// refusalWriteTimeout bounds the write of a refusal, which Accept makes:
// a fresh socket's buffer takes it at once.
const refusalWriteTimeout = 100 * time.Millisecond

func (l *refusing) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.failed != nil {
				l.failed(err)
			}
			return nil, err
		}
		if w, ok := l.admit(c); ok {
			return w, nil
		}
		if l.refusal != nil && c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout)) == nil {
			if _, err := c.Write(l.refusal); err == nil {
				_ = c.Close()
				continue
			}
		}
		if tc, ok := c.(interface{ SetLinger(int) error }); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// conn applies the idle limit: a read or write never waits past the
// earlier of the caller's own deadline (a server's read or write timeout,
// kept here) and IdleTimeout after the last read or write began. A blocked
// read therefore ends after IdleTimeout without a byte, and so does a write
// the client is not draining.
//
// Re-arming a socket deadline costs a clock read, a timer update and a lock
// in the runtime, and the proxy reads and writes several times a request,
// so a read or write re-arms only when the deadline set would end the wait
// more than idleSlack early: the limit holds to within IdleTimeout/16.
type conn struct {
	net.Conn
	cs            *Conns
	read, written deadlines
	closed        atomic.Bool
	// received is set by the first Read that returns a byte; reads come
	// from the connection's one serving goroutine.
	received bool
}

// deadlines are one direction's: the caller's and the one set on the
// socket, on the monotonic clock (mono.Never: none).
type deadlines struct {
	caller, armed atomic.Int64
}

// idleSlack is how much earlier than due an armed idle deadline may fire.
func (c *conn) idleSlack() int64 { return int64(c.cs.limits.IdleTimeout) / 16 }

func (c *conn) Read(b []byte) (int, error) {
	if err := c.rearm(&c.read, c.Conn.SetReadDeadline); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	c.received = c.received || n > 0
	return n, err
}

// Received reports whether the client has sent a byte yet: a server that
// times out a connection which never did (a browser's preconnect, a TCP
// health check) closes it without an answer, as nginx does, rather than
// answer a request nobody made. Call it from the serving goroutine.
func (c *conn) Received() bool { return c.received }

func (c *conn) Write(b []byte) (int, error) {
	if err := c.rearm(&c.written, c.Conn.SetWriteDeadline); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// rearm moves d's socket deadline to IdleTimeout from now (or the caller's,
// if earlier) when the one armed would fire more than idleSlack early.
func (c *conn) rearm(d *deadlines, set func(time.Time) error) error {
	idle := int64(c.cs.limits.IdleTimeout)
	if idle <= 0 {
		return nil
	}
	want := min(d.caller.Load(), mono.Now()+idle)
	if armed := d.armed.Load(); armed <= want && want-armed <= c.idleSlack() {
		return nil
	}
	d.armed.Store(want)
	return set(mono.Time(want))
}

// arm records the caller's deadline t for d and sets the effective one:
// t itself, or the idle limit when it is earlier, so that a read or write
// already blocked also sees the new deadline.
func (c *conn) arm(d *deadlines, t time.Time, set func(time.Time) error) error {
	caller := mono.Of(t)
	d.caller.Store(caller)
	eff := caller
	if idle := int64(c.cs.limits.IdleTimeout); idle > 0 {
		eff = min(caller, mono.Now()+idle)
	}
	d.armed.Store(eff)
	return set(mono.Time(eff))
}

// NetConn is the connection c limits.
func (c *conn) NetConn() net.Conn { return c.Conn }

func (c *conn) SetDeadline(t time.Time) error {
	if err := c.arm(&c.read, t, c.Conn.SetReadDeadline); err != nil {
		return err
	}
	return c.arm(&c.written, t, c.Conn.SetWriteDeadline)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	return c.arm(&c.read, t, c.Conn.SetReadDeadline)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	return c.arm(&c.written, t, c.Conn.SetWriteDeadline)
}

// Close closes the connection and uncounts it, once however often it is
// called.
func (c *conn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.cs.Release(c.RemoteAddr())
	}
	return err
}

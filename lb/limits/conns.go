package limits

import (
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
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

// Wrap returns ln with the limits applied: Accept closes a connection over
// its address's cap at once and goes on accepting (the kernel completed
// the handshake before Accept could see the address, so closing is the
// only refusal left; SO_LINGER 0 makes the close a reset, which frees the
// socket at once instead of holding it in TIME_WAIT, and tells the client
// plainly). Accepted connections count until closed, and each read or
// write gets a deadline no later than IdleTimeout from its start.
func (cs *Conns) Wrap(ln net.Listener) net.Listener { return &listener{Listener: ln, cs: cs} }

type listener struct {
	net.Listener
	cs *Conns
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.cs.Acquire(c.RemoteAddr()) {
			w := &conn{Conn: c, cs: l.cs}
			w.readDL.Store(noDeadline)
			w.writeDL.Store(noDeadline)
			return w, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// conn applies the idle limit: every Read and Write first sets the
// deadline of its direction to the earlier of the caller's own deadline
// (a server's read or write timeout, kept here) and IdleTimeout from now.
// A blocked read therefore ends after IdleTimeout without a byte, and so
// does a write the client is not draining.
type conn struct {
	net.Conn
	cs *Conns
	// readDL and writeDL are the caller's deadlines, unix ns (noDeadline:
	// none).
	readDL, writeDL atomic.Int64
	closed          atomic.Bool
	// received is set by the first Read that returns a byte; reads come
	// from the connection's one serving goroutine.
	received bool
}

func (c *conn) Read(b []byte) (int, error) {
	if c.cs.limits.IdleTimeout > 0 {
		if err := c.Conn.SetReadDeadline(c.deadline(c.readDL.Load())); err != nil {
			return 0, err
		}
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
	if c.cs.limits.IdleTimeout > 0 {
		if err := c.Conn.SetWriteDeadline(c.deadline(c.writeDL.Load())); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(b)
}

// deadline is the earlier of the caller's deadline (unix ns) and the idle
// limit from now.
func (c *conn) deadline(caller int64) time.Time {
	idle := time.Now().Add(c.cs.limits.IdleTimeout)
	if caller < idle.UnixNano() {
		return time.Unix(0, caller)
	}
	return idle
}

// noDeadline stands for the zero time.Time, which means no deadline.
const noDeadline = math.MaxInt64

// unixNano is t in unix ns, clamped to the range UnixNano defines (years
// 1678 to 2262): earlier is long past, later is never.
func unixNano(t time.Time) int64 {
	switch y := t.Year(); {
	case t.IsZero() || y > 2261:
		return noDeadline
	case y < 1679:
		return 1
	}
	return t.UnixNano()
}

// effective is the deadline to set now for a caller's deadline t: t
// itself, or the idle limit when it is earlier, so that a read or write
// already blocked also sees the new deadline.
func (c *conn) effective(t time.Time) time.Time {
	if c.cs.limits.IdleTimeout <= 0 {
		return t
	}
	return c.deadline(unixNano(t))
}

func (c *conn) SetDeadline(t time.Time) error {
	c.readDL.Store(unixNano(t))
	c.writeDL.Store(unixNano(t))
	return c.Conn.SetDeadline(c.effective(t))
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.readDL.Store(unixNano(t))
	return c.Conn.SetReadDeadline(c.effective(t))
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.writeDL.Store(unixNano(t))
	return c.Conn.SetWriteDeadline(c.effective(t))
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

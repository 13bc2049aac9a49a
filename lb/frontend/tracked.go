package frontend

import (
	"context"
	"maps"
	"net"
	"slices"
	"sync"

	"github.com/valyala/fasthttp"
)

// tracked is the fasthttp front end's listener: it keeps the connections
// it accepted until they close, so that a shutdown can close what is left
// at its end, which fasthttp's own does not (nor does it know the
// connections still in a TLS handshake or an h2c sniff).
type tracked struct {
	net.Listener
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
	// closed says closeAll ran: a connection Accept takes from the
	// kernel after that (it was on its way out as closeAll looked) is
	// closed at once, not left serving.
	closed bool
}

func track(ln net.Listener) *tracked {
	return &tracked{Listener: ln, conns: make(map[*trackedConn]struct{})}
}

func (t *tracked) Accept() (net.Conn, error) {
	c, err := t.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	closed := t.closed
	if !closed {
		t.conns[tc] = struct{}{}
	}
	t.mu.Unlock()
	if closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return tc, nil
}

// closeAll closes every connection still open, and any Accept takes
// after it.
func (t *tracked) closeAll() {
	t.mu.Lock()
	t.closed = true
	conns := slices.Collect(maps.Keys(t.conns))
	t.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *tracked
	once sync.Once
}

// NetConn is the connection tracked, for those that look under wrappers
// (lingerConnOf).
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

// Received is the per-address limit's (limits.Conns), which a client's
// read timeout asks to tell a silent connection, which gets no answer,
// from a slow request: true where the connection does not know.
func (c *trackedConn) Received() bool {
	r, ok := c.Conn.(interface{ Received() bool })
	return !ok || r.Received()
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

// fastShutdown runs fasthttp's shutdown of a server across the calls of
// a front end's ShutdownWithContext. fasthttp's own keeps closing idle
// connections, and ending kept ones after their answer, only while it
// runs, and a later call of it returns at once: so it is called once,
// with no deadline, and the calls wait for it until their ctx ends; stop
// ends it for good.
type fastShutdown struct {
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

// wait starts srv's shutdown on its first call, and waits until srv has
// no connection left (nil) or ctx ends (its error).
func (f *fastShutdown) wait(ctx context.Context, srv *fasthttp.Server) error {
	f.once.Do(func() {
		all, cancel := context.WithCancel(context.Background())
		f.cancel, f.done = cancel, make(chan struct{})
		go func() {
			_ = srv.ShutdownWithContext(all)
			close(f.done)
		}()
	})
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the shutdown wait started, leaving its connections as they
// are (the caller closes them).
func (f *fastShutdown) stop() {
	if f.cancel != nil {
		f.cancel()
		<-f.done
	}
}

package frontend

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// Names of the front ends, as configuration spells them.
const (
	NameFastHTTP = "fasthttp"
	NameGNet     = "gnet"
)

// Server is a running front end.
type Server interface {
	// Addr is the address it listens on.
	Addr() string
	// Done reports the server stopping on its own with an error.
	Done() <-chan error
	// ShutdownWithContext stops accepting, lets requests in flight
	// (streams included) finish until ctx ends, then closes what is left.
	ShutdownWithContext(ctx context.Context) error
}

// Start serves h on addr with the front end called name ("" is fasthttp)
// and returns once it listens.
func Start(name, addr string, h Handler, o Options) (Server, error) {
	switch name {
	case NameGNet:
		return StartGNet(addr, h, o)
	case "", NameFastHTTP:
	default:
		return nil, fmt.Errorf("frontend: unknown front end %q (want %s or %s)", name, NameFastHTTP, NameGNet)
	}
	lg := new(lingering)
	limited, err := listenLimited(addr, o, lg)
	if err != nil {
		return nil, err
	}
	ln := track(limited)
	if o.TLS != nil || !o.HTTP2.Disabled {
		// Handshakes and the h2c preface need a goroutine per connection
		// (tls.go).
		return startConnServer(ln, h, o, lg), nil
	}
	s := &fastServer{Server: FastHTTP(h, o), ln: ln, done: make(chan error, 1), linger: lg}
	go func() {
		if err := s.Serve(ln); err != nil {
			s.done <- err
		}
	}()
	return s, nil
}

// listenLimited is Listen with o's descriptor guard and per-address cap,
// its connections lingering on close under lg.
func listenLimited(addr string, o Options, lg *lingering) (net.Listener, error) {
	ln, err := Listen(addr)
	if err != nil {
		return nil, err
	}
	// Innermost, so the connection closed is the socket itself.
	ln = o.FDs.Wrap(&lingerListener{Listener: ln, l: lg})
	if o.Conns != nil {
		// A TLS client would read a plain 429 as garbage: it is reset,
		// before a handshake is spent on it (as on gnet's loops).
		r := refusal
		if o.TLS != nil {
			r = nil
		}
		ln = o.Conns.Wrap(ln, r)
	}
	return ln, nil
}

type fastServer struct {
	*fasthttp.Server
	ln       *tracked
	done     chan error
	linger   *lingering
	shutting atomic.Bool
	down     fastShutdown
}

// ShutdownWithContext stops accepting and waits for fasthttp's
// connections until ctx ends. As on gnet, the first call that runs out of
// time leaves what is still served running, so that the caller can end its
// streams and call again; a later call, or one that found nothing left,
// closes what is left.
func (s *fastServer) ShutdownWithContext(ctx context.Context) error {
	first := !s.shutting.Swap(true)
	// fasthttp's closes only a listener its Serve has taken, which a
	// Shutdown right after the start may precede.
	_ = s.ln.Close()
	err := s.down.wait(ctx, s.Server)
	if err == nil || !first {
		s.down.stop()
		s.ln.closeAll()
	}
	s.linger.stop()
	return err
}

func (s *fastServer) Addr() string       { return s.ln.Addr().String() }
func (s *fastServer) Done() <-chan error { return s.done }

var (
	_ Server = (*fastServer)(nil)
	_ Server = (*GNet)(nil)
	_ Server = (*connServer)(nil)
)

// Listen opens a TCP listener on addr with SO_REUSEPORT, as gnet's loops
// bind theirs: the loops bind beside it, and a pdlb started on the port of
// one that drains (after its ShutdownWithContext began) takes the new
// connections at once, on either front end. The admin listener binds so
// too, so that the new pdlb of an in-place upgrade starts with the same
// configuration.
func Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

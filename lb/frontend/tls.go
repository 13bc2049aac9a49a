package frontend

// TLS and HTTP/2 on the front ends.
//
// On fasthttp, a TLS listener's accept loop hands each connection to a
// goroutine of its own, which runs the handshake (crypto/tls), and the
// negotiated protocol picks the server: ALPN h2 goes to the HTTP/2 server
// (h2.go), anything else to fasthttp's, whose worker goroutines take it
// over. A handshake (a few hundred microseconds of public-key work per
// client) run on an event loop would stall every other connection of that
// loop, so on gnet too it runs on a goroutine, fed by the connection's
// loop, which then serves an HTTP/1.1 connection itself (gnet_tls.go).
// The plain listener of the fasthttp front end goes through the same
// goroutine when h2c is on, which reads the connection's first bytes for
// HTTP/2's preface; gnet's loops look for it themselves (h2c.go).

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// KeyPair names a certificate chain (leaf first) and its private key, PEM
// files.
type KeyPair struct{ CertFile, KeyFile string }

// Certs is a listener's certificates. Each handshake takes the first whose
// names match the client's server name (SNI), or the first of all; Reload
// and Serve swap in a new set for the handshakes after them, and
// connections already open keep theirs.
type Certs struct {
	// mu serializes swaps; files, under it, are what the set was read from.
	mu    sync.Mutex
	files []KeyPair
	set   atomic.Pointer[[]tls.Certificate]
}

// CertSet is certificates read from their files and not served yet, so a
// reload can read every new file before it changes anything.
type CertSet struct {
	files []KeyPair
	set   []tls.Certificate
}

// ReadCerts reads files, which must name at least one pair.
func ReadCerts(files []KeyPair) (*CertSet, error) {
	if len(files) == 0 {
		return nil, errors.New("frontend: no certificate")
	}
	s := &CertSet{files: slices.Clone(files), set: make([]tls.Certificate, len(files))}
	for i, f := range files {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("frontend: certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
		}
		s.set[i] = cert
	}
	return s, nil
}

// LoadCerts reads files, which must name at least one pair, and serves
// them.
func LoadCerts(files []KeyPair) (*Certs, error) {
	s, err := ReadCerts(files)
	if err != nil {
		return nil, err
	}
	c := &Certs{}
	c.Serve(s)
	return c, nil
}

// Serve makes s the certificates of the handshakes from now on, and
// reports whether s was read from other files than the set it replaced.
func (c *Certs) Serve(s *CertSet) (moved bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	moved = !slices.Equal(c.files, s.files)
	c.files = s.files
	c.set.Store(&s.set)
	return moved
}

// Reload reads the files again; on an error the certificates in use stay.
func (c *Certs) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := ReadCerts(c.files)
	if err != nil {
		return err
	}
	c.set.Store(&s.set)
	return nil
}

// Files lists every file the certificates are read from.
func (c *Certs) Files() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var paths []string
	for _, f := range c.files {
		paths = append(paths, f.CertFile, f.KeyFile)
	}
	return paths
}

func (c *Certs) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	set := *c.set.Load()
	for i := range set {
		if hello.SupportsCertificate(&set[i]) == nil {
			return &set[i], nil
		}
	}
	return &set[0], nil
}

// TLS is how a listener terminates TLS.
type TLS struct {
	Certs *Certs
	// MinVersion is tls.VersionTLS12 (the default) or tls.VersionTLS13.
	MinVersion uint16
	// TicketRotation is how often the session-ticket key changes
	// (default 1h); a ticket stays valid for ticketKeys rotations.
	TicketRotation time.Duration
}

// ticketKeys is how many session-ticket keys are kept: the newest seals
// tickets, all of them open tickets.
const ticketKeys = 3

// DefaultTicketRotation is TLS.TicketRotation's default.
const DefaultTicketRotation = time.Hour

// Config is the crypto/tls configuration of a listener that offers
// protos by ALPN, in order of preference. Its session-ticket keys rotate
// every TicketRotation until stop is closed.
func (t *TLS) Config(protos []string, stop <-chan struct{}) *tls.Config {
	cfg := &tls.Config{
		GetCertificate: t.Certs.certificate,
		MinVersion:     max(t.MinVersion, tls.VersionTLS12),
		NextProtos:     protos,
	}
	every := t.TicketRotation
	if every <= 0 {
		every = DefaultTicketRotation
	}
	// The first key is in place before any handshake: one made before
	// would get a ticket under crypto/tls's own key, which the first
	// SetSessionTicketKeys drops.
	go rotateTickets(cfg, nextTicketKey(cfg, nil), every, stop)
	return cfg
}

// rotateTickets puts a new session-ticket key first every period until
// stop is closed.
func rotateTickets(cfg *tls.Config, keys [][32]byte, every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			keys = nextTicketKey(cfg, keys)
		case <-stop:
			return
		}
	}
}

// nextTicketKey puts a new session-ticket key before keys, drops the
// oldest past ticketKeys, and sets them on cfg.
func nextTicketKey(cfg *tls.Config, keys [][32]byte) [][32]byte {
	var k [32]byte
	_, _ = rand.Read(k[:])
	keys = append([][32]byte{k}, keys[:min(len(keys), ticketKeys-1)]...)
	cfg.SetSessionTicketKeys(keys)
	return keys
}

// ALPN protocol names.
const (
	protoH2    = "h2"
	protoHTTP1 = "http/1.1"
)

// connServer serves a listener whose connections each get a goroutine
// before fasthttp takes them: for the TLS handshake, or to look for the
// h2c preface.
type connServer struct {
	fast        *fasthttp.Server
	h2          *h2Server   // nil: HTTP/2 off
	tls         *tls.Config // nil: plain, h2c
	ln          *handoff
	readTimeout time.Duration
	log         *slog.Logger
	done        chan error
	stop        chan struct{} // closed by the first Shutdown: ticket rotation ends
	stopOnce    sync.Once
	linger      *lingering
	conns       *tracked // every connection, handed off or not
	shutting    atomic.Bool
	down        fastShutdown
	workers     *workers // run serveConn: a kept goroutine's stack has grown to a handshake's depth
}

// startConnServer serves ln with TLS when o.TLS is set, else plain with
// h2c.
func startConnServer(ln *tracked, h Handler, o Options, lg *lingering) *connServer {
	o = o.withDefaults()
	s := &connServer{fast: FastHTTP(h, o), readTimeout: o.ReadTimeout, log: o.Log,
		ln: newHandoff(ln), done: make(chan error, 1), stop: make(chan struct{}), linger: lg, conns: ln,
		workers: newWorkers()}
	if !o.HTTP2.Disabled {
		s.h2 = newH2Server(h, o)
	}
	if o.TLS != nil {
		protos := []string{protoHTTP1}
		if s.h2 != nil {
			protos = []string{protoH2, protoHTTP1}
		}
		s.tls = o.TLS.Config(protos, s.stop)
	}
	go s.accept(ln)
	go func() {
		if err := s.fast.Serve(s.ln); err != nil {
			s.done <- err
		}
	}()
	return s
}

func (s *connServer) Addr() string       { return s.ln.Addr().String() }
func (s *connServer) Done() <-chan error { return s.done }

// ShutdownWithContext closes the listener, sends HTTP/2 connections
// GOAWAY, and waits for both servers' requests until ctx ends. A call
// that ends with nothing served, or a later call (the first ran out of
// time), closes every connection left: those still in a handshake or an
// h2c sniff, and those fasthttp's first shutdown left open.
func (s *connServer) ShutdownWithContext(ctx context.Context) error {
	first := !s.shutting.Swap(true)
	s.stopOnce.Do(func() { close(s.stop) })
	s.workers.stop()
	// fasthttp's Shutdown closes only a listener its Serve has taken, which
	// a Shutdown right after the start may precede.
	_ = s.ln.Close()
	errc := make(chan error, 1)
	go func() { errc <- s.down.wait(ctx, s.fast) }()
	var err error
	if s.h2 != nil {
		err = s.h2.shutdown(ctx)
	}
	err = errors.Join(<-errc, err)
	if err == nil || !first {
		s.down.stop()
		s.conns.closeAll()
	}
	s.linger.stop()
	return err
}

// accept runs until the listener closes, each connection on a worker.
func (s *connServer) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or memory: fasthttp waits as long.
			if s.log != nil {
				s.log.Warn("frontend: accept failed", "err", err)
			}
			time.Sleep(time.Second)
			continue
		}
		s.workers.run(&accepted{s, c})
	}
}

// accepted is a connection for serveConn, as a workers job.
type accepted struct {
	s *connServer
	c net.Conn
}

func (a *accepted) work() { a.s.serveConn(a.c) }

// serveConn runs the handshake, or reads the h2c preface, then serves c
// with the HTTP/2 server or hands it to fasthttp.
func (s *connServer) serveConn(c net.Conn) {
	if s.tls != nil {
		tc := tls.Server(c, s.tls)
		_ = c.SetDeadline(time.Now().Add(s.readTimeout))
		if err := tc.Handshake(); err != nil {
			refuseHandshake(c, err)
			return
		}
		_ = c.SetDeadline(time.Time{})
		if tc.ConnectionState().NegotiatedProtocol == protoH2 {
			s.h2.serve(tc)
			return
		}
		c = &tlsConn{Conn: tc}
	} else if s.h2 != nil {
		pc, h2c := sniffPreface(c, s.readTimeout)
		if pc == nil {
			return
		}
		if h2c {
			s.h2.serve(pc)
			return
		}
		c = pc
	}
	s.ln.put(c)
}

// plainOnTLS is what a client that sent plain HTTP to the TLS port gets,
// as nginx words it.
const plainOnTLS = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 46\r\n\r\nThe plain HTTP request was sent to HTTPS port\n"

// refuseHandshake closes a connection whose handshake failed, first
// answering 400 when the client spoke plain HTTP. crypto/tls already sent
// an alert for a ClientHello it could not take.
func refuseHandshake(c net.Conn, err error) {
	var rhe tls.RecordHeaderError
	if errors.As(err, &rhe) && rhe.Conn != nil && looksLikeHTTP(rhe.RecordHeader[:]) {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte(plainOnTLS))
	}
	_ = c.Close()
}

// looksLikeHTTP reports whether a connection's first bytes begin an
// HTTP/1 request line: a method in capitals.
func looksLikeHTTP(b []byte) bool {
	for _, ch := range b {
		if ch == ' ' {
			return true
		}
		if ch < 'A' || ch > 'Z' {
			return false
		}
	}
	return true
}

// handoff is the listener fasthttp serves: Accept returns the connections
// put after their handshake, and Close closes the listener under it, so
// fasthttp's Shutdown stops the accept loop too.
type handoff struct {
	net.Listener
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoff(ln net.Listener) *handoff {
	return &handoff{Listener: ln, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close closes the listener once; later calls do nothing.
func (l *handoff) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closed)
		err = l.Listener.Close()
	})
	return err
}

// put hands c to fasthttp, or closes it once the listener is closed.
func (l *handoff) put(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		_ = c.Close()
	}
}

// tlsConn is a TLS connection as fasthttp serves it, with Received as the
// per-IP limits' connections have it (limits.conn), which the tls.Conn
// hides: a client that finished its handshake and sent no request is
// closed at the read timeout without an answer, as on plain HTTP.
type tlsConn struct {
	*tls.Conn
	received bool
}

func (c *tlsConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.received = c.received || n > 0
	return n, err
}

// Received reports whether the client has sent a byte of a request yet
// (the handshake's do not count). Call it from the serving goroutine.
func (c *tlsConn) Received() bool { return c.received }

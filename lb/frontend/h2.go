package frontend

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
)

// HTTP2 bounds what an HTTP/2 client may cost (golang.org/x/net/http2
// serves the protocol; this package adapts its streams to the Handler).
type HTTP2 struct {
	// Disabled turns HTTP/2 off: no h2 in ALPN, no h2c.
	Disabled bool
	// MaxConcurrentStreams caps a connection's open streams (default 250).
	MaxConcurrentStreams uint32
	// MaxFrameBytes is the largest frame a client may send (default
	// 16384).
	MaxFrameBytes uint32
	// MaxResetsPerSecond is the rate of stream cancellations a client may
	// keep up (default 100); see resetGuard.
	MaxResetsPerSecond int
}

// Defaults of HTTP2.
const (
	DefaultMaxConcurrentStreams = 250
	DefaultMaxFrameBytes        = 16 << 10
	DefaultMaxResetsPerSecond   = 100
)

// h2Server serves HTTP/2 connections, each on the goroutine that hands it
// over, with x/net's server; every stream runs the front end's Handler on
// a fasthttp.RequestCtx (serveStream), so HTTP/1.1 and HTTP/2 requests
// take one path through the gateway, with the same metrics.
type h2Server struct {
	srv  *http2.Server
	base *http.Server // its MaxHeaderBytes is the header list size; Shutdown sends GOAWAY
	h    Handler
	o    Options

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	open  atomic.Int64
}

func newH2Server(h Handler, o Options) *h2Server {
	c := o.HTTP2
	s := &h2Server{h: h, o: o, conns: map[net.Conn]struct{}{},
		srv: &http2.Server{
			MaxConcurrentStreams: cmpOr(c.MaxConcurrentStreams, DefaultMaxConcurrentStreams),
			MaxReadFrameSize:     cmpOr(c.MaxFrameBytes, DefaultMaxFrameBytes),
			IdleTimeout:          o.IdleTimeout,
		},
		base: &http.Server{MaxHeaderBytes: o.MaxHeaderBytes, ReadHeaderTimeout: o.ReadTimeout,
			// A client's bad preface or frames: its doing, by the
			// thousand at the edge (as fasthttp's, see debugLog).
			ErrorLog: log.New(io.Discard, "", 0)},
	}
	if o.Log != nil {
		s.base.ErrorLog = slog.NewLogLogger(o.Log.Handler(), slog.LevelDebug)
	}
	if err := http2.ConfigureServer(s.base, s.srv); err != nil {
		panic("BUG: http2.ConfigureServer: " + err.Error())
	}
	return s
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// serve runs one HTTP/2 connection until it ends.
func (s *h2Server) serve(c net.Conn) {
	rate := s.o.HTTP2.MaxResetsPerSecond
	if rate <= 0 {
		rate = DefaultMaxResetsPerSecond
	}
	g := newResetGuard(c, rate)
	s.mu.Lock()
	s.conns[g] = struct{}{}
	s.mu.Unlock()
	s.open.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.conns, g)
		s.mu.Unlock()
		s.open.Add(-1)
	}()
	s.srv.ServeConn(g, &http2.ServeConnOpts{BaseConfig: s.base, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serveStream(c, w, r)
	})})
}

// shutdown sends every connection GOAWAY and waits until they closed or
// ctx ended; then it closes what is left.
func (s *h2Server) shutdown(ctx context.Context) error {
	_ = s.base.Shutdown(ctx)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.open.Load() > 0 {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			for c := range s.conns {
				_ = c.Close()
			}
			s.mu.Unlock()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

var h2Ctxs = sync.Pool{New: func() any { return new(fasthttp.RequestCtx) }}

// serveStream runs the Handler for one stream of the connection c.
func (s *h2Server) serveStream(c net.Conn, w http.ResponseWriter, r *http.Request) {
	ctx := h2Ctxs.Get().(*fasthttp.RequestCtx)
	defer func() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		h2Ctxs.Put(ctx)
	}()
	ctx.Init2(&h2Stream{parent: c, done: r.Context().Done()}, ctxLogger, false)
	req := &ctx.Request
	req.Header.SetMethod(r.Method)
	req.SetRequestURI(r.RequestURI)
	req.Header.SetHost(r.Host)
	for k, vs := range r.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if err := s.readBody(req, r); err != nil {
		if r.Context().Err() != nil {
			return // the client cancelled the stream
		}
		s.h.Error(ctx, err)
	} else {
		s.h.Serve(ctx)
	}
	writeResponse(w, r, &ctx.Response)
}

// readBody reads r's body into req, up to MaxBodyBytes.
func (s *h2Server) readBody(req *fasthttp.Request, r *http.Request) error {
	limit := int64(s.o.MaxBodyBytes)
	if r.ContentLength > limit {
		return fasthttp.ErrBodyTooLarge
	}
	n, err := io.Copy(req.BodyWriter(), io.LimitReader(r.Body, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return fasthttp.ErrBodyTooLarge
	}
	req.Header.SetContentLength(int(n))
	return nil
}

// writeResponse sends resp on the stream. A streamed body goes out a
// chunk at a time, each flushed as DATA frames at once; a write blocks
// while the stream's flow-control window is closed, which holds up the
// relay feeding it, so a slow reader stops the reads from its pod
// instead of buffering them.
func writeResponse(w http.ResponseWriter, r *http.Request, resp *fasthttp.Response) {
	h := w.Header()
	stream := resp.IsBodyStream()
	for k, v := range resp.Header.All() {
		if hopByHop(k) || (stream && bytes.EqualFold(k, []byte("Content-Length"))) {
			continue
		}
		h.Add(string(k), string(v))
	}
	if !stream {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body())))
	}
	w.WriteHeader(resp.StatusCode())
	if r.Method == http.MethodHead {
		return
	}
	if !stream {
		_, _ = w.Write(resp.Body())
		return
	}
	fw := flushWriter{w: w, rc: http.NewResponseController(w)}
	body := resp.BodyStream()
	if wt, ok := body.(io.WriterTo); ok {
		_, _ = wt.WriteTo(fw)
	} else {
		_, _ = io.Copy(fw, body)
	}
	if c, ok := body.(io.Closer); ok {
		_ = c.Close()
	}
}

// hopByHop reports the HTTP/1.1 connection headers HTTP/2 forbids.
func hopByHop(k []byte) bool {
	for _, h := range [...]string{"Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Proxy-Connection"} {
		if bytes.EqualFold(k, []byte(h)) {
			return true
		}
	}
	return false
}

// flushWriter sends each Write at once.
type flushWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// h2Stream is what ctx.Conn() is for a stream: the connection's addresses,
// and the stream's end for ClientGone. It carries no bytes.
type h2Stream struct {
	parent net.Conn
	done   <-chan struct{}
}

var errStreamConn = errors.New("frontend: an HTTP/2 stream is not read or written as a connection")

func (c *h2Stream) Read([]byte) (int, error)         { return 0, errStreamConn }
func (c *h2Stream) Write([]byte) (int, error)        { return 0, errStreamConn }
func (c *h2Stream) Close() error                     { return nil }
func (c *h2Stream) LocalAddr() net.Addr              { return c.parent.LocalAddr() }
func (c *h2Stream) RemoteAddr() net.Addr             { return c.parent.RemoteAddr() }
func (c *h2Stream) SetDeadline(time.Time) error      { return nil }
func (c *h2Stream) SetReadDeadline(time.Time) error  { return nil }
func (c *h2Stream) SetWriteDeadline(time.Time) error { return nil }

// resetGuard is the connection as the HTTP/2 server reads it. It watches
// the frame headers go by for RST_STREAM from the client, the rapid-reset
// attack (CVE-2023-44487): open a stream, cancel it, again, each costing
// the server a handler start while the client pays two small frames.
// x/net's server bounds the handlers in flight (MaxConcurrentStreams, then
// a queue of four times as many, then it closes the connection), but a
// client that cancels within those bounds may loop forever. A token
// bucket allows rate cancellations a second with bursts of ten seconds'
// worth; past it, reads from the client pause (it is throttled: its
// frames wait, nobody else's do), and a client still over after
// resetStrikes pauses is cut off.
type resetGuard struct {
	net.Conn
	rate float64

	// Owned by the server's one reading goroutine.
	skip   int // bytes left of the preface or a frame's payload
	hdr    [9]byte
	filled int
	tokens float64
	last   time.Time
	strike int
}

const resetStrikes = 3

// errRapidReset closes a connection that cancels streams too fast.
var errRapidReset = errors.New("frontend: HTTP/2 client cancels streams too fast (rapid reset)")

func newResetGuard(c net.Conn, rate int) *resetGuard {
	r := float64(rate)
	return &resetGuard{Conn: c, rate: r, tokens: 10 * r, skip: len(http2.ClientPreface), last: time.Now()}
}

func (g *resetGuard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	resets := g.count(p[:n])
	if resets == 0 {
		return n, err
	}
	now := time.Now()
	g.tokens = min(g.tokens+now.Sub(g.last).Seconds()*g.rate, 10*g.rate) - float64(resets)
	g.last = now
	if g.tokens < 0 {
		if g.strike++; g.strike > resetStrikes {
			_ = g.Conn.Close()
			return n, errRapidReset
		}
		time.Sleep(min(time.Duration(-g.tokens/g.rate*float64(time.Second)), time.Second))
	}
	return n, err
}

// count follows the frames in b and counts the RST_STREAM headers.
func (g *resetGuard) count(b []byte) int {
	resets := 0
	for len(b) > 0 {
		if g.skip > 0 {
			k := min(g.skip, len(b))
			g.skip -= k
			b = b[k:]
			continue
		}
		k := copy(g.hdr[g.filled:], b)
		g.filled += k
		b = b[k:]
		if g.filled < len(g.hdr) {
			break
		}
		g.filled = 0
		g.skip = int(g.hdr[0])<<16 | int(g.hdr[1])<<8 | int(g.hdr[2])
		if http2.FrameType(g.hdr[3]) == http2.FrameRSTStream {
			resets++
		}
	}
	return resets
}

// sniffPreface reads c's first bytes, as far as they agree with HTTP/2's
// client preface, and returns c with them put back and whether they are
// the preface (h2c with prior knowledge). nil: the client sent nothing
// within timeout, or left; c is closed.
func sniffPreface(c net.Conn, timeout time.Duration) (net.Conn, bool) {
	var buf [len(http2.ClientPreface)]byte
	n := 0
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	for {
		k, err := c.Read(buf[n:])
		n += k
		if n > 0 && !bytes.HasPrefix([]byte(http2.ClientPreface), buf[:n]) {
			break
		}
		if n == len(buf) {
			_ = c.SetReadDeadline(time.Time{})
			return &prefixedConn{Conn: c, early: buf[:n]}, true
		}
		if err != nil {
			_ = c.Close()
			return nil, false
		}
	}
	return &prefixedConn{Conn: c, early: bytes.Clone(buf[:n])}, false
}

// prefixedConn reads early before what is still on its connection.
type prefixedConn struct {
	net.Conn
	early []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

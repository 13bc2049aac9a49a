// Package frontend accepts client connections and hands each request to the
// gateway's handler.
package frontend

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/mono"
	"pdlb/lb/limits"
)

// Handler is what a front end serves: the gateway's request handler and the
// handler of requests fasthttp rejects before parsing completes.
type Handler struct {
	Serve func(ctx *fasthttp.RequestCtx)
	Error func(ctx *fasthttp.RequestCtx, err error)
	// OnLoop lets the gnet front end run Serve on its event loop (see
	// loop.go): Serve then never blocks when LoopOf(ctx) is not nil.
	OnLoop bool
}

// Options bound what one client may cost.
type Options struct {
	// MaxBodyBytes is the largest request body read (larger: 413; default
	// 4 MiB, fasthttp's).
	MaxBodyBytes int
	// MaxHeaderBytes is the largest request line and header block read
	// (larger: the Error handler gets fasthttp.ErrSmallReadBuffer; default
	// 4096, fasthttp's read buffer).
	MaxHeaderBytes int
	// IdleTimeout closes keep-alive connections idle this long (default
	// 90s); on HTTP/2 it also bounds a write the client does not read: a
	// stream whose windows stay shut this long is reset, a connection
	// whose socket takes no bytes this long is closed.
	IdleTimeout time.Duration
	// ReadTimeout bounds reading one request's headers and body (default
	// 30s), so a slow client cannot hold a connection forever.
	ReadTimeout time.Duration
	// Log receives the server's own messages at debug level (nil: none).
	Log *slog.Logger
	// Conns, if set, caps each client address's connections on either
	// front end (one over its cap is reset at once); on fasthttp it also
	// puts its idle deadline on every read and write (gnet times out
	// stalled reads and writes with IdleTimeout on its own loop).
	Conns *limits.Conns
	// FDs, if set, closes client connections that got one of the process's
	// last file descriptors, and refuses the loop's upstream dials that
	// would take one (see limits.FDs).
	FDs *limits.FDs
	// TLS, if set, makes the listener speak TLS; HTTP2 bounds HTTP/2
	// clients (tls.go, h2.go).
	TLS   *TLS
	HTTP2 HTTP2
	// UpstreamTimeout is the shortest deadline an exchange on gnet's
	// loops may be given (a first-byte deadline's floor, a response or
	// keep-alive timeout): the loops sweep often enough for it from the
	// first tick, as for each one a Send gave since (0: from the first
	// Send, whose deadlines the ticker, a second between ticks until
	// then and never woken early, may find that late).
	UpstreamTimeout time.Duration
	// NoRing makes gnet's loops send and receive with a system call each,
	// not in io_uring batches (see evloop.Options).
	NoRing bool
	// clock is the gnet front end's time, in nanoseconds, for every stamp
	// and deadline its sweeps compare; nil: mono.Now, which a step of the
	// wall clock does not move (Upstream.Down's times are on it too).
	clock func() int64
}

// FastHTTP serves h on ln with fasthttp until ln is closed or Shutdown is
// called on the returned server.
func FastHTTP(h Handler, o Options) *fasthttp.Server {
	o = o.withDefaults()
	return &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			// Refused, as on gnet: the error handler gets the head
			// unread, and nothing behind it is served.
			if emptied(&ctx.Request.Header) {
				h.Error(ctx, errBareLF)
				ctx.SetConnectionClose()
				return
			}
			h.Serve(ctx)
			if !ctx.Request.Header.IsHTTP11() {
				http10(ctx)
			}
		},
		HeaderReceived: refuseBareLF,
		ErrorHandler:   h.Error,
		// A body over the limit is refused before the client sends it,
		// as gnet and nginx refuse it; fasthttp's own handling gives the
		// go-ahead first.
		ExpectHandler: func(ctx *fasthttp.RequestCtx) int {
			if ctx.Request.Header.ContentLength() > o.MaxBodyBytes {
				h.Error(ctx, fasthttp.ErrBodyTooLarge)
				return fasthttp.StatusRequestEntityTooLarge
			}
			return fasthttp.StatusContinue
		},
		MaxRequestBodySize: o.MaxBodyBytes,
		// A form (the audio APIs') goes to its pod as it came; fasthttp
		// would read every part of it first, and refuse one its parser
		// chokes on before the gateway can answer it.
		DisablePreParseMultipartForm: true,
		ReadBufferSize:               o.MaxHeaderBytes,
		ReadTimeout:                  o.ReadTimeout,
		IdleTimeout:                  o.IdleTimeout,
		NoDefaultServerHeader:        true,
		CloseOnShutdown:              true,
		Logger:                       debugLog{o.Log},
	}
}

// refuseBareLF empties a head whose header block has a line ending in a
// bare LF, which fasthttp's parser took for the line's end because a CRLF
// CRLF came after it (even one of a request pipelined behind): fasthttp
// then reads no body and sends no 100 Continue for it, and the handler
// refuses it (emptied) as gnet does. RawHeaders is the block as it came;
// the request line, and a blank line before it, fasthttp keeps no copy of.
func refuseBareLF(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if bareLF(h.RawHeaders()) {
		h.Reset()
	}
	return fasthttp.RequestConfig{}
}

// emptied reports whether refuseBareLF emptied h: fasthttp serves no
// other HTTP/1.1 head without a Host.
func emptied(h *fasthttp.RequestHeader) bool { return len(h.Host()) == 0 && h.IsHTTP11() }

// http10 settles the answer to an HTTP/1.0 request. fasthttp holds an
// answer back while a pipelined request is buffered behind it; an
// HTTP/1.0 one goes out at once instead (a handler's write deadline makes
// fasthttp flush, and the zero one sets none), so that a stream behind it,
// which streamRaw writes to the connection itself, cannot overtake it. An
// HTTP/1.1 answer is still held (flushing each costs every request a
// deadline set and reset): a client that pipelines an HTTP/1.0 stream
// behind an HTTP/1.1 request gets that answer at the end of the stream's
// body, on its own connection.
func http10(ctx *fasthttp.RequestCtx) {
	_ = ctx.SetWriteDeadline(time.Time{})
	if ctx.Response.IsBodyStream() && !ctx.IsHead() {
		streamRaw(ctx)
	}
}

// streamRaw writes ctx's streamed answer to an HTTP/1.0 client, which
// cannot read the chunked framing fasthttp would give it: the body goes
// out as it comes and the close ends it. The connection is then
// fasthttp's as hijacked with nothing left to write, which it closes.
func streamRaw(ctx *fasthttp.RequestCtx) {
	resp := &ctx.Response
	body := resp.BodyStream()
	setUnframed(&resp.Header)
	c := ctx.Conn()
	_, err := c.Write(resp.Header.Header())
	switch sb, ok := body.(streamBody); {
	case ok && err != nil:
		// A stream writer finishes its request (the pod's call, its
		// charge, the log line) once a write fails, so it must run.
		_, _ = sb.WriteTo(failedWriter{err})
	case ok:
		_, _ = sb.WriteTo(c)
	case err == nil:
		_, _ = io.Copy(c, body)
	}
	// Tells a stream writer still running that the client is gone.
	_ = resp.CloseBodyStream()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
}

// failedWriter fails every write with err.
type failedWriter struct{ err error }

func (w failedWriter) Write([]byte) (int, error) { return 0, w.err }

// debugLog hands fasthttp's messages (a client that went away, a malformed
// request already answered) to the gateway's log at debug level: they are
// the clients' doing, and at the edge they come by the thousand.
type debugLog struct{ log *slog.Logger }

func (l debugLog) Printf(format string, args ...any) {
	if l.log != nil {
		l.log.Debug(withoutContents(fmt.Sprintf(format, args...)))
	}
}

// ErrorText is a request's error as the Error handler may show it.
// fasthttp words a request it could not parse with the bytes it read: the
// header block ("buffer size=N, contents: ..."), a quoted header value, the
// quoted request line with the headers after it. Those are the client's
// headers, Authorization included, and belong neither in an answer (clients
// log error bodies) nor in a log; what went wrong, the words before them,
// stays.
func ErrorText(err error) string { return withoutContents(err.Error()) }

func withoutContents(msg string) string {
	if i := strings.Index(msg, ", contents: "); i >= 0 {
		msg = msg[:i]
	}
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = strings.TrimRight(msg[:i], " :")
	}
	return msg
}

// Defaults of Options.
const (
	DefaultMaxBodyBytes   = fasthttp.DefaultMaxRequestBodySize
	DefaultMaxHeaderBytes = 4096
	DefaultIdleTimeout    = 90 * time.Second
	DefaultReadTimeout    = 30 * time.Second
)

func (o Options) withDefaults() Options {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxHeaderBytes == 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.clock == nil {
		o.clock = mono.Now
	}
	return o
}

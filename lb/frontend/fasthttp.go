// Package frontend accepts client connections and hands each request to the
// gateway's handler.
package frontend

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Handler is what a front end serves: the gateway's request handler and the
// handler of requests fasthttp rejects before parsing completes.
type Handler struct {
	Serve func(ctx *fasthttp.RequestCtx)
	Error func(ctx *fasthttp.RequestCtx, err error)
}

// Options bound what one client may cost.
type Options struct {
	// MaxBodyBytes is the largest request body read (larger: 413).
	MaxBodyBytes int
	// IdleTimeout closes keep-alive connections idle this long (default 90s).
	IdleTimeout time.Duration
	// ReadTimeout bounds reading one request's headers and body (default
	// 30s), so a slow client cannot hold a connection forever.
	ReadTimeout time.Duration
}

// FastHTTP serves h on ln with fasthttp until ln is closed or Shutdown is
// called on the returned server.
func FastHTTP(h Handler, o Options) *fasthttp.Server {
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 90 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 30 * time.Second
	}
	return &fasthttp.Server{
		Handler:            h.Serve,
		ErrorHandler:       h.Error,
		Name:               "pdlb",
		MaxRequestBodySize: o.MaxBodyBytes,
		ReadTimeout:        o.ReadTimeout,
		IdleTimeout:        o.IdleTimeout,
		// Header names go upstream as the client wrote them.
		DisableHeaderNamesNormalizing: true,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 false,
		CloseOnShutdown:               true,
		// Streams flush per event; buffering would hold tokens back.
		ReduceMemoryUsage: false,
	}
}

// Listen opens a TCP listener on addr.
func Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

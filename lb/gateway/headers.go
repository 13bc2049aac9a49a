package gateway

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Headers the gateway sets itself.
const (
	headerPod       = "x-pdlb-pod"
	headerRequestID = "X-Request-Id"
)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), and are never forwarded in either direction.
var hopByHop = [][]byte{
	[]byte("Connection"), []byte("Keep-Alive"), []byte("Proxy-Connection"),
	[]byte("Proxy-Authenticate"), []byte("Proxy-Authorization"), []byte("Te"),
	[]byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
	[]byte("Host"), []byte("Content-Length"),
	// The front end answered the client's 100-continue; the pod gets the
	// whole body at once (as nginx and Envoy send it).
	[]byte("Expect"),
}

// hopByHopByLen is hopByHop by name length: every header of every request
// and answer is looked up, and compared with the names of its own length
// it meets one or two instead of twelve.
var hopByHopByLen = func() (t [len("Proxy-Authorization") + 1][][]byte) {
	for _, h := range hopByHop {
		t[len(h)] = append(t[len(h)], h)
	}
	return t
}()

func isHopByHop(k []byte) bool {
	if len(k) >= len(hopByHopByLen) {
		return false
	}
	for _, h := range hopByHopByLen[len(k)] {
		if bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

var (
	pdlbPrefix    = []byte("x-pdlb-")
	authorization = []byte(fasthttp.HeaderAuthorization)
	forwardedFor  = []byte(fasthttp.HeaderXForwardedFor)
	server        = []byte(fasthttp.HeaderServer)
)

// sessionOf returns the request's session key, "" when it has none. Only
// requests that carry one pay for the string.
func sessionOf(ctx *fasthttp.RequestCtx) string {
	v := ctx.Request.Header.Peek(headerSession)
	if len(v) == 0 {
		v = ctx.Request.Header.Peek(headerSessionAIBrix)
	}
	return string(v)
}

// buildUpstream copies the client's request into up: the body byte for
// byte, the headers less hop-by-hop ones and any x-pdlb-* a client made up,
// an X-Request-Id, generated when the client sent none, and the client's
// address appended to X-Forwarded-For (upstream.x_forwarded_for).
func (g *Gateway) buildUpstream(ctx *fasthttp.RequestCtx, up *fasthttp.Request) {
	authorize, forward := g.keys.Enabled(), g.cfg.Upstream.XForwardedFor
	up.Header.DisableNormalizing()
	// The Host header names each attempt's pod (attemptStage): a request
	// sent on the event loop goes without its URI parsed, and one a pod's
	// client sends keeps the header, not the host of its parsed URI.
	up.UseHostHeader = true
	up.Header.SetMethod(fasthttp.MethodPost)
	up.SetRequestURIBytes(ctx.Path())
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		if isHopByHop(k) || (len(k) >= len(pdlbPrefix) && bytes.EqualFold(k[:len(pdlbPrefix)], pdlbPrefix)) {
			return
		}
		// A client's key is the gateway's business, not the pods'.
		if authorize && bytes.EqualFold(k, authorization) {
			return
		}
		// Set whole below, the client's chain with its address added.
		if forward && bytes.EqualFold(k, forwardedFor) {
			return
		}
		up.Header.AddBytesKV(k, v)
	})
	// up has neither header yet: added, not set, they skip fasthttp's scan
	// of every header already there for one to replace.
	if forward {
		var buf [128]byte
		up.Header.AddBytesV(fasthttp.HeaderXForwardedFor, appendForwardedFor(buf[:0], ctx))
	}
	if len(ctx.Request.Header.Peek(headerRequestID)) == 0 {
		var id [32]byte
		ctx.Request.Header.SetBytesV(headerRequestID, appendRequestID(id[:0], ctx.ID(), ctx.ConnTime()))
		up.Header.AddBytesV(headerRequestID, ctx.Request.Header.Peek(headerRequestID))
	}
	// The body is the client's own buffer, valid until the handler returns;
	// the upstream request is written before that.
	up.SetBodyRaw(ctx.PostBody())
}

// appendForwardedFor appends the X-Forwarded-For the pods get: the
// client's own, its several fields joined as one (RFC 9110 section 5.3),
// then the client's address.
func appendForwardedFor(b []byte, ctx *fasthttp.RequestCtx) []byte {
	for _, v := range ctx.Request.Header.PeekAll(fasthttp.HeaderXForwardedFor) {
		if len(v) > 0 {
			b = append(append(b, v...), ", "...)
		}
	}
	if a, ok := clientAddr(ctx); ok {
		return a.Addr().AppendTo(b)
	}
	return append(b, "unknown"...)
}

// clientAddr is the address ctx's client connected from, IPv4 as such.
func clientAddr(ctx *fasthttp.RequestCtx) (netip.AddrPort, bool) {
	a, ok := ctx.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := a.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// appendRequestID renders a request id unique per process run: the
// connection's start time and the request's sequence number on it.
func appendRequestID(dst []byte, seq uint64, connTime time.Time) []byte {
	dst = strconv.AppendInt(dst, connTime.UnixNano(), 36)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, seq, 36)
}

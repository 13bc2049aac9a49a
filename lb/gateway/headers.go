package gateway

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/route"
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

// namedIn reports whether nominated (Connection values joined by commas)
// names the header k, whatever its case.
func namedIn(nominated, k []byte) bool {
	named := false
	eachNominated(nominated, func(name []byte) { named = named || bytes.EqualFold(k, name) })
	return named
}

// nominates reports whether v, a Connection header's value, names a header
// beyond the hop-by-hop ones every message loses anyway (close,
// keep-alive, upgrade...): only then must the headers it names be dropped.
func nominates(v []byte) bool {
	found := false
	eachNominated(v, func([]byte) { found = true })
	return found
}

// eachNominated calls f with each header name v nominates (v: Connection
// values joined by commas), other than close and the hop-by-hop names
// (keep-alive, upgrade...). Those headers describe one connection too, and
// are dropped like the fixed names (RFC 9110 section 7.6.1).
func eachNominated(v []byte, f func(name []byte)) {
	for len(v) > 0 {
		tok := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		if tok = bytes.Trim(tok, " \t"); len(tok) > 0 && !isHopByHop(tok) && !bytes.EqualFold(tok, closeToken) {
			f(tok)
		}
	}
}

var (
	connection    = []byte(fasthttp.HeaderConnection)
	contentLength = []byte(fasthttp.HeaderContentLength)
	closeToken    = []byte("close")
	pdlbPrefix    = []byte("x-pdlb-")
	accessControl = []byte("access-control-")
	authorization = []byte(fasthttp.HeaderAuthorization)
	xAPIKey       = []byte("X-Api-Key") // where Anthropic's SDKs send a key
	forwardedFor  = []byte(fasthttp.HeaderXForwardedFor)
	requestID     = []byte(headerRequestID) // fasthttp's canonical form
	server        = []byte(fasthttp.HeaderServer)
	date          = []byte(fasthttp.HeaderDate)
)

// sessionOf returns the request's session key, "" when it has none. Only
// requests that carry one pay for the string.
func sessionOf(x *completion) string {
	if !x.req.Kind.Outputs() || x.req.Continues() {
		// No prompt of the session's; or a Responses follow-up's, which
		// holds its new input alone, not the session's whole
		// conversation the ledger's growth rule compares.
		return ""
	}
	v := x.hdr[hdrSession]
	if len(v) == 0 {
		v = x.hdr[hdrSessionAIBrix]
	}
	return string(v)
}

// buildUpstream copies the client's request into up: the body byte for
// byte, the headers less hop-by-hop ones (the fixed names and those its
// Connection header nominates) and any x-pdlb-* a client made up, one
// X-Request-Id (generated when the client sent none), and the client's
// address appended to X-Forwarded-For (upstream.x_forwarded_for). id is
// the request's X-Request-Id (requestIDOf).
func (g *Gateway) buildUpstream(ctx *fasthttp.RequestCtx, up *fasthttp.Request, id []byte) {
	authorize, forward := g.keys.Enabled(), g.cfg.Upstream.XForwardedFor
	// Copied whole, then what the pod must not get is deleted: adding
	// header by header, fasthttp checked and normalised again every name
	// and value its parser had checked, which cost an SDK's request of
	// fifteen headers a microsecond. The copy carries the client's
	// protocol version too, which is not the pod's.
	ctx.Request.Header.CopyTo(&up.Header)
	up.Header.SetProtocol("HTTP/1.1")
	up.Header.DisableNormalizing()
	// A client's request without a Content-Type goes without one, as
	// behind nginx: fasthttp's default (a form's) makes FastAPI engines
	// (vLLM, SGLang) refuse the JSON body with 422.
	up.Header.SetNoDefaultContentType(true)
	// The Host header names each attempt's pod (attemptStage): a request
	// sent on the event loop goes without its URI parsed, and one a pod's
	// client sends keeps the header, not the host of its parsed URI.
	up.UseHostHeader = true
	up.Header.SetMethod(fasthttp.MethodPost)
	up.SetRequestURIBytes(ctx.Path())
	// The client's Connection values when they nominate other headers:
	// rare, so the common request neither allocates nor scans twice. Its
	// X-Forwarded-For chain and X-Request-Id are read on the way, not
	// looked up again (fasthttp's Peek normalizes the name each time).
	var buf [128]byte
	var nominated, clientID []byte
	chain, ids := buf[:0], 0
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		switch {
		case len(k) == len(contentLength) && bytes.EqualFold(k, contentLength):
			// Each write sets it from the body (render, fasthttp's).
			return
		case isHopByHop(k):
			if nominatesIn(k, v) {
				nominated = append(append(nominated, v...), ',')
			}
		case len(k) >= len(pdlbPrefix) && (k[0]|0x20) == 'x' && bytes.EqualFold(k[:len(pdlbPrefix)], pdlbPrefix):
		// A client's key is the gateway's business, not the pods'.
		case authorize && (len(k) == len(authorization) && bytes.EqualFold(k, authorization) || len(k) == len(xAPIKey) && bytes.EqualFold(k, xAPIKey)):
		// Set whole below: the client's fields joined as one (RFC 9110
		// section 5.3), with its address added.
		case forward && len(k) == len(forwardedFor) && bytes.EqualFold(k, forwardedFor):
			if len(v) > 0 {
				chain = append(append(chain, v...), ", "...)
			}
		case len(k) == len(requestID) && bytes.EqualFold(k, requestID):
			// Pods get one X-Request-Id, id: a client's lone one is
			// it, and stays where the copy put it.
			if ids == 0 {
				clientID = v
			}
			ids++
			return
		default:
			return
		}
		// The client's names are in the copy as they are here.
		up.Header.DelBytes(k)
	})
	if nominated != nil {
		// A name matches whatever its case: up's header does not
		// normalise the name DelBytes gets, so each goes as the client
		// sent it.
		ctx.Request.Header.VisitAll(func(k, _ []byte) {
			if namedIn(nominated, k) {
				up.Header.DelBytes(k)
			}
		})
		if namedIn(nominated, forwardedFor) {
			chain = chain[:0]
		}
		if namedIn(nominated, requestID) {
			// Deleted with the rest; the pod still gets id.
			ids = 0
		}
	}
	// up has neither header now: added, not set, they skip fasthttp's scan
	// of every header already there for one to replace.
	if forward {
		up.Header.AddBytesV(fasthttp.HeaderXForwardedFor, appendClientAddr(chain, ctx))
	}
	if ids != 1 || len(clientID) == 0 {
		if ids > 0 {
			up.Header.DelBytes(requestID)
		}
		up.Header.AddBytesKV(requestID, id)
	}
	// The body is the client's own buffer, valid until the handler returns;
	// the upstream request is written before that.
	up.SetBodyRaw(ctx.PostBody())
}

// requestIDOf appends the request's X-Request-Id to dst: the client's
// first (as Peek reads it), or, when that is empty, one made up. Pods get
// it, the client's answer carries it, and the access log and the explain
// trail name the request by it.
func requestIDOf(dst []byte, ctx *fasthttp.RequestCtx, client []byte) []byte {
	if len(client) > 0 {
		return append(dst, client...)
	}
	return appendRequestID(dst, ctx.ID(), ctx.ConnTime())
}

// appendClientAddr appends the address ctx's client connected from,
// "unknown" when it has none (a test's or a pipe's connection).
func appendClientAddr(b []byte, ctx *fasthttp.RequestCtx) []byte {
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
	dst = strconv.AppendInt(dst, connTime.UnixNano(), 16)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, seq, 16)
}

// The client's headers the gateway acts on, by index in clientHeaders.
const (
	hdrAuthorization = iota
	hdrAPIKey
	hdrPriority
	hdrDebug
	hdrAdminToken
	hdrProfile
	hdrStrategy
	hdrSession
	hdrSessionAIBrix
	hdrRequestID
	numClientHeaders
)

var clientHeaderNames = [numClientHeaders][]byte{
	hdrAuthorization: authorization,
	hdrAPIKey:        xAPIKey,
	hdrPriority:      []byte(headerPriority),
	hdrDebug:         []byte(headerDebug),
	hdrAdminToken:    []byte(headerAdminToken),
	hdrProfile:       []byte(route.HeaderConfigProfile),
	hdrStrategy:      []byte(route.HeaderRoutingStrategy),
	hdrSession:       []byte(headerSession),
	hdrSessionAIBrix: []byte(headerSessionAIBrix),
	hdrRequestID:     requestID,
}

// clientHeaderLens has bit n set when a name in clientHeaderNames is n
// bytes long: most of a client's headers are passed over on their length.
var clientHeaderLens = func() (m uint64) {
	for _, name := range clientHeaderNames {
		m |= 1 << len(name)
	}
	return m
}()

// clientHeaders holds the values of the client's headers the gateway acts
// on, each the first of its name as Peek would find it, read in one pass:
// Peek normalises the name and walks every header each time, and a
// request looked up eight. The values are the request header's own
// bytes, valid while the request is served.
type clientHeaders [numClientHeaders][]byte

func (h *clientHeaders) read(rh *fasthttp.RequestHeader) {
	*h = clientHeaders{}
	var seen uint
	rh.VisitAll(func(k, v []byte) {
		if len(k) >= 64 || clientHeaderLens&(1<<len(k)) == 0 {
			return
		}
		for i, name := range clientHeaderNames {
			if len(k) == len(name) && seen&(1<<i) == 0 && bytes.EqualFold(k, name) {
				h[i], seen = v, seen|1<<i
				return
			}
		}
	})
}

package gateway

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/tracing"
	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/pool"
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

// rateLimitField reports whether k names one of the rate-limit fields
// of a keyed answer (limits.RateLimitHeaders), whatever its case.
func rateLimitField(k []byte) bool {
	for _, name := range limits.RateLimitHeaders {
		if len(k) == len(name) && strings.EqualFold(string(k), name) {
			return true
		}
	}
	return false
}

// namedIn reports whether nominated (Connection values joined by commas)
// names the header k, whatever its case.
func namedIn(nominated, k []byte) bool {
	for name, rest := nextNominated(nominated); name != nil; name, rest = nextNominated(rest) {
		if bytes.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// nominates reports whether v, a Connection header's value, names a header
// beyond the hop-by-hop ones every message loses anyway (close,
// keep-alive, upgrade...): only then must the headers it names be dropped.
func nominates(v []byte) bool {
	name, _ := nextNominated(v)
	return name != nil
}

// eachNominated calls f with each header name v nominates (nextNominated).
func eachNominated(v []byte, f func(name []byte)) {
	for name, rest := nextNominated(v); name != nil; name, rest = nextNominated(rest) {
		f(name)
	}
}

// nextNominated returns the first header name v nominates (v: Connection
// values joined by commas), other than close and the hop-by-hop names
// (keep-alive, upgrade...), and the rest of v after it; nil when none is
// left. Those headers describe one connection too, and are dropped like
// the fixed names (RFC 9110 section 7.6.1). Its names are v's own bytes,
// and no callback sees them: namedIn, on every request that nominates,
// keeps its caller's buffers off the heap.
func nextNominated(v []byte) (name, rest []byte) {
	for len(v) > 0 {
		tok := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		if tok = bytes.Trim(tok, " \t"); len(tok) > 0 && !isHopByHop(tok) && !bytes.EqualFold(tok, closeToken) {
			return tok, v
		}
	}
	return nil, nil
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
	traceparent   = []byte("traceparent")
	tracestate    = []byte("tracestate")
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

// buildUpstream copies the client's request into up, for pod: the body
// byte for byte, the headers less hop-by-hop ones (the fixed names and
// those its Connection header nominates) and any x-pdlb-* a client made
// up, one X-Request-Id (generated when the client sent none), the
// client's address appended to X-Forwarded-For
// (upstream.x_forwarded_for), and the pod's API key in place of the
// client's. id is the request's X-Request-Id (requestIDOf).
// appendUpstream renders the same request as bytes.
func (g *Gateway) buildUpstream(ctx *fasthttp.RequestCtx, up *fasthttp.Request, id []byte, pod *pool.Pod) {
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
	up.SetRequestURIBytes(pathOf(ctx))
	var buf [128]byte
	p, chain := g.podHeaders(pod), buf[:0]
	for k, v := range ctx.Request.Header.All() {
		// The client's names are in the copy as they are here; each
		// write sets Content-Length from the body (render, fasthttp's),
		// and X-Request-Id is settled below.
		var fate fieldFate
		if fate, chain = p.sort(k, v, chain); fate == fieldDropped {
			up.Header.DelBytes(k)
		}
	}
	if p.nominated != nil {
		// A name matches whatever its case: up's header does not
		// normalise the name DelBytes gets, so each goes as the client
		// sent it.
		for k := range ctx.Request.Header.All() {
			if namedIn(p.nominated, k) {
				up.Header.DelBytes(k)
			}
		}
		chain = p.nominatedGone(chain)
	}
	// up has neither header now: added, not set, they skip fasthttp's scan
	// of every header already there for one to replace.
	if p.forward {
		up.Header.AddBytesV(fasthttp.HeaderXForwardedFor, appendClientAddr(chain, ctx))
	}
	if p.auth != nil {
		up.Header.AddBytesKV(authorization, p.auth)
	}
	if p.ids != 1 || len(p.clientID) == 0 {
		// Pods get one X-Request-Id, id: a client's lone one is it, and
		// stays where the copy put it.
		if p.ids > 0 {
			up.Header.DelBytes(requestID)
		}
		up.Header.AddBytesKV(requestID, id)
	}
	// The body is the client's own buffer, valid until the handler returns;
	// the upstream request is written before that.
	up.SetBodyRaw(ctx.PostBody())
}

// pathOf is ctx.Path(): the request target as sent when it is a plain
// path (no escapes, query, fragment, dot or empty segment, all of which
// Path decodes, drops or normalises), without parsing the URI.
func pathOf(ctx *fasthttp.RequestCtx) []byte {
	uri := ctx.Request.Header.RequestURI()
	if len(uri) == 0 || uri[0] != '/' {
		return ctx.Path()
	}
	for i, c := range uri {
		switch c {
		case '%', '?', '#', '.':
			return ctx.Path()
		case '/':
			if i > 0 && uri[i-1] == '/' {
				return ctx.Path()
			}
		}
	}
	return uri
}

// appendUpstream appends x's request to x.pod as it goes on the wire: what
// buildUpstream makes (a POST of the client's path and body), with the
// attempt's trace context, rendered from the client's request with no
// fasthttp request in between.
func (g *Gateway) appendUpstream(dst []byte, x *completion) []byte {
	ctx := x.ctx
	dst = append(dst, "POST "...)
	dst = append(dst, pathOf(ctx)...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(append(dst, x.pod.Config.Address...), crlf...)
	var buf [128]byte
	p, chain, fields := g.podHeaders(x.pod), buf[:0], len(dst)
	// The attempt's trace context replaces the client's, as Inject does:
	// a context that is not valid (tracing off) sends nothing, and the
	// client's goes.
	sc := x.tr.attemptContext()
	if sc.IsValid() {
		p.traceparent, p.tracestate = true, sc.TraceState().Len() > 0
	}
	for k, v := range ctx.Request.Header.All() {
		var fate fieldFate
		if fate, chain = p.sort(k, v, chain); fate == fieldPassed {
			dst = appendHeaderLine(dst, k, v)
		}
	}
	if p.nominated != nil {
		// Rare: the fields the client's Connection header nominated
		// may have come before it, and are taken out again.
		kept := fields
		for line := dst[fields:]; len(line) > 0; {
			end := len(line)
			if i := bytes.IndexByte(line, '\n'); i >= 0 {
				end = i + 1
			}
			if k, _, _ := bytes.Cut(line[:end], colon); !namedIn(p.nominated, k) {
				kept += copy(dst[kept:], line[:end])
			}
			line = line[end:]
		}
		dst = dst[:kept]
		chain = p.nominatedGone(chain)
	}
	if p.forward {
		dst = append(dst, "X-Forwarded-For: "...)
		dst = append(appendClientAddr(append(dst, chain...), ctx), crlf...)
	}
	if p.auth != nil {
		dst = appendHeaderLine(dst, authorization, p.auth)
	}
	// The client's lone X-Request-Id, or its first, or one made up, as
	// requestIDOf settled it: buildUpstream's one.
	dst = appendHeaderLine(dst, requestID, x.reqID)
	dst = appendRank(dst, x.pin)
	dst = tracing.AppendFields(dst, sc)
	body := ctx.PostBody()
	dst = append(dst, "Content-Length: "...)
	dst = append(strconv.AppendInt(dst, int64(len(body)), 10), "\r\n\r\n"...)
	return append(dst, body...)
}

// appendHeaderLine appends the header field k: v, its line.
func appendHeaderLine(dst, k, v []byte) []byte {
	dst = append(append(dst, k...), ": "...)
	return append(append(dst, v...), crlf...)
}

var (
	crlf  = []byte("\r\n")
	colon = []byte(":")
)

// podHeaders reads a client's header fields, one at a time (sort), for
// its request to pod: what the pod gets of them, as buildUpstream and
// appendUpstream send it.
func (g *Gateway) podHeaders(pod *pool.Pod) podHeaders {
	auth := pod.Auth()
	return podHeaders{dropKey: auth != nil || g.keys.Load().Enabled(), auth: auth, forward: g.cfg.Upstream.XForwardedFor}
}

// podHeaders is what sort gathered of a client's header. The common
// request neither allocates nor scans twice: its X-Forwarded-For chain
// and X-Request-Id are read on the way, not looked up again (fasthttp's
// Peek normalizes the name each time).
type podHeaders struct {
	// dropKey: the client's Authorization and x-api-key stay here (the
	// gateway checks API keys, or the pod gets its own, auth); forward:
	// the pod gets the client's address in X-Forwarded-For; traceparent
	// and tracestate: the request sends its own trace context's
	// (appendUpstream).
	dropKey, forward, traceparent, tracestate bool
	auth                                      []byte
	// nominated is the client's Connection values when they name other
	// headers (rare), each followed by a comma; clientID its first
	// X-Request-Id, and ids how many it sent.
	nominated, clientID []byte
	ids                 int
}

// fieldFate is what the pod's request does with a client's header field.
type fieldFate uint8

const (
	// fieldPassed: the pod gets it as the client sent it.
	fieldPassed fieldFate = iota
	// fieldDropped: the pod must not get it.
	fieldDropped
	// fieldReplaced: the pod gets the request's own instead
	// (Content-Length, X-Request-Id).
	fieldReplaced
)

// sort tells the fate of the client's header field k: v, and notes what
// the request's own fields take from it; a client's X-Forwarded-For value
// joins chain, followed by ", ". chain goes in and out, not in p: stored
// through a pointer, a caller's stack buffer would move to the heap.
func (p *podHeaders) sort(k, v, chain []byte) (fieldFate, []byte) {
	switch {
	case len(k) == len(contentLength) && bytes.EqualFold(k, contentLength):
		return fieldReplaced, chain
	case isHopByHop(k):
		if nominatesIn(k, v) {
			p.nominated = append(append(p.nominated, v...), ',')
		}
	case len(k) >= len(pdlbPrefix) && (k[0]|0x20) == 'x' && bytes.EqualFold(k[:len(pdlbPrefix)], pdlbPrefix):
	// A client's key is the gateway's business, not the pods'.
	case p.dropKey && (len(k) == len(authorization) && bytes.EqualFold(k, authorization) || len(k) == len(xAPIKey) && bytes.EqualFold(k, xAPIKey)):
	// Set whole by the request: the client's fields joined as one (RFC
	// 9110 section 5.3), with its address added.
	case p.forward && len(k) == len(forwardedFor) && bytes.EqualFold(k, forwardedFor):
		if len(v) > 0 {
			chain = append(append(chain, v...), ", "...)
		}
	case p.traceparent && len(k) == len(traceparent) && bytes.EqualFold(k, traceparent),
		p.tracestate && len(k) == len(tracestate) && bytes.EqualFold(k, tracestate):
	case len(k) == len(requestID) && bytes.EqualFold(k, requestID):
		if p.ids == 0 {
			p.clientID = v
		}
		p.ids++
		return fieldReplaced, chain
	default:
		return fieldPassed, chain
	}
	return fieldDropped, chain
}

// nominatedGone takes the fields the client's Connection header nominated
// out of what sort gathered, chain included.
func (p *podHeaders) nominatedGone(chain []byte) []byte {
	if namedIn(p.nominated, requestID) {
		// Gone with the rest; the pod still gets the request's id.
		p.ids = 0
	}
	if namedIn(p.nominated, forwardedFor) {
		return chain[:0]
	}
	return chain
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
	if a, ok := frontend.ClientAddr(ctx); ok {
		return a.Addr().AppendTo(b)
	}
	return append(b, "unknown"...)
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
	hdrTraceparent
	hdrDataParallelRank
	numClientHeaders
)

var clientHeaderNames = [numClientHeaders][]byte{
	hdrAuthorization:    authorization,
	hdrAPIKey:           xAPIKey,
	hdrPriority:         []byte(headerPriority),
	hdrDebug:            []byte(headerDebug),
	hdrAdminToken:       []byte(headerAdminToken),
	hdrProfile:          []byte(route.HeaderConfigProfile),
	hdrStrategy:         []byte(route.HeaderRoutingStrategy),
	hdrSession:          []byte(headerSession),
	hdrSessionAIBrix:    []byte(headerSessionAIBrix),
	hdrRequestID:        requestID,
	hdrTraceparent:      []byte("traceparent"),
	hdrDataParallelRank: dataParallelRank,
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

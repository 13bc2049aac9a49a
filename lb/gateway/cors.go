package gateway

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
	"pdlb/lb/openai"
)

// corsPolicy is the cors section as the request path reads it; the zero
// value is CORS off.
type corsPolicy struct {
	on        bool
	anyOrigin bool
	origins   []string
	// methods and headers are nil when any is allowed; headers are in
	// lower case, with the CORS-safelisted ones, which a browser may ask
	// for (Content-Type: application/json is not safelisted itself) and
	// the engines' servers always allow.
	methods     []string
	headers     []string
	allowMethod string // Access-Control-Allow-Methods when methods is not nil
	allowHeader string // Access-Control-Allow-Headers when headers is not nil
	credentials bool
	expose      string
	maxAge      string // in seconds
}

func newCORS(c config.CORS) corsPolicy {
	if !c.Enabled() {
		return corsPolicy{}
	}
	p := corsPolicy{on: true, anyOrigin: slices.Contains(c.AllowedOrigins, "*"), origins: c.AllowedOrigins,
		credentials: c.AllowCredentials, expose: strings.Join(c.ExposeHeaders, ", "),
		maxAge: strconv.FormatInt(int64(c.MaxAge/time.Second), 10)}
	if !slices.Contains(c.AllowedMethods, "*") {
		p.methods = slices.Clone(c.AllowedMethods)
		p.allowMethod = strings.Join(p.methods, ", ")
	}
	if !slices.Contains(c.AllowedHeaders, "*") {
		p.headers = []string{"accept", "accept-language", "content-language", "content-type"}
		for _, h := range c.AllowedHeaders {
			if h = strings.ToLower(h); !slices.Contains(p.headers, h) {
				p.headers = append(p.headers, h)
			}
		}
		p.allowHeader = strings.Join(p.headers, ", ")
	}
	return p
}

// cors gives ctx's answer the Access-Control-* fields its Origin gets, or,
// when ctx is a preflight (OPTIONS with Access-Control-Request-Method),
// answers it: then it returns true, with the error a refused one got.
func (g *Gateway) cors(ctx *fasthttp.RequestCtx) (bool, *openai.Error) {
	p := &g.corsPolicy
	origin := p.origin(ctx)
	if origin == nil {
		return false, nil
	}
	method := ctx.Request.Header.Peek(fasthttp.HeaderAccessControlRequestMethod)
	if len(method) == 0 || !ctx.IsOptions() {
		p.allow(&ctx.Response.Header, origin)
		return false, nil
	}
	asked := ctx.Request.Header.Peek(fasthttp.HeaderAccessControlRequestHeaders)
	var why string
	switch {
	case !p.allowed(origin):
		why = "origin " + strconv.Quote(string(origin)) + " is not in cors.allowed_origins"
	case p.methods != nil && !slices.Contains(p.methods, string(method)):
		why = "method " + strconv.Quote(string(method)) + " is not in cors.allowed_methods"
	case p.headers != nil:
		if h := p.refusedHeader(asked); h != nil {
			why = "header " + strconv.Quote(string(h)) + " is not in cors.allowed_headers"
		}
	}
	if why != "" {
		e := &openai.Error{Status: fasthttp.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: "CORS preflight refused: " + why + "."}
		if !p.anyOrigin {
			// Refused for this origin: another's may be answered.
			ctx.Response.Header.Add(fasthttp.HeaderVary, fasthttp.HeaderOrigin)
		}
		writeFailure(ctx, answer(e))
		return true, e
	}
	h := &ctx.Response.Header
	p.allow(h, origin)
	if p.methods == nil {
		h.SetBytesV(fasthttp.HeaderAccessControlAllowMethods, method)
	} else {
		h.Set(fasthttp.HeaderAccessControlAllowMethods, p.allowMethod)
	}
	switch {
	case len(asked) == 0:
	case p.headers == nil:
		h.SetBytesV(fasthttp.HeaderAccessControlAllowHeaders, asked)
	default:
		h.Set(fasthttp.HeaderAccessControlAllowHeaders, p.allowHeader)
	}
	h.Set(fasthttp.HeaderAccessControlMaxAge, p.maxAge)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true, nil
}

// corsFields gives ctx's answer the Access-Control-* fields its Origin
// gets, for an answer made before the handler's cors ran.
func (g *Gateway) corsFields(ctx *fasthttp.RequestCtx) {
	if o := g.corsPolicy.origin(ctx); o != nil {
		g.corsPolicy.allow(&ctx.Response.Header, o)
	}
}

// origin is ctx's Origin when CORS is on, nil when it is off or ctx has
// none (or an empty one).
func (p *corsPolicy) origin(ctx *fasthttp.RequestCtx) []byte {
	if !p.on {
		return nil
	}
	if o := ctx.Request.Header.Peek(fasthttp.HeaderOrigin); len(o) > 0 {
		return o
	}
	return nil
}

// allowed reports whether origin may call the API.
func (p *corsPolicy) allowed(origin []byte) bool {
	if p.anyOrigin {
		return true
	}
	for _, o := range p.origins {
		// Compared without a conversion, which would allocate for an
		// origin longer than 32 bytes.
		if string(origin) == o {
			return true
		}
	}
	return false
}

// allow sets the fields of an answer to origin: the origin allowed ("*"
// when any is and no credentials go with it), credentials, the fields
// exposed. An origin not allowed gets none, and the browser keeps the
// answer from the page.
func (p *corsPolicy) allow(h *fasthttp.ResponseHeader, origin []byte) {
	switch {
	case p.anyOrigin && !p.credentials:
		h.Set(fasthttp.HeaderAccessControlAllowOrigin, "*")
	case p.allowed(origin):
		h.SetBytesV(fasthttp.HeaderAccessControlAllowOrigin, origin)
		// The answer depends on Origin: a cache must not give it to
		// another.
		h.Add(fasthttp.HeaderVary, fasthttp.HeaderOrigin)
	default:
		h.Add(fasthttp.HeaderVary, fasthttp.HeaderOrigin)
		return
	}
	if p.credentials {
		h.Set(fasthttp.HeaderAccessControlAllowCredentials, "true")
	}
	if p.expose != "" {
		h.Set(fasthttp.HeaderAccessControlExposeHeaders, p.expose)
	}
}

// refusedHeader is the first name of asked (Access-Control-Request-Headers:
// names joined by commas) that headers lacks, nil when it has them all.
func (p *corsPolicy) refusedHeader(asked []byte) []byte {
	for name := range bytes.SplitSeq(asked, []byte(",")) {
		name = bytes.Trim(name, " \t")
		if len(name) > 0 && !slices.ContainsFunc(p.headers, func(h string) bool { return bytes.EqualFold(name, []byte(h)) }) {
			return name
		}
	}
	return nil
}

package sim

import (
	"bytes"
	"crypto/subtle"
	"strings"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
)

// vllmPublic are the paths vLLM's API-key middleware leaves open, each
// with the paths under it (PUBLIC_ENDPOINTS in its entrypoints, less the
// API docs the sim does not serve); it guards every other route.
var vllmPublic = []string{"/health", "/ping", "/load", "/version", "/metrics"}

// authorized answers 401 as the engine's API-key middleware does, false,
// when the pod has an APIKey and ctx's request needs but lacks it. A
// preflight never does (the CORS middleware answered it already).
func (p *Pod) authorized(ctx *fasthttp.RequestCtx) bool {
	if p.cfg.APIKey == "" || ctx.IsOptions() || !p.guarded(string(ctx.Path())) {
		return true
	}
	scheme, key, _ := bytes.Cut(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), []byte(" "))
	if string(bytes.ToLower(scheme)) == "bearer" && subtle.ConstantTimeCompare(key, []byte(p.cfg.APIKey)) == 1 {
		return true
	}
	// vLLM's and SGLang's answer alike: no OpenAI error object.
	ctx.SetStatusCode(fasthttp.StatusUnauthorized)
	writeJSON(ctx, []byte(`{"error":"Unauthorized"}`))
	return false
}

// guarded reports whether the engine's API key guards path: the sim's
// own /admin/role too, as the engine guards its admin endpoints (vLLM's
// /sleep, /reset_prefix_cache, SGLang's /update_weights...).
func (p *Pod) guarded(path string) bool {
	if p.cfg.Engine == engines.SGLang {
		// Prefixes, not segments: /health_generate is open too.
		return !strings.HasPrefix(path, "/health") && !strings.HasPrefix(path, "/metrics")
	}
	for _, pub := range vllmPublic {
		if path == pub || strings.HasPrefix(path, pub+"/") {
			return false
		}
	}
	return true
}

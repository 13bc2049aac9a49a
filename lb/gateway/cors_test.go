package gateway

import (
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
)

// TestCORSAllocs: the fields of an answer to a listed origin cost no
// allocation, whatever the origin's length (a []byte-to-string conversion
// allocates past 32 bytes).
func TestCORSAllocs(t *testing.T) {
	const origin = "https://chat.internal.example-company.com"
	for _, origins := range [][]string{{"*"}, {"https://a.example", origin}} {
		g := &Gateway{corsPolicy: newCORS(config.CORS{AllowedOrigins: origins, AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}})}
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.Header.Set(fasthttp.HeaderOrigin, origin)
		allocs := testing.AllocsPerRun(100, func() {
			ctx.Response.Reset()
			if preflight, _ := g.cors(&ctx); preflight {
				t.Fatal("a POST taken for a preflight")
			}
		})
		if got := string(ctx.Response.Header.Peek(fasthttp.HeaderAccessControlAllowOrigin)); got == "" || allocs != 0 {
			t.Errorf("origins %q: Access-Control-Allow-Origin %q, %v allocations a request, want it set and 0", origins, got, allocs)
		}
	}
}

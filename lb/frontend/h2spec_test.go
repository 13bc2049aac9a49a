package frontend_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	h2specconfig "github.com/summerwind/h2spec/config"
	"github.com/summerwind/h2spec/generic"
	h2spechpack "github.com/summerwind/h2spec/hpack"
	h2spechttp2 "github.com/summerwind/h2spec/http2"
	"github.com/summerwind/h2spec/spec"
	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
	"pdlb/lb/frontend"
)

// TestH2Spec runs h2spec, the HTTP/2 conformance suite (its 146 cases,
// the strict ones included, follow RFC 7540 and RFC 7541's sections),
// against both front ends over TLS and over h2c.
func TestH2Spec(t *testing.T) {
	ts := newTLSSetup(t)
	// A body of more than five bytes: the flow-control cases need one.
	h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("served by pdlb\n") }, Error: writeFrontError}
	for _, name := range frontEnds {
		for _, secure := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/h2c", true: "/h2"}[secure], func(t *testing.T) {
				// The default header limit: 6.10/1 sends 8,000 bytes of fields.
				o := frontend.Options{MaxBodyBytes: testMaxBody, MaxHeaderBytes: config.DefaultMaxHeaderBytes}
				if secure {
					o.TLS = ts.options().TLS
				}
				host, port, _ := net.SplitHostPort(serveWith(t, name, h, o))
				c := &h2specconfig.Config{Host: host, Path: "/", Timeout: 5 * time.Second, MaxHeaderLen: 4000, Strict: true, TLS: secure, Insecure: true}
				c.Port, _ = strconv.Atoi(port)
				for _, g := range []*spec.TestGroup{generic.Spec(), h2spechttp2.Spec(), h2spechpack.Spec()} {
					g.Test(c)
					for _, r := range failed(g) {
						id := r.TestCase.Parent.ID() + "/" + strconv.Itoa(r.Sequence)
						// Over h2c, bytes that are not the preface are an
						// HTTP/1.1 request, this one answered 400 before
						// the close.
						if !secure && id == "http2/3.5/2" {
							continue
						}
						t.Errorf("%s %s: %v", id, r.TestCase.Desc, r.Error)
					}
				}
			})
		}
	}
}

// failed lists the results of g's test cases that failed.
func failed(g *spec.TestGroup) []*spec.TestResult {
	var out []*spec.TestResult
	for _, tc := range append(g.Tests, g.StrictTests...) {
		if tc.Result != nil && tc.Result.Failed {
			out = append(out, tc.Result)
		}
	}
	for _, sub := range g.Groups {
		out = append(out, failed(sub)...)
	}
	return out
}

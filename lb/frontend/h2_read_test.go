package frontend_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/lb/frontend"
)

// TestHTTP2ReadTimeout: a request whose body does not come whole within
// ReadTimeout is answered with the Error handler's timeout, as on
// HTTP/1.1; a client that sent half a request, or died after it, would
// hold its stream, its connection and a shutdown forever.
func TestHTTP2ReadTimeout(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			got := make(chan error, 1)
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) { t.Error("a request without its body served") },
				Error: func(ctx *fasthttp.RequestCtx, err error) {
					got <- err
					ctx.SetStatusCode(fasthttp.StatusRequestTimeout)
				}}
			fr := rawH2(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody, ReadTimeout: 200 * time.Millisecond}), nil)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			h2Open(fr, 1, "POST", "/echo", false)
			_ = fr.WriteData(1, false, []byte(`{"model":`))
			select {
			case err := <-got:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("the Error handler got %v; want a timeout", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a request whose body never ended is still waited for")
			}
			h2Until(t, fr, "the answer", func(f http2.Frame) bool {
				mh, ok := f.(*http2.MetaHeadersFrame)
				if ok && mh.PseudoValue("status") != "408" {
					t.Errorf("status %s; want 408", mh.PseudoValue("status"))
				}
				return ok && mh.StreamID == 1
			})
		})
	}
}

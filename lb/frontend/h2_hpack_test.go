package frontend_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/lb/frontend"
)

// TestHTTP2RequestIDNotIndexed: an answer's X-Request-Id, which no later
// answer repeats, goes as a literal never indexed, so it evicts nothing
// from the connection's HPACK table; the fields that repeat are indexed.
func TestHTTP2RequestIDNotIndexed(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			n := 0
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				n++
				ctx.Response.Header.Set("X-Request-Id", "req-"+strconv.Itoa(n))
				ctx.Response.Header.Set("X-Pdlb-Pod", "pod-a")
				ctx.SetBodyString("ok")
			}}
			h2AnswerFields(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), 2, func(id uint32, fields []hpack.HeaderField) {
				for _, hf := range fields {
					switch hf.Name {
					case "x-request-id":
						if !hf.Sensitive {
							t.Errorf("stream %d: x-request-id %q went indexed", id, hf.Value)
						}
						if want := "req-" + strconv.Itoa(int(id+1)/2); hf.Value != want {
							t.Errorf("stream %d: x-request-id %q, want %q", id, hf.Value, want)
						}
					case "x-pdlb-pod":
						if hf.Sensitive {
							t.Errorf("stream %d: x-pdlb-pod went never indexed", id)
						}
					}
				}
			})
		})
	}
}

// h2AnswerFields sends n GET requests over one HTTP/2 connection to
// addr, one after the other on streams 1, 3, ..., and gives check each
// answer's header fields as they were decoded.
func h2AnswerFields(t *testing.T, addr string, n int, check func(id uint32, fields []hpack.HeaderField)) {
	t.Helper()
	fr := rawH2(t, addr, nil)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for id := uint32(1); id < uint32(2*n); id += 2 {
		h2Open(fr, id, "GET", "/", true)
		h2Until(t, fr, "the answer", func(f http2.Frame) bool {
			mh, ok := f.(*http2.MetaHeadersFrame)
			if ok && mh.StreamID == id {
				check(id, mh.Fields)
			}
			return ok && mh.StreamID == id
		})
	}
}

// TestHTTP2Date: an answer over h2 carries the time it was sent, as one
// over HTTP/1.1 does (RFC 9110 6.6.1: a server with a clock sends Date).
func TestHTTP2Date(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }}
			h2AnswerFields(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), 1, func(_ uint32, fields []hpack.HeaderField) {
				var dates []string
				for _, hf := range fields {
					if hf.Name == "date" {
						dates = append(dates, hf.Value)
					}
				}
				if len(dates) != 1 {
					t.Fatalf("date fields %q, want one", dates)
				}
				if d, err := http.ParseTime(dates[0]); err != nil || time.Since(d).Abs() > time.Minute {
					t.Errorf("date %q: %v", dates[0], err)
				}
			})
		})
	}
}

// TestHTTP2PassHead: header lines PassHead gives go out in the answer's
// HEADERS with the fields its header holds, names lowered, hop-by-hop
// ones dropped, X-Request-Id never indexed; the next answer on the
// connection, which gave none, carries none of them.
func TestHTTP2PassHead(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			n := 0
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				n++
				ctx.Response.Header.SetNoDefaultContentType(true)
				ctx.Response.Header.Set("X-Gateway", "1")
				if n == 1 && !frontend.PassHead(ctx, []byte("content-type: application/json\r\nX-Request-Id: req-1\r\nConnection: close\r\nx-pdlb-pod: pod-a\r\n")) {
					t.Error("PassHead refused an HTTP/2 stream")
				}
				ctx.SetBodyString("{}")
			}}
			h2AnswerFields(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), 2, func(id uint32, fields []hpack.HeaderField) {
				got := map[string]string{}
				for _, hf := range fields {
					if _, dup := got[hf.Name]; dup {
						t.Errorf("stream %d: %s twice", id, hf.Name)
					}
					got[hf.Name] = hf.Value
					if hf.Name == "x-request-id" && !hf.Sensitive {
						t.Errorf("stream %d: x-request-id went indexed", id)
					}
				}
				want := map[string]string{"x-gateway": "1"}
				if id == 1 {
					want = map[string]string{"x-gateway": "1", "content-type": "application/json", "x-request-id": "req-1", "x-pdlb-pod": "pod-a"}
				}
				for k, v := range want {
					if got[k] != v {
						t.Errorf("stream %d: %s %q, want %q", id, k, got[k], v)
					}
				}
				for _, k := range []string{"connection", "content-type", "x-pdlb-pod"} {
					if _, ok := want[k]; !ok && got[k] != "" {
						t.Errorf("stream %d: %s %q, want none", id, k, got[k])
					}
				}
			})
		})
	}
}

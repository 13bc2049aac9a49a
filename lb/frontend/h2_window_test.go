package frontend_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/lb/frontend"
)

// h2Get opens stream id on fr with a GET of path.
func h2Get(fr *http2.Framer, id uint32, path string) { h2Open(fr, id, "GET", path, true) }

// h2Open opens stream id on fr with a request's header; end: it has no
// body.
func h2Open(fr *http2.Framer, id uint32, method, path string, end bool) {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: method}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path}, {Name: ":authority", Value: "x"}} {
		_ = enc.WriteField(f)
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: end})
}

// h2Until reads frames from fr until want says stop.
func h2Until(t *testing.T, fr *http2.Framer, what string, want func(http2.Frame) bool) {
	t.Helper()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if want(f) {
			return
		}
	}
}

// TestHTTP2NegativeWindowEnd: a client may shrink its
// SETTINGS_INITIAL_WINDOW_SIZE below what a stream already took, which
// leaves the stream's window negative (RFC 9113 6.9.2); the empty DATA
// frame that ends the stream needs no window and still goes out.
func TestHTTP2NegativeWindowEnd(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
					_, _ = w.Write([]byte("data: 1\n\n"))
					_ = w.Flush()
					<-release
				})
			}, Error: writeFrontError}
			fr := rawH2(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			h2Get(fr, 1, "/stream")
			h2Until(t, fr, "the first event", func(f http2.Frame) bool {
				d, ok := f.(*http2.DataFrame)
				return ok && d.StreamID == 1 && len(d.Data()) > 0
			})
			_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			h2Until(t, fr, "the SETTINGS' ack", func(f http2.Frame) bool {
				s, ok := f.(*http2.SettingsFrame)
				return ok && s.IsAck()
			})
			close(release)
			h2Until(t, fr, "the stream's end", func(f http2.Frame) bool {
				if r, ok := f.(*http2.RSTStreamFrame); ok {
					t.Fatalf("stream reset (%v) instead of ended", r.ErrCode)
				}
				d, ok := f.(*http2.DataFrame)
				return ok && d.StreamID == 1 && d.StreamEnded()
			})
		})
	}
}

// TestHTTP2WindowOpensDuringFlush: a client that grants one byte of window
// at a time, each as soon as the byte comes, gets the whole answer. The
// writer flushes before it waits for the window, and the flush lets go of
// the connection's lock while it writes: a WINDOW_UPDATE handled then
// must not be missed, or the stream waits for good.
func TestHTTP2WindowOpensDuringFlush(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 4000)
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body) }, Error: writeFrontError}
			fr := rawH2(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
			h2Get(fr, 1, "/")
			got := 0
			h2Until(t, fr, "the answer, a byte of window at a time", func(f http2.Frame) bool {
				d, ok := f.(*http2.DataFrame)
				if !ok {
					return false
				}
				if n := len(d.Data()); n > 0 {
					got += n
					_ = fr.WriteWindowUpdate(1, uint32(n))
				}
				return d.StreamEnded()
			})
			if got != len(body) {
				t.Errorf("%d bytes of the body came, want %d", got, len(body))
			}
		})
	}
}

// TestHTTP2StreamEndsWithLastData: a streamed answer's last bytes go out
// in a DATA frame that ends the stream, not followed by an empty one (a
// frame, a flush and on TLS a record fewer a stream); bytes flushed
// before stay in frames of their own that end nothing.
func TestHTTP2StreamEndsWithLastData(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
					_, _ = w.Write([]byte("data: 1\n\n"))
					_ = w.Flush()
					_, _ = w.Write([]byte("data: 2\n\n"))
				})
			}, Error: writeFrontError}
			fr := rawH2(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			h2Get(fr, 1, "/stream")
			var frames []string
			h2Until(t, fr, "the stream's end", func(f http2.Frame) bool {
				d, ok := f.(*http2.DataFrame)
				if !ok || d.StreamID != 1 {
					return false
				}
				frames = append(frames, fmt.Sprintf("%q end=%v", d.Data(), d.StreamEnded()))
				return d.StreamEnded()
			})
			want := []string{`"data: 1\n\n" end=false`, `"data: 2\n\n" end=true`}
			if !slices.Equal(frames, want) {
				t.Errorf("DATA frames %q, want %q", frames, want)
			}
		})
	}
}

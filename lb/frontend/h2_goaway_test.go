package frontend_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"

	"pdlb/lb/frontend"
)

// TestHTTP2GoAwayGrace: a connection that sent GOAWAY and has no stream
// left still reads and answers for a while (a PING sent after the
// client's GOAWAY is acknowledged, RFC 9113 6.8 and h2spec 7/1), then
// closes though its client never does.
func TestHTTP2GoAwayGrace(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			fr := rawH2(t, serveWith(t, name, newApp().handler(), frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			h2Until(t, fr, "the server's GOAWAY", func(f http2.Frame) bool {
				_, ok := f.(*http2.GoAwayFrame)
				return ok
			})
			ping := [8]byte{'p', 'd', 'l', 'b'}
			_ = fr.WritePing(false, ping)
			h2Until(t, fr, "the PING's acknowledgement", func(f http2.Frame) bool {
				p, ok := f.(*http2.PingFrame)
				return ok && p.IsAck() && p.Data == ping
			})
			start := time.Now()
			for {
				if _, err := fr.ReadFrame(); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatalf("the connection ended with %v, want EOF", err)
					}
					break
				}
			}
			if waited := time.Since(start); waited > 5*time.Second {
				t.Errorf("closed %v after the GOAWAY, want about a second", waited.Round(time.Millisecond))
			}
		})
	}
}

// TestHTTP2ErrorCloseLingers: a connection ended by a connection error
// while its client still sends is half-closed, and what comes after is
// read and dropped: the client reads the GOAWAY and then the end of the
// stream, where closing with unread bytes would reset the connection
// (and some clients lose the GOAWAY with it). On the gnet front end
// HTTP/2 runs on a duplicate of the loop's socket, which lingers too.
func TestHTTP2ErrorCloseLingers(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			fr, c := rawH2Conn(t, serveWith(t, name, newApp().handler(), frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			// HEADERS on an even stream is a connection error; the PINGs
			// sent with it (170 KB, more than one read takes) are never
			// read by the HTTP/2 server.
			var out bytes.Buffer
			w := http2.NewFramer(&out, nil)
			_ = w.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: h2Request("GET", "/"), EndHeaders: true, EndStream: true})
			for range 10000 {
				_ = w.WritePing(false, [8]byte{})
			}
			go func() { _, _ = c.Write(out.Bytes()) }()
			var ended error
			goAway := false
			for ended == nil {
				var f http2.Frame
				if f, ended = fr.ReadFrame(); ended == nil {
					if g, ok := f.(*http2.GoAwayFrame); ok && g.ErrCode == http2.ErrCodeProtocol {
						goAway = true
					}
				}
			}
			if !goAway || !errors.Is(ended, io.EOF) {
				t.Fatalf("GOAWAY PROTOCOL_ERROR read: %v; the connection ended with %v, want EOF", goAway, ended)
			}
		})
	}
}

// TestHTTP2FramesAfterGoAway: a stream the client opened before it saw
// the server's GOAWAY is not served, and its DATA and trailers are dropped
// (RFC 9113 6.8); the stream the GOAWAY lets finish is answered.
func TestHTTP2FramesAfterGoAway(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				<-release
				ctx.SetBodyString("ok")
			}, Error: writeFrontError}
			s, err := frontend.Start(name, "127.0.0.1:0", h, frontend.Options{MaxBodyBytes: testMaxBody})
			if err != nil {
				t.Fatal(err)
			}
			fr := rawH2(t, s.Addr(), nil)
			h2Get(fr, 1, "/")
			h2Until(t, fr, "the SETTINGS acknowledgement", func(f http2.Frame) bool {
				sf, ok := f.(*http2.SettingsFrame)
				return ok && sf.IsAck()
			})
			done := make(chan error, 1)
			go func() { done <- s.ShutdownWithContext(context.Background()) }()
			h2Until(t, fr, "the GOAWAY", func(f http2.Frame) bool {
				_, ok := f.(*http2.GoAwayFrame)
				return ok
			})
			h2Open(fr, 3, "POST", "/", false)
			_ = fr.WriteData(3, false, []byte("body"))
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: h2Trailers(), EndHeaders: true, EndStream: true})
			_ = fr.WritePing(false, [8]byte{1})
			h2Until(t, fr, "the PING's acknowledgement", func(f http2.Frame) bool {
				p, ok := f.(*http2.PingFrame)
				return ok && p.IsAck()
			})
			close(release)
			if got := h2Outcome(fr, 1); got != "status 200" {
				t.Errorf("stream 1, below the GOAWAY's last stream: %s, want status 200", got)
			}
			if err := <-done; err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
	}
}

// TestHTTP2LingerOutlastsGrace: a connection error while a handler still
// runs ends the connection in a lingering close, which the GOAWAY's grace
// (armed when that handler ends) must not cut short: the client may send
// on for the linger's bounds.
func TestHTTP2LingerOutlastsGrace(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				time.Sleep(200 * time.Millisecond)
				ctx.SetBodyString("ok")
			}, Error: writeFrontError}
			fr, c := rawH2Conn(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			h2Get(fr, 1, "/")
			// HEADERS on an even stream: a connection error.
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: h2Request("GET", "/"), EndHeaders: true, EndStream: true})
			var end error
			for end == nil {
				_, end = fr.ReadFrame()
			}
			if !errors.Is(end, io.EOF) {
				t.Fatalf("the connection ended with %v, want EOF", end)
			}
			start := time.Now()
			for time.Since(start) < 1500*time.Millisecond {
				if _, err := c.Write(make([]byte, 100)); err != nil {
					t.Fatalf("the linger ended %v after the EOF: %v", time.Since(start).Round(10*time.Millisecond), err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

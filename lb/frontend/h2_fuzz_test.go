package frontend

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
)

// FuzzH2Conn: whatever frames follow a client's preface and SETTINGS, the
// connection ends (here, when the client's side closes) without a panic,
// and every stream's handler returns.
func FuzzH2Conn(f *testing.F) {
	frames := func(write func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		write(http2.NewFramer(&b, nil))
		return b.Bytes()
	}
	get := []byte{0x82, 0x86, 0x84, 0x41, 0x01, 'x'} // GET, http, /, :authority x (HPACK)
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: get, EndHeaders: true, EndStream: true})
	}))
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: get, EndHeaders: true})
		_ = fr.WriteData(1, false, []byte("abc"))
		_ = fr.WriteWindowUpdate(1, 10)
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
		_ = fr.WritePing(false, [8]byte{1})
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: get[:3], EndStream: true})
		_ = fr.WriteContinuation(3, true, get[3:])
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	}))
	f.Add(frames(func(fr *http2.Framer) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: get, EndHeaders: true, EndStream: true})
		_ = fr.WriteData(5, true, []byte("late"))
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: get, EndHeaders: true})
	}))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := newH2Server(Handler{
			Serve: func(ctx *fasthttp.RequestCtx) {
				if bytes.Equal(ctx.Path(), []byte("/stream")) {
					SetBodyStreamWriter(ctx, func(w *StreamWriter) {
						_, _ = w.Write([]byte("data: 1\n\n"))
						_ = w.Flush()
					})
					return
				}
				ctx.SetBody(ctx.Request.Body())
			},
			Error: func(ctx *fasthttp.RequestCtx, err error) { ctx.SetStatusCode(400) },
		}, Options{}.withDefaults())
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			s.serve(server)
			close(done)
		}()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(client, http2.ClientPreface)
		_ = http2.NewFramer(client, nil).WriteSettings()
		_, _ = client.Write(in)
		_ = client.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the connection outlived its client")
		}
		_ = s.shutdown(context.Background())
	})
}

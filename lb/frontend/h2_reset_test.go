package frontend_test

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"

	"pdlb/lb/frontend"
)

// TestHTTP2StreamWriterRunsOnceReset: a stream writer runs even when its
// client reset the stream before the answer's header went out (it fails
// at its first write): the gateway's relay, which it is, ends its request
// there, giving back its key's slot, its charges and its pod's
// connection; a writer that never ran would hold them for good.
func TestHTTP2StreamWriterRunsOnceReset(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			started, release, ran := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				close(started)
				<-release // the pod's answer head is in
				frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
					_, err := w.Write([]byte("data: 1\n\n"))
					if err == nil {
						err = w.Flush()
					}
					ran <- err
				})
			}, Error: writeFrontError}
			fr := rawH2(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			h2Get(fr, 1, "/stream")
			<-started
			// The server reads frames in order: the PING's ack says it
			// has taken in the reset.
			_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = fr.WritePing(false, [8]byte{1})
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("waiting for the PING's ack: %v", err)
				}
				if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
					break
				}
			}
			close(release)
			select {
			case err := <-ran:
				if err == nil {
					t.Errorf("the writer of a reset stream wrote without an error")
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the stream writer never ran: the stream was reset before its header went out")
			}
		})
	}
}

// TestHTTP2ClientGone: a stream's ClientGone channel closes when its
// client resets the stream, whether the handler asked for it before the
// reset or after; a later stream's starts open, though streams are
// pooled.
func TestHTTP2ClientGone(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			started, release, seen := make(chan struct{}, 1), make(chan struct{}), make(chan string, 1)
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				gone := func() string {
					select {
					case <-frontend.ClientGone(ctx):
						return "gone"
					default:
						return "open"
					}
				}
				switch string(ctx.Path()) {
				case "/before":
					g := frontend.ClientGone(ctx)
					started <- struct{}{}
					select {
					case <-g:
						seen <- "gone"
					case <-time.After(10 * time.Second):
						seen <- "open"
					}
				case "/after":
					started <- struct{}{}
					<-release
					seen <- gone()
				default:
					ctx.SetBodyString(gone())
				}
			}, Error: writeFrontError}
			fr := rawH2(t, serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			// The server reads frames in order: the PING's ack says it
			// has taken in the reset.
			reset := func(id uint32) {
				_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
				_ = fr.WritePing(false, [8]byte{byte(id)})
				h2Until(t, fr, "the PING's ack", func(f http2.Frame) bool {
					p, ok := f.(*http2.PingFrame)
					return ok && p.IsAck()
				})
			}
			h2Get(fr, 1, "/before")
			<-started
			reset(1)
			if s := <-seen; s != "gone" {
				t.Errorf("asked before the reset: the client is %s", s)
			}
			h2Get(fr, 3, "/after")
			<-started
			reset(3)
			close(release)
			if s := <-seen; s != "gone" {
				t.Errorf("asked after the reset: the client is %s", s)
			}
			for id := uint32(5); id <= 9; id += 2 {
				h2Get(fr, id, "/later")
				var body string
				h2Until(t, fr, "the answer", func(f http2.Frame) bool {
					d, ok := f.(*http2.DataFrame)
					if ok && d.StreamID == id {
						body += string(d.Data())
					}
					return ok && d.StreamID == id && d.StreamEnded()
				})
				if body != "open" {
					t.Errorf("stream %d after the resets: the client is %s", id, body)
				}
			}
		})
	}
}

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

package frontend

import (
	"errors"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/valyala/fasthttp"
)

// SetBodyStreamWriter makes sw write ctx's response body, on either front
// end, on the goroutine that writes the response: fasthttp's serving
// goroutine, or one the gnet connection starts for the stream. Each Flush
// of sw's writer goes out at once as one HTTP chunk. Unlike
// ctx.SetBodyStreamWriter, no second goroutine and no in-memory pipe stand
// between sw and the socket, and no buffer is held while sw waits between
// events. As with fasthttp's, sw must not touch ctx: the gnet front end
// recycles it once the response header is rendered.
func SetBodyStreamWriter(ctx *fasthttp.RequestCtx, sw func(w *StreamWriter)) {
	ctx.Response.SetBodyStream(streamBody(sw), -1)
}

// setUnframed makes h announce a body that only the close ends, as an
// HTTP/1.0 client's stream is sent: no length and no chunked coding (-2,
// which also says Connection: close; it leaves a Transfer-Encoding set
// before in place, hence the Del).
func setUnframed(h *fasthttp.ResponseHeader) {
	h.Del(fasthttp.HeaderTransferEncoding)
	h.SetContentLength(-2)
}

// StreamWriter gathers a streamed body's bytes between two Flushes, which
// then leave as one HTTP chunk. Its buffer comes from a pool at the first
// Write after a Flush and goes back at the Flush, so a stream waiting for
// its next event holds none; a stream relayed on an event loop borrows
// the loop's instead, as every Flush comes in the same turn of the loop
// as the Writes before it. Not safe for concurrent use.
type StreamWriter struct {
	chunks io.Writer // sends each Write as one chunk, at once
	buf    *[]byte   // nil between a Flush and the next Write
	loop   *[]byte   // the loop's buffer (cap streamBufferBytes), or nil
	n      int64     // bytes handed to chunks
	err    error     // the first failed write; every later one fails with it
}

// streamBufferBytes is the most a StreamWriter gathers before it sends a
// chunk without waiting for Flush; a Write of that much or more with
// nothing gathered goes out as a chunk of its own, uncopied.
//
// A chunk starts in a small buffer and moves to a full one only when it
// outgrows it. An engine's token event is a few hundred bytes, and when
// thousands of streams get theirs at once each holds its buffer until the
// front end wrote it (on gnet, until the event loop got to it), so full
// buffers alone would keep one per stream live after such bursts.
const (
	streamBufferBytes = 4096
	smallBufferBytes  = 512
)

var streamBufs, smallBufs = bufPool(streamBufferBytes), bufPool(smallBufferBytes)

func bufPool(size int) *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]byte, 0, size)
		return &b
	}}
}

// getBuf returns an empty pooled buffer that holds n bytes (n is at most
// streamBufferBytes).
func getBuf(n int) *[]byte {
	if n <= smallBufferBytes {
		return smallBufs.Get().(*[]byte)
	}
	return streamBufs.Get().(*[]byte)
}

func putBuf(b *[]byte) {
	*b = (*b)[:0]
	if cap(*b) == smallBufferBytes {
		smallBufs.Put(b)
	} else {
		streamBufs.Put(b)
	}
}

// Write adds p to the chunk being gathered. It fails once the client is
// gone, which is how a relay learns to cancel its upstream.
func (w *StreamWriter) Write(p []byte) (int, error) {
	if w.buf != nil && len(*w.buf)+len(p) > cap(*w.buf) {
		if n := len(*w.buf) + len(p); n <= streamBufferBytes {
			b := getBuf(n)
			*b = append(*b, *w.buf...)
			putBuf(w.buf)
			w.buf = b
		} else if err := w.Flush(); err != nil {
			return 0, err
		}
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.buf == nil {
		switch {
		case len(p) >= streamBufferBytes:
			return len(p), w.send(p, false)
		case w.loop != nil:
			w.buf = w.loop
		default:
			w.buf = getBuf(len(p))
		}
	}
	*w.buf = append(*w.buf, p...)
	return len(p), nil
}

// Flush sends what was written since the last Flush as one chunk and
// returns the buffer to the pool; with nothing written it sends nothing.
func (w *StreamWriter) Flush() error { return w.flush(false) }

// flush is Flush; last: the bytes are the stream's last, which a writer
// that can (lastWriter) sends with the stream's end.
func (w *StreamWriter) flush(last bool) error {
	if w.buf == nil {
		return w.err
	}
	b := w.buf
	w.buf = nil
	err := w.send(*b, last)
	if b == w.loop {
		*b = (*b)[:0]
	} else {
		putBuf(b)
	}
	return err
}

// A lastWriter sends a stream's last bytes and its end together (on
// HTTP/2, a DATA frame with END_STREAM), so that the end costs no write
// of its own.
type lastWriter interface {
	WriteLast(p []byte) (int, error)
}

func (w *StreamWriter) send(p []byte, last bool) error {
	if w.err != nil {
		return w.err
	}
	n, err := w.write(p, last)
	w.n += int64(n)
	w.err = err
	return err
}

func (w *StreamWriter) write(p []byte, last bool) (int, error) {
	if last {
		if lw, ok := w.chunks.(lastWriter); ok {
			return lw.WriteLast(p)
		}
	}
	return w.chunks.Write(p)
}

// streamBody is a response body a StreamWriter function makes. Both front
// ends write it with WriteTo, handing it a writer that frames each Write as
// one chunk and sends it (fasthttp: through BodyWriterTo, which skips its
// copy buffer; gnet: its chunk writer).
type streamBody func(w *StreamWriter)

var (
	errStreamRead  = errors.New("frontend: a stream writer's body is written with WriteTo, not read")
	errStreamPanic = errors.New("frontend: the stream writer panicked")
)

// WriteTo runs the stream writer. A writer that panics has its stream cut
// (the connection closes without the last chunk, so the client sees a
// broken stream, not a short one) and is logged with its stack, on either
// front end: one stream's bug must not end every other stream in the
// process, as it would on gnet, nor vanish into a debug line, as
// fasthttp's own recovery would leave it.
func (f streamBody) WriteTo(chunks io.Writer) (int64, error) {
	w := StreamWriter{chunks: chunks}
	err := f.run(&w)
	return w.n, err
}

func (f streamBody) run(w *StreamWriter) (err error) {
	defer cutOnPanic(&err)
	f(w)
	return w.flush(true)
}

// cutOnPanic, deferred by what runs a stream's code (a stream writer, a
// loop relay's Sink), turns its panic into errStreamPanic, which cuts that
// stream, and logs it with its stack.
func cutOnPanic(err *error) {
	if r := recover(); r != nil {
		slog.Error("frontend: a stream's code panicked; its connection is closed", "panic", r, "stack", string(debug.Stack()))
		*err = errStreamPanic
	}
}

// SupportsBodyWriteTo tells fasthttp to call WriteTo (fasthttp.BodyWriterTo).
func (streamBody) SupportsBodyWriteTo() bool { return true }

func (streamBody) Read([]byte) (int, error) { return 0, errStreamRead }

var _ fasthttp.BodyWriterTo = streamBody(nil)

package frontend

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"pdlb/lb/evloop"
)

// Streams on the event loop. An answer streamed on a goroutine crosses
// threads three times per event (the pod's bytes wake the goroutine, its
// write wakes the loop, the loop's callback wakes the goroutine); relayed
// on the loop, an event is read, handed to the Sink and written to the
// client in one turn of the loop, and a waiting stream holds no goroutine.

// Sink takes a streamed answer on the loop, for Loop.Relay. Neither method
// may touch the request's context, which is recycled once the answer's
// header is rendered (as with SetBodyStreamWriter), nor block, nor keep w
// past the call: what it wrote is flushed from the loop's own buffer
// before the loop turns to another connection.
type Sink interface {
	// Body gets the next bytes of the pod's body, decoded, and writes what
	// it relays to w; an error ends the stream (and closes the pod's
	// connection, which tells the pod to stop).
	Body(w *StreamWriter, p []byte) error
	// End ends the stream, once: err is nil after the body's last byte,
	// ErrClientGone when the client left, else why the stream broke (the
	// pod's connection closed early, fasthttp.ErrTimeout when no byte came
	// within the idle time, or Body's error). It may write a last event.
	End(w *StreamWriter, err error)
}

// ErrClientGone ends a relay whose client closed its connection or stopped
// reading.
var ErrClientGone = errors.New("frontend: the client went away")

// ErrAborted ends an exchange or a relay that GNet.AbortRelays ended.
var ErrAborted = errors.New("frontend: the relay was aborted")

// maxStreamBacklog is how far a client may fall behind a stream relayed on
// the loop (bytes waiting in the loop's outbound buffer) before it is cut: the
// loop reads the pod as its events come and cannot pause it.
const maxStreamBacklog = 256 << 10

// CanRelay reports whether a stream may be relayed on this loop: the
// connection goes on after it, chunked (a last answer, and an HTTP/1.0
// client's stream, which only the close ends, are written by a worker,
// which waits for the client before it closes; so is a HEAD's header).
func (l *Loop) CanRelay() bool {
	ctx := l.gc.cur
	return !l.gc.last(ctx) && ctx.Request.Header.IsHTTP11() && !ctx.IsHead()
}

// Relay streams the answer of the Send that just ended (Answered
// with nil, the answer's header in its response) to the client, chunked,
// with the header ctx's response holds now; the Send must have asked
// for a stream. idle bounds the wait for each next byte of the pod's.
func (l *Loop) Relay(idle time.Duration, sink Sink) {
	gc := l.gc
	uc := gc.relaying
	uc.sink, uc.idle = sink, idle
	uc.fed = gc.s.now.Load()
	gc.s.noteTimeout(idle)
	uc.w = StreamWriter{chunks: &gc.lchunks, loop: &gc.ls.gather}
	ctx := gc.cur
	gc.startChunked(ctx)
	gc.ls.giveCtx(ctx)
	gc.cur = nil
}

// loopChunks frames what a relay's StreamWriter flushes as one HTTP chunk
// and writes it on the loop (which keeps what the socket does not take).
type loopChunks struct{ gc *gconn }

func (w *loopChunks) Write(p []byte) (int, error) {
	gc := w.gc
	if gc.closed {
		return 0, ErrClientGone
	}
	size := strconv.AppendInt(gc.size[:0], int64(len(p)), 16)
	size = append(size, crlf...)
	gc.iov = append(gc.iov[:0], gc.head, size, p, crlf)
	gc.head = nil
	if err := gc.writev(gc.iov); err != nil {
		return 0, ErrClientGone
	}
	return len(p), nil
}

// The body decoder's states.
const (
	bodyFixed     = iota // remain bytes left (Content-Length)
	bodyChunkSize        // at a chunk's size line
	bodyChunk            // remain bytes of the chunk left
	bodyChunkEnd         // at the CRLF after a chunk
	bodyTrailer          // at a trailer line, or the empty line that ends
	bodyToClose          // until the pod closes (no length, not chunked)
)

// maxChunkLine bounds a chunk's size line (extensions included) and a
// trailer line.
const maxChunkLine = 4096

var errBadChunk = errors.New("frontend: malformed chunked body from the pod")

// startBody sets the decoder up for a body with Content-Length cl
// (fasthttp: -1 chunked, -2 until close).
func (uc *upConn) startBody(cl int) {
	switch {
	case cl >= 0:
		uc.state, uc.remain = bodyFixed, cl
	case cl == -1:
		uc.state = bodyChunkSize
	default:
		uc.state = bodyToClose
	}
}

// decode hands the body bytes at the head of buf to the sink and returns
// how many bytes of buf it used and whether the body ended.
func (uc *upConn) decode(buf []byte) (used int, end bool, err error) {
	i := 0
	for {
		switch uc.state {
		case bodyFixed, bodyChunk:
			if uc.remain == 0 {
				if uc.state == bodyFixed {
					return i, true, nil
				}
				uc.state = bodyChunkEnd
				continue
			}
			if i == len(buf) {
				return i, false, nil
			}
			k := min(uc.remain, len(buf)-i)
			uc.remain -= k
			if err := uc.body(buf[i : i+k]); err != nil {
				return i + k, false, err
			}
			i += k
		case bodyToClose:
			if i < len(buf) {
				err = uc.body(buf[i:])
			}
			return len(buf), false, err
		case bodyChunkEnd:
			if len(buf)-i < 2 {
				return i, false, nil
			}
			if buf[i] != '\r' || buf[i+1] != '\n' {
				return i, false, errBadChunk
			}
			i += 2
			uc.state = bodyChunkSize
		case bodyChunkSize, bodyTrailer:
			j := bytes.IndexByte(buf[i:], '\n')
			if j < 0 {
				if len(buf)-i > maxChunkLine {
					return i, false, errBadChunk
				}
				return i, false, nil
			}
			line := bytes.TrimSuffix(buf[i:i+j], crlf[:1])
			i += j + 1
			if uc.state == bodyTrailer {
				if len(line) == 0 {
					return i, true, nil
				}
				continue
			}
			if k := bytes.IndexByte(line, ';'); k >= 0 {
				line = line[:k]
			}
			n, perr := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 31)
			if perr != nil {
				return i, false, errBadChunk
			}
			uc.state, uc.remain = bodyChunk, int(n)
			if n == 0 {
				uc.state = bodyTrailer
			}
		}
	}
}

// body hands p to the sink; a sink that panics ends its stream, cut.
func (uc *upConn) body(p []byte) (err error) {
	defer cutOnPanic(&err)
	return uc.sink.Body(&uc.w, p)
}

// end hands the stream's end, err, to sink, and returns err, or
// errStreamPanic if the sink panicked.
func (uc *upConn) end(sink Sink, err error) (out error) {
	defer cutOnPanic(&out)
	sink.End(&uc.w, err)
	return err
}

// feed relays what the pod sent, on the loop.
func (uc *upConn) feed() evloop.Action {
	c := uc.c
	n := c.InboundBuffered()
	if n == 0 && (uc.state != bodyFixed || uc.remain > 0) {
		// Nothing to relay yet; a Content-Length: 0 body ends here
		// (handOff), with no byte to wait for.
		return evloop.None
	}
	uc.fed = uc.ls.s.now.Load()
	buf, _ := c.Peek(n)
	used, end, err := uc.decode(buf)
	if used > 0 {
		// Discard(0) drops all that is buffered: a size line or CRLF
		// split across reads would go with it.
		_, _ = c.Discard(used)
	}
	if err == nil {
		err = uc.w.Flush()
	}
	gc := uc.gc
	switch {
	case err != nil:
	case end:
		// Parked first: the client's next request, which endRelay may
		// start, can take the connection again.
		keep := c.InboundBuffered() == 0 && !uc.closeAfter && !uc.closing()
		if keep {
			uc.ls.park(uc)
		}
		uc.endRelay(nil)
		if keep {
			return evloop.None
		}
		return evloop.Close
	case gc.c.Backlog() > maxStreamBacklog:
		err = ErrClientGone
		_ = gc.c.Close()
	default:
		return evloop.None
	}
	uc.endRelay(err)
	return evloop.Close
}

// endRelay ends the relay: the sink's End, then the stream's last chunk
// unless it was cut, and the client's connection goes on.
func (uc *upConn) endRelay(err error) {
	gc, sink := uc.gc, uc.sink
	uc.gc, uc.sink = nil, nil
	err = uc.end(sink, err)
	werr := uc.w.Flush()
	switch {
	case gc.closed || errors.Is(err, ErrClientGone):
	case err == errStreamPanic || werr != nil:
		_ = gc.c.Close()
	default:
		gc.iov = append(gc.iov[:0], gc.head, lastChunk)
		gc.head = nil
		if err := gc.writev(gc.iov); err != nil {
			_ = gc.c.Close()
		}
	}
	gc.head = nil
	gc.relaying = nil
	gc.answered() // idle from here (see afterLoop)
	gc.held.Store(false)
	gc.ls.serving.Add(-1)
	gc.resume()
}

// relayClosed is OnClose of a connection whose answer is being relayed.
func (uc *upConn) relayClosed() {
	var err error
	switch {
	case uc.gc.closed:
		err = ErrClientGone
	case uc.aborted:
		err = ErrAborted
	case uc.timedOut:
		err = fasthttp.ErrTimeout
	case uc.state != bodyToClose:
		err = io.ErrUnexpectedEOF
	}
	uc.endRelay(err)
}

package frontend

import (
	"bytes"
	"io"
	"maps"
	"net/textproto"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/lb/limits"
	"pdlb/lb/upstream"
)

// serveStream runs the Handler for st and sends its response.
func (c *h2Conn) serveStream(st *h2Stream) {
	ctx := st.ctx
	if st.err != nil {
		c.s.h.Error(ctx, st.err)
	} else {
		ctx.Request.Header.SetContentLength(len(ctx.Request.Body()))
		c.s.h.Serve(ctx)
	}
	ended := c.writeResponse(st, &ctx.Response, ctx.IsHead()) == nil
	c.mu.Lock()
	if st.cut == nil {
		switch {
		case !ended:
			// The handler's stream broke off: the client must not
			// take what it got for the whole answer.
			c.resetLocked(st.id, http2.ErrCodeInternal)
		case !st.recvEnded:
			// Answered before the whole body came (413): the rest is
			// not wanted (RFC 9113 8.1).
			c.resetLocked(st.id, http2.ErrCodeNo)
		default:
			c.closeStreamLocked(st, errH2Closed)
		}
		_ = c.flushLocked()
	}
	c.dropBodyLocked(st)
	c.running.Add(-1)
	c.closeIfDoneLocked()
	c.mu.Unlock()
	st.release()
	c.handlers.Done()
}

// writeResponse sends resp on st. A streamed body goes out a chunk at a
// time, each flushed as DATA frames at once; a write waits while the
// stream's flow-control window is closed, which holds up the relay feeding
// it, so a slow reader stops the reads from its pod instead of buffering
// them.
func (c *h2Conn) writeResponse(st *h2Stream, resp *fasthttp.Response, head bool) error {
	stream := resp.IsBodyStream()
	var body []byte
	if !stream {
		body = resp.Body()
	}
	end := head || (!stream && len(body) == 0)
	err := c.writeHeaders(st, resp, stream, end)
	switch {
	case stream:
		bs := resp.BodyStream()
		// A StreamWriter's writer runs even when the header could not go
		// out (the client reset the stream meanwhile), its writes failing:
		// what it holds, as the gateway's relay holds its request's
		// charges, only its end gives back.
		if _, sw := bs.(streamBody); (err == nil || sw) && !head {
			w := &h2Body{c: c, st: st}
			var werr error
			if wt, ok := bs.(io.WriterTo); ok {
				_, werr = wt.WriteTo(w)
			} else {
				_, werr = io.Copy(w, bs)
			}
			if err == nil {
				err = werr
			}
			if err == nil && !w.ended {
				err = c.writeData(st, nil, true)
			}
		}
		if cl, ok := bs.(io.Closer); ok {
			_ = cl.Close()
		}
	case err == nil && !end:
		err = c.writeData(st, body, true)
	}
	return err
}

// h2Body sends each Write on its stream at once; ended: WriteLast ended
// the stream.
type h2Body struct {
	c     *h2Conn
	st    *h2Stream
	ended bool
}

func (b *h2Body) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := b.c.writeData(b.st, p, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteLast sends p in the stream's last DATA frames (lastWriter).
func (b *h2Body) WriteLast(p []byte) (int, error) {
	b.ended = true
	if err := b.c.writeData(b.st, p, true); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeHeaders adds resp's status and header to out as HEADERS (and
// CONTINUATION) frames; with end they end the stream and are flushed.
func (c *h2Conn) writeHeaders(st *h2Stream, resp *fasthttp.Response, stream, end bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.writableLocked(st); err != nil {
		return err
	}
	c.hbuf.Reset()
	field := func(k, v string) { _ = c.enc.WriteField(hpack.HeaderField{Name: k, Value: v}) }
	var num [20]byte
	field(":status", c.valueLocked(0, strconv.AppendInt(num[:0], int64(resp.StatusCode()), 10)))
	// fasthttp writes the Date of an HTTP/1.1 answer itself and keeps
	// none in the header (RFC 9110 6.6.1: a server with a clock sends it).
	var date [32]byte
	field("date", c.valueLocked(1, fasthttp.AppendHTTPDate(date[:0], time.Now())))
	i := 2
	add := func(k, v []byte) {
		if hopByHop(k) || bytes.EqualFold(k, []byte("Content-Length")) {
			return
		}
		f := hpack.HeaderField{Name: lowerName(k)}
		if f.Name == "x-request-id" {
			// A value no later answer repeats is sent not indexed:
			// indexed, each would evict another field from the table
			// this connection and its client keep in step, a cost per
			// answer on both sides. The encoder keeps nothing of a field
			// it does not index, so its bytes serve as they are.
			f.Value, f.Sensitive = unsafe.String(unsafe.SliceData(v), len(v)), true
		} else {
			f.Value = c.valueLocked(i, v)
		}
		_ = c.enc.WriteField(f)
		i++
	}
	for k, v := range resp.Header.All() {
		add(k, v)
	}
	upstream.EachField(st.pass, func(k, v, _ []byte) { add(k, v) })
	st.pass = st.pass[:0]
	if !stream {
		field("content-length", c.valueLocked(i, strconv.AppendInt(num[:0], int64(len(resp.Body())), 10)))
	}
	block := c.hbuf.Bytes()
	n := min(len(block), c.maxFrameOut)
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: block[:n], EndStream: end, EndHeaders: n == len(block)})
	c.sentEndLocked(st, end)
	for block = block[n:]; len(block) > 0; block = block[n:] {
		n = min(len(block), c.maxFrameOut)
		_ = c.fr.WriteContinuation(st.id, n == len(block), block[:n])
	}
	if resp.ConnectionClose() {
		// HTTP/2 has no Connection field: an answer that would close an
		// HTTP/1.1 connection (a draining gateway's) makes this one go
		// away, as Go's own server does; its open streams go on.
		c.goAwayLocked(http2.ErrCodeNo)
	}
	if end {
		return c.flushLocked()
	}
	return nil
}

// valueLocked is v as a string: the one this connection sent last in
// place i of a response's fields when it has the same bytes, else a copy,
// kept for the next response; mu is held.
func (c *h2Conn) valueLocked(i int, v []byte) string {
	if i < len(c.sent) && c.sent[i] == string(v) {
		return c.sent[i]
	}
	s := string(v)
	switch {
	case i < len(c.sent):
		c.sent[i] = s
	case i == len(c.sent) && i < h2SentFields:
		c.sent = append(c.sent, s)
	}
	return s
}

// h2SentFields bounds the fields whose values a connection keeps.
const h2SentFields = 16

// writableLocked is why nothing more may be written on st, nil when it
// may; mu is held.
func (c *h2Conn) writableLocked(st *h2Stream) error {
	if c.werr != nil {
		return c.werr
	}
	return st.cut
}

// writeData sends p on st as DATA frames, ending the stream with end, and
// flushes them. It waits while the stream's or the connection's window is
// closed, and while out holds h2MaxPending bytes for a socket being
// written; a wait that makes no progress for IdleTimeout resets the
// stream, so a client that stops reading pins neither it nor its pod.
func (c *h2Conn) writeData(st *h2Stream, p []byte, end bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var stalled *time.Timer // wakes the wait at the stall's deadline
	var since time.Time     // when the wait without progress began; zero: none
	defer func() {
		if stalled != nil {
			stalled.Stop()
		}
	}()
	for {
		if err := c.writableLocked(st); err != nil {
			return err
		}
		// A window may be negative (the client shrank its initial
		// window): nothing may be sent then but an empty, ending frame.
		n := max(min(int64(min(len(p), c.maxFrameOut)), st.sendWindow, c.sendWindow), 0)
		if (n <= 0 && len(p) > 0) || (c.writing && len(c.out) >= h2MaxPending) {
			if !c.writing && len(c.out) > 0 {
				// The client gets what is gathered before it is waited
				// on to open its windows. The flush releases mu, and a
				// window that opened meanwhile wakes nobody: look again.
				if err := c.flushLocked(); err != nil {
					return err
				}
				continue
			}
			if limit := c.s.o.IdleTimeout; limit > 0 {
				switch {
				case since.IsZero():
					since = time.Now()
					if stalled == nil {
						stalled = time.AfterFunc(limit, c.wake)
					} else {
						stalled.Reset(limit)
					}
				case time.Since(since) >= limit:
					c.resetLocked(st.id, http2.ErrCodeCancel)
					_ = c.flushLocked()
					return errH2Stalled
				}
			}
			c.cond.Wait()
			continue
		}
		since = time.Time{}
		last := end && int(n) == len(p)
		_ = c.fr.WriteData(st.id, last, p[:n])
		c.sentEndLocked(st, last)
		st.sendWindow -= n
		c.sendWindow -= n
		p = p[n:]
		if len(p) == 0 {
			return c.flushLocked()
		}
	}
}

// flushLocked writes out to the socket unless another goroutine is at it,
// which then writes what was added meanwhile too; mu is held, and released
// while writing. On a connection with other streams in flight it first
// yields the processor once.
func (c *h2Conn) flushLocked() error {
	for !c.writing && len(c.out) > 0 && c.werr == nil {
		if c.running.Load() > 1 {
			// Other streams' handlers may be about to write: letting
			// them run first puts their frames in this write.
			c.writing = true
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		if limit := c.s.o.IdleTimeout; limit > 0 && !c.finalWrite {
			// A client that stops reading its socket holds up every
			// stream of the connection: it is closed. The deadline
			// moves only once it is less than limit ahead, to limit
			// plus slack: moving it is a timer change in the poller,
			// and a stream flushes at every token.
			if now := time.Now(); now.Add(limit).After(c.writeBy) {
				c.writeBy = now.Add(limit + limit/64)
				_ = c.nc.SetWriteDeadline(c.writeBy)
			}
		}
		out := c.out
		c.out, c.spare = c.spare[:0], nil
		c.writing = true
		c.mu.Unlock()
		_, err := c.nc.Write(out)
		c.mu.Lock()
		c.writing = false
		c.spare = out[:0]
		if err != nil {
			c.werr = err
			_ = c.nc.Close()
		}
		c.cond.Broadcast()
	}
	c.closeIfDoneLocked()
	return c.werr
}

// sentEndLocked records whether the answer's last frame is queued; then
// the request's body is no longer counted in the connection's budget, so
// a client that sends its next upload as soon as it read the answer is
// not refused for it. mu is held.
func (c *h2Conn) sentEndLocked(st *h2Stream, end bool) {
	if st.sentEnd = end; end {
		c.dropBodyLocked(st)
	}
}

// wake wakes the goroutines waiting on cond, to look at the time.
func (c *h2Conn) wake() {
	c.mu.Lock()
	c.cond.Broadcast()
	c.mu.Unlock()
}

// lowerName is a header name as HTTP/2 writes it, in lower case.
func lowerName(k []byte) string {
	if n, ok := h2Names[string(k)]; ok {
		return n
	}
	return strings.ToLower(string(k))
}

// h2Names are the names the gateway's responses carry, lowered once: by
// fasthttp's spelling of them (that of textproto's canonical keys), which
// the answer's header holds, and by their lower case, which engines send
// and the lines PassHead gives keep.
var h2Names = func() map[string]string {
	m := map[string]string{"Content-Type": "content-type", "Server": "server", "Date": "date",
		"Cache-Control": "cache-control", "X-Request-Id": "x-request-id", "Retry-After": "retry-after",
		"X-Pdlb-Model": "x-pdlb-model", "X-Pdlb-Pod": "x-pdlb-pod", "Vary": "vary",
		"Access-Control-Allow-Origin": "access-control-allow-origin", "Access-Control-Allow-Credentials": "access-control-allow-credentials",
		"Access-Control-Expose-Headers": "access-control-expose-headers", "Access-Control-Allow-Methods": "access-control-allow-methods",
		"Access-Control-Allow-Headers": "access-control-allow-headers", "Access-Control-Max-Age": "access-control-max-age"}
	for _, name := range append(limits.RateLimitHeaders[:], limits.RetryAfterMillis, limits.ShouldRetry) {
		m[textproto.CanonicalMIMEHeaderKey(name)] = name
	}
	for _, lower := range maps.Clone(m) {
		m[lower] = lower
	}
	return m
}()

// hopByHop reports the HTTP/1.1 connection headers HTTP/2 forbids.
func hopByHop(k []byte) bool {
	for _, h := range [...]string{"Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Proxy-Connection"} {
		if bytes.EqualFold(k, []byte(h)) {
			return true
		}
	}
	return false
}

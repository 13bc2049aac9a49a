package frontend

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/lb/upstream"
)

// HTTP2 bounds what an HTTP/2 client may cost (this package's server
// speaks the protocol with golang.org/x/net/http2's framer and HPACK).
type HTTP2 struct {
	// Disabled turns HTTP/2 off: no h2 in ALPN, no h2c.
	Disabled bool
	// MaxConcurrentStreams caps a connection's open streams (default 250).
	MaxConcurrentStreams uint32
	// MaxFrameBytes is the largest frame a client may send (default
	// 16384).
	MaxFrameBytes uint32
	// MaxResetsPerSecond is the rate of stream cancellations a client may
	// keep up, its own and those its frames make the server's (default
	// 100); see h2Conn.charge.
	MaxResetsPerSecond int
	// MaxBodyBytesPerConnection bounds the request bodies a connection
	// holds (default h2BodyBudget of MaxBodyBytes); see onData.
	MaxBodyBytesPerConnection int64
}

// Defaults of HTTP2.
const (
	DefaultMaxConcurrentStreams = 250
	DefaultMaxFrameBytes        = 16 << 10
	DefaultMaxResetsPerSecond   = 100
)

// Receive windows the server grants, in bytes: per stream (its
// SETTINGS_INITIAL_WINDOW_SIZE) and per connection. Request bodies are
// read whole before the handler runs, each capped by MaxBodyBytes and a
// connection's together by h2BodyBudget, so the windows bound nothing in
// memory and are replenished as DATA comes.
const (
	h2StreamWindow = 1 << 20
	h2ConnWindow   = 1 << 24
	// h2InitialWindow is the window every side starts with (RFC 9113
	// 6.9.2).
	h2InitialWindow = 65535
	// h2MaxWindow is the largest flow-control window (RFC 9113 6.9.1).
	h2MaxWindow = 1<<31 - 1
	// h2BodyBudget is how many largest bodies (MaxBodyBytes) the request
	// bodies a connection holds may add up to by default: without a bound,
	// one client could have max_concurrent_streams of them held at once.
	h2BodyBudget = 4
)

// h2MaxPending is how many bytes of frames may wait for the socket before
// a stream's writer waits for them to be written; h2MaxControl is how
// many the client's own frames (PING, SETTINGS acknowledgements) may pile
// up before the connection is closed as a flood.
const (
	h2MaxPending = 256 << 10
	h2MaxControl = 4 << 20
)

// h2Server serves HTTP/2 connections, each on the goroutine that hands it
// over, which reads its frames (h2Conn.run). Every stream runs the front
// end's Handler on a fasthttp.RequestCtx of its own goroutine, so HTTP/1.1
// and HTTP/2 requests take one path through the gateway, with the same
// metrics; the streams' frames are written by whichever goroutine finds
// the socket idle (h2Conn.flushLocked), many to a write.
type h2Server struct {
	h            Handler
	o            Options
	maxStreams   uint32
	maxFrame     uint32
	bodyBudget   int64 // bytes of request bodies a connection may hold; see onData
	resetRate    float64
	headerLimit  uint32
	shuttingDown atomic.Bool

	// workers serve the streams; shutdown stops them.
	workers *workers

	mu    sync.Mutex
	conns map[*h2Conn]struct{}
	open  atomic.Int64
}

func newH2Server(h Handler, o Options) *h2Server {
	c := o.HTTP2
	return &h2Server{h: h, o: o, conns: map[*h2Conn]struct{}{}, workers: newWorkers(),
		maxStreams:  cmpOr(c.MaxConcurrentStreams, DefaultMaxConcurrentStreams),
		maxFrame:    cmpOr(c.MaxFrameBytes, DefaultMaxFrameBytes),
		resetRate:   float64(cmpOr(max(c.MaxResetsPerSecond, 0), DefaultMaxResetsPerSecond)),
		headerLimit: uint32(cmpOr(o.MaxHeaderBytes, DefaultMaxHeaderBytes)),
		bodyBudget:  cmpOr(c.MaxBodyBytesPerConnection, h2BodyBudget*int64(o.MaxBodyBytes)),
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// serve runs one HTTP/2 connection until it and its streams ended.
func (s *h2Server) serve(nc net.Conn) {
	c := newH2Conn(s, nc)
	s.open.Add(1)
	defer c.finish()
	c.run()
}

// finish counts c out of the open connections once run returned; a close
// that lingers (lingerConn) goes on without it.
func (c *h2Conn) finish() {
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	c.s.open.Add(-1)
}

// track makes c one that shutdown sends GOAWAY, once c sent its SETTINGS
// (which must come first); one that starts during a shutdown gets it now.
func (s *h2Server) track(c *h2Conn) {
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	if s.shuttingDown.Load() {
		c.goAway(http2.ErrCodeNo)
	}
}

// shutdown sends every connection GOAWAY and waits until they closed or
// ctx ended. As the front ends' own, the first call that runs out of time
// leaves what is still served running, so that the caller can end its
// streams cleanly (with an error event) and call again; a later call
// closes what is left when its ctx ends.
func (s *h2Server) shutdown(ctx context.Context) error {
	first := !s.shuttingDown.Swap(true)
	s.workers.stop()
	s.each((*h2Conn).goAway, http2.ErrCodeNo)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.open.Load() > 0 {
		select {
		case <-ctx.Done():
			if !first {
				s.each(func(c *h2Conn, _ http2.ErrCode) { _ = c.nc.Close() }, 0)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func (s *h2Server) each(f func(*h2Conn, http2.ErrCode), code http2.ErrCode) {
	s.mu.Lock()
	conns := slices.Collect(maps.Keys(s.conns))
	s.mu.Unlock()
	for _, c := range conns {
		f(c, code)
	}
}

// h2Conn is one HTTP/2 connection. Its goroutine (run) reads frames and
// changes stream state; writes come from it and from the streams'
// handlers, all under mu, into out, which flushLocked writes to the
// socket.
type h2Conn struct {
	s  *h2Server
	nc net.Conn
	br *bufio.Reader
	fr *http2.Framer // read by run alone; written under mu

	mu   sync.Mutex
	cond sync.Cond // on mu: a window opened, out was written, or the connection or a stream ended
	out  []byte    // frames not yet written
	// spare is out's other buffer, written by the flusher meanwhile.
	spare   []byte
	writing bool  // a goroutine is writing to nc, mu released
	werr    error // the socket failed or was closed: every write fails
	// writeBy is nc's write deadline as flushLocked last set it;
	// finalWrite: end set the last one, which no flush moves.
	writeBy    time.Time
	finalWrite bool
	enc        *hpack.Encoder
	hbuf       bytes.Buffer // enc's output, one header block at a time
	// sent are the values of the last response's header fields, by
	// place: HPACK's table keeps a field's strings, so each must be its
	// own, and most repeat from one response to the next (valueLocked).
	sent    []string
	streams map[uint32]*h2Stream
	// Send side: the connection's window and the client's settings.
	sendWindow    int64
	initialWindow int64
	bodies        int64 // bytes of request bodies the streams hold (held)
	maxFrameOut   int
	goingAway     bool   // GOAWAY sent: no new streams
	lastID        uint32 // the highest stream the client opened
	awayID        uint32 // the last stream GOAWAY said is served
	// resets are the last streams the server reset, in a ring at
	// resetAt: what the client sent on them before it saw the reset is
	// dropped (RFC 9113 5.1, closed).
	resets  [32]uint32
	resetAt int
	idle    *time.Timer
	grace   *time.Timer // ends the connection h2GoAwayGrace after its last stream
	// reading times out the requests whose body is still coming
	// (onReadTimeout); readArmed: it is set to fire.
	reading   *time.Timer
	readArmed bool

	// Owned by run.
	block       *h2Block // the last header block read
	recvWindow  int64    // the connection's receive window left
	recvUnacked int64    // received bytes not yet given back in a WINDOW_UPDATE
	handlers    sync.WaitGroup
	running     atomic.Int32
	tokens      float64 // rapid-reset bucket; see charge
	last        time.Time
	strikes     int
	refused     int // streams reset for a frame of the client's, not yet charged
}

func newH2Conn(s *h2Server, nc net.Conn) *h2Conn {
	c := &h2Conn{s: s, nc: nc, br: bufio.NewReaderSize(nc, 16<<10), streams: map[uint32]*h2Stream{},
		sendWindow: h2InitialWindow, initialWindow: h2InitialWindow, maxFrameOut: http2DefaultFrame,
		recvWindow: h2ConnWindow, tokens: 10 * s.resetRate, last: time.Now()}
	c.cond.L = &c.mu
	c.fr = http2.NewFramer((*h2Out)(c), c.br)
	c.fr.SetMaxReadFrameSize(s.maxFrame)
	c.block = newH2Block(s.headerLimit)
	c.fr.SetReuseFrames()
	c.enc = hpack.NewEncoder(&c.hbuf)
	return c
}

// http2DefaultFrame is the frame size both sides may send before the
// other's SETTINGS say more.
const http2DefaultFrame = 16 << 10

// h2Out is the framer's writer: frames go to out, under mu.
type h2Out h2Conn

func (o *h2Out) Write(p []byte) (int, error) {
	o.out = append(o.out, p...)
	return len(p), nil
}

// errH2Closed fails a stream's write after its connection ended or its
// answer was sent; errStreamReset one after the stream was reset;
// errH2Stalled one the client opened no window for in IdleTimeout;
// errRapidReset ends a connection that cancels streams too fast.
var (
	errH2Closed    = errors.New("frontend: the HTTP/2 connection is closed")
	errStreamReset = errors.New("frontend: the client reset the HTTP/2 stream")
	errH2Stalled   = errors.New("frontend: the HTTP/2 client read nothing of the stream for IdleTimeout")
	errRapidReset  = errors.New("frontend: HTTP/2 client cancels streams too fast (rapid reset)")
)

// run reads and handles frames until the connection fails or ends, then
// waits for the streams' handlers.
func (c *h2Conn) run() {
	err := c.start()
	for err == nil {
		var f http2.Frame
		// The next frame's type, should the framer refuse it; a peek at
		// what ReadFrame reads next, which waits no longer than it would.
		typ, whole := http2.FrameType(0xff), false
		if h, perr := c.br.Peek(9); perr == nil {
			typ = http2.FrameType(h[3])
			whole = c.br.Buffered() >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
		}
		if f, err = c.fr.ReadFrame(); err == nil {
			err = c.handle(f)
		}
		if se, ok := err.(http2.StreamError); ok {
			err = c.onStreamError(se, typ)
		} else if f == nil && whole && errors.Is(err, io.ErrUnexpectedEOF) {
			// A frame too short for its fields (a padded one of length
			// 0), which the framer reports as a short read (RFC 9113 4.2).
			err = http2.ConnectionError(http2.ErrCodeFrameSize)
		}
		if err == nil && c.refused > 0 {
			err = c.charge(float64(c.refused))
			c.refused = 0
		}
		if err == nil && c.br.Buffered() == 0 {
			// About to wait for the client: what its frames made goes
			// out now, in one write with whatever the streams added.
			c.mu.Lock()
			err = c.flushLocked()
			c.mu.Unlock()
		}
	}
	c.end(err)
	c.handlers.Wait()
	_ = c.nc.Close()
}

// onStreamError resets the stream of a frame of type typ the framer
// refused. A HEADERS frame opened its stream, closed now: frames the
// client sent on it meanwhile are dropped, not taken for an idle stream's.
// Any other frame on an idle stream is a connection error (RFC 9113 5.1),
// which no RST_STREAM may answer (6.4).
func (c *h2Conn) onStreamError(se http2.StreamError, typ http2.FrameType) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if se.StreamID > c.lastID {
		if typ != http2.FrameHeaders || se.StreamID%2 == 0 {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		c.lastID = se.StreamID
	}
	c.refuseLocked(se.StreamID, se.Code)
	return nil
}

// start reads the client's preface and sends the server's SETTINGS.
func (c *h2Conn) start() error {
	_ = c.nc.SetReadDeadline(time.Now().Add(c.s.o.ReadTimeout))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != http2.ClientPreface {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	_ = c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.s.maxStreams},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: c.s.maxFrame},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: c.s.headerLimit},
	)
	_ = c.fr.WriteWindowUpdate(0, h2ConnWindow-h2InitialWindow)
	c.idleLocked()
	err := c.flushLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	c.s.track(c)
	return c.handle(f)
}

// handle acts on one frame from the client; an error ends the connection.
func (c *h2Conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if err := c.block.read(c.fr, f); err != nil {
			return err
		}
		return c.onHeaders(c.block)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.onReset(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		return c.control(func() error { return c.fr.WritePing(true, f.Data) })
	case *http2.GoAwayFrame:
		c.goAway(http2.ErrCodeNo)
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	case *http2.PriorityFrame:
		// Priorities are not acted on, but a stream cannot depend on
		// itself (RFC 9113 5.3.1).
		if f.StreamDep == f.StreamID {
			c.mu.Lock()
			c.refuseLocked(f.StreamID, http2.ErrCodeProtocol)
			c.mu.Unlock()
		}
	}
	// Unknown frames are ignored.
	return nil
}

// control writes a frame answering the client's own, closing the
// connection when the client sends them faster than it reads the answers.
func (c *h2Conn) control(write func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.controlLocked(write)
}

// controlLocked is control with mu held.
func (c *h2Conn) controlLocked(write func() error) error {
	if len(c.out) > h2MaxControl {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	return write()
}

func (c *h2Conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		// The framer checks only a frame's first INITIAL_WINDOW_SIZE;
		// a MAX_FRAME_SIZE of 0 would loop writeHeaders for good.
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			// Open streams' windows move by the difference (RFC 9113
			// 6.9.2).
			d := int64(s.Val) - c.initialWindow
			c.initialWindow = int64(s.Val)
			for _, st := range c.streams {
				if st.sendWindow += d; st.sendWindow > h2MaxWindow {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
			c.cond.Broadcast()
		case http2.SettingMaxFrameSize:
			c.maxFrameOut = int(min(s.Val, http2DefaultFrame))
		case http2.SettingHeaderTableSize:
			c.enc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.controlLocked(c.fr.WriteSettingsAck)
}

func (c *h2Conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		if c.sendWindow += int64(f.Increment); c.sendWindow > h2MaxWindow {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
	} else if st := c.streams[f.StreamID]; st != nil {
		if st.sendWindow += int64(f.Increment); st.sendWindow > h2MaxWindow {
			c.refuseLocked(f.StreamID, http2.ErrCodeFlowControl)
		}
	} else if f.StreamID > c.lastID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream (RFC 9113 5.1)
	}
	c.cond.Broadcast()
	return nil
}

// onReset cancels a stream at the client's request.
func (c *h2Conn) onReset(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	if st := c.streams[f.StreamID]; st != nil {
		c.closeStreamLocked(st, errStreamReset)
	} else if f.StreamID > c.lastID {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	c.mu.Unlock()
	return c.charge(1)
}

// charge takes n streams' cancellations from a token bucket that allows
// MaxResetsPerSecond of them with bursts of ten seconds' worth: the
// rapid-reset attack (CVE-2023-44487) opens and cancels streams in a loop,
// each costing the server a stream while the client pays two small
// frames, and its variant (CVE-2025-8671) has the server reset them, for
// a frame it must refuse. Past the bucket the connection's reads pause
// (the offender is throttled; nobody else is), and one still over after
// resetStrikes pauses is closed. On run's goroutine.
func (c *h2Conn) charge(n float64) error {
	now := time.Now()
	c.tokens = min(c.tokens+now.Sub(c.last).Seconds()*c.s.resetRate, 10*c.s.resetRate) - n
	c.last = now
	if c.tokens < 0 {
		if c.strikes++; c.strikes > resetStrikes {
			return errRapidReset
		}
		time.Sleep(min(time.Duration(-c.tokens/c.s.resetRate*float64(time.Second)), time.Second))
	} else {
		// Only pauses in a row count: a client over the bucket once an
		// hour is within the rate, not an attacker.
		c.strikes = 0
	}
	return nil
}

const resetStrikes = 3

// onHeaders opens a stream, or ends one with trailers.
func (c *h2Conn) onHeaders(f *h2Block) error {
	id := f.StreamID
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.open(id); st != nil {
		// Trailers: they end the request; their fields are dropped. No
		// pseudo-header may be among them (RFC 9113 8.1), and nothing may
		// follow the end of the client's side (5.1: half-closed).
		switch {
		case st.recvEnded:
			c.refuseLocked(id, http2.ErrCodeStreamClosed)
			return nil
		case !f.StreamEnded() || len(f.PseudoFields()) > 0 || f.selfDependent() || !st.bodyWhole(true):
			c.refuseLocked(id, http2.ErrCodeProtocol)
			return nil
		}
		st.recvEnded = true
		c.dispatch(st)
		return nil
	}
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if id <= c.lastID {
		if c.droppedLocked(id) {
			return nil
		}
		// A closed stream, or one the client skipped, which a higher
		// one closed (RFC 9113 5.1.1).
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.lastID = id
	switch {
	case c.goingAway:
		return nil
	case len(c.streams) >= int(c.s.maxStreams) && c.openCountLocked() >= int(c.s.maxStreams):
		c.refuseLocked(id, http2.ErrCodeRefusedStream)
		return nil
	case c.running.Load() >= 4*int32(c.s.maxStreams):
		// Streams the client cancelled whose handlers still run.
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	method, path := f.PseudoValue("method"), f.PseudoValue("path")
	if method == "" || f.PseudoValue("scheme") == "" || !(strings.HasPrefix(path, "/") || path == "*") || !h2Fields(f.RegularFields()) || f.selfDependent() {
		// Malformed (RFC 9113 8.1.1): the stream is refused, the
		// connection goes on.
		c.refuseLocked(id, http2.ErrCodeProtocol)
		return nil
	}
	declared, ok := h2ContentLength(f.RegularFields())
	if !ok || f.StreamEnded() && declared > 0 {
		c.refuseLocked(id, http2.ErrCodeProtocol)
		return nil
	}
	st := h2Streams.Get().(*h2Stream)
	*st = h2Stream{parent: c.nc, c: c, id: id, declared: declared,
		sendWindow: c.initialWindow, recvWindow: h2StreamWindow, ctx: st.ctx}
	st.ctx.Init2(st, ctxLogger, false)
	req := &st.ctx.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(path)
	host := f.PseudoValue("authority")
	for _, hf := range f.RegularFields() {
		if hf.Name == "host" && host == "" {
			host = hf.Value
		}
		req.Header.Add(hf.Name, hf.Value)
	}
	req.Header.SetHost(host)
	if f.Truncated {
		st.err = errHeaderList
	} else if req.Header.ContentLength() > c.s.o.MaxBodyBytes {
		st.err = fasthttp.ErrBodyTooLarge
	}
	c.streams[id] = st
	if c.idle != nil {
		c.idle.Stop()
	}
	st.recvEnded = f.StreamEnded()
	if st.recvEnded || st.err != nil {
		c.dispatch(st)
	} else {
		c.awaitBodyLocked(st)
	}
	return nil
}

// awaitBodyLocked gives st's request ReadTimeout to come whole, as on
// HTTP/1.1: a client that stops midway, or died, must not hold the stream
// and its connection for good. One timer a connection serves all its
// streams; mu is held.
func (c *h2Conn) awaitBodyLocked(st *h2Stream) {
	limit := c.s.o.ReadTimeout
	if limit <= 0 {
		return
	}
	st.readBy = time.Now().Add(limit)
	if c.readArmed {
		return
	}
	c.readArmed = true
	if c.reading == nil {
		c.reading = time.AfterFunc(limit, c.onReadTimeout)
	} else {
		c.reading.Reset(limit)
	}
}

// onReadTimeout answers each request whose body is overdue with the Error
// handler's timeout, and sets the timer for the next one due.
func (c *h2Conn) onReadTimeout() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var next time.Time
	for _, st := range c.streams {
		switch {
		case st.started:
		case !now.Before(st.readBy):
			st.err = os.ErrDeadlineExceeded
			c.dispatch(st)
		case next.IsZero() || st.readBy.Before(next):
			next = st.readBy
		}
	}
	// After end the map is empty: nothing is dispatched past run's
	// handlers.Wait.
	if c.readArmed = !next.IsZero(); c.readArmed {
		c.reading.Reset(next.Sub(now))
	}
}

// h2Fields reports whether a request's fields are free of the
// connection-specific ones HTTP/2 forbids (RFC 9113 8.2.2).
func h2Fields(fields []hpack.HeaderField) bool {
	for _, f := range fields {
		switch f.Name {
		case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
			return false
		case "te":
			if f.Value != "trailers" {
				return false
			}
		}
	}
	return true
}

// errHeaderList is a request whose header list is over MaxHeaderBytes:
// the Error handler answers it as an HTTP/1.1 head over the limit
// (HeadTooLarge).
var errHeaderList = errors.New("frontend: the HTTP/2 header list is over the limit")

// onData adds a DATA frame to its stream's body and gives the window back.
func (c *h2Conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length)
	if c.recvWindow -= n; c.recvWindow < 0 {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recvUnacked += n; c.recvUnacked >= h2ConnWindow/2 {
		_ = c.fr.WriteWindowUpdate(0, uint32(c.recvUnacked))
		c.recvWindow += c.recvUnacked
		c.recvUnacked = 0
	}
	st := c.open(f.StreamID)
	switch {
	case st == nil && f.StreamID > c.lastID:
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	case st == nil && c.droppedLocked(f.StreamID):
		return nil
	case st == nil:
		// A closed stream (RFC 9113 6.1): the reset costs no handler,
		// so it is not charged, but a client that sends such frames
		// faster than it reads the resets is a flood.
		return c.controlLocked(func() error { return c.fr.WriteRSTStream(f.StreamID, http2.ErrCodeStreamClosed) })
	case st.recvEnded:
		c.refuseLocked(f.StreamID, http2.ErrCodeStreamClosed)
		return nil
	}
	if st.recvWindow -= n; st.recvWindow < 0 {
		c.refuseLocked(f.StreamID, http2.ErrCodeFlowControl)
		return nil
	}
	if st.err == nil {
		data := f.Data()
		switch {
		case len(st.ctx.Request.Body())+len(data) > c.s.o.MaxBodyBytes:
			st.err = fasthttp.ErrBodyTooLarge
			c.dispatch(st)
		case c.bodies+int64(len(data)) > c.s.bodyBudget:
			// The connection holds its budget of bodies: the stream is
			// refused before anything of it was processed, which its
			// client may send again (RFC 9113 8.7). Not the client's
			// fault, so not charged as a reset.
			c.resetLocked(f.StreamID, http2.ErrCodeRefusedStream)
			return nil
		default:
			st.ctx.Request.AppendBody(data)
			st.held += int64(len(data))
			c.bodies += int64(len(data))
		}
	}
	if !st.bodyWhole(f.StreamEnded()) {
		// Malformed: its DATA disagrees with its content-length (RFC
		// 9113 8.1.1).
		c.refuseLocked(f.StreamID, http2.ErrCodeProtocol)
		return nil
	}
	st.recvEnded = f.StreamEnded()
	if st.recvEnded {
		if st.err == nil {
			c.dispatch(st)
		}
	} else if st.recvUnacked += n; st.recvUnacked >= h2StreamWindow/2 {
		_ = c.fr.WriteWindowUpdate(st.id, uint32(st.recvUnacked))
		st.recvWindow += st.recvUnacked
		st.recvUnacked = 0
	}
	return nil
}

// open is stream id unless it is closed: not in streams, or ended by
// both sides. mu is held.
func (c *h2Conn) open(id uint32) *h2Stream {
	if st := c.streams[id]; st != nil && !st.ended() {
		return st
	}
	return nil
}

// ended reports whether both sides ended st, which is closed then though
// its handler may not have let go of it yet; c.mu is held.
func (st *h2Stream) ended() bool { return st.recvEnded && st.sentEnd }

// openCountLocked is how many of streams are open (see open): what
// MaxConcurrentStreams bounds (RFC 9113 5.1.2). mu is held.
func (c *h2Conn) openCountLocked() int {
	n := 0
	for _, st := range c.streams {
		if !st.ended() {
			n++
		}
	}
	return n
}

// droppedLocked reports whether the frames of closed stream id are
// dropped: the server reset it (lately), or it came after the GOAWAY's
// last stream (RFC 9113 6.8). mu is held.
func (c *h2Conn) droppedLocked(id uint32) bool {
	return c.goingAway && id > c.awayID || slices.Contains(c.resets[:], id)
}

// dispatch starts st's handler; mu is held.
func (c *h2Conn) dispatch(st *h2Stream) {
	if st.started {
		return
	}
	st.started = true
	c.handlers.Add(1)
	c.running.Add(1)
	c.s.workers.run(st)
}

// bodyWhole reports whether st's body so far agrees with the
// content-length its client declared, with ended if it is all there; a
// body refused as too large agrees with any. mu is held.
func (st *h2Stream) bodyWhole(ended bool) bool {
	if st.declared < 0 || st.err != nil {
		return true
	}
	n := int64(len(st.ctx.Request.Body()))
	return n < st.declared && !ended || n == st.declared
}

// h2ContentLength is the content-length among a request's fields, -1 when
// there is none; false when one does not parse or two disagree.
func h2ContentLength(fields []hpack.HeaderField) (int64, bool) {
	n := int64(-1)
	for _, hf := range fields {
		if hf.Name != "content-length" {
			continue
		}
		v, err := strconv.ParseInt(hf.Value, 10, 64)
		if err != nil || strings.TrimLeft(hf.Value, "0123456789") != "" || n >= 0 && v != n {
			return 0, false
		}
		n = v
	}
	return n, true
}

// work serves the stream on a worker (workers).
func (st *h2Stream) work() { st.c.serveStream(st) }

// refuseLocked resets stream id for a frame of the client's, which the
// rapid-reset bucket is charged for; mu is held, on run's goroutine.
func (c *h2Conn) refuseLocked(id uint32, code http2.ErrCode) {
	c.resetLocked(id, code)
	c.refused++
}

// resetLocked sends RST_STREAM for id and closes the stream; mu is held.
func (c *h2Conn) resetLocked(id uint32, code http2.ErrCode) {
	_ = c.fr.WriteRSTStream(id, code)
	c.resets[c.resetAt] = id
	c.resetAt = (c.resetAt + 1) % len(c.resets)
	if st := c.streams[id]; st != nil {
		c.closeStreamLocked(st, errStreamReset)
	}
}

// closeStreamLocked ends st: its writes fail with err, and ClientGone
// fires; mu is held.
func (c *h2Conn) closeStreamLocked(st *h2Stream, err error) {
	if st.cut != nil {
		return
	}
	st.cut = err
	st.done.fire()
	st.onCut.cut()
	delete(c.streams, st.id)
	if !st.started {
		c.dropBodyLocked(st)
		st.release()
	}
	c.idleLocked()
	c.cond.Broadcast()
}

// dropBodyLocked takes st's body out of the connection's count, once its
// answer ended, its handler is done with it, or it never ran; mu is held.
func (c *h2Conn) dropBodyLocked(st *h2Stream) {
	c.bodies -= st.held
	st.held = 0
}

// idleLocked arms the idle timer when no stream is open: a connection
// idle for IdleTimeout is sent GOAWAY and closed.
func (c *h2Conn) idleLocked() {
	if len(c.streams) > 0 || c.s.o.IdleTimeout <= 0 {
		return
	}
	if c.idle == nil {
		c.idle = time.AfterFunc(c.s.o.IdleTimeout, c.onIdle)
	} else {
		c.idle.Reset(c.s.o.IdleTimeout)
	}
}

func (c *h2Conn) onIdle() {
	c.mu.Lock()
	idle := len(c.streams) == 0
	c.mu.Unlock()
	if idle {
		c.goAway(http2.ErrCodeNo)
	}
}

// goAway sends GOAWAY: no stream after the last one opened will be
// served, and the connection closes once its open streams are done.
func (c *h2Conn) goAway(code http2.ErrCode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.goAwayLocked(code)
}

// goAwayLocked is goAway with mu held.
func (c *h2Conn) goAwayLocked(code http2.ErrCode) {
	if c.goingAway {
		return
	}
	c.goingAway, c.awayID = true, c.lastID
	_ = c.fr.WriteGoAway(c.lastID, code, nil)
	_ = c.flushLocked()
	c.closeIfDoneLocked()
}

// closeIfDoneLocked ends a connection that sent GOAWAY and has no stream
// left, h2GoAwayGrace later: meanwhile run still reads, so what the
// client sent before it saw the GOAWAY is not left unread (which would
// make the close a reset that can take the GOAWAY with it), and its
// PINGs are answered. The client's own close ends it sooner. mu is held.
func (c *h2Conn) closeIfDoneLocked() {
	if c.goingAway && c.grace == nil && c.werr == nil && len(c.streams) == 0 && c.running.Load() == 0 && !c.writing {
		// run's read fails at the deadline, and run closes the socket.
		c.grace = time.AfterFunc(h2GoAwayGrace, func() { _ = c.nc.SetReadDeadline(time.Now()) })
	}
}

// h2GoAwayGrace is how long a connection that sent GOAWAY and has no
// stream left waits for its client to close it (Go's server waits one
// second too).
const h2GoAwayGrace = time.Second

// end closes the connection after run's last read: a connection error is
// sent to the client in a GOAWAY; every stream still open is cut.
func (c *h2Conn) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	code := http2.ErrCodeNo
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		code = http2.ErrCode(ce)
	case errors.Is(err, http2.ErrFrameTooLarge):
		code = http2.ErrCodeFrameSize
	case errors.Is(err, errRapidReset):
		code = http2.ErrCodeEnhanceYourCalm
	default:
		code = 0xff // the socket failed: nothing to tell the client
	}
	if code != 0xff && !c.goingAway {
		c.goingAway, c.awayID = true, c.lastID
		_ = c.fr.WriteGoAway(c.lastID, code, nil)
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.finalWrite = true
		for c.writing {
			c.cond.Wait()
		}
		_ = c.flushLocked()
	}
	if c.s.o.Log != nil && code != 0xff && code != http2.ErrCodeNo {
		c.s.o.Log.Debug("frontend: HTTP/2 connection error", "err", err, "remote", c.nc.RemoteAddr())
	}
	c.goingAway = true
	if c.werr == nil {
		c.werr = errH2Closed
	}
	for _, st := range c.streams {
		c.closeStreamLocked(st, errH2Closed)
	}
	if c.idle != nil {
		c.idle.Stop()
	}
	if c.reading != nil {
		c.reading.Stop()
	}
	if c.grace != nil {
		c.grace.Stop()
	}
	_ = c.nc.Close()
	c.cond.Broadcast()
}

// h2Streams are streams released (release), each with its ctx.
var h2Streams = sync.Pool{New: func() any { return &h2Stream{ctx: new(fasthttp.RequestCtx)} }}

// h2Stream is one stream, and what ctx.Conn() is for its request: the
// connection's addresses, and the stream's end for ClientGone. It carries
// no bytes.
type h2Stream struct {
	parent net.Conn
	c      *h2Conn
	id     uint32
	ctx    *fasthttp.RequestCtx

	// Under c.mu.
	err        error // the request cannot be served: Handler.Error answers
	cut        error // the stream was closed: writes fail with it
	sendWindow int64
	recvWindow int64
	// recvUnacked is received body not yet given back in a WINDOW_UPDATE.
	recvUnacked int64
	recvEnded   bool      // the client ended its side
	sentEnd     bool      // the server ended its side
	held        int64     // body bytes counted in c.bodies
	declared    int64     // the request's content-length; -1: none
	readBy      time.Time // when the request must be whole (awaitBodyLocked)
	started     bool      // its handler runs
	// onCut: the calls ClientCut's watchers cut when the stream is.
	onCut cutters
	// done is ClientGone's, fired when the stream is cut (reset, the
	// connection ended).
	done goneChan

	// pass holds the answer's header lines PassHead gave, until its
	// header is written (empty: none); the handler's. Its buffer is kept
	// for the stream's next use.
	pass []byte
}

// gone is ClientGone's channel for st.
func (st *h2Stream) gone() <-chan struct{} {
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	return st.done.get(st.cut != nil)
}

// ClientCut is ClientGone for a caller that would rather not have a
// goroutine wait on the channel: the client of ctx leaving as an
// upstream.Cut, on an HTTP/2 stream and on a gnet connection served on a
// worker. A watcher's Cut runs under the connection's lock, so it must
// not block or come back to the connection. nil on fasthttp's HTTP/1,
// which has no such hook (WatchClient is the way there).
func ClientCut(ctx *fasthttp.RequestCtx) upstream.Cut {
	switch c := ctx.Conn().(type) {
	case *h2Stream:
		return c
	case *gconn:
		return c
	}
	return nil
}

// Watch is ClientCut's for st.
func (st *h2Stream) Watch(w upstream.Cutter) {
	c := st.c
	c.mu.Lock()
	if st.cut != nil {
		c.mu.Unlock()
		w.Cut()
		return
	}
	st.onCut.add(w)
	c.mu.Unlock()
}

func (st *h2Stream) Unwatch(w upstream.Cutter) {
	c := st.c
	c.mu.Lock()
	st.onCut.remove(w)
	c.mu.Unlock()
}

// release returns the stream and its ctx to the pool, once neither its
// connection nor its handler holds it.
func (st *h2Stream) release() {
	ctx := st.ctx
	ctx.Request.Reset()
	ctx.Response.Reset()
	*st = h2Stream{ctx: ctx, pass: st.pass[:0]}
	h2Streams.Put(st)
}

var errStreamConn = errors.New("frontend: an HTTP/2 stream is not read or written as a connection")

func (st *h2Stream) Read([]byte) (int, error)         { return 0, errStreamConn }
func (st *h2Stream) Write([]byte) (int, error)        { return 0, errStreamConn }
func (st *h2Stream) Close() error                     { return nil }
func (st *h2Stream) LocalAddr() net.Addr              { return st.parent.LocalAddr() }
func (st *h2Stream) RemoteAddr() net.Addr             { return st.parent.RemoteAddr() }
func (st *h2Stream) SetDeadline(time.Time) error      { return nil }
func (st *h2Stream) SetReadDeadline(time.Time) error  { return nil }
func (st *h2Stream) SetWriteDeadline(time.Time) error { return nil }

// sniffPreface reads c's first bytes, as far as they agree with HTTP/2's
// client preface, and returns c with them put back and whether they are
// the preface (h2c with prior knowledge). nil: the client sent nothing
// within timeout, or left; c is closed.
func sniffPreface(c net.Conn, timeout time.Duration) (net.Conn, bool) {
	var buf [len(http2.ClientPreface)]byte
	n := 0
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	for {
		k, err := c.Read(buf[n:])
		n += k
		if n > 0 && !bytes.HasPrefix([]byte(http2.ClientPreface), buf[:n]) {
			break
		}
		if n == len(buf) {
			_ = c.SetReadDeadline(time.Time{})
			return &prefixedConn{Conn: c, early: buf[:n]}, true
		}
		if err != nil {
			_ = c.Close()
			return nil, false
		}
	}
	return &prefixedConn{Conn: c, early: bytes.Clone(buf[:n])}, false
}

// prefixedConn reads early before what is still on its connection.
type prefixedConn struct {
	net.Conn
	early []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

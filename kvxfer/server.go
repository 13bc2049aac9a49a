package kvxfer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"
)

// Outcome says why held KV was released.
type Outcome uint8

const (
	// PickedUp: a destination received every byte and acknowledged them.
	PickedUp Outcome = iota
	// Expired: nobody picked it up within the hold's TTL.
	Expired
	// Dropped: the holder released it (Server.Release) or the server closed.
	Dropped
)

var outcomeNames = [...]string{"picked_up", "expired", "dropped"}

func (o Outcome) String() string { return outcomeNames[o] }

// Hold is KV to serve until it is picked up or expires.
type Hold struct {
	// Handle names it; "" lets the server pick a unique one. A handle
	// already held is an error.
	Handle string
	Tokens int
	// Bytes is how many bytes a pull streams.
	Bytes int64
	// TTL is how long the KV waits for pickup; it must be positive.
	TTL time.Duration
	// Released, if not nil, is called exactly once, from a goroutine of the
	// server's, when the KV leaves the server. It must not block long.
	Released func(Outcome)
}

// ServerConfig configures a transfer server.
type ServerConfig struct {
	// Listen is the host:port to listen on; port 0 picks a free one.
	Listen string
	// Pace, when not nil, is the wall time a transfer of n bytes should
	// take; the server spreads its writes over it, so a simulated pod's
	// transfers last as long as its link model says (scaled to wall time).
	// Nil streams as fast as TCP goes.
	Pace func(n int64) time.Duration
	// IOTimeout bounds each write and the wait for the destination's
	// acknowledgement (default DefaultIOTimeout).
	IOTimeout time.Duration
}

// DefaultIOTimeout is ServerConfig.IOTimeout's and TCP.IOTimeout's default.
const DefaultIOTimeout = 30 * time.Second

// Server serves held KV by handle over TCP. Its methods are safe for
// concurrent use.
type Server struct {
	cfg ServerConfig
	ln  net.Listener

	mu      sync.Mutex
	entries map[string]*entry
	bytes   int64         // of entries
	changed chan struct{} // closed and replaced when a handle becomes available
	closed  bool
	conns   map[net.Conn]struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

type entry struct {
	hold     Hold
	inflight bool // a pull is streaming it
	expired  bool // its TTL passed while in flight
	timer    *time.Timer
}

var (
	// ErrNotHeld is a pull's error when the source holds no KV under the
	// handle (never did, already picked up, expired, or the wait passed).
	ErrNotHeld = errors.New("kvxfer: handle not held")
	errHeld    = errors.New("kvxfer: handle already held")
	errClosed  = errors.New("kvxfer: server closed")
)

// Listen starts a server.
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("kvxfer: %w", err)
	}
	s := &Server{
		cfg: cfg, ln: ln,
		entries: map[string]*entry{},
		changed: make(chan struct{}),
		conns:   map[net.Conn]struct{}{},
		done:    make(chan struct{}),
	}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Hold registers KV for pickup and returns its descriptor.
func (s *Server) Hold(h Hold) (Descriptor, error) {
	if h.TTL <= 0 || h.Bytes < 0 {
		return Descriptor{}, fmt.Errorf("kvxfer: hold needs a positive TTL and bytes >= 0 (ttl %v, bytes %d)", h.TTL, h.Bytes)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Descriptor{}, errClosed
	}
	if h.Handle == "" {
		for h.Handle == "" || s.entries[h.Handle] != nil {
			h.Handle = strconv.FormatUint(rand.Uint64()>>1, 10)
		}
	} else if s.entries[h.Handle] != nil {
		return Descriptor{}, fmt.Errorf("%w: %q", errHeld, h.Handle)
	}
	e := &entry{hold: h}
	handle := h.Handle
	e.timer = time.AfterFunc(h.TTL, func() { s.expire(handle, e) })
	s.entries[handle] = e
	s.bytes += h.Bytes
	s.broadcastLocked()
	return Descriptor{Addr: s.Addr(), Handle: handle, Tokens: h.Tokens, Bytes: h.Bytes}, nil
}

// Release drops the KV held under handle, as an engine does when its
// request is aborted; false if none is held or a pull is streaming it.
func (s *Server) Release(handle string) bool {
	s.mu.Lock()
	e := s.entries[handle]
	if e == nil || e.inflight {
		s.mu.Unlock()
		return false
	}
	s.removeLocked(handle, e)
	s.mu.Unlock()
	s.released(e, Dropped)
	return true
}

// Held returns the number of holds and their bytes.
func (s *Server) Held() (holds int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries), s.bytes
}

// Close stops the server: it closes the listener and every connection,
// drops what it holds (calling each Released with Dropped) and waits for
// its goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	err := s.ln.Close()
	for c := range s.conns {
		_ = c.Close()
	}
	var dropped []*entry
	for h, e := range s.entries {
		s.removeLocked(h, e)
		dropped = append(dropped, e)
	}
	s.mu.Unlock()
	s.wg.Wait()
	for _, e := range dropped {
		s.released(e, Dropped)
	}
	return err
}

// broadcastLocked wakes the pulls waiting for a handle to become
// available.
func (s *Server) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) removeLocked(handle string, e *entry) {
	e.timer.Stop()
	delete(s.entries, handle)
	s.bytes -= e.hold.Bytes
}

func (s *Server) released(e *entry, o Outcome) {
	if e.hold.Released != nil {
		e.hold.Released(o)
	}
}

func (s *Server) expire(handle string, e *entry) {
	s.mu.Lock()
	if s.entries[handle] != e {
		s.mu.Unlock()
		return
	}
	if e.inflight {
		e.expired = true // the pull in flight decides
		s.mu.Unlock()
		return
	}
	s.removeLocked(handle, e)
	s.mu.Unlock()
	s.released(e, Expired)
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Go(func() {
			s.serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = c.Close()
		})
		s.mu.Unlock()
	}
}

// serve answers one pull.
func (s *Server) serve(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.IOTimeout))
	handle, waitMS, err := readRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	// From here the client sends one byte, the ack, or closes: one reader
	// goroutine reports which, so a waiting pull notices its client leave.
	// serve's caller closes c, which ends that read.
	ack := make(chan bool, 1)
	s.wg.Go(func() {
		var b [1]byte
		_, err := c.Read(b[:])
		ack <- err == nil && b[0] == ackByte
	})
	e, ok := s.claim(handle, time.Duration(waitMS)*time.Millisecond, ack)
	if !ok {
		_ = c.SetWriteDeadline(time.Now().Add(s.cfg.IOTimeout))
		_, _ = c.Write([]byte{statusNotHeld})
		return
	}
	if s.stream(c, e.hold.Bytes) {
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.IOTimeout))
		select {
		case acked := <-ack:
			if acked {
				s.finish(handle, e, true)
				return
			}
		case <-s.done:
		}
	}
	s.finish(handle, e, false)
}

// claim marks the KV under handle as in flight, waiting up to wait for it
// to be held; false when it is not held by then, the client left (ack
// fired) or the server closed.
func (s *Server) claim(handle string, wait time.Duration, ack <-chan bool) (*entry, bool) {
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-ack: // the client already left
			return nil, false
		default:
		}
		s.mu.Lock()
		if e := s.entries[handle]; e != nil && !e.inflight {
			e.inflight = true
			s.mu.Unlock()
			return e, true
		}
		changed := s.changed
		s.mu.Unlock()
		if deadline == nil {
			return nil, false
		}
		select {
		case <-changed:
		case <-deadline:
			return nil, false
		case <-ack: // the client closed (or sent garbage) while waiting
			return nil, false
		case <-s.done:
			return nil, false
		}
	}
}

// finish ends a pull: picked up, or back on the shelf (or expired) when it
// failed.
func (s *Server) finish(handle string, e *entry, ok bool) {
	s.mu.Lock()
	if s.entries[handle] != e {
		s.mu.Unlock()
		return // Close took it
	}
	e.inflight = false
	var o Outcome
	switch {
	case ok:
		o = PickedUp
	case e.expired:
		o = Expired
	default:
		s.broadcastLocked() // a waiting pull may take it before the TTL
		s.mu.Unlock()
		return
	}
	s.removeLocked(handle, e)
	s.mu.Unlock()
	s.released(e, o)
}

// chunk is the size of one write, and payload its contents: the bytes
// stand in for KV blocks, so any pattern does.
const chunk = 64 << 10

var payload = func() []byte {
	b := make([]byte, chunk)
	for i := range b {
		b[i] = byte(i*131 + 7)
	}
	return b
}()

// stream writes the OK status, the length and n bytes, paced when the
// server has a Pace; false on any write error or when the server closes.
func (s *Server) stream(c net.Conn, n int64) bool {
	start := time.Now()
	var total time.Duration
	if s.cfg.Pace != nil {
		total = s.cfg.Pace(n)
	}
	if n == 0 && !s.sleepUntil(start.Add(total)) {
		return false // nothing to spread the time over: the header is late
	}
	var hdr [9]byte
	hdr[0] = statusOK
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	_ = c.SetWriteDeadline(time.Now().Add(s.cfg.IOTimeout))
	if _, err := c.Write(hdr[:]); err != nil {
		return false
	}
	for sent := int64(0); sent < n; {
		k := min(int64(chunk), n-sent)
		// A chunk leaves when the link would have delivered it, so the
		// last byte arrives no sooner than total.
		if total > 0 && !s.sleepUntil(start.Add(time.Duration(float64(total)*float64(sent+k)/float64(n)))) {
			return false
		}
		_ = c.SetWriteDeadline(time.Now().Add(s.cfg.IOTimeout))
		if _, err := c.Write(payload[:k]); err != nil {
			return false
		}
		sent += k
	}
	return true
}

// sleepUntil waits for t; false if the server closed first.
func (s *Server) sleepUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-s.done:
		return false
	}
}

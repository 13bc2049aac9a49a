package chaos

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Fault modes of a pod's proxy.
const (
	modeNormal int32 = iota
	// modeHung: bytes stop flowing both ways on every connection, new and
	// old, and the pod answers nothing, health checks included.
	modeHung
	// modeSlow: every chunk from the pod is held back slowDelay.
	modeSlow
)

// slowDelay is what modeSlow adds to each chunk a pod sends.
const slowDelay = 100 * time.Millisecond

// faultProxy stands in front of one sim pod at a fixed address, so the
// gateway's configuration never changes while the pod behind it is hung,
// slowed, killed (the proxy stops listening and cuts every connection: the
// gateway sees resets, then refused connections) and restarted (a new pod
// behind the same address).
//
// It notes what each fault did to the request it met (faults), by the
// X-Request-Id the gateway passes on from the client.
type faultProxy struct {
	addr   string
	pod    int // the pod's index in the fleet
	mode   atomic.Int32
	faults *faultLog

	mu      sync.Mutex
	ln      net.Listener
	backend string
	conns   map[net.Conn]*exchange
	wg      sync.WaitGroup
}

func newFaultProxy(pod int, backend string, faults *faultLog) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{addr: ln.Addr().String(), pod: pod, backend: backend, conns: map[net.Conn]*exchange{}, faults: faults}
	p.serve(ln)
	return p, nil
}

func (p *faultProxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pipe(c)
			}()
		}
	}()
}

// pipe joins a client connection to the pod until either side ends.
func (p *faultProxy) pipe(client net.Conn) {
	ex := &exchange{}
	p.mu.Lock()
	backend := p.backend
	p.conns[client] = ex
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, client)
		p.mu.Unlock()
		client.Close()
	}()
	pod, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer pod.Close()
	done := make(chan struct{}, 2)
	go func() { p.copy(pod, client, ex, false); done <- struct{}{} }()
	go func() { p.copy(client, pod, ex, true); done <- struct{}{} }()
	<-done
	// One side ended: end the other, then wait for its copy.
	client.Close()
	pod.Close()
	<-done
}

// copy moves bytes from src to dst, stalling while the proxy is hung and
// delaying the pod's chunks while it is slow.
func (p *faultProxy) copy(dst, src net.Conn, ex *exchange, fromPod bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !fromPod {
			if id := ex.request(buf[:n]); id != "" {
				p.faults.visit(id, p.pod)
			}
		}
		if n > 0 && p.mode.Load() == modeHung {
			p.faults.note(ex.fault(faultHungBefore, faultHungMid))
		}
		for n > 0 && p.mode.Load() == modeHung {
			// Hold the bytes; a kill or the end of the run closes src and
			// dst, which ends the write below.
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 && fromPod && p.mode.Load() == modeSlow {
			time.Sleep(slowDelay)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if fromPod {
				ex.answer(buf[:n])
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// kill stops listening and cuts every connection at once.
func (p *faultProxy) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c, ex := range p.conns {
		p.faults.note(ex.fault(faultReset, faultCut))
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}

// restart listens again on the same address, in front of backend.
func (p *faultProxy) restart(backend string) error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.backend = backend
	p.serve(ln)
	p.mu.Unlock()
	return nil
}

// close ends the proxy and waits for its goroutines.
func (p *faultProxy) close() {
	p.mode.Store(modeNormal)
	p.kill()
	p.wg.Wait()
}

// Kinds of fault a request met, as the pod's proxy saw it; a refused
// connection never reaches a proxy (the gateway counts those).
const (
	faultReset      = "reset before first byte"
	faultHungBefore = "hung before first byte"
	faultCut        = "cut mid-stream"
	faultHungMid    = "hung mid-stream"
)

// faultLog is the last fault each request met, and the pods it went to
// in order, by request id.
type faultLog struct {
	mu     sync.Mutex
	byID   map[string]string
	visits map[string][]visit
}

// visit is a request reaching a pod's proxy.
type visit struct {
	pod int
	at  time.Time
}

func (l *faultLog) visit(id string, pod int) {
	l.mu.Lock()
	l.visits[id] = append(l.visits[id], visit{pod, time.Now()})
	l.mu.Unlock()
}

func (l *faultLog) visited(id string) []visit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.visits[id]
}

func (l *faultLog) note(id, kind string) {
	if id == "" {
		return
	}
	l.mu.Lock()
	l.byID[id] = kind
	l.mu.Unlock()
}

func (l *faultLog) kind(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID[id]
}

// exchange is the request a proxied connection carries now: its id (""
// for none, or a health check), whether bytes of its answer went back,
// and whether the answer is whole.
type exchange struct {
	mu       sync.Mutex
	id       string
	answered bool
	whole    bool
	// The answer's framing: its header's length and Content-Length (-1:
	// chunked), once its header is in, and the bytes so far.
	head, length, got int
}

var requestIDHeader = []byte("\r\nx-request-id: ")

// request notes a chunk of the gateway's request: one with an id starts
// the connection's next exchange, and request returns the id.
func (e *exchange) request(b []byte) string {
	i := bytes.Index(bytes.ToLower(b), requestIDHeader)
	if i < 0 {
		return ""
	}
	id := b[i+len(requestIDHeader):]
	if j := bytes.IndexByte(id, '\r'); j >= 0 {
		id = id[:j]
	}
	e.mu.Lock()
	e.id, e.answered, e.whole, e.head, e.got = string(id), false, false, 0, 0
	e.mu.Unlock()
	return string(id)
}

// answer notes a chunk of the pod's answer sent back.
func (e *exchange) answer(b []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.answered = true
	e.got += len(b)
	if e.head == 0 {
		// The sim writes its header in one piece.
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			return
		}
		e.head, e.length = end+4, -1
		lower := bytes.ToLower(b[:end])
		if i := bytes.Index(lower, []byte("\r\ncontent-length: ")); i >= 0 {
			v := lower[i+len("\r\ncontent-length: "):]
			if j := bytes.IndexByte(v, '\r'); j >= 0 {
				v = v[:j]
			}
			e.length, _ = strconv.Atoi(string(v))
		}
	}
	e.whole = (e.length >= 0 && e.got-e.head >= e.length) || (e.length < 0 && bytes.HasSuffix(b, []byte("0\r\n\r\n")))
}

// fault is the id of the request a fault hits now, and its kind: before
// or after the first byte of its answer; no id when the connection
// carries none, or its answer is whole.
func (e *exchange) fault(before, after string) (string, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.id == "" || e.whole:
		return "", ""
	case e.answered:
		return e.id, after
	}
	return e.id, before
}

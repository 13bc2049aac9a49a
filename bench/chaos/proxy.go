package chaos

import (
	"errors"
	"io"
	"net"
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
type faultProxy struct {
	addr string
	mode atomic.Int32

	mu      sync.Mutex
	ln      net.Listener
	backend string
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func newFaultProxy(backend string) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{addr: ln.Addr().String(), backend: backend, conns: map[net.Conn]struct{}{}}
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
	p.mu.Lock()
	backend := p.backend
	p.conns[client] = struct{}{}
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
	go func() { p.copy(pod, client, false); done <- struct{}{} }()
	go func() { p.copy(client, pod, true); done <- struct{}{} }()
	<-done
	// One side ended: end the other, then wait for its copy.
	client.Close()
	pod.Close()
	<-done
}

// copy moves bytes from src to dst, stalling while the proxy is hung and
// delaying the pod's chunks while it is slow.
func (p *faultProxy) copy(dst, src net.Conn, fromPod bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
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
	for c := range p.conns {
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

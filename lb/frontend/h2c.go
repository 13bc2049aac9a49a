package frontend

import (
	"bytes"
	"net"
	"os"

	"golang.org/x/net/http2"
	"pdlb/lb/evloop"
)

// h2cOnLoop looks, on the loop, at a new connection's first bytes for
// HTTP/2's client preface (h2c with prior knowledge). done reports that
// the connection is taken care of: the preface is still incomplete (wait),
// or it came whole and the connection leaves the loop for the HTTP/2
// server.
//
// HTTP/2 multiplexes streams, each served on a goroutine that may block,
// over one connection whose reads and writes the HTTP/2 server owns
// (h2.go); serving it on a loop would mean driving that server from the
// loop's buffers. So the socket is duplicated into a net.Conn on Go's
// poller, served on a goroutine like the TLS front end's h2 connections,
// and the loop closes its own descriptor (after taking it off its epoll
// instance, so the duplicate is left alone).
func (s *GNet) h2cOnLoop(gc *gconn) (act evloop.Action, done bool) {
	c := gc.c
	buf, _ := c.Peek(c.InboundBuffered())
	preface := []byte(http2.ClientPreface)
	if !bytes.HasPrefix(preface, buf[:min(len(buf), len(preface))]) {
		gc.sniffed = true
		return evloop.None, false
	}
	if len(buf) < len(preface) {
		return evloop.None, true
	}
	gc.sniffed = true
	nc, err := s.dupConn(c)
	if err != nil {
		s.logDebug("frontend: h2c connection not taken over", err)
		return evloop.Close, true
	}
	early := bytes.Clone(buf)
	_, _ = c.Discard(len(buf))
	// Its place under the per-address cap goes with it: taken again on
	// the goroutine, it could be before OnClose gave it back, and a
	// client at its cap would be refused.
	gc.handed = true
	go s.serveH2(c.RemoteAddr(), &prefixedConn{Conn: nc, early: early}, nc, true)
	return evloop.Close, true
}

// serveH2 serves an HTTP/2 connection a loop handed over, conn over the
// duplicate socket nc, which it closes when done. Unless held (the
// connection kept its place under the per-address cap), OnClose gave the
// place back; it is taken again.
func (s *GNet) serveH2(remote net.Addr, conn, nc net.Conn, held bool) {
	defer nc.Close()
	if s.o.Conns != nil {
		if !held && !s.o.Conns.Acquire(remote) {
			return
		}
		defer s.o.Conns.Release(remote)
	}
	s.h2.serve(conn)
}

// dupConn is a net.Conn on a duplicate of c's socket, whose close
// lingers as the loops' own do.
func (s *GNet) dupConn(c *evloop.Conn) (net.Conn, error) {
	dup, err := c.Dup()
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "h2c")
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return &lingerConn{TCPConn: nc.(*net.TCPConn), l: &s.linger}, nil
}

func (s *GNet) logDebug(msg string, err error) {
	if s.o.Log != nil {
		s.o.Log.Debug(msg, "err", err)
	}
}

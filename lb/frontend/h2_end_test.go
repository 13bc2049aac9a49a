package frontend

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// deadlineConn takes every write whole and keeps the last write deadline
// set on it.
type deadlineConn struct {
	net.Conn
	deadline time.Time
}

func (d *deadlineConn) Write(p []byte) (int, error)        { return len(p), nil }
func (d *deadlineConn) SetWriteDeadline(t time.Time) error { d.deadline = t; return nil }
func (d *deadlineConn) Close() error                       { return nil }
func (d *deadlineConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (d *deadlineConn) SetReadDeadline(t time.Time) error  { return nil }
func (d *deadlineConn) Read(p []byte) (n int, err error)   { return 0, net.ErrClosed }
func (d *deadlineConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (d *deadlineConn) SetDeadline(t time.Time) error      { return nil }

// TestHTTP2GoAwayWriteBounded: the GOAWAY that ends a connection on a
// connection error is written within a second, however long IdleTimeout
// lets a flush wait: a client that stopped reading must not hold its
// connection (and the goroutine ending it) for the idle timeout.
func TestHTTP2GoAwayWriteBounded(t *testing.T) {
	nc := &deadlineConn{}
	c := newH2Conn(newH2Server(Handler{}, Options{IdleTimeout: time.Hour}), nc)
	c.mu.Lock()
	_ = c.fr.WriteSettings()
	_ = c.flushLocked()
	c.mu.Unlock()
	c.end(http2.ConnectionError(http2.ErrCodeProtocol))
	if ahead := time.Until(nc.deadline); ahead > 2*time.Second {
		t.Fatalf("the GOAWAY's write may wait %v; want at most a second", ahead.Round(time.Second))
	}
}

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

// TestHTTP2StrikesInARow: a client over the rapid-reset bucket now and
// then, within the rate on average, is paused each time but never closed:
// only pauses in a row count towards resetStrikes. One that keeps over it
// is closed.
func TestHTTP2StrikesInARow(t *testing.T) {
	c := newH2Conn(newH2Server(Handler{}, Options{HTTP2: HTTP2{MaxResetsPerSecond: 100}}), &deadlineConn{})
	burst := func() (err error) {
		// The bucket's worth of resets, one at a time, and one more.
		for n := 0; err == nil && n <= int(10*c.s.resetRate); n++ {
			err = c.charge(1)
		}
		return err
	}
	for hour := range 2 * resetStrikes {
		c.last = c.last.Add(-time.Hour) // an hour without a reset: the bucket is full
		if err := burst(); err != nil {
			t.Fatalf("burst %d, an hour after the last: %v", hour+1, err)
		}
	}
	var err error
	for n := 0; err == nil && n <= resetStrikes; n++ {
		err = c.charge(1)
	}
	if err != errRapidReset {
		t.Fatalf("resets on after the bucket ran out: %v, want errRapidReset", err)
	}
}

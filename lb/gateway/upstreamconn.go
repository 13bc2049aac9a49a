package gateway

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// fasthttp's client sets a connection's read deadline once per request, from
// the request timeout, and leaves it there while the caller streams the body.
// A stream outlives any sensible response timeout, so the relay must own the
// deadline once the headers are in: it moves it forward by the idle timeout
// before every read.
//
// The client does not hand out its connections, but it does record the
// connection's LocalAddr on the response. upstreamConn returns a LocalAddr
// that points back at itself, which lets the relay find the connection of a
// response without any table.
type upstreamConn struct {
	net.Conn
	local connAddr
}

// connAddr is a net.Addr that knows its connection.
type connAddr struct {
	net.Addr
	conn *upstreamConn
}

func (c *upstreamConn) LocalAddr() net.Addr { return &c.local }

// dialUpstream dials addr within timeout and wraps the connection.
func dialUpstream(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := fasthttp.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	uc := &upstreamConn{Conn: c}
	uc.local = connAddr{Addr: c.LocalAddr(), conn: uc}
	return uc, nil
}

// connOf returns the connection a response was read from, nil if it did not
// come through dialUpstream.
func connOf(resp *fasthttp.Response) *upstreamConn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.conn
	}
	return nil
}

package frontend

import (
	"fmt"
	"net/http"

	"pdlb/lb/evloop"

	"pdlb/lb/openai"
)

// Refusing a connection over its address's cap (limits.max_conns_per_ip)
// with an answer. The kernel completed the handshake before the front end
// could look at the connection, and a reset tells the client nothing it
// can show; so the connection gets a 429 in OpenAI's error shape and
// closes lingering (linger.go), which lets a client that sent its request
// before reading read the answer. With every lingering slot taken, it is
// reset, which frees the socket at once.

// refusal is that answer. Its Retry-After is 1, as a key's concurrency
// limit says: a slot frees when one of the address's connections closes,
// which may be at any moment, and OpenAI's SDKs wait as told.
var refusal = func() []byte {
	e := openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRequests, Code: openai.CodeRateLimited,
		Message: "Too many connections from your address are open (limits.max_conns_per_ip); send on one you hold, or close one and retry."}
	body := e.AppendJSON(nil)
	return fmt.Appendf(nil, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}()

// refuse answers c with refusal and lets it linger, or resets it when no
// lingering slot is left or c is a TLS client, which could not read the
// plain answer; on the loop, from OnOpen. The connection counts toward no
// cap (refused) and serves no request (stopped).
func (s *GNet) refuse(c *evloop.Conn) evloop.Action {
	if s.tls != nil || !s.linger.take() {
		_ = c.SetLinger(0)
		return evloop.Close
	}
	gc := newGConn(s, c)
	gc.refused, gc.stopped, gc.sniffed = true, true, true
	c.SetContext(gc)
	s.mu.Lock()
	s.conns[gc] = struct{}{}
	s.mu.Unlock()
	err := c.AsyncWrite(refusal, func(*evloop.Conn, error) { gc.startLinger() })
	if err != nil {
		s.linger.release()
		_ = c.SetLinger(0)
		return evloop.Close
	}
	return evloop.None
}

package upstream

import (
	"errors"
	"io"
	"net"

	"github.com/valyala/fasthttp"
)

// ReadWhole copies a whole answer's streamed body to dst, at most limit
// bytes (upstream.max_response_bytes): past it, fasthttp.ErrBodyTooLarge,
// as the pods' clients say it of the bodies they read whole.
func ReadWhole(dst io.Writer, src io.Reader, limit int, buf []byte) error {
	n, err := io.CopyBuffer(dst, io.LimitReader(src, int64(limit)+1), buf)
	if err == nil && n > int64(limit) {
		return fasthttp.ErrBodyTooLarge
	}
	return err
}

// CloseStream abandons a response body: the connection is closed rather
// than reused, which also tells the pod to stop generating.
func CloseStream(resp *fasthttp.Response, err error) {
	if s, ok := resp.BodyStream().(fasthttp.ReadCloserWithError); ok {
		_ = s.CloseWithError(err)
	}
}

// NotSent reports whether err came before the request left: connecting
// failed, or the gateway's own cap refused a connection. The pod received
// nothing, so another pod may take the request.
func NotSent(err error) bool {
	var op *net.OpError
	return errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrNoFreeConns) ||
		(errors.As(err, &op) && op.Op == "dial")
}

// WriteFailed reports whether err failed the request's write: the pod
// closed or reset the connection before it took the whole request.
// fasthttp's client reads an answer only once the request is out, so no
// byte of one came, as when it answers fasthttp.ErrConnectionClosed.
func WriteFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "write"
}

package frontend

import (
	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"pdlb/internal/rawio"
)

// sendv writes iov to c, a plain connection, on its loop. With nothing
// of c's waiting in gnet's buffer, it sends with one raw sendmsg
// (rawio): gnet's Writev would go through the runtime's entersyscall and
// exitsyscall and the kernel's VFS layer. What the socket does not take
// (or everything, after an error) goes to gnet's Writev, which buffers
// the rest or closes c as before; iov's first buffer may be left trimmed
// of what was sent. vec is the caller's scratch, reused.
func sendv(c gnet.Conn, iov [][]byte, vec *[]unix.Iovec) error {
	if c.OutboundBuffered() == 0 {
		n, err := rawio.Sendv(c.Fd(), iov, vec)
		if err == nil {
			if iov = skip(iov, n); len(iov) == 0 {
				return nil
			}
		}
	}
	_, err := c.Writev(iov)
	return err
}

// send is sendv of one buffer.
func send(c gnet.Conn, b []byte) error {
	if c.OutboundBuffered() == 0 {
		n, err := rawio.Send(c.Fd(), b)
		if err == nil {
			if b = b[n:]; len(b) == 0 {
				return nil
			}
		}
	}
	_, err := c.Write(b)
	return err
}

// skip drops the first n bytes of iov: the buffers they fill (empty ones
// among them) and the start of the next, trimmed in place.
func skip(iov [][]byte, n int) [][]byte {
	for len(iov) > 0 && n >= len(iov[0]) {
		n -= len(iov[0])
		iov = iov[1:]
	}
	if len(iov) > 0 {
		iov[0] = iov[0][n:]
	}
	return iov
}

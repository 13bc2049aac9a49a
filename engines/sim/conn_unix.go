//go:build unix

package sim

import (
	"net"
	"syscall"
)

// connGone reports whether the client closed or reset conn, by peeking at
// the socket without consuming anything: a readable socket with no data is
// at end of file. fasthttp tells a handler nothing of a client that hangs up
// while the handler waits, and vLLM aborts such a request, freeing its batch
// slot, so the sim must notice too.
func connGone(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == nil:
			gone = n == 0
		case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK || rerr == syscall.EINTR:
		default:
			gone = true // reset, or closed under us
		}
		return true // never wait for readability: this is a poll
	})
	return gone || err != nil
}

package frontend

import (
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// sendv writes iov to c, a plain connection, on its loop. With nothing
// of c's waiting in gnet's buffer, it sends with one sendmsg made as a raw
// system call: gnet's writev goes through the runtime's entersyscall and
// exitsyscall, and the kernel's VFS layer, neither of which a
// non-blocking socket call needs. What the socket does not take (or an
// error) goes to gnet's Writev, which buffers the rest or closes c as
// before. vec is the caller's scratch, reused.
func sendv(c gnet.Conn, iov [][]byte, vec *[]unix.Iovec) error {
	if c.OutboundBuffered() == 0 {
		v, total := (*vec)[:0], 0
		for _, b := range iov {
			if len(b) > 0 {
				var e unix.Iovec
				e.Base = &b[0]
				e.SetLen(len(b))
				v = append(v, e)
				total += len(b)
			}
		}
		*vec = v
		if total == 0 {
			return nil
		}
		var msg unix.Msghdr
		msg.Iov = &v[0]
		msg.SetIovlen(len(v))
		n, _, errno := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(c.Fd()), uintptr(unsafe.Pointer(&msg)), unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		if errno == 0 {
			if int(n) == total {
				return nil
			}
			iov = skip(iov, int(n))
		}
	}
	_, err := c.Writev(iov)
	return err
}

// send is sendv of one buffer, with sendto.
func send(c gnet.Conn, b []byte) error {
	if c.OutboundBuffered() == 0 && len(b) > 0 {
		n, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(c.Fd()), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, 0, 0)
		if errno == 0 {
			if int(n) == len(b) {
				return nil
			}
			b = b[n:]
		}
	}
	_, err := c.Write(b)
	return err
}

// skip drops the first n bytes of iov, in place.
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

// Package rawio makes a non-blocking socket's sends and receives as raw
// system calls. A call that cannot block needs neither the runtime's
// entersyscall and exitsyscall, which syscall.Read and Write and
// x/sys/unix's go through, nor the kernel's VFS layer, which read, write
// and writev go through and recvfrom, sendto and sendmsg skip. The socket
// must be non-blocking (the runtime's poller and gnet make theirs so): a
// raw call that blocked would hold its thread from the scheduler.
package rawio

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// flags: no SIGPIPE from a peer's reset, and no wait whatever the socket.
const flags = unix.MSG_NOSIGNAL | unix.MSG_DONTWAIT

// Send sends b with one sendto: the bytes the socket took, or the call's
// error (syscall.EAGAIN when it took none).
func Send(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), flags, 0, 0)
	return result(n, errno)
}

// Sendv sends iov's buffers with one sendmsg, as Send does; vec is the
// caller's scratch for the iovecs, kept for the next call and cleared
// after this one, so that it holds no buffer alive.
func Sendv(fd int, iov [][]byte, vec *[]unix.Iovec) (int, error) {
	v := (*vec)[:0]
	for _, b := range iov {
		if len(b) > 0 {
			var e unix.Iovec
			e.Base = &b[0]
			e.SetLen(len(b))
			v = append(v, e)
		}
	}
	*vec = v
	if len(v) == 0 {
		return 0, nil
	}
	var msg unix.Msghdr
	msg.Iov = &v[0]
	msg.SetIovlen(len(v))
	n, _, errno := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), flags)
	clear(v)
	return result(n, errno)
}

// Recv reads into p with one recvfrom: the bytes read (0 with a nil error
// when the peer closed and p has room), or the call's error
// (syscall.EAGAIN when nothing is there yet).
func Recv(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(ptr), uintptr(len(p)), unix.MSG_DONTWAIT, 0, 0)
	return result(n, errno)
}

func result(n uintptr, errno syscall.Errno) (int, error) {
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

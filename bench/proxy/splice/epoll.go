package main

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The epoll poller: the same splice on event loops of this file's own, one
// epoll instance and SO_REUSEPORT listener each, to tell gnet's share of
// the floor from the Go runtime's. A loop waits in epoll_pwait as a raw
// system call, which keeps its P and skips entersyscall and exitsyscall:
// an idle loop is not handed off by the runtime's monitor, nor does a
// process whose loops all wait wake the monitor into its 20 µs polling
// when they return, and there is no idle Gosched. The monitor and the
// garbage collector still stop a loop that holds its P too long, by a
// signal that ends the wait with EINTR, after which the loop yields. Run
// it with more Ps than loops, as the gnet splice: goroutines get a P only
// from one no loop holds, else every 10 ms from the monitor.

// epollSplice is the epoll poller's loops.
type epollSplice struct {
	loops []*epollLoop
	wg    sync.WaitGroup
}

// epollLoop is one loop: its listener and connections are its own and
// touched only by it, so nothing is locked.
type epollLoop struct {
	ep, listen, stop int // stop: an eventfd that ends the loop
	up               unix.Sockaddr
	conns            map[int]*spliced
	buf              []byte
}

// spliced is one side of a client's connection and its upstream one.
type spliced struct {
	fd        int
	peer      *spliced
	pending   []byte // bytes for fd that its socket did not take yet
	connected bool   // false while an upstream connect is in progress
}

// startEpoll listens on listen with loops loops, splicing each connection
// to upstream (both IPv4 host:port).
func startEpoll(listen, upstream string, loops int) (*epollSplice, error) {
	la, err := netip.ParseAddrPort(listen)
	if err != nil || !la.Addr().Is4() {
		return nil, fmt.Errorf("--listen %q: an IPv4 host:port", listen)
	}
	ua, err := netip.ParseAddrPort(upstream)
	if err != nil || !ua.Addr().Is4() {
		return nil, fmt.Errorf("--upstream %q: an IPv4 host:port", upstream)
	}
	s := &epollSplice{}
	for range loops {
		l, err := newEpollLoop(&unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()},
			&unix.SockaddrInet4{Port: int(ua.Port()), Addr: ua.Addr().As4()})
		if err != nil {
			for _, l := range s.loops {
				l.close() // none runs yet
			}
			return nil, err
		}
		s.loops = append(s.loops, l)
	}
	for _, l := range s.loops {
		s.wg.Go(l.run)
	}
	return s, nil
}

// Close ends the loops, which close their connections and listeners.
func (s *epollSplice) Close() {
	one := [8]byte{1}
	for _, l := range s.loops {
		_, _ = unix.Write(l.stop, one[:])
	}
	s.wg.Wait()
	s.loops = nil
}

func newEpollLoop(listen, up unix.Sockaddr) (*epollLoop, error) {
	l := &epollLoop{ep: -1, listen: -1, stop: -1, up: up, conns: map[int]*spliced{}, buf: make([]byte, 64<<10)}
	var err error
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	if l.stop, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		l.close()
		return nil, err
	}
	if l.listen, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		l.close()
		return nil, err
	}
	err = errors.Join(unix.SetsockoptInt(l.listen, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1),
		unix.SetsockoptInt(l.listen, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1))
	if err == nil {
		err = unix.Bind(l.listen, listen)
	}
	if err == nil {
		err = unix.Listen(l.listen, unix.SOMAXCONN)
	}
	if err == nil {
		err = errors.Join(l.watch(l.listen, unix.EPOLLIN, unix.EPOLL_CTL_ADD), l.watch(l.stop, unix.EPOLLIN, unix.EPOLL_CTL_ADD))
	}
	if err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

func (l *epollLoop) watch(fd int, events uint32, op int) error {
	return unix.EpollCtl(l.ep, op, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

// close closes the loop's connections and descriptors.
func (l *epollLoop) close() {
	for fd := range l.conns {
		_ = unix.Close(fd)
	}
	clear(l.conns)
	for _, fd := range []int{l.listen, l.stop, l.ep} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

func (l *epollLoop) run() {
	defer l.close()
	events := make([]unix.EpollEvent, 128)
	for {
		// A raw call: see the top of the file. -1: no timeout.
		r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), ^uintptr(0), 0, 0)
		if errno == unix.EINTR {
			// Most likely the runtime's preemption signal: the raw
			// call has no preemption point, this is one.
			runtime.Gosched()
			continue
		}
		if errno != 0 {
			panic(fmt.Sprintf("splice: epoll_pwait: %v", errno))
		}
		for _, ev := range events[:r] {
			switch fd := int(ev.Fd); fd {
			case l.stop:
				return
			case l.listen:
				l.accept()
			default:
				l.ready(fd, ev.Events)
			}
		}
	}
}

// accept takes the connections waiting and starts each one's connect to
// the upstream.
func (l *epollLoop) accept() {
	for {
		fd, _, err := unix.Accept4(l.listen, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: none left
		}
		c := &spliced{fd: fd, connected: true}
		l.conns[fd] = c
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		if err := l.watch(fd, unix.EPOLLIN, unix.EPOLL_CTL_ADD); err != nil {
			l.drop(c)
			continue
		}
		ufd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			l.drop(c)
			continue
		}
		u := &spliced{fd: ufd, peer: c}
		c.peer = u
		l.conns[ufd] = u
		_ = unix.SetsockoptInt(ufd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		// Writable once the connect is done, which sends what the
		// client sent meanwhile.
		if err := unix.Connect(ufd, l.up); (err != nil && err != unix.EINPROGRESS) ||
			l.watch(ufd, unix.EPOLLIN|unix.EPOLLOUT, unix.EPOLL_CTL_ADD) != nil {
			l.drop(c)
		}
	}
}

// ready moves what fd's socket has to its peer and what its peer left
// pending to it.
func (l *epollLoop) ready(fd int, events uint32) {
	c := l.conns[fd]
	if c == nil {
		return // closed by an earlier event of the batch
	}
	if events&unix.EPOLLOUT != 0 {
		c.connected = true
		l.flush(c)
	}
	if events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) == 0 || c.fd < 0 {
		return
	}
	n, errno := rawCall(unix.SYS_RECVFROM, fd, l.buf, unix.MSG_DONTWAIT)
	switch {
	case errno == unix.EAGAIN:
	case errno != 0 || n == 0:
		l.drop(c)
	default:
		l.send(c.peer, l.buf[:n])
	}
}

// send writes b to c, or keeps it (and waits for c to be writable) for
// what c's socket does not take or while c connects.
func (l *epollLoop) send(c *spliced, b []byte) {
	if len(c.pending) > 0 || !c.connected {
		c.pending = append(c.pending, b...)
		return
	}
	n, errno := rawCall(unix.SYS_SENDTO, c.fd, b, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	switch {
	case errno == unix.EAGAIN:
		n = 0
	case errno != 0:
		l.drop(c)
		return
	}
	if n < len(b) {
		c.pending = append(c.pending, b[n:]...)
		if l.watch(c.fd, unix.EPOLLIN|unix.EPOLLOUT, unix.EPOLL_CTL_MOD) != nil {
			l.drop(c)
		}
	}
}

// flush writes what c has pending, and stops waiting for it to be writable
// once nothing is.
func (l *epollLoop) flush(c *spliced) {
	if len(c.pending) > 0 {
		n, errno := rawCall(unix.SYS_SENDTO, c.fd, c.pending, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		switch {
		case errno == unix.EAGAIN:
			return
		case errno != 0:
			l.drop(c)
			return
		}
		c.pending = append(c.pending[:0], c.pending[n:]...)
	}
	if len(c.pending) == 0 && l.watch(c.fd, unix.EPOLLIN, unix.EPOLL_CTL_MOD) != nil {
		l.drop(c)
	}
}

// drop closes c and its peer.
func (l *epollLoop) drop(c *spliced) {
	for ; c != nil && c.fd >= 0; c = c.peer {
		delete(l.conns, c.fd)
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}

// rawCall makes recvfrom or sendto on fd with b as a raw call: the socket
// is non-blocking, so it cannot hold the thread.
func rawCall(trap uintptr, fd int, b []byte, flags int) (int, syscall.Errno) {
	n, _, errno := unix.RawSyscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(flags), 0, 0)
	return int(n), errno
}

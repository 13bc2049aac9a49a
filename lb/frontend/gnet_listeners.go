package frontend

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// closeListeners takes the loops' listening sockets off the port at the
// start of a shutdown, as fasthttp's front end closes its listener: a
// client that connects while requests drain is refused (a dial error any
// client or balancer retries elsewhere) instead of being accepted and
// closed, and a pdlb started beside this one on the same port
// (SO_REUSEPORT) gets every new connection at once.
//
// gnet has no call that closes its listeners and keeps its connections,
// and closing or shutting down a listener under a loop would fail the
// loop's next accept, which stops the whole engine. So each listener's
// descriptor is replaced in place (dup3) by an unbound, listening Unix
// socket: the TCP listener is released (the kernel resets what waited in
// its accept queue, or hands it to another listener on the port with
// net.ipv4.tcp_migrate_req=1), and a loop that still accepts on the
// descriptor finds nothing to accept (EAGAIN) rather than an error.
func (s *GNet) closeListeners() error {
	select {
	case <-s.stopped:
		return nil // gnet closed them, and their numbers may be reused
	default:
	}
	for _, ln := range s.listeners {
		if !ln.current() {
			continue
		}
		stub, err := idleUnixListener()
		if err != nil {
			return err
		}
		err = unix.Dup3(stub, ln.fd, unix.O_CLOEXEC)
		_ = unix.Close(stub)
		if err != nil {
			return fmt.Errorf("replacing listener %d: %w", ln.fd, err)
		}
	}
	return nil
}

// listenerFD is a listening socket: its descriptor and the socket's
// inode, which says whether the descriptor still holds it.
type listenerFD struct {
	fd  int
	ino uint64
}

func (ln listenerFD) current() bool {
	var st unix.Stat_t
	return unix.Fstat(ln.fd, &st) == nil && st.Ino == ln.ino
}

// binding makes front ends bind one at a time, so that the listeners that
// appear on an address while one binds are its own (one process may run
// two on the same port while one hands over to the other).
var binding sync.Mutex

// newListeners lists the TCP sockets listening on addr that are not in
// before.
func newListeners(addr string, before []listenerFD) ([]listenerFD, error) {
	now, err := listenersOn(addr)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(now, func(ln listenerFD) bool { return slices.Contains(before, ln) }), nil
}

// openDescriptors counts the process's open descriptors.
func openDescriptors() (int, error) {
	entries, err := os.ReadDir("/proc/self/fd")
	// Less the directory's own, open while it was read.
	return len(entries) - 1, err
}

// listenersOn lists the process's descriptors that are TCP sockets
// listening on addr.
func listenersOn(addr string) ([]listenerFD, error) {
	want, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	var lns []listenerFD
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || on != 1 {
			continue // not a socket (or ReadDir's own descriptor, closed since), or not listening
		}
		var got netip.AddrPort
		switch sa, _ := unix.Getsockname(fd); sa := sa.(type) {
		case *unix.SockaddrInet4:
			got = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
		case *unix.SockaddrInet6:
			got = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
		default:
			continue
		}
		var st unix.Stat_t
		if got.Port() != want.Port() || got.Addr().Unmap() != want.Addr().Unmap() || unix.Fstat(fd, &st) != nil {
			continue
		}
		lns = append(lns, listenerFD{fd: fd, ino: st.Ino})
	}
	return lns, nil
}

// idleUnixListener is a non-blocking Unix socket listening on an address
// the kernel picks in the abstract namespace (autobind): nothing connects
// to it, so accept on it says EAGAIN.
func idleUnixListener() (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err = unix.Bind(fd, &unix.SockaddrUnix{}); err == nil {
		err = unix.Listen(fd, 1)
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

package limits

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"pdlb/internal/mono"
	"pdlb/internal/spaced"
)

// FDs keeps the process's last file descriptors for accepting. With none
// left, accept fails with EMFILE, and the front ends stop accepting for a
// while (fasthttp a second, the gnet front end's loops 10 ms) while
// connections wait in the queue and clients time out. So a client
// connection given one of the last FDReserve descriptors is closed at once
// (a reset, as over max_conns_per_ip), and an upstream dial is refused
// before it connects when its socket is one of the last FDReserve/2 (less
// two for each other dial in progress, see DialThen): requests on open
// connections still reach their pods, and what stays free covers a few
// accepts at a time and the descriptors nothing here counts (health checks,
// scrapes, event loops). The kernel gives out the lowest free descriptor,
// so a socket's number says how full the table is below it, at no cost; it
// says nothing of the descriptors in use above it, which connections closed
// low in the table leave behind (a flood's resets, its 503s). A front end
// that can count its sockets (SetOpen) makes the guard take the larger of
// the two: on gnet, a table filled through such holes let an accept fail
// with EMFILE.
// A nil *FDs guards nothing.
type FDs struct {
	limit                int
	acceptLine, dialLine int
	shed, refused        atomic.Uint64
	// unaccepted counts the accepts the kernel refused (AcceptFailed).
	unaccepted atomic.Uint64
	// dialing counts the dials admitted and not yet done (DialThen).
	dialing atomic.Int64
	// open, if set, estimates the descriptors the process holds (SetOpen).
	open atomic.Pointer[func() int]
	log  *slog.Logger
	// warned spaces the warnings (fdWarnEvery, on mono's clock).
	warned spaced.Lines
}

// fdWarnEvery spaces the warnings of a process at its limit.
const fdWarnEvery = time.Minute

// ErrOutOfFDs is the error of an upstream dial FDs refused.
var ErrOutOfFDs = errors.New("the gateway is at its open-files limit")

// NewFDs guards the open-files limit (RLIMIT_NOFILE) the process has now;
// log gets a warning a minute while the guard refuses anything.
func NewFDs(log *slog.Logger) (*FDs, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return nil, fmt.Errorf("open-files limit: %w", err)
	}
	return FDsFor(int(min(rl.Cur, 1<<30)), log), nil
}

// FDsFor guards an open-files limit of limit descriptors: NewFDs's, or a
// test's.
func FDsFor(limit int, log *slog.Logger) *FDs {
	reserve := FDReserve(limit)
	return &FDs{limit: limit, acceptLine: limit - reserve, dialLine: limit - reserve/2, log: log}
}

// FDReserve is how many of limit descriptors client connections leave:
// 1/16 of them, between 16 and 256.
func FDReserve(limit int) int { return min(max(limit/16, 16), 256) }

// SetOpen gives the guard an estimate of the descriptors the process
// holds (those open when the front end started, plus its sockets), which
// it weighs with each socket's number; nil takes it back.
func (f *FDs) SetOpen(open func() int) {
	if f == nil {
		return
	}
	if open == nil {
		f.open.Store(nil)
		return
	}
	f.open.Store(&open)
}

// used is how full the table is, as far as the guard can tell, given a
// socket just numbered fd.
func (f *FDs) used(fd int) int {
	if open := f.open.Load(); open != nil {
		return max(fd, (*open)())
	}
	return fd
}

// Accept reports whether a client connection on descriptor fd may stay
// open; on false the caller closes it.
func (f *FDs) Accept(fd int) bool {
	if f == nil || f.used(fd) < f.acceptLine {
		return true
	}
	f.shed.Add(1)
	f.warn(refusedWarning)
	return false
}

// Dial connects to the TCP address addr within timeout, refusing with
// ErrOutOfFDs (in a *net.OpError, as any dial error) when the socket is
// one of the last reserved for accepting.
func (f *FDs) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := f.DialThen(addr, timeout, func(d net.Conn) error { c = d; return nil })
	return c, err
}

// DialThen is Dial handing the connection to then, which may take one
// more descriptor (the gnet front end's Enroll dups the socket); its error is
// DialThen's. Until then returns, the dial counts as in progress: dials at
// once each hold a socket while they connect and may take another after,
// so a socket is refused when its number plus two for each dial in
// progress reaches the line.
//
// A host name in addr is resolved through the process's cache of pod
// names (hostCache); its addresses are tried in turn within timeout.
func (f *FDs) DialThen(addr string, timeout time.Duration, then func(net.Conn) error) error {
	d := net.Dialer{Deadline: time.Now().Add(timeout)}
	var admitted atomic.Int64
	if f != nil {
		// Control runs once per address tried (twice when IPv4 and IPv6
		// race), so each admission is counted.
		d.Control = func(_, _ string, c syscall.RawConn) error {
			err := f.control(c)
			if err == nil {
				admitted.Add(1)
			}
			return err
		}
		defer func() { f.dialing.Add(-admitted.Load()) }()
	}
	c, err := dialHost(&d, addr, timeout)
	if err != nil {
		return OutOfFDs(err)
	}
	return OutOfFDs(then(c))
}

// dialHost dials addr with d, by the addresses podHosts has for its host.
func dialHost(d *net.Dialer, addr string, timeout time.Duration) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	ips, err := podHosts.addrs(host, timeout)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	for _, ip := range ips {
		var c net.Conn
		if c, err = d.Dial("tcp", net.JoinHostPort(ip.String(), port)); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// control runs between socket() and connect(): a refused socket is closed
// before it connects to anything.
func (f *FDs) control(c syscall.RawConn) error {
	var fd uintptr
	if err := c.Control(func(s uintptr) { fd = s }); err != nil {
		return err
	}
	if n := f.dialing.Add(1); f.used(int(fd))+2*int(n) < f.dialLine {
		return nil
	}
	f.dialing.Add(-1)
	f.refused.Add(1)
	f.warn(refusedWarning)
	return ErrOutOfFDs
}

// NoFDs reports whether err came of the gateway's own open-files limit:
// ErrOutOfFDs, or no descriptor left in the process or the system (EMFILE,
// ENFILE). Such an error says nothing about the pod.
func NoFDs(err error) bool {
	return errors.Is(err, ErrOutOfFDs) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// OutOfFDs returns a dial's err as ErrOutOfFDs (in a *net.OpError) when it
// is NoFDs, else err unchanged.
func OutOfFDs(err error) error {
	if !NoFDs(err) || errors.Is(err, ErrOutOfFDs) {
		return err
	}
	return &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("%w (%w)", ErrOutOfFDs, err)}
}

// refusedWarning is the guard's own refusals' warning.
const refusedWarning = "at the open-files limit: new client connections are closed and new upstream connections refused; raise the limit (systemd LimitNOFILE, ulimit -n)"

// warn logs msg with args, the limit and the metric, once a minute
// (fdWarnEvery) whatever the message: they are one trouble.
func (f *FDs) warn(msg string, args ...any) {
	if f.log == nil {
		return
	}
	if held, ok := f.warned.Allow(mono.Now(), fdWarnEvery); ok {
		f.log.Warn(msg, append(args, "limit", f.limit, "metric", MetricFDRefused, "suppressed", held)...)
	}
}

// AcceptFailed counts an accept the kernel refused for want of
// descriptors or memory (err: EMFILE, ENFILE, ENOBUFS, ENOMEM), which the
// guard's line did not keep from happening (descriptors it does not see,
// the system's own limit): the front end rests its listener and the
// client waits in the listen queue. It warns as the guard's refusals do.
func (f *FDs) AcceptFailed(err error) {
	if f == nil {
		return
	}
	f.unaccepted.Add(1)
	f.warn("accept failed: new client connections wait in the listen queue; raise the open-files limit (systemd LimitNOFILE, ulimit -n) or fs.file-max", "err", err)
}

// Limit is the open-files limit guarded.
func (f *FDs) Limit() int { return f.limit }

// Wrap returns ln resetting the connections Accept refuses, as the gnet
// front end's OnOpen does: fasthttp survives EMFILE (it waits a second and accepts
// again), but accepts nothing meanwhile; each such failure (NoFDs) is
// AcceptFailed's.
func (f *FDs) Wrap(ln net.Listener) net.Listener {
	if f == nil {
		return ln
	}
	return &refusing{Listener: ln, admit: f.admit, failed: func(err error) {
		if NoFDs(err) {
			f.AcceptFailed(err)
		}
	}}
}

// admit is Accept for a connection of a net.Listener.
func (f *FDs) admit(c net.Conn) (net.Conn, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c, true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c, true
	}
	keep := true
	_ = rc.Control(func(fd uintptr) { keep = f.Accept(int(fd)) })
	return c, keep
}

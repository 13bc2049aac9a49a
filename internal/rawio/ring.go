package rawio

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Ring makes a batch of sends and receives on non-blocking sockets with
// one io_uring_enter: where a system call is dear (a guest whose kernel
// entry flushes the TLB), sixteen sendto and recvfrom calls cost several
// times the one entry that carries them all. Every operation asks for no
// wait (MSG_DONTWAIT), so io_uring runs each as the submission reaches it
// and completes it there, with the bytes it moved or its error
// (syscall.EAGAIN when the socket had no room or nothing to read): Submit
// returns once all are done, and no buffer is the kernel's after it. A
// Ring is its owner's alone (one goroutine at a time).
type Ring struct {
	fd                     int
	sqHead, sqTail, sqMask *uint32
	cqHead, cqTail, cqMask *uint32
	sqes                   []sqe
	cqes                   []cqe
	rings, sqeMap          []byte
	held                   [][]byte // the queued ops' buffers, alive until Submit returns
	results                []Result
}

// Result is an operation's outcome: the bytes sent or received (0 with a
// nil Err for a receive: the peer closed), or the error.
type Result struct {
	N   int
	Err error
}

// The kernel's structures (include/uapi/linux/io_uring.h).
type (
	sqRingOffsets struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqRingOffsets struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
	ringParams struct {
		sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
		resv                                                                   [3]uint32
		sqOff                                                                  sqRingOffsets
		cqOff                                                                  cqRingOffsets
	}
	sqe struct {
		opcode, flags         uint8
		ioprio                uint16
		fd                    int32
		off, addr             uint64
		len, msgFlags         uint32
		userData              uint64
		bufIndex, personality uint16
		spliceFDIn            int32
		addr3, pad            uint64
	}
	cqe struct {
		userData uint64
		res      int32
		flags    uint32
	}
)

const (
	opSend = 26 // IORING_OP_SEND
	opRecv = 27 // IORING_OP_RECV

	setupClamp     = 1 << 4 // IORING_SETUP_CLAMP: fewer entries where the kernel allows fewer
	setupSubmitAll = 1 << 7 // IORING_SETUP_SUBMIT_ALL (5.18): an op that fails does not stop those behind it

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP: both rings in one mapping

	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
	registerProbe  = 8      // IORING_REGISTER_PROBE

	offSQRing = 0          // IORING_OFF_SQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES
)

// ErrRingUnsupported is NewRing's answer where the kernel has no io_uring
// this Ring can use (older than 5.18, or turned off); the error wrapping
// it says what was missing.
var ErrRingUnsupported = errors.New("rawio: no io_uring with SUBMIT_ALL, SEND and RECV")

// NewRing sets up a ring for batches of up to entries operations (the
// kernel may clamp them; Cap says). Where io_uring is missing, refused
// (kernel.io_uring_disabled, a seccomp filter) or too old, the error says
// so, and the caller makes its calls one by one.
func NewRing(entries int) (*Ring, error) {
	p := ringParams{flags: setupClamp | setupSubmitAll}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		// EINVAL: a kernel before SUBMIT_ALL; ENOSYS or EPERM: none, or
		// refused.
		return nil, fmt.Errorf("%w: io_uring_setup: %w", ErrRingUnsupported, errno)
	}
	r := &Ring{fd: int(fd)}
	if p.features&featSingleMmap == 0 {
		r.Close()
		return nil, fmt.Errorf("%w: no IORING_FEAT_SINGLE_MMAP", ErrRingUnsupported)
	}
	if err := r.probe(opSend, opRecv); err != nil {
		r.Close()
		return nil, err
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*uint32(unsafe.Sizeof(cqe{})))
	var err error
	if r.rings, err = unix.Mmap(r.fd, offSQRing, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("rawio: mapping io_uring's rings: %w", err)
	}
	if r.sqeMap, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("rawio: mapping io_uring's entries: %w", err)
	}
	base := unsafe.Pointer(&r.rings[0])
	at := func(off uint32) *uint32 { return (*uint32)(unsafe.Add(base, off)) }
	r.sqHead, r.sqTail, r.sqMask = at(p.sqOff.head), at(p.sqOff.tail), at(p.sqOff.ringMask)
	r.cqHead, r.cqTail, r.cqMask = at(p.cqOff.head), at(p.cqOff.tail), at(p.cqOff.ringMask)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMap[0])), p.sqEntries)
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(base, p.cqOff.cqes)), p.cqEntries)
	// Slot i of the submission array names entry i, for good: ops go in
	// in the ring's order.
	for i, a := 0, unsafe.Slice(at(p.sqOff.array), p.sqEntries); i < len(a); i++ {
		a[i] = uint32(i)
	}
	r.held = make([][]byte, 0, p.sqEntries)
	return r, nil
}

// probe asks the kernel whether it runs ops (a sandbox's io_uring may
// set a ring up and still lack them).
func (r *Ring) probe(ops ...uint8) error {
	// struct io_uring_probe: last_op, ops_len, 14 bytes reserved, then
	// 8 bytes an op: op, a byte reserved, flags (IO_URING_OP_SUPPORTED: 1).
	var probe [16 + 256*8]byte
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerProbe, uintptr(unsafe.Pointer(&probe[0])), 256, 0, 0); errno != 0 {
		return fmt.Errorf("%w: IORING_REGISTER_PROBE: %w", ErrRingUnsupported, errno)
	}
	for _, op := range ops {
		if e := probe[16+8*int(op):]; op > probe[0] || e[2]&1 == 0 {
			return fmt.Errorf("%w: no op %d", ErrRingUnsupported, op)
		}
	}
	return nil
}

// Close releases the ring.
func (r *Ring) Close() {
	if r.sqeMap != nil {
		_ = unix.Munmap(r.sqeMap)
	}
	if r.rings != nil {
		_ = unix.Munmap(r.rings)
	}
	_ = unix.Close(r.fd)
	r.rings, r.sqeMap, r.sqes, r.cqes = nil, nil, nil, nil
}

// Cap is how many operations a batch takes.
func (r *Ring) Cap() int { return len(r.sqes) }

// Len is how many operations wait for Submit.
func (r *Ring) Len() int { return len(r.held) }

// Send queues a send of b on fd, with sendto's flags; b must be on the
// heap and unchanged until Submit. Queue at most Cap operations.
func (r *Ring) Send(fd int, b []byte) { r.queue(opSend, fd, b, flags) }

// Recv queues a receive into p from fd, as Recv does; p must be on the
// heap.
func (r *Ring) Recv(fd int, p []byte) { r.queue(opRecv, fd, p, unix.MSG_DONTWAIT) }

func (r *Ring) queue(op uint8, fd int, b []byte, msgFlags uint32) {
	i := len(r.held)
	tail := atomic.LoadUint32(r.sqTail)
	e := &r.sqes[tail&*r.sqMask]
	*e = sqe{opcode: op, fd: int32(fd), len: uint32(len(b)), msgFlags: msgFlags, userData: uint64(i)}
	if len(b) > 0 {
		e.addr = uint64(uintptr(unsafe.Pointer(&b[0])))
	}
	r.held = append(r.held, b)
	atomic.StoreUint32(r.sqTail, tail+1)
}

// Submit runs the queued operations with one io_uring_enter (more only
// when a signal cuts the wait short) and returns their results in the
// order they were queued, valid until the next Submit.
func (r *Ring) Submit() []Result {
	n := len(r.held)
	if n == 0 {
		return nil
	}
	r.results = r.results[:0]
	for range n {
		r.results = append(r.results, Result{Err: errPending})
	}
	for done := 0; done < n; {
		// What the kernel has not taken yet: all of it, unless a signal
		// cut the last call short.
		toSubmit := atomic.LoadUint32(r.sqTail) - atomic.LoadUint32(r.sqHead)
		_, _, errno := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(n-done), enterGetEvents, 0, 0)
		done += r.reap()
		if errno != 0 && errno != unix.EINTR {
			// The ring itself failed (it never should): what did not
			// complete has its error, and the kernel is told to skip
			// the entries it did not take.
			for i := range r.results {
				if r.results[i].Err == errPending {
					r.results[i].Err = errno
				}
			}
			atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqHead))
			break
		}
	}
	r.finish()
	return r.results
}

// errPending marks a result not completed yet.
var errPending = errors.New("rawio: pending")

// reap takes the completions there are and says how many.
func (r *Ring) reap() int {
	head, tail := atomic.LoadUint32(r.cqHead), atomic.LoadUint32(r.cqTail)
	n := int(tail - head)
	for ; head != tail; head++ {
		c := &r.cqes[head&*r.cqMask]
		if c.res < 0 {
			r.results[c.userData] = Result{Err: syscall.Errno(-c.res)}
		} else {
			r.results[c.userData] = Result{N: int(c.res)}
		}
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// finish forgets the batch's buffers.
func (r *Ring) finish() {
	runtime.KeepAlive(r.held)
	clear(r.held)
	r.held = r.held[:0]
}

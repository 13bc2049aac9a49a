package kvxfer

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// Transport pulls held KV from a source pod. Implementations must be safe
// for concurrent use; TCP is the one here, and an RDMA or NIXL transport
// (one-sided reads of registered memory) fits the same contract.
type Transport interface {
	// Pull fetches the KV d names. When wait is positive and the source
	// does not hold it yet, the source waits up to wait for it to appear
	// (SGLang's bootstrap rooms, TensorRT-LLM's generation-first legs:
	// the decode side asks before the prefill is done); when it is zero,
	// a missing handle fails at once with ErrNotHeld. Cancelling ctx
	// abandons the pull; the source keeps the KV for a later one.
	Pull(ctx context.Context, d Descriptor, wait time.Duration) (Transfer, error)
}

// Transfer is what one pull moved and how long it took.
type Transfer struct {
	Bytes int64
	// Elapsed runs from dialling to the last byte: connection set-up,
	// any wait for the KV to be held, and the bytes themselves.
	Elapsed time.Duration
}

// TCP pulls over a TCP connection per transfer, the wire format in wire.go.
// The zero value is ready to use.
type TCP struct {
	// DialTimeout bounds connecting (default 5 s).
	DialTimeout time.Duration
	// IOTimeout bounds each read of KV bytes, a stall detector (default
	// DefaultIOTimeout); the wait for the KV to be held is bounded by the
	// wait argument instead.
	IOTimeout time.Duration
}

const defaultDialTimeout = 5 * time.Second

// maxWait is the longest wait the wire's millisecond field carries.
const maxWait = time.Duration(1<<32-1) * time.Millisecond

// Pull implements Transport.
func (t TCP) Pull(ctx context.Context, d Descriptor, wait time.Duration) (Transfer, error) {
	start := time.Now()
	dialTimeout, ioTimeout := t.DialTimeout, t.IOTimeout
	if dialTimeout == 0 {
		dialTimeout = defaultDialTimeout
	}
	if ioTimeout == 0 {
		ioTimeout = DefaultIOTimeout
	}
	if d.Handle == "" || len(d.Handle) > maxHandleLen {
		return Transfer{}, fmt.Errorf("%w: handle %q", errDescriptor, d.Handle)
	}
	dialer := net.Dialer{Timeout: dialTimeout}
	c, err := dialer.DialContext(ctx, "tcp", d.Addr)
	if err != nil {
		return Transfer{}, fmt.Errorf("kvxfer: pull %s: %w", d, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() }) // unblocks any read or write
	defer stop()
	fail := func(err error) (Transfer, error) {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Transfer{}, fmt.Errorf("kvxfer: pull %s: %w", d, err)
	}
	wait = min(max(wait, 0), maxWait)
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.Write(appendRequest(nil, d.Handle, uint32(wait/time.Millisecond))); err != nil {
		return fail(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait + ioTimeout))
	r := bufio.NewReaderSize(c, chunk)
	status, err := r.ReadByte()
	if err != nil {
		return fail(err)
	}
	switch status {
	case statusOK:
	case statusNotHeld:
		return Transfer{}, fmt.Errorf("%w: %s", ErrNotHeld, d)
	default:
		return fail(fmt.Errorf("%w: status %d", errProtocol, status))
	}
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fail(err)
	}
	n := int64(binary.BigEndian.Uint64(hdr[:]))
	if n < 0 {
		return fail(fmt.Errorf("%w: length %d", errProtocol, n))
	}
	got, err := io.Copy(io.Discard, &stallReader{c: c, r: r, n: n, timeout: ioTimeout})
	if err != nil || got != n {
		return fail(fmt.Errorf("received %d of %d bytes: %w", got, n, cmpErr(err, io.ErrUnexpectedEOF)))
	}
	elapsed := time.Since(start)
	_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
	if _, err := c.Write([]byte{ackByte}); err != nil {
		return fail(err)
	}
	// The server closes once it has the ack and has released the KV; wait
	// for that, so a caller that sees success finds the source freed.
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	_, _ = r.ReadByte()
	return Transfer{Bytes: n, Elapsed: elapsed}, nil
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// stallReader reads at most n bytes, failing when one read waits longer
// than timeout.
type stallReader struct {
	c       net.Conn
	r       io.Reader
	n       int64
	timeout time.Duration
}

func (s *stallReader) Read(p []byte) (int, error) {
	if s.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.n {
		p = p[:s.n]
	}
	_ = s.c.SetReadDeadline(time.Now().Add(s.timeout))
	k, err := s.r.Read(p)
	s.n -= int64(k)
	if err == io.EOF && s.n > 0 {
		err = io.ErrUnexpectedEOF
	}
	return k, err
}

var _ Transport = TCP{}

package evloop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"pdlb/internal/rawio"
)

func TestMain(m *testing.M) {
	// A loop that holds connections keeps its P while it waits (see the
	// package comment): leave Ps over for the tests' own goroutines.
	if runtime.GOMAXPROCS(0) < 8 {
		runtime.GOMAXPROCS(8)
	}
	goleak.VerifyTestMain(m)
}

// noRing: the tests run on loops that make a system call per send and
// receive; TestWithoutRing sets it for a run of them all.
var noRing = os.Getenv(noRingEnv) == "1"

const noRingEnv = "EVLOOP_TEST_NO_RING"

// TestWithoutRing runs the package's other tests again on loops without
// io_uring (Options.NoRing), in a copy of the test binary: both ways of
// making the loops' socket calls pass the same tests.
func TestWithoutRing(t *testing.T) {
	if noRing {
		t.Skip("the copy itself")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.timeout=5m", "-test.skip=^TestWithoutRing$")
	cmd.Env = append(os.Environ(), noRingEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the tests without io_uring: %v\n%s", err, out)
	}
}

// TestRingInUse: where the kernel has io_uring, the loops batch with it
// unless told not to, and Ring says which.
func TestRingInUse(t *testing.T) {
	if r, err := rawio.NewRing(8); err != nil {
		t.Skipf("no io_uring here: %v", err)
	} else {
		r.Close()
	}
	s := start(t, newHandler(t), 1)
	if err := s.e.Ring(); (err == nil) == noRing {
		t.Fatalf("Ring() = %v with NoRing %v", err, noRing)
	}
	if noRing && !errors.Is(s.e.Ring(), ErrNoRing) {
		t.Fatalf("Ring() = %v, want ErrNoRing", s.e.Ring())
	}
}

// goid is the calling goroutine's id, to tell that a callback runs on
// its loop's goroutine.
func goid() uint64 {
	var b [64]byte
	f := bytes.Fields(b[:runtime.Stack(b[:], false)]) // "goroutine 12 [running]:"
	id, _ := strconv.ParseUint(string(f[1]), 10, 64)
	return id
}

// handler is a Handler made of the test's functions (echo when traffic is
// nil); it checks that every connection opens before it closes and
// closes once.
type handler struct {
	t       *testing.T
	booted  chan *Engine
	open    func(c *Conn) ([]byte, Action)
	traffic func(c *Conn) Action
	closed  func(c *Conn, err error)
	tick    func() time.Duration
	pause   func(err error, pause time.Duration)

	mu     sync.Mutex
	opened map[*Conn]bool
	closes map[*Conn]int
	loopG  map[*Loop]uint64 // each loop's goroutine
}

func newHandler(t *testing.T) *handler {
	return &handler{t: t, opened: map[*Conn]bool{}, closes: map[*Conn]int{}, loopG: map[*Loop]uint64{}}
}

func (h *handler) OnBoot(e *Engine) { h.booted <- e }

func (h *handler) OnOpen(c *Conn) ([]byte, Action) {
	if !h.onLoop(c.EventLoop()) {
		h.t.Error("OnOpen off its loop's goroutine")
	}
	h.mu.Lock()
	h.opened[c] = true
	h.mu.Unlock()
	if h.open != nil {
		return h.open(c)
	}
	return nil, None
}

func (h *handler) OnTraffic(c *Conn) Action {
	if !h.onLoop(c.EventLoop()) {
		h.t.Error("OnTraffic off its loop's goroutine")
	}
	if h.traffic != nil {
		return h.traffic(c)
	}
	b, _ := c.Next(-1)
	_, _ = c.Write(b)
	return None
}

func (h *handler) OnClose(c *Conn, err error) {
	if !h.onLoop(c.EventLoop()) {
		h.t.Error("OnClose off its loop's goroutine")
	}
	h.mu.Lock()
	h.closes[c]++
	n, opened := h.closes[c], h.opened[c]
	h.mu.Unlock()
	if n != 1 || !opened {
		h.t.Errorf("OnClose for %v: call %d, opened %v", c.RemoteAddr(), n, opened)
	}
	if h.closed != nil {
		h.closed(c, err)
	}
}

func (h *handler) OnAcceptPause(err error, pause time.Duration) {
	if h.pause != nil {
		h.pause(err, pause)
	}
}

func (h *handler) OnTick() time.Duration {
	if h.tick != nil {
		return h.tick()
	}
	return time.Hour
}

// onLoop says whether the caller runs on l's goroutine.
func (h *handler) onLoop(l *Loop) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.loopG[l] == goid()
}

type server struct {
	e    *Engine
	h    *handler
	addr string
	ran  chan struct{} // closed when Run returned, with err
	err  error
}

// start runs h on loops loops on 127.0.0.1 and returns once they listen;
// the test's cleanup stops them and checks that Run returned nil and
// every connection opened closed once.
func start(t *testing.T, h *handler, loops int) *server {
	t.Helper()
	return startAt(t, h, loops, "")
}

// startAt is start on at, unless it is empty.
func startAt(t *testing.T, h *handler, loops int, at string) *server {
	t.Helper()
	for try := 0; ; try++ {
		addr := at
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		if at == "" && loops > 1 {
			// Each loop binds the address: the port must be known.
			addr = freeAddr(t)
		}
		s := &server{h: h, ran: make(chan struct{})}
		h.booted = make(chan *Engine, 1)
		go func() {
			s.err = Run(h, addr, Options{Loops: loops, NoRing: noRing})
			close(s.ran)
		}()
		select {
		case s.e = <-h.booted:
		case <-s.ran:
			if at == "" && try < 3 && errors.Is(s.err, unix.EADDRINUSE) {
				continue // someone took the free port meanwhile
			}
			t.Fatalf("Run(%s): %v", addr, s.err)
		}
		s.addr = s.e.loops[0].local.String()
		t.Cleanup(func() {
			if err := s.stop(t); err != nil {
				t.Errorf("Run: %v", err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			for c := range h.opened {
				if h.closes[c] != 1 {
					t.Errorf("connection from %v closed %d times", c.RemoteAddr(), h.closes[c])
				}
			}
			if n := s.e.CountConnections(); n != 0 {
				t.Errorf("CountConnections after Run: %d", n)
			}
		})
		for _, l := range s.e.loops {
			var id uint64
			runOn(t, l, func() { id = goid() })
			h.mu.Lock()
			h.loopG[l] = id
			h.mu.Unlock()
		}
		return s
	}
}

// stop stops the engine and returns what Run did.
func (s *server) stop(t *testing.T) error {
	t.Helper()
	s.e.Stop()
	select {
	case <-s.ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Stop")
	}
	return s.err
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runOn runs fn on l and waits for it.
func runOn(t *testing.T, l *Loop, fn func()) {
	t.Helper()
	done := make(chan struct{})
	if err := l.Execute(func() { fn(); close(done) }); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Execute's func did not run")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// dial connects to addr, with a deadline that keeps a failing test from
// hanging.
func dial(addr string) (*net.TCPConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c.(*net.TCPConn), nil
}

func mustDial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg to c and reads back what it expects.
func roundTrip(c net.Conn, msg, want string) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read after %q: %w", msg, err)
	}
	if string(got) != want {
		return fmt.Errorf("got %q, want %q", got, want)
	}
	return nil
}

// expectEOF reads c to its end, which must come with nothing more than
// want before it.
func expectEOF(t *testing.T, c net.Conn, want string) {
	t.Helper()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != want {
		t.Fatalf("read to EOF: %q, %v; want %q, EOF", got, err, want)
	}
}

// TestEcho: several clients on two loops sharing a port each get their
// messages back, sent one by one and then pipelined in one write; OnOpen
// sees the addresses; a client closing is OnClose with io.EOF.
func TestEcho(t *testing.T) {
	h := newHandler(t)
	var mu sync.Mutex
	addrs := map[string]string{} // client's address → server's, per OnOpen
	var eofs atomic.Int32
	h.open = func(c *Conn) ([]byte, Action) {
		mu.Lock()
		addrs[c.RemoteAddr().String()] = c.LocalAddr().String()
		mu.Unlock()
		return nil, None
	}
	h.closed = func(c *Conn, err error) {
		if !errors.Is(err, io.EOF) {
			t.Errorf("OnClose after the client closed: %v, want EOF", err)
		}
		eofs.Add(1)
	}
	s := start(t, h, 2)

	const clients, msgs = 8, 40
	conns := make([]*net.TCPConn, clients)
	for i := range conns {
		conns[i] = mustDial(t, s.addr)
	}
	waitFor(t, "every client open", func() bool { return s.e.CountConnections() == clients })
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			var rest []byte
			for j := range msgs {
				m := fmt.Sprintf("client %d message %d\n", i, j)
				if j >= msgs/2 {
					rest = append(rest, m...)
					continue
				}
				if err := roundTrip(c, m, m); err != nil {
					t.Error(err)
					return
				}
			}
			if err := roundTrip(c, string(rest), string(rest)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	for _, c := range conns {
		if got := addrs[c.LocalAddr().String()]; got != s.addr {
			t.Errorf("OnOpen's LocalAddr for %v: %q, want %q", c.LocalAddr(), got, s.addr)
		}
	}
	mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	// The count drops before OnClose runs: wait for the calls.
	waitFor(t, "every connection closed", func() bool { return s.e.CountConnections() == 0 && eofs.Load() == clients })
}

// TestTurnBatch: what several clients sent while their loop was busy is
// read in one turn, and the echoes written in it go out at its end (with
// a ring, one io_uring_enter for the reads and one for the writes), each
// whole to its own client; a larger message than a batch's slice of the
// loop's buffer comes whole over the turns after.
func TestTurnBatch(t *testing.T) {
	h := newHandler(t)
	var turns map[uint64]bool // the turns that read a round's messages; on the loop
	h.traffic = func(c *Conn) Action {
		turns[c.EventLoop().Turn()] = true
		b, _ := c.Next(-1)
		_, _ = c.Write(b)
		return None
	}
	s := start(t, h, 1)
	const clients = 20 // more than a batch's 16 reads
	conns := make([]*net.TCPConn, clients)
	for i := range conns {
		conns[i] = mustDial(t, s.addr)
	}
	waitFor(t, "every client open", func() bool { return s.e.CountConnections() == clients })
	for round := range 3 {
		held, release := make(chan struct{}), make(chan struct{})
		if err := s.e.loops[0].Execute(func() { turns = map[uint64]bool{}; close(held); <-release }); err != nil {
			t.Fatal(err)
		}
		<-held
		msgs := make([]string, clients)
		for i, c := range conns {
			msgs[i] = fmt.Sprintf("round %d client %d\n", round, i)
			if round == 2 && i%5 == 0 {
				// Past the 16 KiB a read of a batch of 16 gets.
				msgs[i] = strings.Repeat(msgs[i], 40<<10/len(msgs[i]))
			}
			if _, err := c.Write([]byte(msgs[i])); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(20 * time.Millisecond) // in the loop's sockets, not on their way
		close(release)
		for i, c := range conns {
			got := make([]byte, len(msgs[i]))
			if n, err := io.ReadFull(c, got); err != nil || string(got) != msgs[i] {
				t.Fatalf("round %d client %d: %d bytes back, %v; want its %d, the same", round, i, n, err, len(msgs[i]))
			}
		}
		read := make(chan int, 1)
		if err := s.e.loops[0].Execute(func() { read <- len(turns) }); err != nil {
			t.Fatal(err)
		}
		if n := <-read; round < 2 && n != 1 {
			t.Errorf("round %d: the %d clients' messages were read in %d turns, want one", round, clients, n)
		}
	}
}

// TestTrimSpares: the buffers a loop's drained outbound queues gave back
// (with a ring, every echo's) stay for its next writes until a period
// passes with them unused; then TrimSpares lets them go.
func TestTrimSpares(t *testing.T) {
	s := start(t, newHandler(t), 1)
	conns := make([]*net.TCPConn, 4)
	for i := range conns {
		conns[i] = mustDial(t, s.addr)
		if err := roundTrip(conns[i], "ping\n", "ping\n"); err != nil {
			t.Fatal(err)
		}
	}
	l := s.e.loops[0]
	kept := make(chan [2]int, 1)
	if err := l.Execute(func() {
		before := l.outs.Len()
		l.TrimSpares(100, 100) // the first: nothing was counted unused before it
		l.TrimSpares(200, 100)
		kept <- [2]int{before, l.outs.Len()}
	}); err != nil {
		t.Fatal(err)
	}
	got := <-kept
	if l.ring != nil && got[0] == 0 {
		t.Error("the loop kept no buffer of its echoes for its next writes")
	}
	if got[1] != 0 {
		t.Errorf("%d of %d buffers kept after a period unused, want none", got[1], got[0])
	}
}

// TestPartialLines: a handler that consumes only whole lines gets the
// rest back, after the next read, in order: lines split across writes
// that arrive apart, several in one write, and lines longer than the
// loop's read buffer come back whole.
func TestPartialLines(t *testing.T) {
	h := newHandler(t)
	maxHeld := 0 // the most bytes left waiting; the loop's
	h.traffic = func(c *Conn) Action {
		b, err := c.Peek(-1)
		if err != nil || len(b) != c.InboundBuffered() {
			t.Errorf("Peek(-1): %d bytes, %v; %d wait", len(b), err, c.InboundBuffered())
		}
		i := bytes.LastIndexByte(b, '\n')
		if i < 0 {
			maxHeld = max(maxHeld, len(b))
			return None
		}
		lines, err := c.Next(i + 1)
		if err != nil {
			t.Errorf("Next(%d): %v", i+1, err)
		}
		if _, err := c.Write(lines); err != nil {
			t.Errorf("Write: %v", err)
		}
		if left := c.InboundBuffered(); left != len(b)-i-1 {
			t.Errorf("after Next: %d bytes wait, want %d", left, len(b)-i-1)
		}
		maxHeld = max(maxHeld, c.InboundBuffered())
		return None
	}
	s := start(t, h, 1)

	var stream []byte
	for i, n := range []int{5, 0, 100 << 10, 1, 1, 300 << 10, 3, 20000, 70000, 2} {
		for j := range n {
			stream = append(stream, byte('a'+(i*7+j)%26))
		}
		stream = append(stream, '\n')
	}
	c := mustDial(t, s.addr)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(stream))
		n, err := io.ReadFull(c, b)
		if err != nil {
			t.Errorf("read back: %d of %d bytes: %v", n, len(b), err)
		}
		got <- b[:n]
	}()
	// Pieces of random sizes, apart in time so that they arrive as
	// separate reads.
	r := rand.New(rand.NewPCG(1, 2))
	for off := 0; off < len(stream); {
		n := min(len(stream)-off, 1+r.IntN(48<<10))
		if _, err := c.Write(stream[off : off+n]); err != nil {
			t.Fatal(err)
		}
		off += n
		time.Sleep(time.Millisecond)
	}
	if b := <-got; !bytes.Equal(b, stream) {
		t.Fatalf("echoed stream differs: %d bytes, want %d", len(b), len(stream))
	}
	var held int
	runOn(t, s.e.loops[0], func() { held = maxHeld })
	if held <= readSize {
		t.Errorf("the most held back was %d bytes; want a partial line above %d", held, readSize)
	}
}

// TestFrames: Peek(n) says io.ErrShortBuffer until a length-prefixed
// frame is whole; Discard and Next then take its header and body, the
// frames arriving in random pieces.
func TestFrames(t *testing.T) {
	h := newHandler(t)
	shorts := 0 // the loop's
	h.traffic = func(c *Conn) Action {
		for {
			hdr, err := c.Peek(4)
			if err != nil {
				if !errors.Is(err, io.ErrShortBuffer) {
					t.Errorf("Peek(4): %v", err)
				}
				shorts++
				return None
			}
			n := int(binary.BigEndian.Uint32(hdr))
			if _, err := c.Peek(4 + n); err != nil {
				if !errors.Is(err, io.ErrShortBuffer) {
					t.Errorf("Peek(%d): %v", 4+n, err)
				}
				shorts++
				return None
			}
			if d, err := c.Discard(4); d != 4 || err != nil {
				t.Errorf("Discard(4): %d, %v", d, err)
			}
			var body []byte
			if n > 0 { // Next(0) would take everything
				body, err = c.Next(n)
				if err != nil || len(body) != n {
					t.Errorf("Next(%d): %d bytes, %v", n, len(body), err)
				}
			}
			reply := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(n)), crc32.ChecksumIEEE(body))
			_, _ = c.Write(reply)
		}
	}
	s := start(t, h, 1)

	sizes := []int{0, 1, 3, 100, 70000, 200000, 5, 16 << 10}
	var stream, want []byte
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range sizes {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(r.Uint32())
		}
		stream = binary.BigEndian.AppendUint32(stream, uint32(n))
		stream = append(stream, body...)
		want = binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(want, uint32(n)), crc32.ChecksumIEEE(body))
	}
	c := mustDial(t, s.addr)
	for off := 0; off < len(stream); {
		n := min(len(stream)-off, 1+r.IntN(40<<10))
		if _, err := c.Write(stream[off : off+n]); err != nil {
			t.Fatal(err)
		}
		off += n
		time.Sleep(time.Millisecond)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("replies %x, %v; want %x", got, err, want)
	}
	var n int
	runOn(t, s.e.loops[0], func() { n = shorts })
	if n == 0 {
		t.Error("Peek never said ErrShortBuffer")
	}
}

// counting is n bytes of big-endian uint32 counters, so that a byte out
// of place shows.
func counting(n int) []byte {
	b := make([]byte, n)
	for i := 0; i+4 <= n; i += 4 {
		binary.BigEndian.PutUint32(b[i:], uint32(i/4))
	}
	return b
}

// smallBuffers shrinks the server socket's send buffer, so that the
// outbound queue, not the kernel, holds what a client does not read.
func smallBuffers(t *testing.T, c *Conn) {
	if err := unix.SetsockoptInt(c.Fd(), unix.SOL_SOCKET, unix.SO_SNDBUF, 32<<10); err != nil {
		t.Errorf("SO_SNDBUF: %v", err)
	}
}

// TestBackpressure: what a client does not read waits in the outbound
// queue (Write and Writev, the first one partly sent), the loop serving
// others meanwhile; once the client reads, every byte comes in order,
// the queue empties and the connection goes on.
func TestBackpressure(t *testing.T) {
	const total = 8 << 20
	data := counting(total)
	h := newHandler(t)
	conns := make(chan *Conn, 2)
	h.open = func(c *Conn) ([]byte, Action) {
		smallBuffers(t, c)
		conns <- c
		return nil, None
	}
	h.traffic = func(c *Conn) Action {
		if b, _ := c.Peek(-1); string(b) != "go" {
			b, _ = c.Next(-1)
			_, _ = c.Write(b)
			return None
		}
		_, _ = c.Discard(-1)
		// First a Writev that the socket takes part of, then 256 KiB
		// pieces, by Write and Writev in turn, queued after it.
		if n, err := c.Writev([][]byte{data[:100<<10], data[100<<10 : 1<<20], data[1<<20 : 2<<20]}); n != 2<<20 || err != nil {
			t.Errorf("Writev: %d, %v", n, err)
		}
		for off, i := 2<<20, 0; off < total; off, i = off+256<<10, i+1 {
			p := data[off : off+256<<10]
			var err error
			if i%2 == 0 {
				_, err = c.Write(p)
			} else {
				_, err = c.Writev([][]byte{p[:1000], nil, p[1000:]})
			}
			if err != nil {
				t.Errorf("write at %d: %v", off, err)
			}
		}
		return None
	}
	s := start(t, h, 1)
	l := s.e.loops[0]

	c := mustDial(t, s.addr)
	if err := c.SetReadBuffer(32 << 10); err != nil {
		t.Fatal(err)
	}
	sc := <-conns
	if _, err := c.Write([]byte("go")); err != nil {
		t.Fatal(err)
	}
	var queued int
	waitFor(t, "the queue to fill", func() bool {
		runOn(t, l, func() { queued = sc.OutboundBuffered() })
		return queued > 0
	})
	if queued < total/2 || queued > total {
		t.Fatalf("OutboundBuffered with the client not reading: %d, want most of %d", queued, total)
	}
	// The loop serves another connection meanwhile.
	other := mustDial(t, s.addr)
	<-conns
	if err := roundTrip(other, "ping", "ping"); err != nil {
		t.Fatal(err)
	}

	got := make([]byte, total)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, data); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
	waitFor(t, "the queue to empty", func() bool {
		runOn(t, l, func() { queued = sc.OutboundBuffered() })
		return queued == 0
	})
	if err := roundTrip(c, "after", "after"); err != nil {
		t.Fatal(err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestAsyncWrite: AsyncWrite and AsyncWritev from two goroutines at once
// each deliver their messages whole and in order, calling back on the
// loop with nil; once the connection closed, their callbacks and Wake's
// get net.ErrClosed.
func TestAsyncWrite(t *testing.T) {
	h := newHandler(t)
	conns := make(chan *Conn, 1)
	closed := make(chan error, 1)
	h.open = func(c *Conn) ([]byte, Action) { conns <- c; return nil, None }
	h.closed = func(c *Conn, err error) { closed <- err }
	s := start(t, h, 1)
	c := mustDial(t, s.addr)
	sc := <-conns

	const each = 200
	msg := func(tag byte, i int) []byte { return fmt.Appendf(nil, "%c%014d\n", tag, i) } // 16 bytes
	var called atomic.Int32
	cb := func(cc *Conn, err error) {
		if cc != sc || err != nil || !h.onLoop(s.e.loops[0]) {
			t.Errorf("callback: conn %p (want %p), %v, on the loop %v", cc, sc, err, h.onLoop(s.e.loops[0]))
		}
		called.Add(1)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range each {
			f := cb
			if i%10 == 0 {
				f = nil // no callback is fine too
			}
			if err := sc.AsyncWrite(msg('A', i), f); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Go(func() {
		for i := range each {
			m := msg('B', i)
			if err := sc.AsyncWritev([][]byte{m[:3], m[3:]}, cb); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	got := make([]byte, 2*each*16)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	next := map[byte]int{}
	for m := range bytes.SplitSeq(got, []byte("\n")) {
		if len(m) == 0 {
			continue
		}
		if want := msg(m[0], next[m[0]]); !bytes.Equal(m, want[:len(want)-1]) {
			t.Fatalf("message %q, want %q", m, want)
		}
		next[m[0]]++
	}
	if next['A'] != each || next['B'] != each {
		t.Fatalf("messages: %v", next)
	}
	waitFor(t, "every callback", func() bool { return called.Load() == 2*each-each/10 })

	_ = c.Close()
	if err := <-closed; !errors.Is(err, io.EOF) {
		t.Fatalf("OnClose: %v, want EOF", err)
	}
	errs := make(chan error, 3)
	late := func(_ *Conn, err error) { errs <- err }
	for _, err := range []error{sc.AsyncWrite([]byte("late"), late), sc.AsyncWritev([][]byte{[]byte("late")}, late), sc.Wake(late)} {
		if err != nil {
			t.Fatalf("a call to a live loop: %v", err)
		}
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, net.ErrClosed) {
			t.Errorf("callback after the close: %v, want net.ErrClosed", err)
		}
	}
	if n := called.Load(); n != 2*each-each/10 {
		t.Errorf("%d callbacks, want %d", n, 2*each-each/10)
	}
}

// TestWake: Wake runs OnTraffic with what waits and nothing new; the
// callback runs on the loop after it.
func TestWake(t *testing.T) {
	h := newHandler(t)
	conns := make(chan *Conn, 1)
	calls, woken := 0, false // the loop's
	h.open = func(c *Conn) ([]byte, Action) { conns <- c; return nil, None }
	h.traffic = func(c *Conn) Action {
		calls++
		if !woken {
			return None // leave the bytes
		}
		b, _ := c.Next(-1)
		_, _ = c.Write(append([]byte("woke:"), b...))
		return None
	}
	s := start(t, h, 1)
	l := s.e.loops[0]
	c := mustDial(t, s.addr)
	sc := <-conns
	if _, err := c.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	var before int
	waitFor(t, "the bytes to arrive", func() bool {
		runOn(t, l, func() { before = sc.InboundBuffered() })
		return before == 3
	})
	runOn(t, l, func() { before, woken = calls, true })
	done := make(chan error, 1)
	if err := sc.Wake(func(cc *Conn, err error) {
		if cc != sc || !h.onLoop(l) {
			t.Error("Wake's callback: wrong connection or off the loop")
		}
		if calls != before+1 {
			t.Errorf("Wake's callback after %d OnTraffic calls, want %d", calls-before, 1)
		}
		done <- err
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wake's callback: %v", err)
	}
	got := make([]byte, len("woke:abc"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "woke:abc" {
		t.Fatalf("after Wake: %q, %v", got, err)
	}
}

// TestExecute: funcs given to Execute run on the loop in the order given,
// one given from a func on the loop after it.
func TestExecute(t *testing.T) {
	h := newHandler(t)
	s := start(t, h, 1)
	l := s.e.loops[0]
	var order []int // the loop's
	for i := range 100 {
		if err := l.Execute(func() {
			if !h.onLoop(l) {
				t.Error("Execute's func off the loop")
			}
			order = append(order, i)
		}); err != nil {
			t.Fatal(err)
		}
	}
	nested := make(chan bool, 1)
	var got []int
	runOn(t, l, func() {
		got = append(got, order...)
		ran := false
		if err := l.Execute(func() { nested <- ran && h.onLoop(l) }); err != nil {
			t.Error(err)
		}
		ran = true
	})
	for i, v := range got {
		if i != v {
			t.Fatalf("Execute's funcs ran in order %v", got)
		}
	}
	if len(got) != 100 {
		t.Fatalf("%d of 100 funcs ran before a later one", len(got))
	}
	if !<-nested {
		t.Fatal("a func given from the loop ran before the one that gave it returned, or off the loop")
	}
}

// TestTurn: funcs given to the loop at once run in one turn, and a func
// given after a turn ended runs in a later one.
func TestTurn(t *testing.T) {
	h := newHandler(t)
	s := start(t, h, 1)
	l := s.e.loops[0]
	var first, second, third uint64
	runOn(t, l, func() {
		first = l.Turn()
		if err := l.Execute(func() { second = l.Turn() }); err != nil {
			t.Error(err)
		}
	})
	runOn(t, l, func() { third = l.Turn() })
	if first < 1 {
		t.Fatalf("a func ran in turn %d; turns count from 1", first)
	}
	if second <= first || third <= first {
		t.Fatalf("turns %d, then %d and %d: later funcs ran in the same turn", first, second, third)
	}
}

// TestClose: Conn.Close from another goroutine, Close from OnTraffic
// (after a reply, which the client still gets), SO_LINGER 0 and the
// client's close or reset each close the connection once, with OnClose's
// error nil for the server's closes.
func TestClose(t *testing.T) {
	h := newHandler(t)
	conns := make(chan *Conn, 1)
	closed := make(chan error, 1)
	h.open = func(c *Conn) ([]byte, Action) { conns <- c; return nil, None }
	h.closed = func(c *Conn, err error) { closed <- err }
	h.traffic = func(c *Conn) Action {
		b, _ := c.Next(-1)
		switch string(b) {
		case "quit\n":
			_, _ = c.Write([]byte("bye\n"))
			return Close
		case "reset\n":
			if err := c.SetLinger(0); err != nil {
				t.Errorf("SetLinger: %v", err)
			}
			return Close
		}
		_, _ = c.Write(b)
		return None
	}
	s := start(t, h, 1)
	wantClose := func(t *testing.T, want func(error) bool) {
		t.Helper()
		select {
		case err := <-closed:
			if !want(err) {
				t.Fatalf("OnClose: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no OnClose")
		}
		waitFor(t, "no connection", func() bool { return s.e.CountConnections() == 0 })
	}
	isNil := func(err error) bool { return err == nil }

	t.Run("Conn.Close", func(t *testing.T) {
		c := mustDial(t, s.addr)
		sc := <-conns
		if err := roundTrip(c, "hi\n", "hi\n"); err != nil {
			t.Fatal(err)
		}
		if err := sc.Close(); err != nil {
			t.Fatal(err)
		}
		expectEOF(t, c, "")
		wantClose(t, isNil)
		if err := sc.Close(); err != nil { // a second Close does nothing
			t.Fatal(err)
		}
		runOn(t, s.e.loops[0], func() {})
	})
	t.Run("OnTraffic", func(t *testing.T) {
		c := mustDial(t, s.addr)
		<-conns
		if _, err := c.Write([]byte("quit\n")); err != nil {
			t.Fatal(err)
		}
		expectEOF(t, c, "bye\n")
		wantClose(t, isNil)
	})
	t.Run("SetLinger", func(t *testing.T) {
		c := mustDial(t, s.addr)
		<-conns
		if _, err := c.Write([]byte("reset\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after the server's reset: %v, want ECONNRESET", err)
		}
		wantClose(t, isNil)
	})
	t.Run("client close", func(t *testing.T) {
		c := mustDial(t, s.addr)
		<-conns
		if err := roundTrip(c, "x", "x"); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		wantClose(t, func(err error) bool { return errors.Is(err, io.EOF) })
	})
	t.Run("client reset", func(t *testing.T) {
		c := mustDial(t, s.addr)
		<-conns
		if err := roundTrip(c, "x", "x"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetLinger(0)
		_ = c.Close()
		wantClose(t, func(err error) bool { return errors.Is(err, syscall.ECONNRESET) })
	})
}

// TestOpenClose: OnOpen's bytes reach the client before the Close it
// returns with.
func TestOpenClose(t *testing.T) {
	h := newHandler(t)
	closed := make(chan error, 1)
	h.open = func(c *Conn) ([]byte, Action) { return []byte("full\n"), Close }
	h.closed = func(c *Conn, err error) { closed <- err }
	s := start(t, h, 1)
	c := mustDial(t, s.addr)
	expectEOF(t, c, "full\n")
	if err := <-closed; err != nil {
		t.Fatalf("OnClose: %v", err)
	}
	if n := s.e.CountConnections(); n != 0 {
		t.Fatalf("CountConnections: %d", n)
	}
}

// pair is the two ends of a TCP connection dialed to a listener of the
// test's.
func pair(t *testing.T) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dialed.Close() })
	if accepted, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = accepted.Close() })
	_ = accepted.SetDeadline(time.Now().Add(10 * time.Second))
	return dialed, accepted
}

// TestEnroll: a socket dialed elsewhere and enrolled is a connection of
// the loop: OnOpen sees Enroll's context and its addresses and sends its
// bytes; bytes from the peer, those sent before Enroll too, reach
// OnTraffic; the peer closing is OnClose with io.EOF.
func TestEnroll(t *testing.T) {
	h := newHandler(t)
	type ctxKey struct{ name string }
	var openedWith any // set on the loop before Enroll returns
	var addrs [2]string
	closed := make(chan error, 1)
	h.open = func(c *Conn) ([]byte, Action) {
		openedWith = c.Context()
		addrs = [2]string{c.LocalAddr().String(), c.RemoteAddr().String()}
		return []byte("hello\n"), None
	}
	h.closed = func(c *Conn, err error) { closed <- err }
	s := start(t, h, 1)

	nc, peer := pair(t)
	if _, err := peer.Write([]byte("early\n")); err != nil {
		t.Fatal(err)
	}
	ctx := &ctxKey{"upstream"}
	if err := s.e.loops[0].Enroll(nc, ctx); err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if openedWith != ctx {
		t.Fatalf("OnOpen's Context: %v, want %v", openedWith, ctx)
	}
	if want := [2]string{nc.LocalAddr().String(), nc.RemoteAddr().String()}; addrs != want {
		t.Fatalf("OnOpen's addresses: %v, want %v", addrs, want)
	}
	if _, err := nc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("writing to the net.Conn enrolled: %v, want net.ErrClosed", err)
	}
	if n := s.e.CountConnections(); n != 1 {
		t.Fatalf("CountConnections: %d, want 1", n)
	}
	got := make([]byte, len("hello\nearly\n"))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != "hello\nearly\n" {
		t.Fatalf("the peer got %q, %v", got, err)
	}
	if err := roundTrip(peer, "ping\n", "ping\n"); err != nil {
		t.Fatal(err)
	}
	_ = peer.Close()
	if err := <-closed; !errors.Is(err, io.EOF) {
		t.Fatalf("OnClose: %v, want EOF", err)
	}
	waitFor(t, "no connection", func() bool { return s.e.CountConnections() == 0 })

	// A net.Conn without a socket cannot be enrolled.
	a, b := net.Pipe()
	defer b.Close()
	if err := s.e.loops[0].Enroll(a, nil); err == nil {
		t.Fatal("Enroll of a pipe succeeded")
	}
}

// TestStop: Stop closes every connection, accepted and enrolled, with
// OnClose (err nil); Run returns nil; the clients see EOF; calls to the
// stopped loops say ErrStopped, and Enroll closes the socket it refuses.
func TestStop(t *testing.T) {
	h := newHandler(t)
	conns := make(chan *Conn, 8)
	var closes atomic.Int32
	h.open = func(c *Conn) ([]byte, Action) { conns <- c; return nil, None }
	h.closed = func(c *Conn, err error) {
		if err != nil {
			t.Errorf("OnClose at Stop: %v", err)
		}
		closes.Add(1)
	}
	s := start(t, h, 2)
	const clients = 6
	var cs []net.Conn
	for range clients {
		c := mustDial(t, s.addr)
		if err := roundTrip(c, "x", "x"); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	nc, peer := pair(t)
	if err := s.e.loops[1].Enroll(nc, nil); err != nil {
		t.Fatal(err)
	}
	cs = append(cs, peer)
	waitFor(t, "every connection open", func() bool { return s.e.CountConnections() == clients+1 })
	sc := <-conns

	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := closes.Load(); n != clients+1 {
		t.Fatalf("OnClose %d times, want %d", n, clients+1)
	}
	if n := s.e.CountConnections(); n != 0 {
		t.Fatalf("CountConnections: %d", n)
	}
	for _, c := range cs {
		expectEOF(t, c, "")
	}
	cb := func(*Conn, error) { t.Error("a callback of a call refused ran") }
	for _, l := range s.e.loops {
		if err := l.Execute(func() {}); err != ErrStopped {
			t.Errorf("Execute: %v", err)
		}
	}
	for name, err := range map[string]error{
		"AsyncWrite":  sc.AsyncWrite([]byte("x"), cb),
		"AsyncWritev": sc.AsyncWritev([][]byte{[]byte("x")}, cb),
		"Wake":        sc.Wake(cb),
		"Close":       sc.Close(),
	} {
		if err != ErrStopped {
			t.Errorf("%s: %v, want ErrStopped", name, err)
		}
	}
	nc, peer = pair(t)
	if err := s.e.loops[0].Enroll(nc, nil); err != ErrStopped {
		t.Errorf("Enroll: %v, want ErrStopped", err)
	}
	expectEOF(t, peer, "")
	s.e.Stop() // again: nothing to do
}

// TestTick: OnTick runs first as the loops start, then after each delay
// it returns, and not before.
func TestTick(t *testing.T) {
	h := newHandler(t)
	var calls atomic.Int32
	first := make(chan struct{})
	h.tick = func() time.Duration {
		switch calls.Add(1) {
		case 1:
			close(first)
		case 5:
			return time.Hour
		}
		return 5 * time.Millisecond
	}
	start(t, h, 1)
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("no first OnTick")
	}
	waitFor(t, "five OnTicks", func() bool { return calls.Load() >= 5 })
	time.Sleep(30 * time.Millisecond)
	if n := calls.Load(); n != 5 {
		t.Fatalf("%d OnTicks with the fifth's delay an hour", n)
	}
}

// TestDualStack: a loop listening on "[::]" takes IPv4 clients too, as
// Go's listeners do.
func TestDualStack(t *testing.T) {
	s := startAt(t, newHandler(t), 1, "[::]:0")
	_, port, _ := net.SplitHostPort(s.addr)
	c := mustDial(t, net.JoinHostPort("127.0.0.1", port))
	if err := roundTrip(c, "over IPv4", "over IPv4"); err != nil {
		t.Fatal(err)
	}
}

// TestRunErrors: an address that is no IP literal, and one another
// socket listens on, are Run's error, with OnBoot never called.
func TestRunErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, addr := range []string{"localhost:80", ln.Addr().String()} {
		h := newHandler(t)
		h.booted = make(chan *Engine, 1)
		if err := Run(h, addr, Options{Loops: 2}); err == nil {
			t.Errorf("Run(%q) returned nil", addr)
		}
		if len(h.booted) != 0 {
			t.Errorf("Run(%q) called OnBoot", addr)
		}
	}
}

// TestTickEndsBeforeRun: once Run returned, OnTick is not running, and
// will not run again.
func TestTickEndsBeforeRun(t *testing.T) {
	h := newHandler(t)
	var calls atomic.Int32
	entered := make(chan struct{})
	release := make(chan chan struct{})
	late := make(chan bool, 1) // whether Run had returned as the call ended
	h.tick = func() time.Duration {
		if calls.Add(1) == 2 {
			close(entered)
			ran := <-release
			select {
			case <-ran:
				late <- true
			default:
				late <- false
			}
		}
		return time.Millisecond
	}
	s := start(t, h, 1)
	<-entered
	s.e.Stop()
	select {
	case <-s.ran:
	case <-time.After(200 * time.Millisecond): // what a fix should do
	}
	release <- s.ran
	<-s.ran
	if <-late {
		t.Fatal("Run returned while OnTick ran")
	}
}

// TestExecuteAccepted: a func that Execute accepted (nil) runs, even when
// the loop stops right after accepting it.
func TestExecuteAccepted(t *testing.T) {
	h := newHandler(t)
	s := start(t, h, 1)
	l := s.e.loops[0]
	ran := make(chan struct{})
	accepted := make(chan error, 1)
	runOn(t, l, func() {
		// The stop and this func run in the same batch of tasks, the
		// func after the stop: what it gives lands after the loop's
		// last look at its queue.
		s.e.Stop()
		_ = l.Execute(func() { accepted <- l.Execute(func() { close(ran) }) })
	})
	<-s.ran
	if err := <-accepted; err != nil {
		t.Skipf("Execute refused: %v", err)
	}
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatal("Execute returned nil, but its func never ran")
	}
}

// TestOutboundQueueCompacts: a connection whose queue never empties (a
// reader that keeps a backlog) does not keep every byte it ever queued.
func TestOutboundQueueCompacts(t *testing.T) {
	const chunk, backlog, rounds = 64 << 10, 2 << 20, 160
	data := counting(backlog + rounds*chunk)
	h := newHandler(t)
	conns := make(chan *Conn, 1)
	sent := 0 // the loop's
	h.open = func(c *Conn) ([]byte, Action) {
		smallBuffers(t, c)
		conns <- c
		return nil, None
	}
	h.traffic = func(c *Conn) Action {
		// Each byte from the client asks for a chunk more.
		n, _ := c.Discard(-1)
		for range n {
			_, _ = c.Write(data[sent : sent+chunk])
			sent += chunk
		}
		return None
	}
	s := start(t, h, 1)
	c := mustDial(t, s.addr)
	if err := c.SetReadBuffer(32 << 10); err != nil {
		t.Fatal(err)
	}
	sc := <-conns
	if _, err := c.Write(make([]byte, backlog/chunk)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(data))
	for range rounds {
		// Read a chunk, ask for one: the backlog stays.
		n, err := io.ReadFull(c, got[len(got):len(got)+chunk])
		got = got[:len(got)+n]
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
	}
	var queued, held int
	runOn(t, s.e.loops[0], func() { queued, held = sc.OutboundBuffered(), cap(sc.out) })
	n, err := io.ReadFull(c, got[len(got):len(data)])
	got = got[:len(got)+n]
	if err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, data); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
	if queued == 0 {
		t.Fatal("the queue emptied: the test did not keep a backlog")
	}
	if held > 4*backlog {
		t.Fatalf("the outbound queue holds %d bytes for %d waiting (%d sent in all)", held, queued, len(data))
	}
}

// TestAcceptOutOfDescriptors: an accept that fails for want of a
// descriptor does not stop the engine, and the handler is told of it
// (AcceptWatcher); the connection is served once descriptors are free
// again.
func TestAcceptOutOfDescriptors(t *testing.T) {
	h := newHandler(t)
	paused := make(chan error, 100)
	h.pause = func(err error, pause time.Duration) {
		if pause <= 0 {
			t.Errorf("the listener paused for %v", pause)
		}
		select {
		case paused <- err:
		default:
		}
	}
	s := start(t, h, 1)
	c1 := mustDial(t, s.addr) // the runtime's poller opens its descriptors here
	if err := roundTrip(c1, "one", "one"); err != nil {
		t.Fatal(err)
	}

	// The limit leaves one descriptor free: the client's socket takes it,
	// and the server's accept finds none.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	names, err := dir.Readdirnames(-1)
	dirFD := int(dir.Fd())
	_ = dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{dirFD: false}
	for _, name := range names {
		if fd, err := strconv.Atoi(name); err == nil && fd != dirFD {
			used[fd] = true
		}
	}
	limit, free := 0, 0
	for ; free < 2; limit++ {
		if !used[limit] {
			free++
		}
	}
	limit-- // the second free one is over the limit
	low := lim
	low.Cur = uint64(limit)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	c2, err := dial(s.addr)
	runErr := error(nil)
	select {
	case <-s.ran:
		runErr = s.err
	case <-time.After(200 * time.Millisecond):
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("dial with one descriptor free: %v", err)
	}
	defer c2.Close()
	if err := roundTrip(c2, "two", "two"); err != nil {
		t.Fatalf("the connection accepted once descriptors were free: %v (Run: %v)", err, runErr)
	}
	select {
	case err := <-paused:
		if !errors.Is(err, unix.EMFILE) {
			t.Errorf("OnAcceptPause told %v; want EMFILE", err)
		}
	default:
		t.Error("the handler was not told of the accept that failed")
	}
}

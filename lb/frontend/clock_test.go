package frontend

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/internal/testwait"
)

// wallStep is a step of the machine's wall clock (NTP stepping it at boot
// or after a resume, date -s, a VM migration), as the gnet front end's
// clock sees it.
type wallStep struct{ by atomic.Int64 }

// clock is the front end's own clock (Options' default) once the wall
// clock stepped by w: a clock that reads the wall clock, whose readings
// are the wall's time, jumps with it; the monotonic one does not.
func (w *wallStep) clock() func() int64 {
	read := Options{}.withDefaults().clock
	if d := read() - time.Now().UnixNano(); d < -int64(time.Hour) || d > int64(time.Hour) {
		return read
	}
	return func() int64 { return read() + w.by.Load() }
}

// tickNow runs what the front end's next tick does, at once: it advances
// the coarse clock, closes the connections idle too long and sweeps the
// exchanges on every loop.
func tickNow(t *testing.T, s *GNet) {
	t.Helper()
	now := s.o.clock()
	s.now.Store(now)
	s.closeIdle(now)
	s.mu.Lock()
	loops := make([]*loopState, 0, len(s.loops))
	for _, ls := range s.loops {
		loops = append(loops, ls)
	}
	s.mu.Unlock()
	for _, ls := range loops {
		_ = ls.el.Execute(ls.sweep)
		loopTurns(t, ls.el, 2) // the sweep, then the close it asks for
	}
}

// TestRelayOutlivesWallClockStep: a stream relayed on the loop waits its
// idle time for the pod's next bytes on the monotonic clock. Timed off the
// wall clock, a forward step of a minute cut every stream idle under a
// minute mid-answer at the next sweep.
func TestRelayOutlivesWallClockStep(t *testing.T) {
	var step wallStep
	rest, err := relayOfTwo(t, Options{clock: step.clock()}, 30*time.Second, func(*GNet) {}, func(s *GNet) {
		step.by.Store(int64(time.Minute))
		tickNow(t, s)
	})
	if err != nil || !strings.Contains(rest, "data: 2") {
		t.Fatalf("the stream (idle time 30 s) after the wall clock stepped a minute forward: %q, %v; want its next event", rest, err)
	}
}

// TestKeptConnectionOutlivesWallClockStep: a keep-alive connection waits
// its IdleTimeout for the next request on the monotonic clock; off the
// wall clock, a forward step of a minute closed every idle one at once.
func TestKeptConnectionOutlivesWallClockStep(t *testing.T) {
	var step wallStep
	s := startOK(t, Options{IdleTimeout: 30 * time.Second, clock: step.clock()})
	c := dialGNet(t, s)
	br := bufio.NewReader(c)
	get(t, c, br, "the first request")
	testwait.For(t, "the connection idle", func() bool { return idleGConn(s) != nil })
	step.by.Store(int64(time.Minute))
	tickNow(t, s)
	get(t, c, br, "a request on the kept connection after the wall clock stepped a minute forward (IdleTimeout 30 s)")
}

// TestIdleTimeoutAfterWallClockStepBack: a backward step of the wall
// clock does not hold off IdleTimeout: off the wall clock, every idle
// connection was kept until the clock caught up again.
func TestIdleTimeoutAfterWallClockStepBack(t *testing.T) {
	var step wallStep
	s := startOK(t, Options{IdleTimeout: 200 * time.Millisecond, clock: step.clock()})
	c := dialGNet(t, s)
	br := bufio.NewReader(c)
	get(t, c, br, "the first request")
	step.by.Store(-int64(time.Hour))
	// The ticks close it, a few after IdleTimeout.
	if n, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = errors.New("still open at the test's deadline")
		}
		t.Fatalf("the kept connection after the wall clock stepped an hour back (IdleTimeout 0.2 s): %q, %v; want it closed", n, err)
	}
}

// get sends a GET on c and reads its answer, which must be a 200.
func get(t *testing.T, c net.Conn, br *bufio.Reader, which string) {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatalf("%s: %v", which, err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: %v; want it answered", which, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d; want 200", which, resp.StatusCode)
	}
}

// idleGConn is s's one connection once it serves nothing, nil otherwise.
func idleGConn(s *GNet) *gconn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gc := range s.conns {
		if !gc.partial.Load() && !gc.held.Load() && !gc.busy.Load() {
			return gc
		}
	}
	return nil
}

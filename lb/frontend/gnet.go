package frontend

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/lb/evloop"
)

// GNet is an HTTP/1.1 server on event loops (lb/evloop; gnet's before,
// whose name the front end keeps): one loop per core, each with its own
// SO_REUSEPORT listener. The loops only move bytes: they parse
// complete requests out of what arrived and hand them, in order, to one
// goroutine per busy connection, which runs the Handler and writes the
// response back with AsyncWrite. See gnet_conn.go for the connection's
// life.
type GNet struct {
	h    Handler
	o    Options
	addr string

	workers *workers

	eng      *evloop.Engine
	ready    chan struct{}
	once     sync.Once
	stopOnce sync.Once
	// stopped is closed when evloop.Run returns, with its error in runErr;
	// failed gets that error too when it is one.
	stopped chan struct{}
	runErr  error
	failed  chan error

	// now is a coarse copy of the clock (Options.clock, nanoseconds) that
	// OnTick advances, so the loops stamp traffic without a clock read per
	// event. lag is how far behind the clock it may be (nanoseconds): the
	// longest it went without advancing, between tick and twice that
	// (expired).
	now, lag atomic.Int64
	shutdown atomic.Bool
	// aborting: AbortRelays asked the loops to end their relays.
	aborting atomic.Bool
	linger   lingering

	mu    sync.Mutex
	conns map[*gconn]struct{} // open connections, for timeouts and Shutdown
	loops map[*evloop.Loop]*loopState
	// busy: GOMAXPROCS is raised for the loops (busyLoops); settle gives
	// it back once they hold no connection (settleLoops).
	busy   bool
	settle *time.Timer

	// upstreams counts the open connections to each pod address (of
	// *atomic.Int32), for Send's cap.
	upstreams sync.Map
	// sweepEvery is how often (nanoseconds) the loops look for exchanges
	// past their deadline, set from the shortest timeout a Send was
	// given; 0 until the first.
	sweepEvery atomic.Int64
	lastIdle   int64 // OnTick's last idle sweep, on the clock
	// listeners are the loops' listening sockets (closeListeners).
	listeners []listenerFD
	// h2 serves the h2c connections the loops hand over (h2c.go), and
	// the TLS ones that negotiated h2; nil when HTTP/2 is off.
	h2 *h2Server
	// tls is the listener's TLS (gnet_tls.go), nil when plain; tlsStop
	// ends its ticket-key rotation.
	tls     *tls.Config
	tlsStop chan struct{}
}

// tick is how often OnTick advances the clock and closes idle connections;
// the timeouts are that much coarse.
const tick = time.Second

// StartGNet binds addr and serves h on the gnet front end's loops until
// ShutdownWithContext. It returns once every loop listens.
func StartGNet(addr string, h Handler, o Options) (*GNet, error) {
	s := &GNet{h: h, o: o.withDefaults(), ready: make(chan struct{}), stopped: make(chan struct{}), failed: make(chan error, 1),
		conns: make(map[*gconn]struct{}), loops: make(map[*evloop.Loop]*loopState)}
	s.now.Store(s.o.clock())
	// The first tick sweeps, however young the process (and its clock).
	s.lastIdle = s.now.Load() - int64(tick)
	// tick: the clock's period until a sweep period is set, and the sleep
	// the ticker finishes when one is (noteTimeout).
	s.lag.Store(int64(tick))
	if o.UpstreamTimeout > 0 {
		s.noteTimeout(o.UpstreamTimeout)
	}
	s.workers = newWorkers()
	if !o.HTTP2.Disabled {
		s.h2 = newH2Server(h, s.o)
	}
	// Each loop binds its own socket to addr, and each bind to port 0 would
	// get a port of its own. A port is chosen first, with a socket that holds
	// it until the loops are bound beside it.
	binding.Lock()
	defer binding.Unlock()
	hold, err := Listen(addr)
	if err != nil {
		return nil, err
	}
	s.addr = hold.Addr().String()
	defer hold.Close()
	// Listeners on the port before the loops bind are another front end's
	// (closeListeners must not touch them); the hold is among them.
	others, err := listenersOn(s.addr)
	if err != nil {
		return nil, err
	}
	// Only now: its ticket-key rotation runs until stop, or until the
	// engine fails to start.
	if o.TLS != nil {
		protos := []string{protoHTTP1}
		if s.h2 != nil {
			protos = []string{protoH2, protoHTTP1}
		}
		s.tlsStop = make(chan struct{})
		s.tls = o.TLS.Config(protos, s.tlsStop)
	}
	go func() {
		// The loops wait in a raw system call that keeps their P while
		// they hold connections: see busyLoops.
		// Its error (a loop that failed) closed the port and dropped
		// every connection, and goes to Done: the process must not run
		// on as if it served. It returns nil only after Stop.
		s.runErr = evloop.Run(s, s.addr, evloop.Options{Loops: procs, NoRing: s.o.NoRing})
		// Every connection is closed by now.
		s.mu.Lock()
		if s.settle != nil {
			s.settle.Stop()
		}
		s.idleLoops()
		s.mu.Unlock()
		if s.runErr != nil {
			s.failed <- s.runErr
		}
		close(s.stopped)
	}()
	select {
	case <-s.ready:
		if s.listeners, err = newListeners(s.addr, others); err != nil {
			_ = s.stop()
			return nil, err
		}
		// The guard weighs the descriptors open now (listeners, pollers,
		// the process's own) plus the sockets, with each socket's number.
		base, err := openDescriptors()
		if err != nil {
			_ = s.stop()
			return nil, err
		}
		s.o.FDs.SetOpen(func() int { return base + s.sockets() })
		return s, nil
	case <-s.stopped:
		if s.tlsStop != nil {
			close(s.tlsStop)
		}
		return nil, fmt.Errorf("frontend: %w", s.runErr)
	}
}

// sockets counts the sockets the front end holds: the loops' connections,
// clients' and pods' alike, and the HTTP/2 connections they handed over
// (on a duplicate of the loop's socket, which the loops no longer count).
func (s *GNet) sockets() int {
	n := s.eng.CountConnections()
	if s.h2 != nil {
		n += int(s.h2.open.Load())
	}
	return n
}

// procs is GOMAXPROCS as the process started: the cores it may use.
var procs = runtime.GOMAXPROCS(0)

// busyFronts counts the gnet front ends whose loops hold connections,
// each of which raised GOMAXPROCS from before by procs (see busyLoops).
var busyFronts struct {
	sync.Mutex
	n      int
	before int
}

// idleLoopsAfter is how long the loops of a front end hold no connection
// before it gives back the Ps it raised GOMAXPROCS by: long enough that
// a client making a connection a request now and then does not stop the
// world for each, short enough that a fleet of HTTP/2 clients, whose
// connections leave the loops after their handshake, is soon served with
// one P a core.
const idleLoopsAfter = 100 * time.Millisecond

// busyLoops makes room for the loops while they hold connections; s.mu
// held. There is a loop per core, and a loop that holds connections waits
// in a raw epoll_wait that keeps its P (lb/evloop), so were the loops to
// take every P, goroutines (TLS handshakes, HTTP/2 streams, PD exchanges,
// the workers) would only run once the runtime's monitor preempted a loop,
// after up to 10 ms. So GOMAXPROCS is raised by the loops' count for each
// front end whose loops hold connections: goroutines keep a P a core, and
// the loops' Ps cost nothing while they wait (their threads sleep in the
// kernel). idleLoops gives them back.
func (s *GNet) busyLoops() {
	if s.busy {
		return
	}
	s.busy = true
	busyFronts.Lock()
	defer busyFronts.Unlock()
	if busyFronts.n == 0 {
		busyFronts.before = runtime.GOMAXPROCS(0)
	}
	busyFronts.n++
	runtime.GOMAXPROCS(busyFronts.before + busyFronts.n*procs)
}

// idleLoops gives a front end's Ps back once its loops hold no
// connection; s.mu held.
func (s *GNet) idleLoops() {
	if !s.busy {
		return
	}
	s.busy = false
	busyFronts.Lock()
	defer busyFronts.Unlock()
	busyFronts.n--
	runtime.GOMAXPROCS(busyFronts.before + busyFronts.n*procs)
}

// settleLoops runs idleLoopsAfter after the loops last let go of their
// last connection: idleLoops, unless one came since.
func (s *GNet) settleLoops() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 {
		s.idleLoops()
	}
}

// Addr is the address the loops listen on.
func (s *GNet) Addr() string { return s.addr }

// Done reports the engine stopping on its own with an error.
func (s *GNet) Done() <-chan error { return s.failed }

// ShutdownWithContext stops reading new requests, closes idle connections
// and lets requests in flight (streams included) finish until ctx ends,
// then stops the loops, which closes what is left. As on fasthttp, the
// first call that runs out of time returns its error and leaves what is
// still served running, so the caller can end its streams cleanly and call
// again; the loops stop by themselves once those are done, and a later
// call that runs out of time stops them at once.
func (s *GNet) ShutdownWithContext(ctx context.Context) error {
	first := !s.shutdown.Swap(true)
	if first {
		if err := s.closeListeners(); err != nil && s.o.Log != nil {
			// OnOpen still refuses what the loops accept from here on.
			s.o.Log.Warn("frontend: the listeners stay open while requests drain", "err", err)
		}
		s.closeIdle(0)
	}
	var h2done chan error
	if s.h2 != nil {
		h2done = make(chan error, 1)
		go func() { h2done <- s.h2.shutdown(ctx) }()
	}
	if err := s.drain(ctx); err != nil {
		if first {
			go func() {
				_ = s.drain(context.Background())
				s.stop()
			}()
		} else {
			s.stop()
		}
		return err
	}
	if h2done != nil {
		if err := <-h2done; err != nil {
			return err
		}
	}
	return s.stop()
}

// AbortRelays ends every exchange and stream relayed on a loop, at once,
// with ErrAborted: a shutdown's grace is over, and one whose pod says
// nothing would otherwise wait for its timeout. The pod's connection is
// closed, which tells the pod to stop.
func (s *GNet) AbortRelays() {
	s.aborting.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ls := range s.loops {
		_ = ls.el.Execute(ls.sweep)
	}
}

// drain waits until nothing is served, the engine stopped (on its own:
// what it served went with its connections), or ctx ends.
func (s *GNet) drain(ctx context.Context) error {
	for s.serving() > 0 || s.reading() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopped:
			return nil
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// stop stops the loops, once, and returns why evloop.Run ended.
func (s *GNet) stop() error {
	s.stopOnce.Do(func() {
		s.eng.Stop()
		<-s.stopped
		s.workers.stop()
		s.linger.stop() // the HTTP/2 connections' (lingerConn)
		if s.tlsStop != nil {
			close(s.tlsStop)
		}
	})
	return s.runErr
}

// OnBoot keeps the engine for Shutdown, and says how its loops make
// their socket calls.
func (s *GNet) OnBoot(eng *evloop.Engine) {
	s.eng = eng
	if s.o.Log == nil {
		return
	}
	if err := eng.Ring(); err != nil {
		s.o.Log.Info("frontend: the event loops make a system call per send and receive", "io_uring", false, "why", err.Error())
	} else {
		s.o.Log.Info("frontend: the event loops batch their sends and receives with io_uring", "io_uring", true)
	}
}

// OnAcceptPause counts and logs an accept the kernel refused for want of
// descriptors or memory, which the open-files guard did not forestall
// (evloop.AcceptWatcher): the client waits in the listen queue while the
// loop rests its listener.
func (s *GNet) OnAcceptPause(err error, _ time.Duration) { s.o.FDs.AcceptFailed(err) }

// OnTick runs on the engine's ticker goroutine, first right after every
// loop has bound its listener.
func (s *GNet) OnTick() time.Duration {
	now := s.o.clock()
	// A gap past a tick is the ticker running late; one past two, a stall,
	// which lag does not follow: it would stretch every timeout for good.
	if gap := min(now-s.now.Swap(now), int64(2*tick)); gap > s.lag.Load() {
		s.lag.Store(gap)
	}
	s.once.Do(func() { close(s.ready) })
	if now-s.lastIdle >= int64(tick) {
		s.lastIdle = now
		s.closeIdle(now)
	}
	every := time.Duration(s.sweepEvery.Load())
	if every == 0 {
		return tick
	}
	s.mu.Lock()
	for _, ls := range s.loops {
		_ = ls.el.Execute(ls.sweep)
	}
	s.mu.Unlock()
	return every
}

// expired reports whether d has passed by now (read off the clock; the
// coarse copy's errs late) since an event stamped stamp off the coarse
// clock, which trails the event by up to lag: never before d, at most lag
// after it.
func (s *GNet) expired(stamp int64, d time.Duration, now int64) bool {
	return now-stamp > int64(d)+s.lag.Load()
}

// reading says a connection is reading a request (its ReadTimeout bounds
// it).
func (s *GNet) reading() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gc := range s.conns {
		if gc.unread.Load() {
			return true
		}
	}
	return false
}

// closeIdle closes the connections that serve nothing and either waited
// for a request longer than IdleTimeout or have sent part of one for longer
// than ReadTimeout; now == 0 closes every one that serves nothing and is
// not reading a request.
func (s *GNet) closeIdle(now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gc := range s.conns {
		if gc.busy.Load() || gc.held.Load() {
			continue
		}
		if gc.lingerOver(now) {
			_ = gc.c.Close()
			continue
		}
		// dueSince is read off the clock, lastRead off its coarse copy.
		var over bool
		if gc.partial.Load() || gc.fresh.Load() {
			over = now-gc.dueSince.Load() > int64(s.o.ReadTimeout)
		} else {
			over = s.expired(gc.lastRead.Load(), s.o.IdleTimeout, now)
		}
		switch {
		case now == 0:
			// A request partly read is finished and answered (drain
			// waits for it), as nginx and fasthttp do: a client cannot
			// tell whether a cut POST got through.
			if !gc.unread.Load() {
				_ = gc.c.Close()
			}
		case over:
			// Closed on its loop unless the client is still reading
			// an answer.
			_ = gc.c.EventLoop().Execute(gc.checkIdle)
		}
	}
}

// checkIdleOnLoop closes an idle connection, unless the answer it sent is
// still going out and the client took some of it since the last look: a
// slow reader is idle only once it takes nothing for IdleTimeout. One
// holding part of a request is answered 408 first.
func (gc *gconn) checkIdleOnLoop() {
	if gc.closed {
		return
	}
	if n := int64(gc.c.OutboundBuffered()); n > 0 && n != gc.pending.Swap(n) {
		gc.lastRead.Store(gc.s.now.Load())
		return
	}
	if gc.inbound() > 0 && !gc.stopped {
		// A request partly read at ReadTimeout is answered by the error
		// handler (the gateway's 408), as on fasthttp and HTTP/2; one
		// that sent no byte of it (or only part of a TLS record) is not.
		gc.stopped = true
		gc.discard()
		gc.partial.Store(false)
		gc.unread.Store(false)
		gc.ls.serving.Add(1)
		gc.enqueue(queued{ctx: acquireCtx(), err: os.ErrDeadlineExceeded})
		return
	}
	_ = gc.c.Close()
}

// OnOpen gives the connection its state; during Shutdown, or over its
// address's connection cap, it is refused.
func (s *GNet) OnOpen(c *evloop.Conn) ([]byte, evloop.Action) {
	if uc, ok := c.Context().(*upConn); ok {
		return uc.opened(c)
	}
	if s.shutdown.Load() {
		return nil, evloop.Close
	}
	if !s.o.FDs.Accept(c.Fd()) {
		// A reset: it frees the socket at once and tells the client
		// plainly.
		_ = c.SetLinger(0)
		return nil, evloop.Close
	}
	if s.o.Conns != nil && !s.o.Conns.Acquire(c.RemoteAddr()) {
		return nil, s.refuse(c) // refuse.go
	}
	gc := newGConn(s, c)
	gc.ls = s.loopOf(c.EventLoop())
	c.SetContext(gc)
	s.mu.Lock()
	s.conns[gc] = struct{}{}
	s.busyLoops()
	s.mu.Unlock()
	if s.tls != nil {
		s.startTLS(gc) // gnet_tls.go
	}
	return nil, evloop.None
}

// OnClose releases a writer waiting on the connection; its next write
// fails.
func (s *GNet) OnClose(c *evloop.Conn, _ error) {
	if uc, ok := c.Context().(*upConn); ok {
		uc.closed()
		return
	}
	gc, ok := c.Context().(*gconn)
	if !ok {
		return
	}
	s.mu.Lock()
	delete(s.conns, gc)
	if len(s.conns) == 0 && s.busy {
		if s.settle == nil {
			s.settle = time.AfterFunc(idleLoopsAfter, s.settleLoops)
		} else {
			s.settle.Reset(idleLoopsAfter)
		}
	}
	s.mu.Unlock()
	if s.o.Conns != nil && !gc.refused && !gc.handed {
		s.o.Conns.Release(c.RemoteAddr())
	}
	gc.closed = true
	if gc.tls != nil {
		gc.tls.w.feed.close()
	}
	gc.lingerClosed()
	gc.leave()
	if gc.up != nil {
		gc.up.abandon()
	}
	if gc.relaying != nil {
		// The pod learns to stop generating; OnClose ends the relay.
		gc.relaying.abandon()
	}
	if gc.stalled {
		gc.stalled = false
		gc.wrote <- net.ErrClosed
	}
}

// OnTraffic parses what arrived; it also runs on Wake, when a writer asks
// whether the outbound buffer drained or the worker wants parsing resumed.
func (s *GNet) OnTraffic(c *evloop.Conn) evloop.Action {
	if uc, ok := c.Context().(*upConn); ok {
		return uc.read()
	}
	gc := c.Context().(*gconn)
	refresh(&gc.lastRead, s.now.Load())
	gc.arrived()
	if !gc.sniffed && s.h2 != nil {
		if act, done := s.h2cOnLoop(gc); done {
			return act
		}
	}
	if gc.stalled {
		if n := c.OutboundBuffered(); n <= gc.stallLimit {
			gc.stalled = false
			gc.wrote <- nil
			c.EventLoop().Yield()
		} else {
			gc.pending.Store(int64(n))
		}
	}
	if gc.tls == nil || gc.stopped {
		return gc.read()
	}
	if !gc.tls.w.enrolled {
		b, _ := c.Next(-1)
		return s.handshaking(gc, b) // gnet_tls.go
	}
	raw, _ := c.Next(-1)
	return s.tlsTraffic(gc, raw)
}

// tlsTraffic decrypts raw, what came on gc once its handshake was done,
// and parses it.
func (s *GNet) tlsTraffic(gc *gconn, raw []byte) evloop.Action {
	err := gc.tls.pull(raw)
	act := gc.read()
	gc.tls.settle()
	if err != nil {
		return evloop.Close
	}
	return act
}

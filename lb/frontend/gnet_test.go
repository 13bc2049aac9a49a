package frontend

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"pdlb/internal/certgen"
	"pdlb/internal/testwait"
	"pdlb/lb/evloop"
)

// TestEngineStoppedOnItsOwn: an engine that stops outside a shutdown (a
// loop's accept failed: here its listener was shut down under it) has
// closed its port and dropped every connection; Done must say so, or the
// process runs on as if it served. A shutdown asked for is no failure.
func TestEngineStoppedOnItsOwn(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := Handler{Serve: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/hold" {
			close(entered)
			<-release
		}
	}, Error: func(*fasthttp.RequestCtx, error) {}}
	s, err := StartGNet("127.0.0.1:0", h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := unix.Shutdown(s.listeners[0].fd, unix.SHUT_RD); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.Done():
		if err == nil || !strings.Contains(err.Error(), "accept") {
			t.Fatalf("Done: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an engine that stopped on its own was not reported")
	}
	// The request held went with the engine's connections: a shutdown
	// has nothing to wait for.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.ShutdownWithContext(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown after the engine stopped: %v, want its error at once", err)
	}

	s, err = StartGNet("127.0.0.1:0", h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ShutdownWithContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-s.stopped
	select {
	case err := <-s.Done():
		t.Fatalf("a shutdown reported as a failure: %v", err)
	default:
	}
}

// SharedWith names the process listening on an address, once however
// many sockets it listens with, the way /proc shows it: the warning an
// operator gets before a second gateway silently shares the port.
func TestSharedWith(t *testing.T) {
	first, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := first.Addr().String()
	if got := SharedWith(addr); len(got) != 1 || got[0] != fmt.Sprintf("pid %d (%s)", os.Getpid(), selfComm(t)) {
		t.Fatalf("SharedWith(%s) = %q, want this process", addr, got)
	}
	second, err := Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	if got := SharedWith(addr); len(got) != 1 {
		t.Fatalf("two sockets of one process: %q, want it named once", got)
	}
	// Another address, the unspecified one, and port 0 share nothing.
	_, port, _ := net.SplitHostPort(addr)
	for _, other := range []string{"127.0.0.2:" + port, ":" + port, "127.0.0.1:0"} {
		if got := SharedWith(other); len(got) != 0 {
			t.Errorf("SharedWith(%s) = %q, want none", other, got)
		}
	}
	first.Close()
	second.Close()
	if got := SharedWith(addr); len(got) != 0 {
		t.Fatalf("after both closed: %q", got)
	}
	wild, err := Listen("[::]:0")
	if err != nil {
		t.Skip("no IPv6:", err)
	}
	defer wild.Close()
	_, port, _ = net.SplitHostPort(wild.Addr().String())
	for _, same := range []string{":" + port, "0.0.0.0:" + port, "[::]:" + port} {
		if got := SharedWith(same); len(got) != 1 {
			t.Errorf("SharedWith(%s) = %q, want this process (listening on [::]:%s)", same, got, port)
		}
	}
}

func selfComm(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestGNetCountsH2Sockets: an h2c connection leaves the loop for the
// HTTP/2 server on a duplicate of its socket, which the loops stop counting;
// the open-files guard's count of sockets must keep it.
func TestGNetCountsH2Sockets(t *testing.T) {
	s := startGNet(t, Handler{Serve: func(*fasthttp.RequestCtx) {}}, Options{})
	before := s.sockets()
	const n = 3
	for range n {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "the h2c connections to reach the HTTP/2 server", func() bool { return s.h2.open.Load() == n })
	if got := s.sockets(); got != before+n {
		t.Fatalf("%d sockets counted with %d h2c connections open, %d before; want %d", got, n, before, before+n)
	}
}

// TestLoopsGiveProcsBack: GOMAXPROCS is raised for the loops while they
// hold a connection, and given back once they hold none, an h2c
// connection (which the loops hand to the HTTP/2 server) still open.
func TestLoopsGiveProcsBack(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	raised := before + procs
	s := startOK(t, Options{})
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d with no connection yet, want %d", got, before)
	}
	h1 := dialGNet(t, s)
	if _, err := io.WriteString(h1, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := http.ReadResponse(bufio.NewReader(h1), nil); err != nil {
		t.Fatal(err)
	}
	if got := runtime.GOMAXPROCS(0); got != raised {
		t.Fatalf("GOMAXPROCS %d with a connection on the loops, want %d", got, raised)
	}
	if _, err := io.WriteString(dialGNet(t, s), http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the h2c connection to reach the HTTP/2 server", func() bool { return s.h2.open.Load() == 1 })
	h1.Close()
	testwait.For(t, "GOMAXPROCS to be given back", func() bool { return runtime.GOMAXPROCS(0) == before })
}

// TestHandshakeEndsWithItsConnection: a handshake runs on its loop as a
// coroutine, which waits there for the client's next flight; a client
// that closes then (or never answers) leaves no goroutine behind.
func TestHandshakeEndsWithItsConnection(t *testing.T) {
	ca, err := certgen.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"127.0.0.1"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := LoadCerts([]KeyPair{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{MaxHeaderBytes: 4096, MaxBodyBytes: 64 << 10, ReadTimeout: 30 * time.Second, TLS: &TLS{Certs: certs}}
	s, err := StartGNet("127.0.0.1:0", Handler{Serve: func(*fasthttp.RequestCtx) {}, Error: func(*fasthttp.RequestCtx, error) {}}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.ShutdownWithContext(context.Background()) }()
	// One whole handshake first, for what the front end starts once.
	c, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	before := goleak.IgnoreCurrent()
	hello := clientHello(t)
	var conns []net.Conn
	for range 8 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		// The server's flight: the handshake waits for the Finished now.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
			t.Fatalf("no server flight: %v", err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	goleak.VerifyNone(t, before)
}

// clientHello is the first record a TLS client sends.
func clientHello(t *testing.T) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _ = tls.Client(a, &tls.Config{InsecureSkipVerify: true}).Handshake() }()
	head := make([]byte, 5)
	if _, err := io.ReadFull(b, head); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(head[3])<<8|int(head[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(head, body...)
}

// TestChunkedNeed: the scan of a chunked body that came in part skips the
// chunks wholly there and asks for the rest of the one that is not; it
// leaves to the parser what may be whole or is not plainly well formed,
// and counts the body's bytes across scans.
func TestChunkedNeed(t *testing.T) {
	f := func(buf string, wantAt, wantNeed int) {
		t.Helper()
		var s chunkScan
		if need := s.need([]byte(buf), 0, 100); s.at != wantAt || need != wantNeed {
			t.Errorf("%q: at %d, need %d; want %d, %d", buf, s.at, need, wantAt, wantNeed)
		}
	}
	f("5\r\nhel", 0, 10)
	f("5\r\n", 0, 10)
	f("5", 0, 2)
	f("5\r\nhello\r\n3\r\nab", 10, 18)
	f("5;name=value\r\nhello\r\n", 21, 22)
	f("A\r\n0123456789\r\n", 15, 16)
	f("5\r\nhello\r\n0\r\n", 10, 0) // the last chunk: trailers follow
	f("5x\r\nhello\r\n", 0, 0)      // not plainly well formed: the parser says
	f("5 \r\nhello\r\n", 0, 0)
	f("5\nhello\r\n", 0, 0)
	f("5\r\nhelloXY", 0, 0)
	f("0000000000000005\r\nhello\r\n", 0, 0) // 16 digits
	f("\r\n", 0, 0)
	f("65\r\n", 0, 0) // 101 bytes: over max
	f("5;a\rb\r\nhello\r\n", 0, 0)
	// A size line not whole yet waits while it may still be clean.
	f("", 0, 1)
	f("5;ext\r", 0, 7)
	f("zz", 0, 0)
	f("5\rX", 0, 0)
	f("3c\r\n"+strings.Repeat("a", 60)+"\r\n3c\r\n", 66, 0)

	// Across scans, from where the last stopped, the body counted whole.
	var s chunkScan
	chunk := "32\r\n" + strings.Repeat("b", 50) + "\r\n"
	buf := "HEAD" + chunk
	if need := s.need([]byte(buf), 4, 100); need != len(buf)+1 || s.at != len(buf) || s.body != 50 {
		t.Fatalf("first scan: need %d, at %d, body %d", need, s.at, s.body)
	}
	buf += chunk + chunk
	if need := s.need([]byte(buf), 4, 100); need != 0 || s.body != 100 {
		t.Fatalf("a third chunk over max: need %d, body %d; want 0 (the parser's 413)", need, s.body)
	}
}

// FuzzBareLF: a request head that fasthttp's parser takes whole with a
// line ending in a bare LF is one bareLF finds, so gnet refuses it. The
// fasthttp front end scans the header block (refuseBareLF), which
// RawHeaders holds as it came: past the request line, and whole unless
// the block is only its blank line.
func FuzzBareLF(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"\r\nGET / HTTP/1.1\nHost: x\r\nX: y\n z\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n\n\n",
		"GET / HTTP/1.1\r\nhost: x\r\nx-y: a\r\n\tb\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h fasthttp.RequestHeader
		br := bufio.NewReaderSize(bytes.NewReader(b), len(b)+16)
		if h.Read(br) != nil {
			return
		}
		head := b[:len(b)-br.Buffered()]
		if block := headerBlock(head); len(block) > 2 && !bytes.Equal(h.RawHeaders(), block) {
			t.Fatalf("%q: RawHeaders %q, the header block %q", b, h.RawHeaders(), block)
		}
		for i, c := range head {
			if c == '\n' && (i == 0 || head[i-1] != '\r') {
				if !bareLF(b) {
					t.Fatalf("%q: fasthttp took the head %q, bareLF found no bare LF", b, head)
				}
				return
			}
		}
		if bareLF(b) {
			t.Fatalf("%q: bareLF found a bare LF outside the head %q", b, head)
		}
	})
}

// headerBlock is what follows the request line of head, which fasthttp's
// parser finds past the blank lines before it, each line ending at an LF.
func headerBlock(head []byte) []byte {
	for {
		i := bytes.IndexByte(head, '\n')
		line := bytes.TrimSuffix(head[:i], []byte("\r"))
		head = head[i+1:]
		if len(line) > 0 {
			return head
		}
	}
}

// TestFirstExchangeSwept: the loops sweep for the shortest deadline
// Options.UpstreamTimeout says an exchange may get from the first tick,
// not a second after it (the engine's ticker cannot be woken early, and before
// the first exchange it ticks once a second): the first exchange after
// start, whose pod answers in 0.8 s, is given up at its first-byte
// deadline of 0.1 s.
func TestFirstExchangeSwept(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(800 * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	pod := srv.Listener.Addr().String()
	u := Upstream{DialTimeout: time.Second, Timeout: time.Minute, Keepalive: time.Minute, MaxConns: 8, FirstByte: 100 * time.Millisecond}
	s := sendingGNet(t, Options{UpstreamTimeout: 100 * time.Millisecond}, pod, "/", u, false, nil)
	resp, err := http.Get("http://" + s.Addr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("the first exchange, its first-byte deadline 0.1 s, its pod answering in 0.8 s: %d %q; want it given up", resp.StatusCode, b)
	}
}

// TestFreshConnectionNotSweptEarly: the idle sweep gives a new connection
// its whole ReadTimeout to send a request, counted from its accept. The
// loops' coarse clock lags the real one by up to a tick (1 s), more than
// a ReadTimeout may be; a connection accepted just before a tick, whose
// request came just after it, was closed unanswered.
func TestFreshConnectionNotSweptEarly(t *testing.T) {
	s := startOK(t, Options{ReadTimeout: 500 * time.Millisecond})
	beforeTick(s)
	c := dialGNet(t, s)
	testwait.For(t, "the connection's accept", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 1
	})
	s.closeIdle(s.o.clock()) // the tick's sweep
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a request sent at once on a new connection: %v; want it answered", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request sent at once on a new connection: %d; want 200", resp.StatusCode)
	}
}

// TestKeptConnectionNotSweptEarly: the idle sweep lets a keep-alive
// connection wait its whole IdleTimeout for the next request, counted from
// the answer before it. That stamp comes off the loops' coarse clock, up
// to a tick (1 s) behind: a client that came back within IdleTimeout found
// its connection closed under it, as nginx's keepalive_timeout never does.
func TestKeptConnectionNotSweptEarly(t *testing.T) {
	s := startOK(t, Options{IdleTimeout: 500 * time.Millisecond})
	beforeTick(s)
	c := dialGNet(t, s)
	br := bufio.NewReader(c)
	get(t, c, br, "the first request")
	var gc *gconn
	testwait.For(t, "the connection idle", func() bool { gc = idleGConn(s); return gc != nil })
	s.closeIdle(s.o.clock()) // the tick's sweep
	// Its checkIdle, then the close that queues.
	loopTurns(t, gc.c.EventLoop(), 2)
	get(t, c, br, "the next request, at once on the kept connection")
}

// loopTurns waits until el has run what was queued on it, and what that
// queued in turn, n deep: a close the sweep asked for is done by then.
func loopTurns(t *testing.T, el *evloop.Loop, n int) {
	t.Helper()
	for range n {
		ran := make(chan struct{})
		if err := el.Execute(func() { close(ran) }); err != nil {
			t.Fatal(err)
		}
		<-ran
	}
}

// TestLingerNotCutEarly: a connection lingering after its last answer is
// closed once its client sent nothing for lingerTimeout, not before: its
// stamps come off the loops' coarse clock, up to a tick (1 s) behind.
func TestLingerNotCutEarly(t *testing.T) {
	s := startOK(t, Options{IdleTimeout: time.Minute})
	beforeTick(s)
	c := dialGNet(t, s)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the last answer: %d bytes, %v; want EOF (a half-close)", n, err)
	}
	var gc *gconn
	testwait.For(t, "the connection lingering", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for gc = range s.conns {
			return gc.lingerSince.Load() != 0
		}
		return false
	})
	// The sweep of the tick that comes just short of lingerTimeout after
	// the linger began.
	s.closeIdle(s.o.clock() + int64(lingerTimeout-200*time.Millisecond))
	loopTurns(t, gc.c.EventLoop(), 1) // the close, if the sweep asked for it
	s.mu.Lock()
	_, open := s.conns[gc]
	s.mu.Unlock()
	if !open {
		t.Fatalf("a connection lingering for %v, its client silent, was closed; want it to linger %v", lingerTimeout-200*time.Millisecond, lingerTimeout)
	}
}

// dialGNet connects to s; the connection is closed at the test's end,
// and its reads and writes are bounded by testwait.Timeout.
func dialGNet(t *testing.T, s *GNet) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(testwait.Timeout))
	return c
}

// startOK starts a gnet front end that answers every request 200 "ok" on
// its loop, with o.
func startOK(t *testing.T, o Options) *GNet {
	t.Helper()
	h := Handler{OnLoop: true, Serve: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }, Error: func(*fasthttp.RequestCtx, error) {}}
	return startGNet(t, h, o)
}

// beforeTick sets s's coarse clock where it stands just before a tick:
// 0.9 s behind the clock.
func beforeTick(s *GNet) { s.now.Store(s.o.clock() - int64(900*time.Millisecond)) }

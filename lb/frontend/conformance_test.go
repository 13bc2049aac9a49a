package frontend_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines/sim"
	"pdlb/lb/config"
	"pdlb/lb/frontend"
	"pdlb/lb/gateway"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
)

// The conformance suite: every case runs against both front ends with the
// same handler, over real sockets on loopback.

var frontEnds = []string{frontend.NameFastHTTP, frontend.NameGNet}

const testMaxBody = 64 << 10

// app is the test handler. /echo answers the body; /close answers and
// closes; /big answers a body of n bytes; /sse streams n events through frontend.SetBodyStreamWriter and
// /sse-pipe through fasthttp's own SetBodyStreamWriter, each event flushed,
// with gated=1 waiting on step before each; /flood streams 256 MiB
// as fast as the client takes it, counting what the writer got through;
// /panic streams one event, then its writer panics; /watch watches its
// client (frontend.WatchClient), says so on watching, and waits for step
// (then answers "stayed") or for the client to leave (then says so on
// left).
type app struct {
	step           chan struct{}
	streamErr      chan error
	watching, left chan struct{}
	flooded        atomic.Int64
	// name is the front end serving it (set by forEach).
	name string
	// onLoop lets gnet run the handler on its loop (Handler.OnLoop), as
	// the gateway does: a request on an idle connection is answered there.
	onLoop bool
}

// floodStalled waits until /flood's writer stops making progress and
// returns what it got through.
func (a *app) floodStalled() int64 {
	last, still := int64(-1), 0
	for still < 5 {
		time.Sleep(20 * time.Millisecond)
		n := a.flooded.Load()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	return last
}

func newApp() *app {
	return &app{step: make(chan struct{}), streamErr: make(chan error, 4), watching: make(chan struct{}), left: make(chan struct{})}
}

func (a *app) handler() frontend.Handler {
	return frontend.Handler{Serve: a.serve, Error: writeFrontError, OnLoop: a.onLoop}
}

func (a *app) serve(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/echo":
		ctx.Response.Header.Set("X-Seq", string(ctx.Request.Header.Peek("X-Seq")))
		ctx.SetBody(ctx.PostBody())
	case "/close":
		ctx.SetConnectionClose()
		ctx.SetBodyString("bye")
	case "/big":
		ctx.SetBody(bytes.Repeat([]byte("b"), ctx.QueryArgs().GetUintOrZero("n")))
	case "/sse", "/sse-pipe":
		n := ctx.QueryArgs().GetUintOrZero("n")
		gated := ctx.QueryArgs().GetBool("gated")
		ctx.SetContentType("text/event-stream")
		// The same events through either writer.
		sw := func(w interface {
			io.Writer
			Flush() error
		}) {
			for i := 0; i < n; i++ {
				if gated {
					<-a.step
				}
				fmt.Fprintf(w, "data: %d\n\n", i)
				if err := w.Flush(); err != nil {
					a.streamErr <- err
					return
				}
			}
		}
		if string(ctx.Path()) == "/sse" {
			frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) { sw(w) })
		} else {
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) { sw(w) })
		}
	case "/panic":
		frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
			fmt.Fprintf(w, "data: 0\n\n")
			_ = w.Flush()
			panic("a stream writer's bug")
		})
	case "/flood":
		frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
			block := make([]byte, 4096)
			for i := 0; i < 256<<20/len(block); i++ {
				if _, err := w.Write(block); err != nil {
					a.streamErr <- err
					return
				}
				a.flooded.Add(int64(len(block)))
			}
		})
	case "/watch":
		gone := frontend.WatchClient(ctx)
		a.watching <- struct{}{}
		select {
		case <-gone:
			a.left <- struct{}{}
		case <-a.step:
			ctx.SetBodyString("stayed")
		}
	default:
		ctx.SetStatusCode(http.StatusNotFound)
	}
}

// writeFrontError answers what a front end rejects before the handler, in
// OpenAI's error shape, as the gateway's ErrorHandler does, with the 431 it
// lacks. The Host it read, if any, goes back as X-Host: a head refused
// for its framing reaches it unread.
func writeFrontError(ctx *fasthttp.RequestCtx, err error) {
	if host := ctx.Request.Header.Host(); len(host) > 0 {
		ctx.Response.Header.SetBytesV("X-Host", host)
	}
	e := &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: "Malformed HTTP request: " + err.Error()}
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = openai.BodyTooLarge(testMaxBody)
	case frontend.HeadTooLarge(err):
		e = &openai.Error{Status: http.StatusRequestHeaderFieldsTooLarge, Type: openai.TypeInvalidRequest, Message: "The request headers are too large."}
	}
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(e.AppendJSON(nil))
}

// serve starts front end name on loopback with h and returns its address.
func serve(t testing.TB, name string, h frontend.Handler) string {
	t.Helper()
	return serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody})
}

// serveWith is serve with options of the test's own.
func serveWith(t testing.TB, name string, h frontend.Handler, o frontend.Options) string {
	t.Helper()
	s, err := frontend.Start(name, "127.0.0.1:0", h, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.ShutdownWithContext(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s.Addr()
}

// forEach runs f as a subtest per front end, each with its own app, in
// plain HTTP/1.1 and over TLS (dial speaks TLS to the latter's address).
func forEach(t *testing.T, f func(t *testing.T, addr string, a *app)) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		for _, onLoop := range []bool{false, true} {
			if onLoop && name != frontend.NameGNet {
				continue
			}
			sub := name
			if onLoop {
				sub += "/loop"
			}
			t.Run(sub, func(t *testing.T) {
				a := newApp()
				a.name, a.onLoop = name, onLoop
				f(t, serve(t, name, a.handler()), a)
			})
			t.Run(sub+"/tls", func(t *testing.T) {
				a := newApp()
				a.name, a.onLoop = name, onLoop
				addr := serveWith(t, name, a.handler(), ts.options())
				tlsClients.Store(addr, ts.clientConfig("http/1.1"))
				t.Cleanup(func() { tlsClients.Delete(addr) })
				f(t, addr, a)
			})
		}
	}
}

// tlsClients holds the client configuration of each address served over
// TLS.
var tlsClients sync.Map

type client struct {
	net.Conn
	tcp *net.TCPConn // under TLS, if any
	br  *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tcp := c.(*net.TCPConn)
	if cfg, ok := tlsClients.Load(addr); ok {
		c = tls.Client(c, cfg.(*tls.Config))
	}
	t.Cleanup(func() { c.Close() })
	// A test that hangs fails here instead of at the test binary's limit.
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &client{Conn: c, tcp: tcp, br: bufio.NewReader(c)}
}

// send writes s. A server that answered early and closed (a 413 before
// the body is all sent) may fail the write: the response then tells.
func (c *client) send(t *testing.T, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
}

// response reads one response and its whole body.
func (c *client) response(t *testing.T) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func post(path, body string, extra ...string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		strings.Join(extra, "") + "\r\n" + body
}

func post10(path, body string, extra ...string) string {
	return strings.Replace(post(path, body, extra...), " HTTP/1.1\r\n", " HTTP/1.0\r\n", 1)
}

func expect(t *testing.T, resp *http.Response, body string, status int, want string) {
	t.Helper()
	if resp.StatusCode != status || body != want {
		t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, status, want)
	}
}

func TestPartialReads(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		req := post("/echo", `{"hello":"world"}`)
		for i := 0; i < len(req); i++ {
			c.send(t, req[i:i+1])
			if i%8 == 0 {
				// Lets the server see the request in many reads.
				time.Sleep(time.Millisecond)
			}
		}
		resp, b := c.response(t)
		expect(t, resp, b, 200, `{"hello":"world"}`)
	})
}

func TestPipelining(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		var all strings.Builder
		const n = 40 // more than the gnet front end queues at once
		for i := 0; i < n; i++ {
			all.WriteString(post("/echo", "body-"+strconv.Itoa(i), "X-Seq: "+strconv.Itoa(i)+"\r\n"))
		}
		c.send(t, all.String())
		for i := 0; i < n; i++ {
			resp, b := c.response(t)
			expect(t, resp, b, 200, "body-"+strconv.Itoa(i))
			if resp.Header.Get("X-Seq") != strconv.Itoa(i) {
				t.Fatalf("response %d answers request %s", i, resp.Header.Get("X-Seq"))
			}
		}
	})
}

func TestKeepAliveAndClose(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		for i := 0; i < 3; i++ {
			c.send(t, post("/echo", "again"))
			resp, b := c.response(t)
			expect(t, resp, b, 200, "again")
			if resp.Close {
				t.Fatal("keep-alive response closes the connection")
			}
		}
		// The client's Connection: close, then the handler's.
		c.send(t, post("/echo", "last", "Connection: close\r\n"))
		resp, b := c.response(t)
		expect(t, resp, b, 200, "last")
		if !resp.Close {
			t.Fatal("no Connection: close in the answer to a closing request")
		}
		if n, err := c.br.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("connection left open after Connection: close: %d, %v", n, err)
		}

		c = dial(t, addr)
		c.send(t, post("/close", ""))
		resp, b = c.response(t)
		expect(t, resp, b, 200, "bye")
		if _, err := c.br.Read(make([]byte, 1)); !resp.Close || err != io.EOF {
			t.Fatalf("handler's Connection: close not honoured: close=%v, read %v", resp.Close, err)
		}
	})
}

// TestHTTP10: an HTTP/1.0 client keeps its connection only when it asks
// (Connection: keep-alive, as ab -k sends) and is told so in the answer;
// a streamed answer reaches it unframed, ended by the close, since it
// cannot read chunked framing (RFC 9112, 6.1), whatever it asked.
func TestHTTP10(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, a *app) {
		c := dial(t, addr)
		for i := 0; i < 2; i++ {
			c.send(t, post10("/echo", "again", "Connection: keep-alive\r\n"))
			resp, b := c.response(t)
			expect(t, resp, b, 200, "again")
			if resp.Close || !strings.EqualFold(resp.Header.Get("Connection"), "keep-alive") {
				t.Fatalf("answer %d to an HTTP/1.0 keep-alive request: close=%v, Connection %q", i, resp.Close, resp.Header.Get("Connection"))
			}
		}
		c.send(t, post10("/echo", "last"))
		resp, b := c.response(t)
		expect(t, resp, b, 200, "last")
		if _, err := c.br.Read(make([]byte, 1)); !resp.Close || err != io.EOF {
			t.Fatalf("HTTP/1.0 request without keep-alive: close=%v, then read %v", resp.Close, err)
		}

		for _, path := range []string{"/sse?n=3", "/sse-pipe?n=3"} {
			c = dial(t, addr)
			c.send(t, post10(path, "", "Connection: keep-alive\r\n"))
			resp, b = c.response(t)
			if resp.StatusCode != 200 || len(resp.TransferEncoding) > 0 || resp.ContentLength != -1 || !resp.Close {
				t.Fatalf("%s over HTTP/1.0: status %d, Transfer-Encoding %q, length %d, close=%v", path, resp.StatusCode, resp.TransferEncoding, resp.ContentLength, resp.Close)
			}
			if want := "data: 0\n\ndata: 1\n\ndata: 2\n\n"; b != want {
				t.Fatalf("%s over HTTP/1.0: body %q, want %q", path, b, want)
			}
		}

		// Behind a pipelined answer (fasthttp may still hold it: it wrote
		// the stream ahead of it).
		c = dial(t, addr)
		c.send(t, post10("/echo", "first", "Connection: keep-alive\r\n")+post10("/sse?n=3", "", "Connection: keep-alive\r\n"))
		resp, b = c.response(t)
		expect(t, resp, b, 200, "first")
		resp, b = c.response(t)
		expect(t, resp, b, 200, "data: 0\n\ndata: 1\n\ndata: 2\n\n")

		// A kept connection's stream comes as it is made, not gathered.
		c = dial(t, addr)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		c.send(t, post10("/echo", "first", "Connection: keep-alive\r\n"))
		resp, b = c.response(t)
		expect(t, resp, b, 200, "first")
		c.send(t, post10("/sse?gated=1&n=2", "", "Connection: keep-alive\r\n"))
		a.step <- struct{}{}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		first := make([]byte, len("data: 0\n\n"))
		if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: 0\n\n" {
			t.Fatalf("a kept connection's stream: first event %q, %v", first, err)
		}
		a.step <- struct{}{}
		if rest, _ := io.ReadAll(resp.Body); string(rest) != "data: 1\n\n" {
			t.Fatalf("a kept connection's stream: then %q", rest)
		}
	})
}

// TestHeadOfAStream: a HEAD answered with a stream gets its header alone,
// and a keep-alive connection stays in step (gnet sent the body's chunks,
// read as the next answer).
func TestHeadOfAStream(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
			c := dial(t, addr)
			c.send(t, "HEAD /sse?n=2 "+proto+"\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
			resp, err := http.ReadResponse(c.br, &http.Request{Method: "HEAD"})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if rest, _ := io.ReadAll(c.br); resp.StatusCode != 200 || len(rest) > 0 {
				t.Errorf("%s HEAD of a stream: %d, then %q", proto, resp.StatusCode, rest)
			}
		}
	})
}

// TestIdleCountsFromTheAnswer: a keep-alive connection's idle time runs
// from its last answer, not from its last request: a stream longer than
// IdleTimeout must not have its connection closed right after it ends.
func TestIdleCountsFromTheAnswer(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			a := newApp()
			addr := serveWith(t, name, a.handler(), frontend.Options{MaxBodyBytes: testMaxBody, IdleTimeout: 3 * time.Second})
			c := dial(t, addr)
			c.send(t, "GET /sse?n=1&gated=1 HTTP/1.1\r\nHost: x\r\n\r\n")
			time.Sleep(4 * time.Second)
			a.step <- struct{}{}
			resp, b := c.response(t)
			expect(t, resp, b, 200, "data: 0\n\n")
			// Past a tick of the idle sweep, well within IdleTimeout.
			time.Sleep(1100 * time.Millisecond)
			c.send(t, post("/echo", "next"))
			resp, b = c.response(t)
			expect(t, resp, b, 200, "next")
		})
	}
}

// TestLastAnswerIsWhole: a connection's last answer reaches the client
// whole before the close, one the socket takes at once and one far larger
// than its buffers, which a client that waits before reading drains later.
func TestLastAnswerIsWhole(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		for _, n := range []int{10, 8 << 20} {
			c := dial(t, addr)
			_ = c.tcp.SetReadBuffer(64 << 10)
			c.send(t, fmt.Sprintf("GET /big?n=%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", n))
			time.Sleep(100 * time.Millisecond)
			resp, b := c.response(t)
			if resp.StatusCode != 200 || len(b) != n || !resp.Close {
				t.Fatalf("%d-byte answer: %d, %d bytes, close %v", n, resp.StatusCode, len(b), resp.Close)
			}
			if _, err := c.br.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("%d-byte answer: connection left open: %v", n, err)
			}
		}
	})
}

func TestExpectContinue(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		body := `{"big":"prompt"}`
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n")
		resp, b := c.response(t)
		expect(t, resp, b, 100, "")
		c.send(t, body)
		resp, b = c.response(t)
		expect(t, resp, b, 200, body)

		// HTTP/1.0's expectation is ignored (RFC 9110 10.1.1): no
		// interim answer it cannot read.
		c.send(t, "POST /echo HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
		time.Sleep(20 * time.Millisecond)
		c.send(t, "hello")
		resp, b = c.response(t)
		expect(t, resp, b, 200, "hello")

		// Too large a body is refused before it is sent: no go-ahead.
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "+strconv.Itoa(testMaxBody+1)+"\r\n\r\n")
		resp, b = c.response(t)
		expectError(t, resp, b, 413)

		// A request with no body has nothing to wait for: it is served
		// (the go-ahead may be omitted, RFC 9110 10.1.1), with or without
		// a Content-Length.
		for _, length := range []string{"Content-Length: 0\r\n", ""} {
			c := dial(t, addr) // the 413 closed the other
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"+length+"\r\n")
			resp, b := c.response(t)
			if resp.StatusCode == 100 {
				resp, b = c.response(t)
			}
			expect(t, resp, b, 200, "")
		}
	})
}

func TestChunkedRequestBody(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		time.Sleep(5 * time.Millisecond) // the rest in another read
		c.send(t, "6\r\n world\r\n0\r\n\r\n")
		resp, b := c.response(t)
		expect(t, resp, b, 200, "hello world")
		// A byte a read, with a chunk extension and a trailer.
		body := "5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nT: v\r\n\r\n"
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := range len(body) {
			time.Sleep(time.Millisecond)
			c.send(t, body[i:i+1])
		}
		resp, b = c.response(t)
		expect(t, resp, b, 200, "hello world")
		// A malformed size is refused at once, not after more bytes.
		c = dial(t, addr)
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhe")
		resp, b = c.response(t)
		expectError(t, resp, b, 400)
	})
}

// expectError checks an OpenAI-shaped error.
func expectError(t *testing.T, resp *http.Response, body string, status int) {
	t.Helper()
	var e struct {
		Error struct{ Message, Type string }
	}
	if resp.StatusCode != status || json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("got %d %q, want %d with an OpenAI error", resp.StatusCode, body, status)
	}
	if !resp.Close {
		t.Fatal("an error before the handler must close the connection")
	}
}

func TestLimits(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		f := func(req string, status int) {
			t.Helper()
			c := dial(t, addr)
			c.send(t, req)
			resp, b := c.response(t)
			expectError(t, resp, b, status)
		}
		f(post("/echo", "x", "X-Big: "+strings.Repeat("a", 5000)+"\r\n"), 431)
		f(post("/echo", strings.Repeat("b", testMaxBody+1)), 413)
		chunk := strings.Repeat("c", 16<<10)
		f("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+
			strings.Repeat(fmt.Sprintf("%x\r\n%s\r\n", len(chunk), chunk), 5)+"0\r\n\r\n", 413)
		f("BROKEN\r\n\r\n", 400)
	})
}

// TestConnCapPerIP: a client address gets MaxConnsPerIP connections, the
// next is answered 429 and closed (over TLS, reset: a plain answer would
// be garbage to a TLS client, and no handshake is spent on a connection
// refused), and closing one frees its place.
func TestConnCapPerIP(t *testing.T) {
	ts := newTLSSetup(t)
	for _, fe := range frontEnds {
		for _, secure := range []bool{false, true} {
			name := fe + map[bool]string{true: "/tls"}[secure]
			t.Run(name, func(t *testing.T) {
				testConnCapPerIP(t, fe, secure, ts)
			})
		}
	}
}

func testConnCapPerIP(t *testing.T, name string, secure bool, ts *tlsSetup) {
	const connCap = 3
	conns := limits.NewConns(limits.ConnLimits{MaxConnsPerIP: connCap})
	o := frontend.Options{MaxBodyBytes: testMaxBody, Conns: conns}
	if secure {
		o = ts.options()
		o.Conns = conns
	}
	addr := serveWith(t, name, newApp().handler(), o)
	if secure {
		tlsClients.Store(addr, ts.clientConfig("http/1.1"))
		t.Cleanup(func() { tlsClients.Delete(addr) })
	}
	// served dials and proves the connection is served.
	served := func() *client {
		t.Helper()
		c := dial(t, addr)
		c.send(t, post("/echo", "hi"))
		resp, b := c.response(t)
		expect(t, resp, b, 200, "hi")
		return c
	}
	open := make([]*client, connCap)
	for i := range open {
		open[i] = served()
	}
	// The one over the cap is answered 429 and closed, lingering: the
	// client reads the answer whole, then EOF. Over TLS it is reset.
	over, err := net.Dial("tcp", addr)
	switch {
	case secure && errors.Is(err, syscall.ECONNRESET):
		// The reset came before the dial returned.
	case err != nil:
		t.Fatal(err)
	case secure:
		defer over.Close()
		_ = over.SetDeadline(time.Now().Add(20 * time.Second))
		tc := tls.Client(over, ts.clientConfig("http/1.1"))
		if err := tc.Handshake(); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.EOF) {
			t.Fatalf("a TLS connection over the cap: handshake %v; want a reset", err)
		}
	default:
		defer over.Close()
		_ = over.SetDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.WriteString(over, post("/echo", "over"))
		if b, err := io.ReadAll(over); err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 429 ") {
			t.Fatalf("a connection over the cap: %q, %v; want a 429, then EOF", b, err)
		}
	}
	if conns.Refused() != 1 {
		t.Fatalf("refused %d connections, want 1", conns.Refused())
	}
	open[0].Close()
	// The close reaches the server asynchronously.
	deadline := time.Now().Add(10 * time.Second)
	for conns.Open() > connCap-1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	served()
	if conns.Open() != connCap {
		t.Fatalf("%d connections counted open, want %d", conns.Open(), connCap)
	}
}

// TestStreamingIsIncremental: each event reaches the client before the
// handler writes the next.
func TestStreamingIsIncremental(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, a *app) {
		for _, path := range []string{"/sse", "/sse-pipe"} {
			c := dial(t, addr)
			c.send(t, "GET "+path+"?gated=1&n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
			a.step <- struct{}{}
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%s: %d %v", path, resp.StatusCode, resp.Header)
			}
			br := bufio.NewReader(resp.Body)
			for i := 0; i < 3; i++ {
				line, err := br.ReadString('\n')
				if err != nil || line != fmt.Sprintf("data: %d\n", i) {
					t.Fatalf("%s: event %d: %q, %v", path, i, line, err)
				}
				_, _ = br.ReadString('\n')
				if i < 2 {
					a.step <- struct{}{}
				}
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Fatalf("%s: after the last event: %q, %v", path, rest, err)
			}
		}
	})
}

// TestStreamWriterPanic: a stream writer that panics has its stream cut
// (no last chunk: the client sees it broken) and the process serves on.
func TestStreamWriterPanic(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, a *app) {
		c := dial(t, addr)
		c.send(t, "GET /panic HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		if string(body) != "data: 0\n\n" || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %q, %v; want the first event, then a broken stream", body, err)
		}
		c = dial(t, addr)
		c.send(t, post("/echo", "still here"))
		resp, b := c.response(t)
		expect(t, resp, b, 200, "still here")
	})
}

// TestSlowClient: a client that stops reading blocks the stream writer
// after a bounded number of bytes: the kernel's socket buffers plus a
// front end's own bounded buffering, far below the 256 MiB the writer
// would write.
func TestSlowClient(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, a *app) {
		c := dial(t, addr)
		// A fixed receive buffer keeps the kernel's share small and known.
		_ = c.tcp.SetReadBuffer(64 << 10)
		c.send(t, "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
		last := a.floodStalled()
		const bound = 16 << 20
		if last > bound {
			t.Fatalf("writer got %d bytes past a client that reads nothing (bound %d)", last, bound)
		}
		t.Logf("writer blocked after %d KiB", last>>10)
		// Reading resumes the stream.
		if _, err := io.CopyN(io.Discard, c.br, last+1<<20); err != nil {
			t.Fatal(err)
		}
		if a.flooded.Load() <= last {
			t.Fatal("stream did not resume when the client read")
		}
	})
}

// TestClientDisconnect: a client gone mid-stream fails the stream writer's
// next writes, which is how the gateway learns to cancel upstream.
func TestClientDisconnect(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, a *app) {
		for _, path := range []string{"/sse", "/sse-pipe"} {
			c := dial(t, addr)
			c.send(t, "GET "+path+"?gated=1&n=100000 HTTP/1.1\r\nHost: x\r\n\r\n")
			a.step <- struct{}{}
			if _, err := http.ReadResponse(c.br, nil); err != nil {
				t.Fatal(err)
			}
			c.Close()
			for done := false; !done; {
				select {
				case a.step <- struct{}{}:
				case err := <-a.streamErr:
					t.Logf("%s: writer failed with %v", path, err)
					done = true
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: the stream writer never failed", path)
				}
			}
		}
	})
}

// TestWatchClient: a handler that watches its client learns that it
// left, over TLS too, whose client sends close_notify before its FIN; a
// request the client pipelines meanwhile is no leaving, and it is
// answered next, as is one after it on the same connection.
func TestWatchClient(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, a *app) {
		if a.onLoop {
			t.Skip("a handler on the loop must not wait")
		}
		c := dial(t, addr)
		watch := "GET /watch HTTP/1.1\r\nHost: x\r\n\r\n"
		c.send(t, watch)
		<-a.watching
		c.send(t, post("/echo", "pipelined"))
		select {
		case a.step <- struct{}{}:
		case <-a.left:
			t.Fatal("a pipelined request was taken for the client leaving")
		}
		resp, b := c.response(t)
		expect(t, resp, b, 200, "stayed")
		resp, b = c.response(t)
		expect(t, resp, b, 200, "pipelined")
		c.send(t, watch)
		<-a.watching
		c.Close()
		waitLeft(t, a)
	})
}

// TestWatchOutlivesReadTimeout: on fasthttp, the read deadline of a
// request does not end its watch, nor does that of the request pipelined
// behind it end the latter's.
func TestWatchOutlivesReadTimeout(t *testing.T) {
	const readTimeout = 50 * time.Millisecond
	a := newApp()
	c := dial(t, serveWith(t, frontend.NameFastHTTP, a.handler(), frontend.Options{ReadTimeout: readTimeout}))
	watch := "GET /watch HTTP/1.1\r\nHost: x\r\n\r\n"
	c.send(t, watch+watch)
	<-a.watching
	time.Sleep(2 * readTimeout)
	// fasthttp holds the first answer back until the pipelined request's
	// is ready.
	a.step <- struct{}{}
	<-a.watching
	time.Sleep(2 * readTimeout)
	c.Close()
	waitLeft(t, a)
}

// waitLeft waits for a's /watch to report that its client left.
func waitLeft(t *testing.T, a *app) {
	t.Helper()
	select {
	case <-a.left:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never learned that its client left")
	}
}

// TestGateway runs the real gateway over a simulated vLLM pod on each front
// end: a stream, a whole answer and a body over the limit.
func TestGateway(t *testing.T) {
	pod, err := sim.Start(sim.Config{Name: "m-0", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", ""
	cfg.MaxBodyBytes = testMaxBody
	cfg.Pods = []config.Pod{{Name: "m-0", Model: "m", Address: pod.Addr()}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			g, err := gateway.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Close)
			c := dial(t, serve(t, name, frontend.Handler{Serve: g.Handler, Error: g.ErrorHandler}))

			c.send(t, post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"count"}],"max_tokens":8,"stream":true}`))
			resp, b := c.response(t)
			if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "m-0" || !strings.HasSuffix(b, "data: [DONE]\n\n") {
				t.Fatalf("stream: %d %v %q", resp.StatusCode, resp.Header, b)
			}
			// The sim pod may put several tokens in one event.
			if n := strings.Count(b, "data: {"); n < 2 || !strings.Contains(b, `"finish_reason":"length"`) {
				t.Fatalf("stream of %d events, or not to its length: %q", n, b)
			}

			c.send(t, post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
			resp, b = c.response(t)
			if resp.StatusCode != 200 || !strings.Contains(b, `"completion_tokens":4`) {
				t.Fatalf("whole answer: %d %q", resp.StatusCode, b)
			}

			// The gateway's own answer: the same headers from either
			// front end, and no Server header of its own (a proxied
			// answer carries the pod's).
			c.send(t, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, b = c.response(t)
			if resp.StatusCode != 200 || !strings.Contains(b, `"id":"m"`) || resp.Header.Get("Server") != "" {
				t.Fatalf("models: %d %v %q", resp.StatusCode, resp.Header, b)
			}

			c.send(t, post("/v1/chat/completions", strings.Repeat(" ", testMaxBody+1)))
			resp, b = c.response(t)
			expectError(t, resp, b, 413)
		})
	}
}

// TestHeaderNamesAnyCase: a handler finds a header whatever case the client
// spelled its name in, as HTTP has it (the gateway looks up x-priority,
// x-session-id and the like in lower case; clients send X-Priority).
func TestHeaderNamesAnyCase(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		for _, name := range []string{"X-Seq", "x-seq", "X-SEQ"} {
			c.send(t, post("/echo", "b", name+": 7\r\n"))
			resp, b := c.response(t)
			expect(t, resp, b, 200, "b")
			if got := resp.Header.Get("X-Seq"); got != "7" {
				t.Fatalf("header sent as %q: the handler read %q", name, got)
			}
		}
	})
}

// serveStream starts front end name with a's handler and opens a gated
// stream of two events on it; its body comes back with the first event
// read (the second waits for a.step).
func serveStream(t *testing.T, name string, a *app) (frontend.Server, *bufio.Reader) {
	t.Helper()
	s, err := frontend.Start(name, "127.0.0.1:0", a.handler(), frontend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, s.Addr())
	c.send(t, "GET /sse?gated=1&n=2 HTTP/1.1\r\nHost: x\r\n\r\n")
	a.step <- struct{}{}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 0\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	return s, br
}

// TestShutdownInTwoSteps: a shutdown whose grace runs out leaves the
// streams still served running, so the caller can end them cleanly (the
// gateway sends each an error event) and call again.
func TestShutdownInTwoSteps(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			a := newApp()
			s, br := serveStream(t, name, a)
			short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if err := s.ShutdownWithContext(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a shutdown whose grace ran out with a stream open: %v", err)
			}
			// The stream is still there: its next event goes out, then
			// its end, and the second call returns once it is done.
			a.step <- struct{}{}
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				done <- s.ShutdownWithContext(ctx)
			}()
			rest, err := io.ReadAll(br)
			if err != nil || !strings.HasPrefix(string(rest), "\ndata: 1\n\n") {
				t.Fatalf("after the first call: %q, %v", rest, err)
			}
			if err := <-done; err != nil {
				t.Fatalf("second call: %v", err)
			}
		})
	}
}

// TestShutdownFinishesRequestBeingRead: a request whose body is still
// coming when a shutdown begins is read whole and answered (with
// Connection: close), as nginx and fasthttp do; a connection that has
// sent nothing, or is between requests, is closed at once. gnet closed
// the first too, and the client could not tell whether its POST got
// through.
func TestShutdownFinishesRequestBeingRead(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			s, err := frontend.Start(name, "127.0.0.1:0", newApp().handler(), frontend.Options{MaxBodyBytes: testMaxBody})
			if err != nil {
				t.Fatal(err)
			}
			c, idle := dial(t, s.Addr()), dial(t, s.Addr())
			c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello")
			idle.send(t, post("/echo", "x", ""))
			resp, b := idle.response(t)
			expect(t, resp, b, 200, "x")
			time.Sleep(100 * time.Millisecond)
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				done <- s.ShutdownWithContext(ctx)
			}()
			if _, err := idle.br.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("the connection between requests: %v, want closed", err)
			}
			c.send(t, "world")
			resp, err = http.ReadResponse(c.br, nil)
			if err != nil {
				t.Fatalf("a request whose body was coming when the shutdown began: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			expect(t, resp, string(body), 200, "helloworld")
			if !resp.Close {
				t.Error("answered during a shutdown without Connection: close")
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestShutdownClosesWhatReadsNoRequest: a shutdown does not wait for a
// connection that is reading no request: one still sending after its
// 413 (its bytes are discarded), or, on gnet, a TLS connection that
// finished its handshake and sent nothing (fasthttp's own shutdown waits
// for that one until its read timeout).
func TestShutdownClosesWhatReadsNoRequest(t *testing.T) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		for _, tc := range []string{"after 413", "tls, no request"} {
			if tc == "tls, no request" && name == frontend.NameFastHTTP {
				continue
			}
			t.Run(name+"/"+tc, func(t *testing.T) {
				o := frontend.Options{MaxBodyBytes: testMaxBody, ReadTimeout: 20 * time.Second}
				if tc == "tls, no request" {
					o = ts.options()
					o.ReadTimeout = 20 * time.Second
				}
				s, err := frontend.Start(name, "127.0.0.1:0", newApp().handler(), o)
				if err != nil {
					t.Fatal(err)
				}
				nc := dialTCP(t, s.Addr())
				if tc == "tls, no request" {
					if err := tls.Client(nc, ts.clientConfig("http/1.1")).Handshake(); err != nil {
						t.Fatal(err)
					}
				} else {
					c := &client{Conn: nc, br: bufio.NewReader(nc)}
					c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
					resp, b := c.response(t)
					expectError(t, resp, b, 413)
					stop := make(chan struct{})
					defer close(stop)
					go func() {
						for {
							select {
							case <-stop:
								return
							case <-time.After(50 * time.Millisecond):
							}
							if _, err := nc.Write(make([]byte, 1024)); err != nil {
								return
							}
						}
					}()
				}
				time.Sleep(300 * time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := s.ShutdownWithContext(ctx); err != nil {
					t.Fatalf("shutdown: %v", err)
				}
			})
		}
	}
}

// TestRebindAfterShutdown: connections the server closed first wait out
// TIME_WAIT on its port; a listener that sets SO_REUSEADDR without
// SO_REUSEPORT (Go's, nginx's, the other front end) must still bind it at
// once after a shutdown, as when an operator restarts or rolls back.
func TestRebindAfterShutdown(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			s, err := frontend.Start(name, "127.0.0.1:0", newApp().handler(), frontend.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				c := dial(t, s.Addr())
				c.send(t, post("/echo", "x", "Connection: close\r\n"))
				resp, b := c.response(t)
				expect(t, resp, b, 200, "x")
				// The server's close comes first: its side of the
				// connection is the one in TIME_WAIT.
				if _, err := c.br.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("connection left open after Connection: close: %v", err)
				}
			}
			if err := s.ShutdownWithContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", s.Addr())
			if err != nil {
				t.Fatalf("the port after a shutdown: %v", err)
			}
			ln.Close()
		})
	}
}

// TestHandOverWhileDraining: a front end that begins a shutdown lets go
// of its port at once, as an operator upgrading in place needs. A second
// one started on the same port beforehand (SO_REUSEPORT) then gets every
// new connection while the first finishes its stream; with nobody else on
// the port, a new connection is refused (a dial error clients retry
// elsewhere), never accepted and dropped.
func TestHandOverWhileDraining(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			a := newApp()
			old, events := serveStream(t, name, a)

			h := newApp().handler()
			serveNew := h.Serve
			h.Serve = func(ctx *fasthttp.RequestCtx) {
				ctx.Response.Header.Set("X-Server", "new")
				serveNew(ctx)
			}
			next, err := frontend.Start(name, old.Addr(), h, frontend.Options{})
			if err != nil {
				t.Fatalf("a second front end on the port: %v", err)
			}
			drained := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				drained <- old.ShutdownWithContext(ctx)
			}()
			// Once the shutdown began, every new connection is the new
			// front end's (a connection queued on the old one before may
			// be reset: the streak starts after it).
			deadline := time.Now().Add(5 * time.Second)
			for streak := 0; streak < 32; {
				if time.Now().After(deadline) {
					t.Fatalf("new connections still reach the draining front end (%d in a row answered by the new one)", streak)
				}
				streak++
				c, err := net.Dial("tcp", old.Addr())
				if err != nil {
					streak = 0
					continue
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, post("/echo", "hi")); err != nil {
					streak = 0
				} else if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.Header.Get("X-Server") != "new" {
					streak = 0
				}
				c.Close()
			}
			if err := next.ShutdownWithContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if c, err := net.Dial("tcp", old.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
				if err == nil {
					c.Close()
				}
				t.Fatalf("a connection to the port of a draining front end: %v, want it refused", err)
			}
			a.step <- struct{}{}
			rest, err := io.ReadAll(events)
			if err != nil || !strings.HasPrefix(string(rest), "\ndata: 1\n\n") {
				t.Fatalf("the stream after the hand-over: %q, %v", rest, err)
			}
			if err := <-drained; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		})
	}
}

// TestChunkedOverLimitInSmallReads: a chunked body that goes over
// MaxBodyBytes a chunk a read is refused with 413 once it does, and a
// malformed size line (a bare LF, a CR inside, not hex, even before its
// LF comes) with 400 at once, on both front ends.
func TestChunkedOverLimitInSmallReads(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 1024, strings.Repeat("c", 1024))
		for range testMaxBody/1024 + 16 {
			c.send(t, chunk)
			time.Sleep(time.Millisecond)
		}
		resp, b := c.response(t)
		expectError(t, resp, b, 413)

		for _, bad := range []string{"400\nhe", "5;a\rb\r\n", "zz", "5\rX"} {
			c = dial(t, addr)
			c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+bad)
			resp, b = c.response(t)
			expectError(t, resp, b, 400)
		}
	})
}

// TestBareLFHead: a request head with a line that ends in a bare LF is
// answered 400 at once, wherever the LF is: fasthttp's parser took some
// such heads for unfinished (held until the read timeout), and served
// others (a bare LF before a CRLF CRLF, even one of a pipelined request
// behind). The error handler gets none of the refused head, and nothing
// behind it is served. A lone CR is refused too. The fasthttp front end
// sees only the header block of a head its own reads took whole
// (RequestHeader.RawHeaders): a bare LF ending the request line or a
// blank line before it, and a head fasthttp waits on, are gnet's alone.
func TestBareLFHead(t *testing.T) {
	const bareLF = "a line of the request head ends in a bare LF"
	heads := []struct {
		head, want string
		gnetOnly   bool
	}{
		{"GET /echo HTTP/1.1\nHost: x\n\n", bareLF, true},
		{"GET /echo HTTP/1.1\r\nHost: x\r\n\n", bareLF, true},
		{"GET /echo HTTP/1.1\r\nHost: x\n\r\n", bareLF, true},
		{"GET /echo HTTP/1.1\r\nHost: x\n\n", bareLF, true},
		{"GET /echo HTTP/1.1\r\nHost: x\n", bareLF, true},
		{"GET /echo HTTP/1.1\nHost: x\r\n\r\n", bareLF, true},
		{"GET /echo HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", bareLF, false},
		{"GET /echo HTTP/1.1\r\nHost: x\r\nX: y\n z\r\n\r\n", bareLF, false},
		{"\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n", bareLF, true},
		{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\nX: y\r\n\r\nabc", bareLF, false},
		{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\nExpect: 100-continue\r\n\r\n", bareLF, false},
		{"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\nX: y\r\n\r\n", bareLF, false},
		{"GET /echo HTTP/1.1\r\nHost: x\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n", bareLF, false},
		{"GET /echo HTTP/1.1\r\nHost: x\r\n\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n", bareLF, false},
		{"GET /echo HTTP/1.0\r\nX: y\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n", bareLF, false},
		{"GET /echo HTTP/1.1\r\nHost: x\rY: z\r\n\r\n", "", false},
		{"GET /echo HTTP/1.1\r\nHost: x\r\n\r\r\n", "", true},
	}
	forEach(t, func(t *testing.T, addr string, a *app) {
		for _, h := range heads {
			if h.gnetOnly && a.name != frontend.NameGNet {
				continue
			}
			t.Run(fmt.Sprintf("%q", h.head), func(t *testing.T) {
				t.Parallel()
				c := dial(t, addr)
				c.send(t, h.head)
				resp, b := c.response(t)
				expectError(t, resp, b, 400)
				if !strings.Contains(b, h.want) {
					t.Errorf("got %q, want it to say %q", b, h.want)
				}
				if host := resp.Header.Get("X-Host"); host != "" {
					t.Errorf("the error handler read Host %q of the refused head", host)
				}
				// Nothing of the head is served, nor what follows it.
				if rest, err := io.ReadAll(c.br); len(rest) > 0 || err != nil {
					t.Errorf("after the 400: %q, %v", rest, err)
				}
			})
		}
		// A body may hold blank lines of its own.
		c := dial(t, addr)
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na\n\nb\r\n")
		time.Sleep(20 * time.Millisecond)
		c.send(t, "0\r\n\r\n")
		resp, b := c.response(t)
		expect(t, resp, b, 200, "a\n\nb")
	})
}

// TestShutdownPipelinedPartial: during a shutdown, a request served on a
// worker (or the loop) is answered with Connection: close; the part of a
// pipelined request behind it is discarded, and the shutdown does not
// wait for it (it waited until the linger ended, past its grace).
func TestShutdownPipelinedPartial(t *testing.T) {
	for _, onLoop := range []bool{false, true} {
		t.Run(fmt.Sprintf("onLoop=%v", onLoop), func(t *testing.T) {
			a := newApp()
			a.onLoop = onLoop
			s, err := frontend.Start(frontend.NameGNet, "127.0.0.1:0", a.handler(), frontend.Options{MaxBodyBytes: testMaxBody})
			if err != nil {
				t.Fatal(err)
			}
			c := dial(t, s.Addr())
			c.send(t, "GET /watch HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHo")
			<-a.watching
			time.Sleep(100 * time.Millisecond)
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				done <- s.ShutdownWithContext(ctx)
			}()
			time.Sleep(100 * time.Millisecond)
			a.step <- struct{}{}
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			expect(t, resp, string(b), 200, "stayed")
			if err := <-done; err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
	}
}

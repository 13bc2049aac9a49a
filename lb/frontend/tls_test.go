package frontend_test

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
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/internal/certgen"
	"pdlb/lb/frontend"
)

// tlsSetup is a CA and a listener certificate it signed for 127.0.0.1
// and localhost, in t's temporary directory.
type tlsSetup struct {
	ca    *certgen.CA
	leaf  certgen.Leaf
	certs *frontend.Certs
}

func newTLSSetup(t testing.TB) *tlsSetup {
	t.Helper()
	ca, err := certgen.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leaf := issue(t, ca, "localhost", "127.0.0.1")
	certs, err := frontend.LoadCerts([]frontend.KeyPair{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}})
	if err != nil {
		t.Fatal(err)
	}
	return &tlsSetup{ca: ca, leaf: leaf, certs: certs}
}

func issue(t testing.TB, ca *certgen.CA, names ...string) certgen.Leaf {
	t.Helper()
	l, err := ca.Issue(names, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (s *tlsSetup) options() frontend.Options {
	return frontend.Options{MaxBodyBytes: testMaxBody, TLS: &frontend.TLS{Certs: s.certs}}
}

// clientConfig trusts the CA and offers protos by ALPN.
func (s *tlsSetup) clientConfig(protos ...string) *tls.Config {
	return &tls.Config{RootCAs: s.ca.Pool, ServerName: "localhost", NextProtos: protos}
}

// h2Client speaks HTTP/2 to addr: over TLS by ALPN when s is set, else h2c
// with prior knowledge.
func h2Client(s *tlsSetup) *http.Client {
	tr := &http2.Transport{}
	if s != nil {
		tr.TLSClientConfig = s.clientConfig("h2")
	} else {
		tr.AllowHTTP = true
		tr.DialTLSContext = func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func h2URL(s *tlsSetup, addr, path string) string {
	if s != nil {
		return "https://" + addr + path
	}
	return "http://" + addr + path
}

// TestHTTP2 runs requests and a stream over h2 (TLS, ALPN) and h2c (prior
// knowledge) on both front ends.
func TestHTTP2(t *testing.T) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		for _, secure := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/h2c", true: "/h2"}[secure], func(t *testing.T) {
				a := newApp()
				o := frontend.Options{MaxBodyBytes: testMaxBody}
				var s *tlsSetup
				if secure {
					s, o = ts, ts.options()
				}
				addr := serveWith(t, name, a.handler(), o)
				c := h2Client(s)
				resp, err := c.Post(h2URL(s, addr, "/echo"), "application/json", strings.NewReader(`{"a":1}`))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(b) != `{"a":1}` {
					t.Fatalf("got %s %d %q", resp.Proto, resp.StatusCode, b)
				}
				// Too large a body: the same 413 as HTTP/1.1.
				resp, err = c.Post(h2URL(s, addr, "/echo"), "application/json", strings.NewReader(strings.Repeat("x", testMaxBody+1)))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestEntityTooLarge {
					t.Fatalf("oversized body: got %d, want 413", resp.StatusCode)
				}
				// Each event arrives before the next is written; the
				// header goes with the first.
				go func() { a.step <- struct{}{} }()
				resp, err = c.Get(h2URL(s, addr, "/sse?n=3&gated=1"))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				for i := range 3 {
					if i > 0 {
						a.step <- struct{}{}
					}
					line, err := br.ReadString('\n')
					if err != nil || line != "data: "+string(rune('0'+i))+"\n" {
						t.Fatalf("event %d: %q, %v", i, line, err)
					}
					_, _ = br.ReadString('\n')
				}
			})
		}
	}
}

// TestTLSHandshakes: HTTP/1.1 over TLS, SNI choosing among certificates,
// a reload, plain HTTP on the TLS port and a garbage ClientHello.
func TestTLSHandshakes(t *testing.T) {
	ts := newTLSSetup(t)
	other := issue(t, ts.ca, "other.example")
	certs, err := frontend.LoadCerts([]frontend.KeyPair{{CertFile: ts.leaf.CertFile, KeyFile: ts.leaf.KeyFile}, {CertFile: other.CertFile, KeyFile: other.KeyFile}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			a := newApp()
			addr := serveWith(t, name, a.handler(), frontend.Options{MaxBodyBytes: testMaxBody, TLS: &frontend.TLS{Certs: certs}})
			serverName := func(sni string) string {
				t.Helper()
				c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ts.ca.Pool, ServerName: sni, NextProtos: []string{"http/1.1"}})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				st := c.ConnectionState()
				if st.NegotiatedProtocol != "http/1.1" {
					t.Fatalf("ALPN: %q", st.NegotiatedProtocol)
				}
				_, _ = io.WriteString(c, post("/echo", "hi"))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				expect(t, resp, string(b), 200, "hi")
				return st.PeerCertificates[0].Subject.CommonName
			}
			if got := serverName("localhost"); got != "localhost" {
				t.Fatalf("SNI localhost: certificate %q", got)
			}
			if got := serverName("other.example"); got != "other.example" {
				t.Fatalf("SNI other.example: certificate %q", got)
			}

			c := dial(t, addr)
			c.send(t, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, b := c.response(t)
			expect(t, resp, b, 400, "The plain HTTP request was sent to HTTPS port\n")

			c = dial(t, addr)
			c.send(t, "\x16\x03\x01\x00\x10garbage-garbage!")
			if _, err := c.br.ReadByte(); err != nil && err != io.EOF {
				t.Logf("garbage ClientHello: %v", err)
			}
			if _, err := io.ReadAll(c.br); err != nil {
				t.Fatalf("garbage ClientHello: the connection was not closed: %v", err)
			}
		})
	}
}

// TestTLSRequestWithFinished: a request that reaches the server in the
// same segment as the client's Finished, which the handshake's last read
// takes with it, is served at once.
func TestTLSRequestWithFinished(t *testing.T) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			nc := dialTCP(t, serveWith(t, name, newApp().handler(), ts.options()))
			cork := &corked{Conn: nc}
			c := tls.Client(cork, ts.clientConfig("http/1.1"))
			// The ClientHello goes out; the client's second flight
			// (Finished) and the request wait in cork until both are
			// sealed.
			if _, err := io.WriteString(c, post("/echo", "first")); err != nil {
				t.Fatal(err)
			}
			if err := cork.flush(); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			expect(t, resp, string(b), 200, "first")
		})
	}
}

// TestTLSHandshakeTimeout: a client that connects and sends nothing, or
// only the start of a ClientHello, is closed once ReadTimeout passes
// (on gnet by the idle sweep, which ticks every second, until the first
// byte starts the handshake).
func TestTLSHandshakeTimeout(t *testing.T) {
	ts := newTLSSetup(t)
	o := ts.options()
	o.ReadTimeout = 300 * time.Millisecond
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			addr := serveWith(t, name, newApp().handler(), o)
			for _, first := range []string{"", "\x16\x03\x01\x02\x00\x01"} {
				nc := dialTCP(t, addr)
				if _, err := io.WriteString(nc, first); err != nil {
					t.Fatal(err)
				}
				_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadAll(nc); errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("sent %q: still open 10 s later, with a read timeout of %v", first, o.ReadTimeout)
				}
			}
		})
	}
}

// TestTLSCloseNotify: a connection the server closes after its answer
// (the client asked for Connection: close) ends with TLS's close_notify
// before the TCP close, so the client can tell the end from a truncation.
// TLS 1.2, whose records show their type: the last one is an alert.
func TestTLSCloseNotify(t *testing.T) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			nc := dialTCP(t, serveWith(t, name, newApp().handler(), ts.options()))
			tap := &tapped{Conn: nc}
			cfg := ts.clientConfig("http/1.1")
			cfg.MaxVersion = tls.VersionTLS12
			c := tls.Client(tap, cfg)
			if _, err := io.WriteString(c, post("/echo", "bye", "Connection: close\r\n")); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			expect(t, resp, string(b), 200, "bye")
			if _, err := io.ReadAll(c); err != nil {
				t.Fatalf("after the answer: %v", err)
			}
			var last byte
			for rest := tap.read; len(rest) >= 5; {
				last = rest[0]
				rest = rest[min(len(rest), 5+(int(rest[3])<<8|int(rest[4]))):]
			}
			if last != 21 {
				t.Fatalf("the server's last TLS record has type %d, want 21 (alert: close_notify)", last)
			}
		})
	}
}

// tapped keeps what is read from its connection.
type tapped struct {
	net.Conn
	read []byte
}

func (c *tapped) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read = append(c.read, p[:n]...)
	return n, err
}

// dialTCP opens a plain connection to addr, closed when t ends, with a
// deadline for a test that would hang.
func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return nc
}

// corked passes a connection's first write through and holds the rest
// until flush sends them as one.
type corked struct {
	net.Conn
	writes int
	held   []byte
}

func (c *corked) Write(p []byte) (int, error) {
	if c.writes++; c.writes == 1 {
		return c.Conn.Write(p)
	}
	c.held = append(c.held, p...)
	return len(p), nil
}

func (c *corked) flush() error {
	_, err := c.Conn.Write(c.held)
	c.held = nil
	return err
}

// TestCertReload: a new certificate is served after Reload, and a
// connection opened before keeps working.
func TestCertReload(t *testing.T) {
	ts := newTLSSetup(t)
	addr := serveWith(t, frontend.NameGNet, newApp().handler(), ts.options())
	before, err := tls.Dial("tcp", addr, ts.clientConfig("http/1.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	next := issue(t, ts.ca, "localhost", "127.0.0.1")
	for _, f := range [][2]string{{next.CertFile, ts.leaf.CertFile}, {next.KeyFile, ts.leaf.KeyFile}} {
		b, _ := os.ReadFile(f[0])
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.certs.Reload(); err != nil {
		t.Fatal(err)
	}
	after, err := tls.Dial("tcp", addr, ts.clientConfig("http/1.1"))
	if err != nil {
		t.Fatal(err)
	}
	after.Close()
	if got, want := after.ConnectionState().PeerCertificates[0].SerialNumber, next.Cert.Leaf.SerialNumber; got.Cmp(want) != 0 {
		t.Fatalf("after reload: serial %v, want %v", got, want)
	}
	_, _ = io.WriteString(before, post("/echo", "still"))
	resp, err := http.ReadResponse(bufio.NewReader(before), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	expect(t, resp, string(b), 200, "still")
}

// TestHandshakesDoNotStall: clients that stop halfway through their
// handshake hold no event loop: a keep-alive client's requests go on.
func TestHandshakesDoNotStall(t *testing.T) {
	ts := newTLSSetup(t)
	addr := serveWith(t, frontend.NameGNet, newApp().handler(), ts.options())
	c, err := tls.Dial("tcp", addr, ts.clientConfig("http/1.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stalled []net.Conn
	for range 64 {
		s, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, s)
		// Half a ClientHello record header, then nothing.
		_, _ = s.Write([]byte{0x16, 0x03})
	}
	defer func() {
		for _, s := range stalled {
			s.Close()
		}
	}()
	br := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	for range 20 {
		_, _ = io.WriteString(c, post("/echo", "x"))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		expect(t, resp, string(b), 200, "x")
	}
}

// TestRapidReset: a client that opens and cancels streams in a loop is
// cut off, and another client is served meanwhile.
func TestRapidReset(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			o := frontend.Options{MaxBodyBytes: testMaxBody, HTTP2: frontend.HTTP2{MaxResetsPerSecond: 50}}
			addr := serveWith(t, name, newApp().handler(), o)
			fr := rawH2(t, addr, nil)
			var wg sync.WaitGroup
			wg.Add(1)
			closed := make(chan error, 1)
			go func() {
				defer wg.Done()
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						closed <- err
						return
					}
					if ga, ok := f.(*http2.GoAwayFrame); ok {
						t.Logf("GOAWAY %v", ga.ErrCode)
					}
				}
			}()
			done := make(chan struct{})
			go func() {
				defer close(done)
				for id := uint32(1); ; id += 2 {
					hdr := []byte{0x83, 0x86, 0x84, 0x41, 0x01, 'x'} // POST, http, /, :authority x (HPACK)
					if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr, EndHeaders: true}) != nil ||
						fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
						return
					}
				}
			}()
			othersServed(t, "http://"+addr+"/echo")
			select {
			case err := <-closed:
				t.Logf("the offender's connection ended: %v", err)
			case <-time.After(12 * time.Second):
				t.Fatal("the offender is still connected")
			}
			<-done
			wg.Wait()
		})
	}
}

// othersServed checks that another h2c client is served at url (an echo)
// while an offender is dealt with.
func othersServed(t *testing.T, url string) {
	t.Helper()
	other := h2Client(nil)
	for range 5 {
		resp, err := other.Post(url, "text/plain", strings.NewReader("ok"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != "ok" {
			t.Fatalf("other client: %d %q", resp.StatusCode, b)
		}
	}
}

// forEachH2 runs f per front end over h2c and over h2 (TLS), each with
// its own app; s is nil for h2c.
func forEachH2(t *testing.T, o frontend.Options, f func(t *testing.T, addr string, s *tlsSetup, a *app)) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		for _, secure := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/h2c", true: "/h2"}[secure], func(t *testing.T) {
				a := newApp()
				o := o
				o.MaxBodyBytes = testMaxBody
				var s *tlsSetup
				if secure {
					s, o.TLS = ts, ts.options().TLS
				}
				f(t, serveWith(t, name, a.handler(), o), s, a)
			})
		}
	}
}

// TestHTTP2FlowControl: a stream whose client stops reading blocks its
// writer once the flow-control windows and buffers are full, far below
// the 256 MiB it would write; a stream the client cancels fails its
// writer's next write.
func TestHTTP2FlowControl(t *testing.T) {
	forEachH2(t, frontend.Options{}, func(t *testing.T, addr string, s *tlsSetup, a *app) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", h2URL(s, addr, "/flood"), nil)
		resp, err := h2Client(s).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		last := a.floodStalled()
		if last > 32<<20 {
			t.Fatalf("the writer got %d bytes through to a client that reads nothing", last)
		}
		cancel()
		select {
		case err := <-a.streamErr:
			t.Logf("after %d bytes, the cancelled stream's writer failed with %v", last, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the writer of a cancelled stream never failed")
		}
	})
}

// TestHTTP2Limits: a header list over MaxHeaderBytes gets 431 (a
// "trailer" field's names each counted as a field, as x/net's framer
// counts them), and a frame over MaxFrameBytes ends the connection with
// FRAME_SIZE_ERROR.
func TestHTTP2Limits(t *testing.T) {
	var big []hpack.HeaderField
	for i := range 8 {
		big = append(big, hpack.HeaderField{Name: "x-big-" + string(rune('a'+i)), Value: strings.Repeat("b", 1000)})
	}
	var names []string
	for i := 0; len(names)*5 < 3800; i++ {
		names = append(names, fmt.Sprintf("x%03d", i))
	}
	trailer := []hpack.HeaderField{{Name: "trailer", Value: strings.Join(names, ",")}}
	forEachH2(t, frontend.Options{MaxHeaderBytes: 4096}, func(t *testing.T, addr string, s *tlsSetup, _ *app) {
		for _, fields := range [][]hpack.HeaderField{big, trailer} {
			fr := rawH2(t, addr, s)
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, f := range append([]hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/echo"}, {Name: ":authority", Value: "x"}}, fields...) {
				_ = enc.WriteField(f)
			}
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: true})
			dec := hpack.NewDecoder(4096, nil)
			for status := ""; status == ""; {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("no answer to oversized headers: %v", err)
				}
				if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 {
					fields, _ := dec.DecodeFull(h.HeaderBlockFragment())
					status = fields[0].Value
					if status != "431" {
						t.Fatalf("oversized headers (a %d-byte block): %s, want 431", block.Len(), status)
					}
				}
			}
		}

		fr := rawH2(t, addr, s)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x83, 0x86, 0x84, 0x41, 0x01, 'x'}, EndHeaders: true})
		_ = fr.WriteData(1, false, make([]byte, 64<<10))
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("no GOAWAY before the connection ended: %v", err)
			}
			if ga, ok := f.(*http2.GoAwayFrame); ok {
				if ga.ErrCode != http2.ErrCodeFrameSize {
					t.Fatalf("GOAWAY %v, want FRAME_SIZE_ERROR", ga.ErrCode)
				}
				return
			}
		}
	})
}

// rawH2 opens an HTTP/2 connection (TLS when s is set) and sends the
// preface and empty settings.
func rawH2(t *testing.T, addr string, s *tlsSetup) *http2.Framer {
	t.Helper()
	fr, _ := rawH2Conn(t, addr, s)
	return fr
}

// rawH2Conn is rawH2 with the connection under its framer.
func rawH2Conn(t *testing.T, addr string, s *tlsSetup) (*http2.Framer, net.Conn) {
	t.Helper()
	var c net.Conn
	var err error
	if s != nil {
		c, err = tls.Dial("tcp", addr, s.clientConfig("h2"))
	} else {
		c, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	return fr, c
}

// TestHTTP2WriteStall: a stream whose client opens no window for
// IdleTimeout is reset and its writer fails, so a client that stops
// reading cannot pin it (and its pod) for good; the connection serves on.
// A client that opens its windows wide and then reads nothing from its
// socket gets its connection closed, which fails the writer too.
func TestHTTP2WriteStall(t *testing.T) {
	forEachH2(t, frontend.Options{IdleTimeout: 300 * time.Millisecond}, func(t *testing.T, addr string, s *tlsSetup, a *app) {
		c := h2Client(s)
		resp, err := c.Get(h2URL(s, addr, "/flood"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		select {
		case err := <-a.streamErr:
			t.Logf("after %d bytes, the stalled stream's writer failed with %v", a.flooded.Load(), err)
		case <-time.After(10 * time.Second):
			t.Fatal("the writer of a stream nobody reads never failed")
		}
		if _, err := io.Copy(io.Discard, resp.Body); err == nil {
			t.Fatal("the stalled stream ended as if whole")
		}
		echo, err := c.Post(h2URL(s, addr, "/echo"), "text/plain", strings.NewReader("after"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(echo.Body)
		echo.Body.Close()
		if string(b) != "after" {
			t.Fatalf("after the stalled stream: %d %q", echo.StatusCode, b)
		}

		fr := rawH2(t, addr, s)
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
		_ = fr.WriteWindowUpdate(0, 1<<31-1-65535)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82, 0x86, 0x44, 0x06, '/', 'f', 'l', 'o', 'o', 'd', 0x41, 0x01, 'x'},
			EndHeaders: true, EndStream: true})
		select {
		case err := <-a.streamErr:
			t.Logf("after %d bytes, the writer to a socket nobody reads failed with %v", a.flooded.Load(), err)
		case <-time.After(10 * time.Second):
			t.Fatal("the writer to a socket nobody reads never failed")
		}
	})
}

// TestTLSStartFailureLeavesNothing: a front end that fails to start over
// TLS leaves no goroutine behind (the session-ticket keys' rotation).
func TestTLSStartFailureLeavesNothing(t *testing.T) {
	ts := newTLSSetup(t)
	rotations := func() int {
		buf := make([]byte, 1<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "frontend.rotateTickets")
	}
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			before := rotations()
			if s, err := frontend.Start(name, "256.0.0.1:0", newApp().handler(), ts.options()); err == nil {
				_ = s.ShutdownWithContext(context.Background())
				t.Fatal("started on an address that is none")
			}
			deadline := time.Now().Add(2 * time.Second)
			for rotations() > before {
				if time.Now().After(deadline) {
					t.Fatalf("%d ticket-key rotations still run after the failed start, %d before it", rotations(), before)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// trickle writes what it is given a byte at a time, every 200 ms, once
// on is set.
type trickle struct {
	net.Conn
	on atomic.Bool
}

func (c *trickle) Write(p []byte) (int, error) {
	if !c.on.Load() {
		return c.Conn.Write(p)
	}
	for i := range p {
		time.Sleep(200 * time.Millisecond)
		if _, err := c.Conn.Write(p[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// TestReadTimeoutWhole: ReadTimeout bounds the whole reading of a request,
// its header or its body trickled a byte at a time, in the clear or inside
// one TLS record (nginx: client_header_timeout). gnet timed it from the
// last byte read (on its coarse clock: a ReadTimeout under two of its
// one-second ticks hid it), so a client that sent a byte every second
// held its connection forever.
func TestReadTimeoutWhole(t *testing.T) {
	ts := newTLSSetup(t)
	for _, name := range frontEnds {
		for _, tc := range []struct{ name, head, drip string }{
			{"header", "", "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 60)},
			{"body", "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n", strings.Repeat("b", 59)},
			{"tls record", "", "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 60)},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				o := frontend.Options{MaxBodyBytes: testMaxBody, ReadTimeout: 2 * time.Second, IdleTimeout: time.Minute}
				if tc.name == "tls record" {
					o = ts.options()
					o.ReadTimeout, o.IdleTimeout = 2*time.Second, time.Minute
				}
				nc := &trickle{Conn: dialTCP(t, serveWith(t, name, newApp().handler(), o))}
				var c net.Conn = nc
				if tc.name == "tls record" {
					tc := tls.Client(nc, ts.clientConfig("http/1.1"))
					if err := tc.Handshake(); err != nil {
						t.Fatal(err)
					}
					c = tc
				}
				if _, err := io.WriteString(c, tc.head); err != nil {
					t.Fatal(err)
				}
				nc.on.Store(true)
				ended := make(chan struct{})
				go func() { _, _ = io.Copy(io.Discard, c); close(ended) }()
				go func() { _, _ = io.WriteString(c, tc.drip) }()
				select {
				case <-ended:
				case <-time.After(7 * time.Second):
					t.Fatalf("a request trickled a byte every 200 ms is still read 7 s on (ReadTimeout %v)", o.ReadTimeout)
				}
			})
		}
	}
}

package upstream

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/certgen"
	"pdlb/internal/testnet"
)

// recordingConn keeps every byte read from its connection.
type recordingConn struct {
	net.Conn
	mu   sync.Mutex
	read []byte
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.read = append(c.read, p[:n]...)
	c.mu.Unlock()
	return n, err
}

// lastRecordType is the content type of the last whole TLS record in b
// (21: alert; 23: application data), 0 when there is none.
func lastRecordType(b []byte) byte {
	var typ byte
	for len(b) >= 5 {
		n := 5 + (int(b[3])<<8 | int(b[4]))
		if n > len(b) {
			break
		}
		typ, b = b[0], b[n:]
	}
	return typ
}

// tlsPod serves HTTP/1.1 over TLS 1.2 (whose record types are in the
// clear) on keep-alive connections: "/hang" gets no answer, any other
// path 200. Each connection's last record from the client comes on the
// channel once the client closed it.
func tlsPod(t *testing.T) (addr string, client *tls.Config, last <-chan byte) {
	t.Helper()
	ca, err := certgen.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"127.0.0.1"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf.Cert}, MaxVersion: tls.VersionTLS12}
	ch := make(chan byte, 1)
	addr = testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		rc := &recordingConn{Conn: c}
		tc := tls.Server(rc, cfg)
		br := bufio.NewReader(tc)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				break
			}
			if r.URL.Path != "/hang" {
				_, _ = io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		ch <- lastRecordType(rc.read)
	})
	return addr, &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}, ch
}

// TestTLSCloseSendsCloseNotify: a pod connection dialed with TLS ends
// with a close_notify alert (RFC 8446 6.1 requires one before the close),
// whether the client's pool closes it idle or a cut closes it while the
// pod works: a pod whose TLS library reports a close without one as an
// error (OpenSSL 3: "unexpected eof while reading") logs or counts each
// such close as a failed connection.
func TestTLSCloseSendsCloseNotify(t *testing.T) {
	addr, tc, last := tlsPod(t)
	dial := Dialer(nil)
	const alert = 21
	t.Run("idle", func(t *testing.T) {
		client := &fasthttp.HostClient{Addr: addr, Dial: func(a string) (net.Conn, error) { return dial(a, time.Second, tc) }}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + "/")
		if err := client.DoTimeout(req, resp, 5*time.Second); err != nil || string(resp.Body()) != "ok" {
			t.Fatalf("the call got %q, %v", resp.Body(), err)
		}
		client.CloseIdleConnections()
		if typ := <-last; typ != alert {
			t.Errorf("the idle connection's last record was of type %d; want %d (close_notify)", typ, alert)
		}
	})
	t.Run("cut", func(t *testing.T) {
		c, err := dial(addr, time.Second, tc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "GET /hang HTTP/1.1\r\nHost: pod\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		read := make(chan error)
		go func() {
			_, err := c.Read(make([]byte, 1))
			read <- err
		}()
		_ = c.Close()
		if err := <-read; err == nil {
			t.Error("a read of the closed connection got a byte")
		}
		if typ := <-last; typ != alert {
			t.Errorf("the cut connection's last record was of type %d; want %d (close_notify)", typ, alert)
		}
	})
}

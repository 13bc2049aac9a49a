package lb_test

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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"pdlb/engines/sim"
	"pdlb/internal/certgen"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// tlsProxy terminates TLS with leaf in front of the plain pod at backend,
// as an engine behind its own TLS would answer.
// With clients set, it asks for a client certificate those CAs signed.
func tlsProxy(t *testing.T, leaf certgen.Leaf, backend string, clients *certgen.CA) string {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf.Cert}}
	if clients != nil {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, clients.Pool
	}
	return testnet.Serve(t, tls.NewListener(testnet.Listen(t), cfg), func(c net.Conn) {
		b, err := net.Dial("tcp", backend)
		if err != nil {
			return
		}
		defer b.Close()
		go func() { _, _ = io.Copy(b, c); b.Close() }()
		_, _ = io.Copy(c, b)
	})
}

func newCA(t *testing.T) *certgen.CA {
	t.Helper()
	ca, err := certgen.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issueLeaf(t *testing.T, ca *certgen.CA, from, until time.Time, names ...string) certgen.Leaf {
	t.Helper()
	l, err := ca.Issue(names, from, until)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// tlsGateway starts a gateway over sims serving TLS with a certificate
// for localhost and 127.0.0.1 from a new CA; edit, if set, adjusts the
// configuration.
func tlsGateway(t *testing.T, sims []*sim.Pod, edit func(*config.Config)) (*certgen.CA, certgen.Leaf, *lb.Server) {
	t.Helper()
	ca := newCA(t)
	leaf := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	return ca, leaf, testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}}
		if edit != nil {
			edit(c)
		}
	})
}

const tlsChatBody = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`

// TestHTTPSPods: pods at https:// addresses are verified against the CA
// bundle; one with an expired certificate, or one for another host, gets
// a 502 that says so; one that asks for a client certificate gets the
// gateway's (mutual TLS).
func TestHTTPSPods(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	ca := newCA(t)
	good := tlsProxy(t, issueLeaf(t, ca, time.Time{}, time.Time{}, "127.0.0.1"), sims[0].Addr(), nil)
	expired := tlsProxy(t, issueLeaf(t, ca, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour), "127.0.0.1"), sims[0].Addr(), nil)
	wrongHost := tlsProxy(t, issueLeaf(t, ca, time.Time{}, time.Time{}, "other.example"), sims[0].Addr(), nil)
	mutual := tlsProxy(t, issueLeaf(t, ca, time.Time{}, time.Time{}, "127.0.0.1"), sims[0].Addr(), ca)
	gatewayCert := issueLeaf(t, ca, time.Time{}, time.Time{}, "pdlb")
	var clientCert bool
	f := func(addr, want string, status int) {
		t.Helper()
		for _, frontEnd := range []string{"gnet", "fasthttp"} {
			gw := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: "https://" + addr}}, func(c *config.Config) {
				c.Frontend = frontEnd
				c.Upstream.TLS.CAFile = ca.File
				c.Upstream.Retries = 0
				if clientCert {
					c.Upstream.TLS.CertFile, c.Upstream.TLS.KeyFile = gatewayCert.CertFile, gatewayCert.KeyFile
				}
			})
			for _, stream := range []bool{false, true} {
				body := tlsChatBody
				if stream {
					body = strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
				}
				resp, err := client.Post("http://"+gw.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != status || !strings.Contains(string(b), want) {
					t.Fatalf("%s pod %s, stream %v: got %d %s, want %d with %q", frontEnd, addr, stream, resp.StatusCode, b, status, want)
				}
			}
		}
	}
	f(good, `"choices"`, 200)
	f(expired, "certificate has expired", 502)
	f(wrongHost, "cannot validate certificate for 127.0.0.1", 502)
	f(wrongHost, "TLS handshake with the pod failed", 502)
	// TLS 1.3 refuses a missing client certificate after the handshake:
	// the client sees it as a closed connection.
	f(mutual, "The inference server failed", 502)
	clientCert = true
	f(mutual, `"choices"`, 200)
}

// TestGatewayOverTLSAndH2: the gateway's completions over HTTPS (HTTP/1.1
// and h2) and h2c, streams included, on both front ends.
func TestGatewayOverTLSAndH2(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	ca := newCA(t)
	leaf := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	stream := strings.Replace(tlsChatBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	check := func(t *testing.T, c *http.Client, url string, h2 bool) {
		t.Helper()
		for _, body := range []string{tlsChatBody, stream} {
			resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || (resp.ProtoMajor == 2) != h2 || !strings.Contains(string(b), "choices") {
				t.Fatalf("%s %s: %d %s", url, resp.Proto, resp.StatusCode, b)
			}
			if body == stream && !streamWhole(string(b)) {
				t.Fatalf("stream over %s ends %q", resp.Proto, b[max(0, len(b)-40):])
			}
		}
	}
	for _, frontEnd := range []string{"gnet", "fasthttp"} {
		t.Run(frontEnd, func(t *testing.T) {
			tlsGW := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
				c.Frontend = frontEnd
				c.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}}
			})
			plainGW := testGateway(t, podsOf("m", sims...), func(c *config.Config) { c.Frontend = frontEnd })
			roots := &tls.Config{RootCAs: ca.Pool}
			check(t, &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: roots}}, "https://"+tlsGW.Addr(), false)
			check(t, &http.Client{Timeout: 20 * time.Second, Transport: &http2.Transport{TLSClientConfig: roots}}, "https://"+tlsGW.Addr(), true)
			h2c := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}
			check(t, &http.Client{Timeout: 20 * time.Second, Transport: h2c}, "http://"+plainGW.Addr(), true)
			// Plain HTTP/1.1 on the plain port is as before.
			check(t, client, "http://"+plainGW.Addr(), false)
			// The first event arrives before the stream ends.
			resp, err := (&http.Client{Transport: h2c}).Post("http://"+plainGW.Addr()+"/v1/chat/completions", "application/json",
				strings.NewReader(strings.Replace(stream, `"max_tokens":4`, `"max_tokens":200`, 1)))
			if err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			resp.Body.Close()
			if err != nil || !strings.HasPrefix(line, "data: ") {
				t.Fatalf("first event over h2c: %q, %v", line, err)
			}
		})
	}
}

// corpus reads lb/openai's fuzz corpus for Parse: each entry's kind (odd:
// a completion) and body.
func corpus(t *testing.T) (paths []string, bodies [][]byte) {
	t.Helper()
	files, err := filepath.Glob("openai/testdata/fuzz/FuzzParse/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines", f, len(lines))
		}
		kind, body := lines[1], lines[2]
		// uint8(1) or byte('\x01')
		arg := strings.Trim(kind[strings.IndexByte(kind, '(')+1:], ")'")
		n, err := strconv.Atoi(arg)
		if err != nil {
			r, _, _, _ := strconv.UnquoteChar(arg, '\'')
			n = int(r)
		}
		path := "/v1/chat/completions"
		if n&1 == 1 {
			path = "/v1/completions"
		}
		raw, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(body, "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		paths, bodies = append(paths, path), append(bodies, []byte(raw))
	}
	return paths, bodies
}

// TestBadInputOverH2: lb/openai's fuzz corpus (malformed and odd request
// bodies) gets the same status and error over h2 and h2c as over
// HTTP/1.1, and the gateway serves on after it.
func TestBadInputOverH2(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	ca, _, gw := tlsGateway(t, sims, nil)
	plain := testGateway(t, podsOf("m", sims...), nil)
	h2c := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	clients := []struct {
		name string
		c    *http.Client
		base string
	}{
		{"http/1.1", client, "http://" + plain.Addr()},
		{"h2c", &http.Client{Timeout: 20 * time.Second, Transport: h2c}, "http://" + plain.Addr()},
		{"h2", &http.Client{Timeout: 20 * time.Second, Transport: &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}, "https://" + gw.Addr()},
	}
	paths, bodies := corpus(t)
	for i := range bodies {
		var first string
		for _, cl := range clients {
			resp, err := cl.c.Post(cl.base+paths[i], "application/json", bytes.NewReader(bodies[i]))
			if err != nil {
				t.Fatalf("%s %q: %v", cl.name, bodies[i], err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got := strconv.Itoa(resp.StatusCode)
			if resp.StatusCode != 200 {
				got += " " + string(b)
			}
			if first == "" {
				first = got
			} else if got != first {
				t.Fatalf("%q: %s answered %s, HTTP/1.1 %s", bodies[i], cl.name, got, first)
			}
		}
	}
}

// TestCertFileChangeReloads: a certificate file written anew is served to
// the next handshakes without a signal, while a connection opened before
// goes on.
func TestCertFileChangeReloads(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	ca, leaf, gw := tlsGateway(t, sims, nil)
	roots := &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"}
	serial := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", gw.Addr(), roots)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	get := keptConnection(t, gw, roots)
	get()
	before := serial()
	next := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	overwrite(t, next, leaf)
	want := next.Cert.Leaf.SerialNumber.String()
	deadline := time.Now().Add(10 * time.Second)
	for serial() != want {
		if time.Now().After(deadline) {
			t.Fatalf("still serving serial %s after the files changed, want %s", before, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	get() // the kept connection
}

// TestCertFileChangeFailureCounted: a certificate file changed into one
// that does not load keeps the certificate in use and shows on the
// reload gauges an alert watches, as a failed SIGHUP does; the next good
// file sets them back. Only a log line said so before.
func TestCertFileChangeFailureCounted(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	ca, leaf, gw := tlsGateway(t, sims, nil)
	metrics := "http://" + gw.AdminAddr() + "/metrics"
	waitMetric := func(line string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(get(t, metrics), line); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q on /metrics after the file changed", line)
			}
		}
	}
	if err := os.WriteFile(leaf.CertFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitMetric("pdlb_config_last_reload_successful 0")
	overwrite(t, issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1"), leaf)
	waitMetric("pdlb_config_last_reload_successful 1")

	// A certificate that loads does not hide a configuration reload that
	// failed, nor move its timestamp.
	before := get(t, metrics)
	gw.Gateway.NoteReload(errors.New("refused")) // as a failed SIGHUP
	next := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	overwrite(t, next, leaf)
	waitServed(t, gw.Addr(), &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"}, next)
	after := get(t, metrics)
	if !strings.Contains(after, "pdlb_config_last_reload_successful 0") {
		t.Error("a certificate reload set the gauge back to 1 over a failed configuration reload")
	}
	stamp := func(m string) string {
		_, rest, _ := strings.Cut(m, "pdlb_config_last_reload_success_timestamp_seconds ")
		v, _, _ := strings.Cut(rest, "\n")
		return v
	}
	if stamp(before) != stamp(after) {
		t.Errorf("a certificate reload moved the configuration's timestamp: %s to %s", stamp(before), stamp(after))
	}
}

// keptConnection returns a request on one kept connection to gw's API.
func keptConnection(t *testing.T, gw *lb.Server, cfg *tls.Config) func() {
	kept := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	return func() {
		t.Helper()
		resp, err := kept.Get("https://" + gw.Addr() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// overwrite writes from's key and certificate over to's files, key first.
func overwrite(t *testing.T, from, to certgen.Leaf) {
	t.Helper()
	for _, f := range [][2]string{{from.KeyFile, to.KeyFile}, {from.CertFile, to.CertFile}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCertListReload: a reload may add and remove certificates (a new
// host name needs no restart); connections opened before go on, the
// files of the new list are watched, and a list that fails to load, or a
// switch between plain HTTP and TLS, is refused with the certificates in
// use still served.
func TestCertListReload(t *testing.T) {
	ca, leaf, gw := tlsGateway(t, testFleet(t, "m", 1, 1000), nil)
	other := issueLeaf(t, ca, time.Time{}, time.Time{}, "other.example")
	pair := func(l certgen.Leaf) config.CertFiles {
		return config.CertFiles{CertFile: l.CertFile, KeyFile: l.KeyFile}
	}
	// served is the serial of the certificate a handshake for name gets.
	served := func(name string) string {
		t.Helper()
		c, err := tls.Dial("tcp", gw.Addr(), &tls.Config{RootCAs: ca.Pool, ServerName: name, InsecureSkipVerify: name == "unknown.example"})
		if err != nil {
			t.Fatalf("handshake for %s: %v", name, err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	serial := func(l certgen.Leaf) string { return l.Cert.Leaf.SerialNumber.String() }
	reload := func(certs ...config.CertFiles) error {
		cfg := gw.Gateway.Config()
		cfg.TLS.Certificates = certs
		return gw.Reload(cfg)
	}
	get := keptConnection(t, gw, &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})
	get()

	if err := reload(pair(leaf), pair(other)); err != nil {
		t.Fatal(err)
	}
	if got := served("other.example"); got != serial(other) {
		t.Fatalf("SNI other.example after the reload added its certificate: serial %s, want %s", got, serial(other))
	}
	if got := gw.Gateway.Config().TLS.Certificates; len(got) != 2 {
		t.Fatalf("the configuration in force lists %v, want the two certificates served", got)
	}
	if got := served("localhost"); got != serial(leaf) {
		t.Fatalf("SNI localhost: serial %s, want %s", got, serial(leaf))
	}
	get() // the connection opened before

	// Dropped from the list: localhost gets the first left.
	if err := reload(pair(other)); err != nil {
		t.Fatal(err)
	}
	if got := served("unknown.example"); got != serial(other) {
		t.Fatalf("after the reload dropped localhost's certificate: serial %s, want %s", got, serial(other))
	}

	// Refused: a file that does not exist, a key that is not the
	// certificate's (which leaves the fleet as it was too), a switch to
	// plain HTTP.
	missing := config.CertFiles{CertFile: filepath.Join(t.TempDir(), "none.pem"), KeyFile: other.KeyFile}
	if err := reload(pair(leaf), missing); err == nil || !strings.Contains(err.Error(), "none.pem") {
		t.Fatalf("a certificate file that does not exist: %v; want an error naming it", err)
	}
	cfg := gw.Gateway.Config()
	added := cfg.Pods[0]
	added.Name, added.Address = "added", "127.0.0.1:1"
	cfg.Pods = append(slices.Clone(cfg.Pods), added)
	cfg.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: other.KeyFile}}
	if err := gw.Reload(cfg); err == nil || !strings.Contains(err.Error(), leaf.CertFile) {
		t.Fatalf("a key that does not match its certificate: %v; want an error naming the file", err)
	}
	if n := len(gw.Gateway.Config().Pods); n != len(cfg.Pods)-1 {
		t.Fatalf("a reload refused for its certificate applied its pods: %d pods, want %d", n, len(cfg.Pods)-1)
	}
	if err := reload(); err == nil || !strings.Contains(err.Error(), "tls.certificates") || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("a reload to plain HTTP: %v; want an error naming tls.certificates and the restart it needs", err)
	}
	if got := served("unknown.example"); got != serial(other) {
		t.Fatalf("after refused reloads: serial %s, want %s still", got, serial(other))
	}

	// The new list's files are watched.
	next := issueLeaf(t, ca, time.Time{}, time.Time{}, "other.example")
	overwrite(t, next, other)
	for deadline := time.Now().Add(10 * time.Second); served("other.example") != serial(next); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still serving %s after the new list's files changed, want %s", served("other.example"), serial(next))
		}
	}
}

// TestAdminOverTLS: tls.admin serves /metrics over TLS, with the API's
// certificate when it has none of its own.
func TestAdminOverTLS(t *testing.T) {
	ca, _, gw := tlsGateway(t, testFleet(t, "m", 1, 1000), func(c *config.Config) { c.TLS.Admin = true })
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	resp, err := c.Get("https://" + gw.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "pdlb_") {
		t.Fatalf("admin over TLS: %d %.200s", resp.StatusCode, b)
	}
}

// TestH2ClientGone: an h2 client that resets its stream before the answer
// came takes the pod's connection with it, as an HTTP/1.1 client that
// leaves does (TestLoopClientGone): the pod aborts, the request counts as
// 499, and the gateway serves on, on the same connection too.
func TestH2ClientGone(t *testing.T) {
	for _, frontEnd := range []string{"gnet", "fasthttp"} {
		t.Run(frontEnd, func(t *testing.T) {
			sims := testFleet(t, "m", 1, 1)
			s := testGateway(t, podsOf("m", sims...), func(c *config.Config) { c.Frontend = frontEnd })
			h2c := &http.Client{Timeout: 20 * time.Second, Transport: &http2.Transport{AllowHTTP: true,
				DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				}}}
			body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":3000}`, strings.Repeat("a long prompt to prefill ", 2000))
			ctx, cancel := context.WithCancel(context.Background())
			req, err := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			done := make(chan error, 1)
			go func() {
				resp, err := h2c.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			testwait.For(t, "the pod to take the request", func() bool { return sims[0].Stats().Running == 1 })
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the cancelled request got an answer")
			}
			waitClientGone(t, s, sims[0])
			resp, err := h2c.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(tlsChatBody))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
				t.Fatalf("after a stream was reset: %s %d %s", resp.Proto, resp.StatusCode, b)
			}
		})
	}
}

// TestWatchFileSeesAnEarlyChange: a change made as soon as WatchFile
// returns is seen. The first stamp was taken on the watch's goroutine, so
// a change made before that goroutine ran became its baseline and was
// never reported (TestCertFileChangeFailureCounted failed so under make
// test's load).
func TestWatchFileSeesAnEarlyChange(t *testing.T) {
	for i := range 20 {
		path := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(path, []byte("before"), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		changed := make(chan struct{}, 1)
		lb.WatchFile(ctx, path, 10*time.Millisecond, func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
		if err := os.WriteFile(path, []byte("after, longer"), 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: a change right after WatchFile returned was not seen", i)
		}
		cancel()
	}
}

// TestCertFailureKeptAcrossListeners: the API listener's certificate file
// failing to load stays on the reload gauge while the admin listener's
// own certificate is rotated well (that rotation set it back to 1).
func TestCertFailureKeptAcrossListeners(t *testing.T) {
	sims := testFleet(t, "m", 1, 1000)
	ca := newCA(t)
	adminLeaf := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	_, leaf, gw := tlsGateway(t, sims, func(c *config.Config) {
		c.TLS.Admin = true
		c.TLS.AdminCertificates = []config.CertFiles{{CertFile: adminLeaf.CertFile, KeyFile: adminLeaf.KeyFile}}
	})
	roots := &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: roots}}
	gauge := func() string {
		t.Helper()
		resp, err := hc.Get("https://" + gw.AdminAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		_, rest, _ := strings.Cut(string(b), "\npdlb_config_last_reload_successful ")
		v, _, _ := strings.Cut(rest, "\n")
		return v
	}
	if err := os.WriteFile(leaf.CertFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); gauge() != "0"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the API certificate's failure never showed")
		}
	}
	next := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	overwrite(t, next, adminLeaf)
	waitServed(t, gw.AdminAddr(), roots, next)
	if g := gauge(); g != "0" {
		t.Errorf("pdlb_config_last_reload_successful %s while the API listener's certificate file still fails to load", g)
	}
}

// waitServed waits until addr serves leaf's certificate.
func waitServed(t *testing.T, addr string, roots *tls.Config, leaf certgen.Leaf) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err := tls.Dial("tcp", addr, roots)
		if err != nil {
			t.Fatal(err)
		}
		served := c.ConnectionState().PeerCertificates[0].SerialNumber
		c.Close()
		if served.Cmp(leaf.Cert.Leaf.SerialNumber) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not serve the new certificate", addr)
		}
	}
}

// TestSilentConnectionsGetNoAnswer: a client that connects (and, over
// TLS, finishes its handshake) and sends no request is closed at the read
// timeout without an answer, as nginx closes a browser's preconnect, and
// is not counted as a request; one that sent part of a request gets a
// 408, counted, on either front end (gnet closed it unanswered). Over TLS
// on fasthttp the silent one got a 408, counted.
func TestSilentConnectionsGetNoAnswer(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		for _, mode := range []string{"plain", "h2-off", "tls"} {
			secure := mode == "tls"
			t.Run(fe+"/"+mode, func(t *testing.T) {
				edit := func(c *config.Config) {
					c.Frontend, c.ClientReadTimeout, c.HTTP2.Disabled = fe, 300*time.Millisecond, mode == "h2-off"
				}
				var ca *certgen.CA
				var s *lb.Server
				if secure {
					ca, _, s = tlsGateway(t, testFleet(t, "m", 1, 1000), edit)
				} else {
					s = testGateway(t, podsOf("m", testFleet(t, "m", 1, 1000)...), edit)
				}
				dial := func() net.Conn {
					if !secure {
						c, err := net.Dial("tcp", s.Addr())
						if err != nil {
							t.Fatal(err)
						}
						return c
					}
					c, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}})
					if err != nil {
						t.Fatal(err)
					}
					return c
				}
				counted := func() float64 { return metricValue(t, s, `pdlb_requests_total{model=""`) }
				for _, sent := range []string{"", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"} {
					before := counted()
					c := dial()
					_, _ = io.WriteString(c, sent)
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					got, _ := io.ReadAll(c)
					c.Close()
					switch {
					case sent == "" && (len(got) > 0 || counted() != before):
						t.Errorf("a silent connection got %q, counted %v", got, counted()-before)
					case sent != "" && (!strings.HasPrefix(string(got), "HTTP/1.1 408") || counted() != before+1):
						t.Errorf("a request cut short got %.60q, counted %v", got, counted()-before)
					}
				}
			})
		}
	}
}

// TestHTTPSPodClosesKeptConnections: an https pod that closes a kept
// connection while it idles (uvicorn does after 5 s), or as the gateway's
// next request on it comes, never took that request, so it goes again on
// a new connection to the same pod, as to a plain pod
// (TestPodClosesIdleConnections, TestPodClosesAsTheRequestComes): not a
// reset, which would spend a retry (none is left: the client got 502) and
// count against the pod.
func TestHTTPSPodClosesKeptConnections(t *testing.T) {
	ca := newCA(t)
	leaf := issueLeaf(t, ca, time.Time{}, time.Time{}, "127.0.0.1")
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, tc := range []struct {
			name string
			idle time.Duration // keepAlivePod's
			gap  time.Duration // between requests
		}{{"idle", 100 * time.Millisecond, 300 * time.Millisecond}, {"crossing", -1, 0}} {
			t.Run(fe+"/"+tc.name, func(t *testing.T) {
				addr, accepted := keepAlivePod(t, tc.idle, nil)
				s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: "https://" + tlsProxy(t, leaf, addr, nil)}}, func(c *config.Config) {
					c.Frontend = fe
					c.Health.Interval = time.Hour
					c.Upstream.TLS.CAFile = ca.File
					c.Upstream.Retries = 0
				})
				for i := range 3 {
					if i > 0 {
						time.Sleep(tc.gap)
					}
					if resp, body := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
						t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
					}
				}
				if n := accepted.Load(); n != 3 {
					t.Fatalf("the pod accepted %d connections; want 3, one per request after its first closed", n)
				}
				if n := metricValue(t, s, `pdlb_upstream_errors_total{pod="p"}`); n != 0 {
					t.Fatalf("the pod was charged %v failures", n)
				}
			})
		}
	}
}

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/internal/certgen"
	"pdlb/lb"
	"pdlb/lb/config"
)

// tlsGateway is a gateway over one fast pod of model "m" serving TLS with
// a certificate for localhost and 127.0.0.1 from a test CA, and a plain
// gateway (h2c) over the same pod.
type tlsGateway struct {
	ca           *certgen.CA
	secure       *lb.Server
	plain        *lb.Server
	leaf, keyPEM string
}

func startTLSGateway(t *testing.T, edit func(*config.Config)) *tlsGateway {
	t.Helper()
	ca, err := certgen.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"localhost", "127.0.0.1"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	pods := []config.Pod{podConfig(startPod(t, "m-0", "m", engines.VLLM, 100))}
	secure := startGateway(t, pods, func(c *config.Config) {
		c.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}}
		if edit != nil {
			edit(c)
		}
	})
	return &tlsGateway{ca: ca, secure: secure, plain: startGateway(t, pods, edit), leaf: leaf.CertFile, keyPEM: leaf.KeyFile}
}

// mustHaveTool finds name, or skips the test, and fails it under CI=true,
// where every client must be there.
func mustHaveTool(t *testing.T, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found under CI: %v; %s", name, err, why)
		}
		t.Skipf("SKIP: %s not found (%v); %s", name, err, why)
	}
	return p
}

const streamChat = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}`

// TestCurlHTTP2: curl over h2 (TLS, ALPN) and h2c with prior knowledge,
// a stream and a plain answer; and an h2c upgrade, answered in HTTP/1.1.
func TestCurlHTTP2(t *testing.T) {
	curl := mustHaveTool(t, "curl", "the HTTP/2 client test runs curl")
	if out, _ := exec.Command(curl, "--version").Output(); !strings.Contains(string(out), "HTTP2") {
		if os.Getenv("CI") == "true" {
			t.Fatalf("curl lacks HTTP/2 under CI:\n%s", out)
		}
		t.Skipf("SKIP: curl lacks HTTP/2:\n%s", out)
	}
	g := startTLSGateway(t, nil)
	f := func(args ...string) string {
		t.Helper()
		args = append([]string{"-sS", "--max-time", "20", "-w", "\n%{http_version} %{http_code}"}, args...)
		out, err := exec.Command(curl, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	for _, args := range [][]string{
		{"--http2", "--cacert", g.ca.File, "https://localhost:" + port(g.secure.Addr()) + "/v1/chat/completions"},
		{"--http2-prior-knowledge", "http://" + g.plain.Addr() + "/v1/chat/completions"},
	} {
		out := f(append(args, "-N", "-d", streamChat)...)
		if !strings.HasSuffix(out, "data: [DONE]\n\n\n2 200") {
			t.Fatalf("curl %v: a stream over HTTP/2 ends\n%s", args, out)
		}
		out = f(append(args, "-d", strings.Replace(streamChat, `"stream":true,`, "", 1))...)
		if !strings.Contains(out, `"chat.completion"`) || !strings.HasSuffix(out, "\n2 200") {
			t.Fatalf("curl %v:\n%s", args, out)
		}
	}
	// Over plain http, --http2 asks for `Upgrade: h2c`, which RFC 9113
	// deprecates; the gateway answers in HTTP/1.1, as nginx does.
	args := []string{"--http2", "-N", "-d", streamChat, "http://" + g.plain.Addr() + "/v1/chat/completions"}
	if out := f(args...); !strings.HasSuffix(out, "data: [DONE]\n\n\n1.1 200") {
		t.Fatalf("curl %v: want the stream in HTTP/1.1\n%s", args, out)
	}
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// TestOpenSSLClient: openssl s_client negotiates h2 and http/1.1 by ALPN
// and resumes a session from its ticket, in TLS 1.2 and 1.3.
func TestOpenSSLClient(t *testing.T) {
	openssl := mustHaveTool(t, "openssl", "the ALPN and resumption test runs openssl s_client")
	g := startTLSGateway(t, nil)
	sess := filepath.Join(t.TempDir(), "session.pem")
	f := func(request string, args ...string) string {
		t.Helper()
		args = append([]string{"s_client", "-connect", g.secure.Addr(), "-servername", "localhost", "-CAfile", g.ca.File}, args...)
		if request != "" {
			// Reads on after the request, until the gateway closes.
			args = append(args, "-ign_eof")
		}
		cmd := exec.Command(openssl, args...)
		// A request, so the client stays until the answer, by which time
		// a TLS 1.3 ticket has arrived.
		cmd.Stdin = strings.NewReader(request)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	const get = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
	if out := f("", "-alpn", "h2,http/1.1"); !strings.Contains(out, "ALPN protocol: h2") {
		t.Fatalf("ALPN h2,http/1.1:\n%s", out)
	}
	if out := f(get, "-alpn", "http/1.1"); !strings.Contains(out, "ALPN protocol: http/1.1") || !strings.Contains(out, `"object":"list"`) {
		t.Fatalf("ALPN http/1.1:\n%s", out)
	}
	for _, v := range []string{"-tls1_2", "-tls1_3"} {
		if out := f(get, v, "-alpn", "http/1.1", "-sess_out", sess); !strings.Contains(out, "New, TLSv1.") {
			t.Fatalf("%s first handshake:\n%s", v, out)
		}
		if out := f(get, v, "-alpn", "http/1.1", "-sess_in", sess); !strings.Contains(out, "Reused, TLSv1.") {
			t.Fatalf("%s session not resumed:\n%s", v, out)
		}
	}
}

package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/internal/certgen"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// nodeDir holds the Node project of the official openai client test.
const nodeDir = "openai-node"

// TestOpenAINodeClient runs tests/openai-node/test.mjs, the official openai
// npm client against live gateways: chat and completions, streaming and
// not, the audio APIs, and the gateway's errors surfacing as the client's
// error classes; over plain HTTP, then over HTTPS with a test CA
// (NODE_EXTRA_CA_CERTS).
func TestOpenAINodeClient(t *testing.T) {
	node := lookTool(t, "node", "the official OpenAI client test needs Node.js")
	npm := lookTool(t, "npm", "the official OpenAI client test installs its package with npm")
	installClient(t, npm, nodeDir, "openai")
	t.Run("http", func(t *testing.T) { runNodeClient(t, node, nil) })
	t.Run("https", func(t *testing.T) {
		ca, err := certgen.NewCA(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Issue([]string{"localhost"}, time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		runNodeClient(t, node, &nodeTLS{ca: ca.File, cert: config.CertFiles{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}})
	})
}

// nodeTLS is the certificate the gateways serve and the CA the client
// trusts.
type nodeTLS struct {
	ca   string
	cert config.CertFiles
}

func runNodeClient(t *testing.T, node string, secure *nodeTLS) {
	scheme, withTLS, c := "http://", func(edit func(*config.Config)) func(*config.Config) { return edit }, client
	if secure != nil {
		scheme = "https://"
		pem, err := os.ReadFile(secure.ca)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		c = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		withTLS = func(edit func(*config.Config)) func(*config.Config) {
			return func(c *config.Config) {
				c.TLS.Certificates = []config.CertFiles{secure.cert}
				if edit != nil {
					edit(c)
				}
			}
		}
	}
	url := func(addr string) string {
		return scheme + "localhost:" + addr[strings.LastIndexByte(addr, ':')+1:] + "/v1"
	}

	// Gateway 1: model "m" on two fast pods; model "whisper" on one (the
	// audio APIs); model "down" on a closed port.
	fast := []config.Pod{
		podConfig(startPod(t, "m-0", "m", engines.VLLM, 100)),
		podConfig(startPod(t, "m-1", "m", engines.SGLang, 100)),
		podConfig(startPod(t, "whisper-0", "whisper", engines.VLLM, 100)),
		{Name: "down-0", Model: "down", Address: closedAddr(t)},
	}
	main := startGateway(t, fast, withTLS(nil))
	// Gateway 2: one real-time pod behind max_in_flight 1, so a held stream
	// makes the next request a 429.
	slow := startGateway(t, []config.Pod{podConfig(startPod(t, "slow-0", "slow", engines.VLLM, 1))},
		withTLS(func(c *config.Config) { c.MaxInFlight = 1 }))
	// Gateway 3: the fast pods of "m" behind an API key of 2 requests a
	// minute, whose rate-limit headers the client reads.
	keyed := startGateway(t, fast[:2], withTLS(func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "node", SHA256: limits.HashKey("sk-node"), RequestsPerMinute: 2, TokensPerMinute: 100_000}}
	}))
	waitStatus(t, c, url(main.Addr())+"/chat/completions", "", `{"model":"down","messages":[{"role":"user","content":"hi"}]}`, 503)

	// The deadline only keeps a hung client from holding the test run.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "test.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(),
		"PDLB_BASE_URL="+url(main.Addr()),
		"PDLB_LIMITED_BASE_URL="+url(slow.Addr()),
		"PDLB_KEYED_BASE_URL="+url(keyed.Addr()),
		"NO_COLOR=1",
	)
	if secure != nil {
		cmd.Env = append(cmd.Env, "NODE_EXTRA_CA_CERTS="+secure.ca)
	}
	out, err := cmd.CombinedOutput()
	t.Logf("node test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("node test.mjs: %v", err)
	}
}

// installClient installs the pinned npm package pkg of the Node project
// in dir (its package-lock.json) when node_modules lacks it; make
// test-deps does the same ahead of time.
func installClient(t *testing.T, npm, dir, pkg string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err == nil {
		return
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in tests/%s: %v\n%s", dir, err, out)
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// waitStatus posts body to url, with apiKey as x-api-key when not empty,
// until the answer has status: the gateway needs a health check or two to
// mark a dead pod down.
func waitStatus(t *testing.T, client *http.Client, url, apiKey, body string, status int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if apiKey != "" {
			req.Header.Set("X-Api-Key", apiKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("POST %s still answers %d, want %d", url, resp.StatusCode, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

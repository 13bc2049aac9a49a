package lb_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pdlb/lb"
	"pdlb/lb/config"
)

// oversized is the body size the early-answer tests send: over the default
// max_body_bytes (8 MiB), and far over what socket buffers hold, so the
// client is still sending when the 413 comes.
const oversized = 9 << 20

// lingerGateways starts a gateway on each front end over one sim pod.
func lingerGateways(t *testing.T) map[string]*lb.Server {
	t.Helper()
	pods := podsOf("m", testFleet(t, "m", 1, 100)...)
	out := make(map[string]*lb.Server)
	for _, fe := range []string{"fasthttp", "gnet"} {
		out[fe] = testGateway(t, pods, func(c *config.Config) { c.Frontend = fe })
	}
	return out
}

// clientTool finds a client program: a test that needs it skips where it
// is missing, except under CI (CI=true), where it fails.
func clientTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (%v): the early-answer test needs it", name, err)
		}
		t.Skipf("SKIP: %s not found (%v)", name, err)
	}
	return p
}

// runClient runs a client program with the body on stdin and returns its
// output.
func runClient(t *testing.T, dir string, stdin []byte, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", filepath.Base(name), err, out)
	}
	return string(out)
}

// oversizedBody is a chat request whose body is oversized bytes long.
func oversizedBody() []byte {
	head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
	return []byte(head + strings.Repeat("x", oversized-len(head)-len(tail)) + tail)
}

// pythonClients posts the body read from stdin with http.client and with
// urllib, which write the whole body before reading, and prints each
// answer's status and OpenAI error as JSON lines.
const pythonClients = `
import http.client, json, sys, urllib.error, urllib.request
addr, body = sys.argv[1], sys.stdin.buffer.read()
host, port = addr.rsplit(":", 1)
c = http.client.HTTPConnection(host, int(port), timeout=20)
c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
r = c.getresponse()
print(json.dumps({"client": "http.client", "status": r.status, "error": json.loads(r.read())["error"]}))
try:
    urllib.request.urlopen(urllib.request.Request("http://" + addr + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}), timeout=20)
    print(json.dumps({"client": "urllib", "status": 200}))
except urllib.error.HTTPError as e:
    print(json.dumps({"client": "urllib", "status": e.code, "error": json.loads(e.read())["error"]}))
`

// nodeClient sends an oversized chat request with the official openai npm
// client (from tests/openai-node) and prints the error it got as JSON.
const nodeClient = `
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.env.PDLB_BASE_URL, apiKey: 'unused', maxRetries: 0, timeout: 20000 });
try {
  await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(Number(process.env.PDLB_BYTES)) }] });
  console.log(JSON.stringify({ client: 'openai-node', status: 200 }));
} catch (e) {
  console.log(JSON.stringify({ client: 'openai-node', status: e.status ?? String(e), error: e.error }));
}
`

// answer is one client's report: the status it read and the OpenAI error.
type answer struct {
	Client string `json:"client"`
	Status any    `json:"status"`
	Error  struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// check413 checks the JSON lines a client printed: each must be the
// gateway's 413 with its OpenAI error.
func check413(t *testing.T, out string, lines int) {
	t.Helper()
	var got int
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var a answer
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("client printed %q: %v", line, err)
		}
		if a.Status != float64(http.StatusRequestEntityTooLarge) || a.Error.Type != "invalid_request_error" ||
			!strings.Contains(a.Error.Message, "exceeds the limit") {
			t.Errorf("%s read %v %+v, want 413 with the OpenAI error", a.Client, a.Status, a.Error)
		}
		t.Logf("%s read %v %s: %s", a.Client, a.Status, a.Error.Type, a.Error.Message)
		got++
	}
	if got != lines {
		t.Fatalf("clients printed %d answers, want %d:\n%s", got, lines, out)
	}
}

// TestEarlyAnswerReadByClients: a body over max_body_bytes is answered 413
// before the client finished sending it; the gateway lingers (reads and
// discards until the client closes), so clients that write the whole body
// before reading still read the 413 and its OpenAI error instead of a
// reset: Python's http.client and urllib, curl (without Expect: 100
// continue, so it sends the body) and the official openai npm client, on
// both front ends.
func TestEarlyAnswerReadByClients(t *testing.T) {
	python := clientTool(t, "python3")
	curl := clientTool(t, "curl")
	node := clientTool(t, "node")
	nodeDir, err := filepath.Abs(filepath.Join("..", "tests", "openai-node"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "openai", "package.json")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the openai npm package is not installed (make test-deps): %v", err)
		}
		t.Skipf("SKIP: the openai npm package is not installed (make test-deps): %v", err)
	}
	body := oversizedBody()
	for fe, gw := range lingerGateways(t) {
		t.Run(fe, func(t *testing.T) {
			check413(t, runClient(t, ".", body, python, "-c", pythonClients, gw.Addr()), 2)

			out := runClient(t, ".", body, curl, "-sS", "-H", "Content-Type: application/json", "-H", "Expect:",
				"--data-binary", "@-", "-w", `\n%{http_code}`, "http://"+gw.Addr()+"/v1/chat/completions")
			errBody, status, _ := strings.Cut(out, "\n")
			check413(t, `{"client":"curl","status":`+status+`,"error":`+errBody[len(`{"error":`):len(errBody)-1]+`}`, 1)

			t.Setenv("PDLB_BASE_URL", "http://"+gw.Addr()+"/v1")
			t.Setenv("PDLB_BYTES", "9437184")
			check413(t, runClient(t, nodeDir, []byte(nodeClient), node, "--input-type=module", "-"), 1)
		})
	}
}

// TestHeaderOverflowLingers: a header block over max_header_bytes gets 431
// at once while the client is still sending it; the client reads the whole
// answer and then EOF, not a reset, on both front ends.
func TestHeaderOverflowLingers(t *testing.T) {
	for fe, gw := range lingerGateways(t) {
		t.Run(fe, func(t *testing.T) {
			c, err := net.Dial("tcp", gw.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			sent := make(chan error, 1)
			go func() {
				_, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Big: "+strings.Repeat("a", 4<<20)+"\r\n\r\n")
				sent <- err
			}()
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("reading the answer's body: %v", err)
			}
			var e answer
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || json.Unmarshal(b, &e) != nil || e.Error.Type != "invalid_request_error" {
				t.Fatalf("got %d %s, want 431 with the OpenAI error", resp.StatusCode, b)
			}
			if err := <-sent; err != nil {
				t.Fatalf("sending the headers: %v (the gateway closed before the client was done)", err)
			}
			// The gateway half-closed: EOF, then it closes once we do.
			if n, err := br.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("after the answer: %d bytes, %v; want EOF", n, err)
			}
		})
	}
}

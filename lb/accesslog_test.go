package lb_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pdlb/lb"
	"pdlb/lb/config"
)

// accessLine is a line of the access log, as JSON.
type accessLine map[string]any

func (l accessLine) str(k string) string {
	s, _ := l[k].(string)
	return s
}

func (l accessLine) num(k string) float64 {
	n, _ := l[k].(float64)
	return n
}

// readAccessLog shuts s down, which writes what the log holds, and returns
// its lines.
func readAccessLog(t *testing.T, s *lb.Server, path string) []accessLine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []accessLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l accessLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("not a JSON line: %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// TestAccessLog: one JSON line per request, whatever its end, with what
// an operator looks for: who asked, what, which pod answered, how it went
// and how long it took; on both front ends, streams relayed on the loop
// and by a worker.
func TestAccessLog(t *testing.T) {
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			bothClients(t, func(t *testing.T, via *http.Client) { testAccessLog(t, frontend, via) })
		})
	}
}

func testAccessLog(t *testing.T, frontend string, via *http.Client) {
	// A pod of model b answers a stream's header and one event, then
	// breaks off.
	broken := fakePod(t, func(c net.Conn, r *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000\r\n\r\n"+
			`data: {"choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n")
	})
	path := filepath.Join(t.TempDir(), "access.log")
	pods := append(podsOf("m", testFleet(t, "m", 1, 100)...), config.Pod{Name: "b-0", Model: "b", Address: broken})
	s := testGateway(t, pods, func(c *config.Config) {
		c.Frontend = frontend
		c.AccessLog = path
	})
	var answeredID string // the X-Request-Id of send's last answer
	send := func(id, path, body string) int {
		t.Helper()
		req, err := http.NewRequest("POST", "http://"+s.Addr()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Request-Id", id)
		if body == "" {
			req.Method = "GET"
		}
		resp, err := via.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answeredID = resp.Header.Get("X-Request-Id")
		return resp.StatusCode
	}
	if code := send("whole", "/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("whole answer: %d", code)
	}
	if code := send("stream", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`); code != 200 {
		t.Fatalf("stream: %d", code)
	}
	if code := send("nope", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`); code != 404 {
		t.Fatalf("unknown model: %d", code)
	}
	if answeredID != "nope" {
		t.Fatalf("a refused completion answered with X-Request-Id %q, want the client's", answeredID)
	}
	// A completion that names no id is answered and logged under the one
	// it was given, refused or not.
	if code := send("", "/v1/chat/completions", `{"model":"nope-too","messages":[{"role":"user","content":"hi"}]}`); code != 404 {
		t.Fatalf("unknown model, no id: %d", code)
	}
	madeID := answeredID
	if code := send("models", "/v1/models", ""); code != 200 {
		t.Fatalf("models: %d", code)
	}
	// send posts whenever there is a body: not allowed on /v1/models.
	if code := send("wrong-method", "/v1/models", "{}"); code != 405 {
		t.Fatalf("POST /v1/models: %d", code)
	}
	if code := send("broken", "/v1/chat/completions", `{"model":"b","messages":[{"role":"user","content":"hi"}],"stream":true}`); code != 200 {
		t.Fatalf("broken stream: %d", code)
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-not-logged\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 400 {
		t.Fatalf("malformed request: %v %v", resp, err)
	}
	c.Close()

	lines := readAccessLog(t, s, path)
	byID := map[string]accessLine{}
	for _, l := range lines {
		if _, err := time.Parse(time.RFC3339Nano, l.str("time")); err != nil {
			t.Fatalf("time %q: %v", l.str("time"), err)
		}
		if a, err := net.ResolveTCPAddr("tcp", l.str("client")); err != nil || !a.IP.IsLoopback() {
			t.Fatalf("client %q: %v", l.str("client"), err)
		}
		byID[l.str("request_id")] = l
	}
	if len(lines) != 8 || len(byID) != 8 {
		t.Fatalf("%d lines, %d request ids, want 8: %v", len(lines), len(byID), lines)
	}
	want := func(id string, check func(l accessLine) bool) {
		t.Helper()
		if l := byID[id]; !check(l) {
			t.Fatalf("%s: %v", id, l)
		}
	}
	want("whole", func(l accessLine) bool {
		return l.str("method") == "POST" && l.str("path") == "/v1/chat/completions" && l.num("status") == 200 &&
			l.str("model") == "m" && l["stream"] == false && l.str("pod") == "m-0" && l.num("attempts") == 1 &&
			l.num("prompt_tokens") > 0 && l.num("completion_tokens") == 8 && l.num("duration_ms") > 0 && l["error"] == nil
	})
	want("stream", func(l accessLine) bool {
		return l.num("status") == 200 && l["stream"] == true && l.str("pod") == "m-0" && l.num("completion_tokens") == 8 &&
			l.num("ttft_ms") > 0 && l.num("ttft_ms") <= l.num("duration_ms")
	})
	want("nope", func(l accessLine) bool {
		return l.num("status") == 404 && l.str("model") == "nope" && l["pod"] == nil && strings.Contains(l.str("error"), "nope")
	})
	if l := byID[madeID]; madeID == "" || l.str("model") != "nope-too" || l.num("status") != 404 {
		t.Fatalf("the refused request without an id was answered with id %q; no line of it under that id: %v", madeID, lines)
	}
	want("models", func(l accessLine) bool {
		return l.str("method") == "GET" && l.str("path") == "/v1/models" && l.num("status") == 200
	})
	want("wrong-method", func(l accessLine) bool {
		return l.str("method") == "POST" && l.str("path") == "/v1/models" && l.num("status") == 405 && l.str("error") != ""
	})
	// The client saw a 200 and then an error event: the line tells both.
	want("broken", func(l accessLine) bool {
		return l.num("status") >= 500 && l.str("pod") == "b-0" && l.str("error") != ""
	})
	// A request the front end could not read: no method or path to trust,
	// and none of its headers.
	want("", func(l accessLine) bool {
		return l.num("status") == 400 && l["method"] == nil && strings.Contains(l.str("error"), "duplicate content-length") &&
			!strings.Contains(l.str("error"), "sk-not-logged")
	})
}

// TestAccessLogReopen: after logrotate renames the file, ReopenLogs (what
// SIGUSR1 does) sends the next lines to a new file at the path.
func TestAccessLogReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) { c.AccessLog = path })
	if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// The first line reaches the file within the log's flush interval.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(path); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first line was not written")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReopenLogs(); err != nil {
		t.Fatal(err)
	}
	if resp, b := post(t, s, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	lines := readAccessLog(t, s, path)
	if len(lines) != 1 || lines[0].str("path") != "/v1/completions" {
		t.Fatalf("the new file holds %v", lines)
	}
	old, err := os.ReadFile(path + ".1")
	if err != nil || strings.Count(string(old), "\n") != 1 || !strings.Contains(string(old), "/v1/chat/completions") {
		t.Fatalf("the rotated file holds %q (%v)", old, err)
	}
}

// TestPodFailureNamed: an answer the gateway gives for a pod that failed
// (reset: 502; no answer in time: 504) names the pod in x-pdlb-pod and in
// its access log line, on both front ends, as nginx's $upstream_addr
// does. Neither did before: an operator had to guess which pod.
func TestPodFailureNamed(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, fl := range []struct {
			name  string
			serve func(net.Conn, *http.Request)
			want  int
		}{{"reset", resetPod, 502}, {"hung", hungPod, 504}} {
			t.Run(fe+"/"+fl.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "access.log")
				s := testGateway(t, []config.Pod{{Name: "pod-bad", Model: "m", Address: fakePod(t, fl.serve)}}, func(c *config.Config) {
					c.Frontend = fe
					c.AccessLog = path
					c.Health.Interval = time.Hour
					c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = 300*time.Millisecond, 300*time.Millisecond
				})
				resp, b := post(t, s, "/v1/chat/completions", chatBody)
				if resp.StatusCode != fl.want || resp.Header.Get("x-pdlb-pod") != "pod-bad" {
					t.Fatalf("%d from %q, want %d from pod-bad: %s", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), fl.want, b)
				}
				lines := readAccessLog(t, s, path)
				if len(lines) != 1 || lines[0].str("pod") != "pod-bad" || lines[0].num("status") != float64(fl.want) {
					t.Fatalf("access log %v, want one %d line naming pod-bad", lines, fl.want)
				}
			})
		}
	}
}

package lb_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"

	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, lbtest.LeakOptions()...) }

// testFleet starts n simulated vLLM pods of model m.
func testFleet(t *testing.T, model string, n int, speedup float64) []*sim.Pod {
	t.Helper()
	var pods []*sim.Pod
	for i := 0; i < n; i++ {
		p, err := sim.Start(sim.Config{Name: fmt.Sprintf("%s-%d", model, i), Model: model, Listen: "127.0.0.1:0", Speedup: speedup, DefaultMaxTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pods = append(pods, p)
	}
	return pods
}

// testGateway starts a gateway on loopback over pods; edit adjusts the
// config first.
func testGateway(t *testing.T, pods []config.Pod, edit func(*config.Config)) *lb.Server {
	t.Helper()
	return lbtest.StartGateway(t, pods, edit)
}

func podsOf(model string, sims ...*sim.Pod) []config.Pod {
	var out []config.Pod
	for _, p := range sims {
		out = append(out, config.Pod{Name: p.Config().Name, Model: model, Address: p.Addr()})
	}
	return out
}

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func post(t *testing.T, s *lb.Server, path, body string) (*http.Response, string) {
	t.Helper()
	return postVia(t, client, s, path, body)
}

// bothClients runs f with a client that closes its connection after each
// answer (on gnet a stream is then relayed by a goroutine) and with one
// that keeps it (everything but prefill/decode exchanges stays on the
// event loop).
func bothClients(t *testing.T, f func(t *testing.T, via *http.Client)) {
	t.Run("close", func(t *testing.T) { f(t, client) })
	t.Run("keepalive", func(t *testing.T) {
		kc := &http.Client{Timeout: 20 * time.Second}
		defer kc.CloseIdleConnections()
		f(t, kc)
	})
}

// h2cClient speaks HTTP/2 with prior knowledge over plain TCP.
func h2cClient() *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}}
}

// postVia is post with a client of the test's own (one that keeps its
// connections, say).
func postVia(t *testing.T, c *http.Client, s *lb.Server, path, body string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Post("http://"+s.Addr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`

func TestNonStreaming(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 2, 100)...), nil)
	f := func(path, body, object string) {
		t.Helper()
		resp, b := post(t, s, path, body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", path, resp.StatusCode, b)
		}
		var out struct {
			Object  string
			Choices []struct {
				Text    string
				Message struct{ Content string }
			}
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal([]byte(b), &out); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
		if out.Object != object || len(out.Choices) != 1 || out.Usage.CompletionTokens != 8 {
			t.Fatalf("%s: unexpected body %s", path, b)
		}
		if resp.Header.Get("x-pdlb-pod") == "" || resp.Header.Get("X-Request-Id") == "" {
			t.Fatalf("%s: missing x-pdlb-pod or X-Request-Id: %v", path, resp.Header)
		}
	}
	f("/v1/chat/completions", chatBody, "chat.completion")
	f("/v1/completions", `{"model":"m","prompt":"Once upon a time","max_tokens":8}`, "text_completion")
	// Whole answers are charged their usage, as streams their events.
	if got := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`); got != 16 {
		t.Fatalf("pdlb_completion_tokens_total = %v after two 8-token answers, want 16", got)
	}

	// A client's request id is passed through.
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("X-Request-Id", "abc-123")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Request-Id") != "abc-123" {
		t.Fatalf("request id not propagated: %q", resp.Header.Get("X-Request-Id"))
	}
}

// streamWhole says the stream b ran to its end: its [DONE] with no error
// event before it, which a stream that failed ends with as the engines'
// do.
func streamWhole(b string) bool {
	return strings.HasSuffix(b, "data: [DONE]\n\n") && !strings.Contains(b, `data: {"error"`)
}

// readEvents reads an SSE stream, calling each for every data payload with
// the time it arrived.
func readEvents(t *testing.T, r io.Reader, each func(data string, at time.Time)) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			each(strings.TrimPrefix(line, "data: "), time.Now())
		}
	}
}

func TestStreamingIsIncremental(t *testing.T) {
	// At speedup 1 a decode step takes about 10 ms, so 40 tokens take about
	// 400 ms: the first token must reach the client long before the last
	// one is produced.
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1)...), nil)
	start := time.Now()
	resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"count"}],"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var first, last time.Time
	var content strings.Builder
	done, usage := false, false
	readEvents(t, resp.Body, func(data string, at time.Time) {
		if data == "[DONE]" {
			done = true
			return
		}
		var chunk struct {
			Object  string
			Choices []struct{ Delta struct{ Content string } }
			Usage   *struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		if chunk.Usage != nil && chunk.Usage.CompletionTokens == 40 {
			usage = true
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" {
				if first.IsZero() {
					first = at
				}
				last = at
				content.WriteString(c.Delta.Content)
			}
		}
	})
	if !done || !usage || content.Len() == 0 {
		t.Fatalf("stream incomplete: done=%v usage=%v content=%q", done, usage, content.String())
	}
	if a, b := first.Sub(start), last.Sub(start); a > b/2 {
		t.Fatalf("first token after %v, last after %v: the stream was not relayed incrementally", a, b)
	}
}

func TestErrors(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) { c.MaxBodyBytes = 4096 })
	f := func(method, path, body string, status int, inMessage string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+s.Addr()+path, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct {
				Message, Type string
				Param, Code   *string
			}
		}
		if resp.StatusCode != status || json.Unmarshal(b, &e) != nil || e.Error.Type == "" || !strings.Contains(e.Error.Message, inMessage) {
			t.Fatalf("%s %s: got %d %s, want %d with %q", method, path, resp.StatusCode, b, status, inMessage)
		}
	}
	f("POST", "/v1/chat/completions", `{"model":"m","messages":[`, 400, "JSON")
	f("POST", "/v1/chat/completions", `{"model":5,"messages":[{"role":"user","content":"hi"}]}`, 400, `"model"`)
	f("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"maybe"}`, 400, `"stream"`)
	f("POST", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":-1}`, 400, `"max_tokens"`)
	f("POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "nope")
	f("POST", "/v1/images/generations", `{}`, 404, "/v1/images/generations")
	f("GET", "/v1/chat/completions", ``, 405, "GET")
	f("POST", "/v1/chat/completions", `{"model":"m","prompt":"`+strings.Repeat("x", 5000)+`"}`, 413, "4096")
}

// TestMalformedRequestNotEchoed: fasthttp words a header it cannot parse
// with the bytes it read, the client's Authorization among them; the 400
// names the fault, not the headers (clients log error bodies).
func TestMalformedRequestNotEchoed(t *testing.T) {
	// Each request carries the key, and is malformed in a way fasthttp words
	// with the bytes it read: the header block, a header's value, the
	// request line with the headers after it.
	for _, tc := range []struct{ request, fault string }{
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-do-not-echo\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd",
			"duplicate content-length"},
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-do-not-echo\x01\r\nContent-Length: 4\r\n\r\nabcd",
			"invalid header value"},
		{"POST ../v1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-do-not-echo\r\nContent-Length: 4\r\n\r\nabcd",
			"invalid request uri"},
		{"P@ST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-do-not-echo\r\nContent-Length: 4\r\n\r\nabcd",
			"unsupported http request method"},
	} {
		for _, frontend := range []string{"fasthttp", "gnet"} {
			t.Run(tc.fault+"/"+frontend, func(t *testing.T) {
				log := filepath.Join(t.TempDir(), "access.log")
				s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
					c.Frontend = frontend
					c.AccessLog = log
				})
				c, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				io.WriteString(c, tc.request)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 400 || !strings.Contains(string(b), tc.fault) || strings.Contains(string(b), "sk-do-not-echo") {
					t.Fatalf("%d %s; want a 400 naming the fault without the request's headers", resp.StatusCode, b)
				}
				lines := readAccessLog(t, s, log)
				if len(lines) != 1 || !strings.Contains(lines[0].str("error"), tc.fault) || strings.Contains(fmt.Sprint(lines[0]), "sk-do-not-echo") {
					t.Fatalf("access log %v; want the fault without the request's headers", lines)
				}
			})
		}
	}
}

// fakePod is a raw upstream for faults a real engine does not make on
// demand: it answers /health with 200 and every other request with serve.
func fakePod(t *testing.T, serve func(c net.Conn, r *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return fakePodOn(t, ln, serve)
}

// slowPod is a fakePod that answers every request with okAnswer after d,
// closing the connection.
func slowPod(t *testing.T, d time.Duration) string {
	return fakePod(t, func(c net.Conn, _ *http.Request) {
		time.Sleep(d)
		// The fake pod closes after each answer, so it says so: a kept
		// connection would fail the next request.
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(okAnswer), okAnswer)
	})
}

// fakePodOn is fakePod on a listener of the test's.
func fakePodOn(t *testing.T, ln net.Listener, serve func(c net.Conn, r *http.Request)) string {
	t.Helper()
	return scriptedPod(t, ln, podScript{serve: serve})
}

// podScript is what scriptedPod does.
type podScript struct {
	// accepted sees each new connection (nil: nothing to do).
	accepted func(c net.Conn)
	// checks says whether health checks and scrapes get 200 now (nil:
	// always); when not, the connection hangs, answering nothing.
	checks func() bool
	// closeChecks answers a check with Connection: close, so each check
	// dials anew.
	closeChecks bool
	// serve answers any other request; the connection closes after it.
	serve func(c net.Conn, r *http.Request)
	// unread: serve gets the request with its body unread, as a pod that
	// answers or resets before the whole request came.
	unread bool
}

// scriptedPod serves ln as script says until the test ends, each
// connection on a goroutine of its own; the cleanup closes ln and waits
// for every connection.
func scriptedPod(t *testing.T, ln net.Listener, script podScript) string {
	t.Helper()
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if script.accepted != nil {
				script.accepted(c)
			}
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if !script.unread {
						// Read whole, so that serve may answer first;
						// serve gets it still.
						body, _ := io.ReadAll(r.Body)
						r.Body = io.NopCloser(bytes.NewReader(body))
					}
					if r.URL.Path != "/health" && r.URL.Path != "/metrics" {
						script.serve(c, r)
						return
					}
					if script.checks != nil && !script.checks() {
						_, _ = io.Copy(io.Discard, c)
						return
					}
					if script.closeChecks {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
				}
			})
		}
	})
	return ln.Addr().String()
}

// waitIdle waits until nothing is charged or in flight.
func waitIdle(t *testing.T, s *lb.Server) {
	t.Helper()
	testwait.For(t, "charges and in-flight counts back at zero", func() bool {
		for _, line := range strings.Split(get(t, "http://"+s.AdminAddr()+"/metrics"), "\n") {
			if (strings.HasPrefix(line, "pd_token_load_") || strings.HasPrefix(line, "pdlb_pod_in_flight{") || strings.HasPrefix(line, "pdlb_requests_in_flight")) && !strings.HasSuffix(line, " 0") {
				return false
			}
		}
		return true
	})
}

// TestUpstreamFaults runs on both front ends: on gnet, whole answers are
// exchanged on the event loop, streams on a worker.
func TestUpstreamFaults(t *testing.T) {
	t.Run("fasthttp", func(t *testing.T) { testUpstreamFaults(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { testUpstreamFaults(t, "gnet", via) })
	})
}

func testUpstreamFaults(t *testing.T, frontend string, via *http.Client) {
	hang := make(chan struct{})
	broken := fakePod(t, func(c net.Conn, _ *http.Request) {})
	hung := fakePod(t, func(c net.Conn, _ *http.Request) { <-hang })
	midStream := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, ev := range []string{`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n", `data: {"choices":[{"delta":{"content":"b"}}]}` + "\n\n", `data: {"choi`} {
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		}
	})
	// Whole answers that break off, or stall, after part of their body.
	midBody := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"cmpl-1\",\"choi")
	})
	stalledBody := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"cmpl-1\",\"choi")
		<-hang
	})
	idle := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		<-hang
	})
	// Cleanups run last first: release the hung pods before fakePod's
	// cleanups wait for their connections.
	t.Cleanup(func() { close(hang) })
	pod := func(model, addr string) config.Pod { return config.Pod{Model: model, Address: addr} }
	s := testGateway(t, []config.Pod{
		pod("refused", testnet.Refusing(t)), pod("refused", testnet.Refusing(t)),
		pod("broken", broken), pod("hung", hung), pod("mid", midStream), pod("idle", idle),
		pod("midbody", midBody), pod("stalledbody", stalledBody),
	}, func(c *config.Config) {
		c.Frontend = frontend
		c.Upstream.ResponseTimeout = 300 * time.Millisecond
		c.Upstream.WholeResponseTimeout = 300 * time.Millisecond
		c.Upstream.StreamIdleTimeout = 300 * time.Millisecond
		c.Health.Interval = time.Hour // keep the refusing pods "healthy" so requests reach them
	})
	body := func(model string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, stream)
	}
	f := func(model string, stream bool, status int, inBody string) {
		t.Helper()
		resp, b := postVia(t, via, s, "/v1/chat/completions", body(model, stream))
		if resp.StatusCode != status || !strings.Contains(b, inBody) {
			t.Fatalf("%s: got %d %q, want %d with %q", model, resp.StatusCode, b, status, inBody)
		}
	}
	f("refused", false, 502, "connection refused")
	f("broken", false, 502, `"type":"server_error"`)
	f("hung", false, 504, "did not answer")
	// A whole answer is never relayed in part: the client gets the error.
	f("midbody", false, 502, `"type":"server_error"`)
	f("stalledbody", false, 504, "did not answer")
	// A stream that breaks after its first byte: the whole events, then an
	// error event; never the half event.
	f("mid", true, 200, `data: {"choices":[{"delta":{"content":"b"}}]}`+"\n\n"+`data: {"error"`)
	resp, b := postVia(t, via, s, "/v1/chat/completions", body("mid", true))
	if strings.Contains(b, `{"choi`+"\n") || !strings.HasSuffix(b, "\n\n") || resp.StatusCode != 200 {
		t.Fatalf("broken stream relayed badly: %q", b)
	}
	f("idle", true, 200, `data: {"error"`)

	// Whatever failed, nothing stays charged or in flight.
	waitIdle(t, s)
}

// TestPodHeaders: the pod's own headers reach the client as it sent them,
// repeated ones too; its hop-by-hop ones, its Server (nginx and Envoy keep
// their upstreams' Server to themselves), its Date and those the gateway
// sets itself (X-Request-Id, x-pdlb-*) do not, whole answers and streams
// alike, on both front ends. An answer without a Content-Type gets none.
func TestPodHeaders(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nServer: uvicorn\r\nX-Engine: vllm\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\n" +
		"Date: Mon, 01 Jan 2001 00:00:00 GMT\r\nX-Request-Id: pods\r\nx-pdlb-pod: liar\r\nX-Pdlb-Model: liar\r\n" +
		"Connection: keep-alive, X-Gone, x-pdlb-model\r\nX-Gone: 1\r\n"
	const answer = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
	whole := fakePod(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", head, len(answer), answer)
	})
	bare := fakePod(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
	})
	stream := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, head+"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\ndata: [DONE]\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
	})
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Name: "w", Model: "whole", Address: whole}, {Name: "s", Model: "stream", Address: stream},
			{Name: "b", Model: "bare", Address: bare}}, func(c *config.Config) { c.Frontend = frontend })
		resp, _ := postVia(t, via, s, "/v1/chat/completions", `{"model":"bare","messages":[{"role":"user","content":"hi"}]}`)
		if got := resp.Header.Values("Content-Type"); resp.StatusCode != 200 || len(got) > 0 {
			t.Errorf("an answer without a Content-Type: %d, Content-Type %q", resp.StatusCode, got)
		}
		for _, model := range []string{"whole", "stream"} {
			resp, b := postVia(t, via, s, "/v1/chat/completions",
				fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, model == "stream"))
			if resp.StatusCode != 200 || !strings.Contains(b, "ok") && !strings.Contains(b, "[DONE]") {
				t.Fatalf("%s: %d %q", model, resp.StatusCode, b)
			}
			if got := resp.Header.Get("X-Engine"); got != "vllm" {
				t.Errorf("%s: the pod's X-Engine came back as %q", model, got)
			}
			if got := resp.Header.Get("Server"); got != "" {
				t.Errorf("%s: the pod's Server reached the client: %q", model, got)
			}
			if got := resp.Header.Get("X-Gone"); got != "" {
				t.Errorf("%s: a field the pod's Connection named reached the client: %q", model, got)
			}
			if got := resp.Header.Get("Keep-Alive"); got != "" {
				t.Errorf("%s: the pod's hop-by-hop Keep-Alive reached the client: %q", model, got)
			}
			if got := resp.Header.Values("Set-Cookie"); len(got) != 2 || got[0] != "a=1" || got[1] != "b=2" {
				t.Errorf("%s: the pod's two Set-Cookie came back as %q", model, got)
			}
			if got := resp.Header.Get("Date"); got == "" || strings.Contains(got, "2001") {
				t.Errorf("%s: Date %q, want the gateway's", model, got)
			}
			if got := resp.Header.Values("X-Request-Id"); len(got) != 1 || got[0] == "pods" {
				t.Errorf("%s: X-Request-Id %q, want the gateway's one", model, got)
			}
			if got := resp.Header.Values("x-pdlb-pod"); len(got) != 1 || got[0] != model[:1] {
				t.Errorf("%s: x-pdlb-pod %q, want the gateway's one", model, got)
			}
			if got := resp.Header.Values("X-Pdlb-Model"); len(got) != 1 || got[0] != model {
				t.Errorf("%s: X-Pdlb-Model %q, want the gateway's one", model, got)
			}
		}
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestPodHeadTooLarge: a pod's answer head longer than max_header_bytes
// is refused with a 502 on both front ends, however it arrives, as nginx
// refuses one over proxy_buffer_size ("upstream sent too big header");
// one within it passes, on the event loop and on the pods' clients alike.
func TestPodHeadTooLarge(t *testing.T) {
	pod := func(n int) string {
		return fakePod(t, func(c net.Conn, _ *http.Request) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Big: %s\r\nContent-Length: 2\r\n\r\n{}", strings.Repeat("a", n))
		})
	}
	over, within := pod(config.DefaultMaxHeaderBytes), pod(config.DefaultMaxHeaderBytes*5/8)
	for _, fe := range []string{"fasthttp", "gnet"} {
		s := testGateway(t, []config.Pod{{Name: "o", Model: "over", Address: over}, {Name: "w", Model: "within", Address: within}},
			func(c *config.Config) { c.Frontend = fe })
		for model, want := range map[string]int{"over": http.StatusBadGateway, "within": http.StatusOK} {
			resp, b := postVia(t, client, s, "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
			if resp.StatusCode != want || strings.Contains(b, "aaaa") {
				t.Errorf("%s: a pod's head %s %d bytes: %d %q, want %d, and none of the head", fe, model, config.DefaultMaxHeaderBytes, resp.StatusCode, b, want)
			}
		}
	}
}

// TestPodHeadGarbage: a pod's answer head that does not parse fails with a
// 502 whose message quotes none of it, on both front ends: the pod's
// fields (its cookies) are not the client's business.
func TestPodHeadGarbage(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 2x0 OK\r\nSet-Cookie: secret=1\r\nContent-Length: 2\r\n\r\n{}")
	})
	for _, fe := range []string{"fasthttp", "gnet"} {
		s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = fe })
		resp, b := postVia(t, client, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(b, "secret") || strings.Contains(b, "2x0") {
			t.Errorf("%s: %d %s; want 502 quoting nothing of the pod's head", fe, resp.StatusCode, b)
		}
	}
}

// TestQueueFullIsNotPodFailure: an engine whose waiting queue is full
// (SGLang's --max-queued-requests) answers 503 "The request queue is full."
// at admission: load shedding, not a fault. The client gets the engine's
// answer, and the pod is neither charged a failure nor ejected (a burst
// must not eject a fleet pod by pod); any other 5xx still counts. (An
// ejected pod that is its model's last still serves: panic routing.)
func TestQueueFullIsNotPodFailure(t *testing.T) {
	answer := func(status int, body string) string {
		return fakePod(t, func(c net.Conn, _ *http.Request) {
			fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, http.StatusText(status), len(body), body)
		})
	}
	full := answer(503, `{"error":{"message":"The request queue is full.","type":"ServiceUnavailableError","param":null,"code":503}}`)
	failing := answer(500, `{"error":{"message":"CUDA error","type":"InternalServerError","param":null,"code":500}}`)
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Model: "full", Address: full}, {Model: "failing", Address: failing}}, func(c *config.Config) {
				c.Frontend = frontend
				c.Health.Interval = time.Hour // only passive ejection acts here
				c.Health.EjectAfterFailures = 1
			})
			ask := func(model string) (int, string) {
				resp, b := post(t, s, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model))
				return resp.StatusCode, b
			}
			for i := 0; i < 3; i++ {
				if code, b := ask("full"); code != 503 || !strings.Contains(b, "The request queue is full.") {
					t.Fatalf("request %d to a pod whose queue is full: %d %s; want its own 503", i, code, b)
				}
			}
			if n := metricValue(t, s, "pdlb_upstream_errors_total"); n != 0 {
				t.Fatalf("a full queue was charged as %v pod failures", n)
			}
			// A 500 is a fault: one ejects the pod here.
			if code, b := ask("failing"); code != 500 || !strings.Contains(b, "CUDA error") {
				t.Fatalf("a failing pod: %d %s; want its 500", code, b)
			}
			if n := metricValue(t, s, "pdlb_pod_ejections_total"); n != 1 {
				t.Fatalf("%v ejections after a 500, want 1", n)
			}
		})
	}
}

// TestIPv6Pod: a pod at an IPv6 address passes its health checks and
// serves, on both front ends. fasthttp's default dialer is IPv4 only: the
// checks failed ("couldn't find dns entries") and requests got 502.
func TestIPv6Pod(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	const answer = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
	pod := fakePodOn(t, ln, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
	})
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Name: "v6", Model: "m", Address: pod}}, func(c *config.Config) {
				c.Frontend = frontend
				c.Health.Interval = 20 * time.Millisecond
				c.Health.UnhealthyAfter = 1
			})
			// Several checks have run by now.
			time.Sleep(200 * time.Millisecond)
			if v := metricValue(t, s, `pdlb_pod_healthy{pod="v6"}`); v != 1 {
				t.Fatalf("pdlb_pod_healthy %v after its checks", v)
			}
			if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		})
	}
}

// writeChunked answers body as a 200 JSON answer in chunks of 4 KiB, with
// header lines extra.
func writeChunked(c net.Conn, extra, body string) {
	io.WriteString(c, "HTTP/1.1 200 OK\r\n"+extra+"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	for b := body; len(b) > 0; {
		n := min(len(b), 4096)
		fmt.Fprintf(c, "%x\r\n%s\r\n", n, b[:n])
		b = b[n:]
	}
	io.WriteString(c, "0\r\n\r\n")
}

// TestResponseCap: a whole answer is read before the client gets it, so
// upstream.max_response_bytes caps it: one over the cap, announced by its
// length or sent in chunks, is a 502 naming the setting; one under it
// passes. Streams are relayed as they come and have no cap.
func TestResponseCap(t *testing.T) {
	const limit = 64 << 10
	big := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", 2*limit) + `"},"finish_reason":"stop"}]}`
	small := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
	sized := func(body string) string {
		return fakePod(t, func(c net.Conn, _ *http.Request) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
	}
	chunked := fakePod(t, func(c net.Conn, _ *http.Request) { writeChunked(c, "Connection: close\r\n", big) })
	pods := []config.Pod{{Model: "big", Address: sized(big)}, {Model: "chunked", Address: chunked}, {Model: "small", Address: sized(small)}}
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, pods, func(c *config.Config) {
				c.Frontend = frontend
				c.Upstream.MaxResponseBytes = limit
				c.Health.Interval = time.Hour
			})
			for _, model := range []string{"big", "chunked"} {
				resp, b := post(t, s, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model))
				if resp.StatusCode != 502 || !strings.Contains(b, "upstream.max_response_bytes") {
					t.Fatalf("%s answer over the cap: %d %.200s; want 502 naming upstream.max_response_bytes", model, resp.StatusCode, b)
				}
			}
			if resp, b := post(t, s, "/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 {
				t.Fatalf("an answer under the cap: %d %s", resp.StatusCode, b)
			}
			waitIdle(t, s)
		})
	}
}

// TestEjectionCap: when every pod of a model fails at once, only
// health.max_ejected_percent of them (by default half) are ejected; the
// rest stay in, so the model keeps being served by its pods rather than
// answered "no healthy pod" by the gateway.
func TestEjectionCap(t *testing.T) {
	var pods []config.Pod
	for i := 0; i < 4; i++ {
		addr := fakePod(t, func(c net.Conn, _ *http.Request) {
			body := `{"error":{"message":"CUDA error","type":"InternalServerError","param":null,"code":500}}`
			fmt.Fprintf(c, "HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
		pods = append(pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: addr})
	}
	s := testGateway(t, pods, func(c *config.Config) {
		c.Health.Interval = time.Hour // only passive ejection acts here
		c.Health.EjectAfterFailures = 1
		c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
	})
	for i := 0; i < 8; i++ {
		if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 500 {
			t.Fatalf("request %d: %d %s; want the pods' own 500", i, resp.StatusCode, b)
		}
	}
	if n := metricValue(t, s, "pdlb_upstream_errors_total"); n != 8 {
		t.Fatalf("%v failures counted, want 8", n)
	}
	ejected, kept := 0, 0
	for i := range pods {
		ejected += int(metricValue(t, s, fmt.Sprintf(`pdlb_pod_ejections_total{pod="p%d"}`, i)))
		kept += int(metricValue(t, s, fmt.Sprintf(`pdlb_pod_ejections_kept_total{pod="p%d"}`, i)))
	}
	if ejected != 2 || kept != 6 {
		t.Fatalf("%d ejections and %d kept in; want 2 (half of 4 pods) and the 6 other failures", ejected, kept)
	}
}

// TestLastPodServesWhileEjected: a model's only pod, ejected after its
// engine failed twice and back since (its health checks pass throughout),
// serves the next request at once, as nginx never takes a group's only
// server out: not a 503 "no healthy pod" for the whole ejection time.
func TestLastPodServesWhileEjected(t *testing.T) {
	var n atomic.Int32
	addr := fakePod(t, func(c net.Conn, _ *http.Request) {
		if n.Add(1) <= 2 {
			body := `{"error":{"message":"CUDA error","type":"InternalServerError","param":null,"code":500}}`
			fmt.Fprintf(c, "HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(okAnswer), okAnswer)
	})
	s := testGateway(t, []config.Pod{{Name: "p0", Model: "m", Address: addr}}, func(c *config.Config) {
		c.Health.Interval = time.Hour // the pod stays healthy by its checks
		c.Health.EjectAfterFailures = 2
		c.Health.EjectionTime = time.Hour
		c.Upstream.Retries = 0
	})
	for i := 0; i < 2; i++ {
		if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 500 {
			t.Fatalf("request %d: %d %s; want the engine's 500", i, resp.StatusCode, b)
		}
	}
	if n := metricValue(t, s, `pdlb_pod_ejections_total{pod="p0"}`); n != 1 {
		t.Fatalf("ejected %v times after two failures, want 1", n)
	}
	if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
		t.Fatalf("the model's only pod, ejected and back: %d %s; want it served", resp.StatusCode, b)
	}
}

func TestRefusingPodIsSkippedAndTakenOut(t *testing.T) {
	sims := testFleet(t, "m", 3, 100)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.Health.Interval = time.Hour // only the request path acts here
		c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
	})
	sims[1].Close() // killed mid-test
	served := map[string]int{}
	for i := 0; i < 30; i++ {
		resp, b := post(t, s, "/v1/chat/completions", chatBody)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		served[resp.Header.Get("x-pdlb-pod")]++
	}
	if served["m-1"] != 0 || served["m-0"] == 0 || served["m-2"] == 0 {
		t.Fatalf("served by %v; the killed pod m-1 must serve nothing", served)
	}
	// Its first refusal took it out, as a refused health check would.
	for _, name := range []string{"m-0", "m-1", "m-2"} {
		if podCounts(t, s, name).Healthy == (name == "m-1") {
			t.Fatalf("%s healthy %v: only the killed pod must be out", name, podCounts(t, s, name).Healthy)
		}
	}
	if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="refused"}`); n != 1 {
		t.Fatalf("%v refused retries, want 1", n)
	}
}

func TestUnhealthyPodsGive503(t *testing.T) {
	sims := testFleet(t, "m", 1, 100)
	s := testGateway(t, podsOf("m", sims...), nil)
	sims[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, b := post(t, s, "/v1/chat/completions", chatBody)
		if resp.StatusCode == 503 {
			if !strings.Contains(b, "No healthy") {
				t.Fatalf("503 body %q", b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d after the pod died: %s", resp.StatusCode, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A refused request takes the pod out, as would the health check
	// (every 50 ms here): /ready follows.
	waitNotReady(t, s, "/ready to answer 503 with no healthy pod")
}

func TestShedsOverMaxInFlight(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) { c.MaxInFlight = 1 })
	resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"long"}],"max_tokens":100,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	bufio.NewReader(resp.Body).ReadString('\n') // the stream is under way
	shed, b := post(t, s, "/v1/chat/completions", chatBody)
	if shed.StatusCode != 429 || shed.Header.Get("Retry-After") == "" || !strings.Contains(b, "max_in_flight") {
		t.Fatalf("got %d %q (Retry-After %q), want 429", shed.StatusCode, b, shed.Header.Get("Retry-After"))
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	s := testGateway(t, podsOf("m", sims...), nil)
	resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"long"}],"max_tokens":2000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n')
	if sims[0].Stats().Running != 1 {
		t.Fatalf("running %d, want 1", sims[0].Stats().Running)
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for sims[0].Stats().Running != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pod kept generating after the client left")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMetricsAndModels(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), nil)
	post(t, s, "/v1/chat/completions", chatBody)
	// With its usage: the engine merges the deltas of a consumer that lags
	// (the sim as vLLM), so the stream's events alone may count 1 token,
	// and TPOT needs 2.
	post(t, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"s"}],"stream":true,"max_tokens":4,"stream_options":{"include_usage":true}}`)
	// A request's metrics are recorded once its last byte went out, so the
	// client can read its answer before they are: scrape until they land.
	lacking := func(b []byte) string {
		for _, want := range []string{
			`pdlb_requests_total{model="m",code="200"} 2`,
			`pdlb_requests_in_flight 0`,
			`pdlb_time_to_first_token_seconds_bucket{model="m",le=`,
			`pdlb_time_per_output_token_seconds_count{model="m"} 1`,
			`pdlb_request_duration_seconds_count{model="m"} 2`,
			`pdlb_upstream_errors_total{pod=`,
			`pdlb_pod_healthy{pod=`,
		} {
			if !strings.Contains(string(b), want) {
				return want
			}
		}
		return ""
	}
	for deadline := time.Now().Add(testwait.Timeout); ; time.Sleep(10 * time.Millisecond) {
		resp, err := client.Get("http://" + s.AdminAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := lacking(b)
		if want == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q:\n%s", want, b)
		}
	}
	models, err := client.Get("http://" + s.Addr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(models.Body)
	models.Body.Close()
	if !strings.Contains(string(mb), `"id":"m"`) {
		t.Fatalf("/v1/models = %s", mb)
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Pods = []config.Pod{{Model: "m", Address: "127.0.0.1:1", Engine: "tgi"}}
	_, err := lb.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), `pods[0].engine = "tgi"`) {
		t.Fatalf("Start with a bad engine: %v", err)
	}
}

// TestStartNamesDiscoveryErrorOnce: a discovery source that cannot start
// stops the start with its error, which says "discovery" once.
func TestStartNamesDiscoveryErrorOnce(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", ""
	cfg.Discovery.Kubernetes = &spec.Kubernetes{Kubeconfig: filepath.Join(t.TempDir(), "missing")}
	cfg.Provision()
	_, err := lb.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.HasPrefix(err.Error(), "discovery: kubernetes: ") || strings.Count(err.Error(), "discovery") != 1 {
		t.Fatalf("Start with a missing kubeconfig: %v", err)
	}
}

func newPost(s *lb.Server, body string) (*http.Request, error) {
	req, err := http.NewRequest("POST", "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(body))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, err
}

// postWith posts a chat body with headers given as name, value pairs.
func postWith(t *testing.T, s *lb.Server, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	return send(t, client, s, http.MethodPost, "/v1/chat/completions", body, append([]string{"Content-Type", "application/json"}, headers...)...)
}

// send sends method to path on s through c with the header fields given
// as name, value pairs, and returns the answer and its body.
func send(t *testing.T, c *http.Client, s *lb.Server, method, path, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+s.Addr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestExpectContinue: a client's Expect: 100-continue is the front end's to
// answer; the pod gets the whole body at once and no Expect, as nginx and
// Envoy send it.
func TestExpectContinue(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			expect := make(chan string, 1)
			addr := fakePod(t, func(c net.Conn, r *http.Request) {
				expect <- r.Header.Get("Expect")
				body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			})
			s := testGateway(t, []config.Pod{{Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
			})
			resp, b := postWith(t, s, chatBody, "Expect", "100-continue")
			if resp.StatusCode != 200 || !strings.Contains(b, `"content":"ok"`) {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			if e := <-expect; e != "" {
				t.Fatalf("the pod was sent Expect: %s", e)
			}
		})
	}
}

// TestBusyPodStaysIn: a pod whose /health answers after the check's
// timeout while it serves requests, as a saturated vLLM does, stays in:
// the model's only pod, it answers every request. Once nothing reaches
// it, the same late answers take it out.
func TestBusyPodStaysIn(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			time.Sleep(100 * time.Millisecond)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(srv.Close)
	s := testGateway(t, []config.Pod{{Name: "busy", Model: "m", Address: strings.TrimPrefix(srv.URL, "http://")}}, func(c *config.Config) {
		// Two checks in a row (about 240 ms) without an answer between
		// them would take it out.
		c.Health.Interval, c.Health.Timeout, c.Health.UnhealthyAfter = 100*time.Millisecond, 20*time.Millisecond, 2
		c.Health.MetricsInterval = 0
	})
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Fatalf("the busy pod's request: %d %s", resp.StatusCode, b)
		}
	}
	waitNotReady(t, s, "the pod out once no request reached it")
}

// waitNotReady waits for s's /ready to answer 503 (no healthy pod).
func waitNotReady(t *testing.T, s *lb.Server, what string) {
	t.Helper()
	testwait.For(t, what, func() bool {
		resp, err := client.Get("http://" + s.Addr() + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == 503
	})
}

// TestStartFailureFreesListeners: a Start that fails after binding (here
// Kubernetes discovery, out of a cluster) lets go of the admin and
// metrics ports, so a retry or another process can bind them.
func TestStartFailureFreesListeners(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	cfg := config.Default()
	cfg.Listen, cfg.Admin, cfg.Metrics = "127.0.0.1:0", free(), free()
	cfg.Discovery.Kubernetes = &spec.Kubernetes{Namespace: "x"}
	cfg.Provision()
	if s, err := lb.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		s.Shutdown(context.Background())
		t.Skip("Kubernetes discovery started here")
	}
	for _, addr := range []string{cfg.Admin, cfg.Metrics} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s still bound after a failed Start: %v", addr, err)
			continue
		}
		ln.Close()
	}
}

package lb_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// The gnet front end exchanges whole answers with the pods on its event
// loops (lb/frontend/loop.go). These tests pin what that path must keep:
// keep-alive reuse on both sides, order on a pipelined connection, the
// accounting of a request whose client left, and the connection cap.

// keepAlivePod answers every completion with a small whole JSON body on a
// keep-alive connection, after hold returns; it counts the connections that
// carried completions (health checks and scrapes come on their own). A
// connection idle for idle (0: forever) is closed, as uvicorn does after its
// timeout_keep_alive; idle < 0 closes one at its second completion,
// unanswered, as when that timeout runs out just as the request comes.
func keepAlivePod(t *testing.T, idle time.Duration, hold func()) (addr string, accepted *atomic.Int32) {
	t.Helper()
	accepted = new(atomic.Int32)
	addr = testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		br := bufio.NewReader(c)
		counted := false
		for {
			if idle > 0 {
				c.SetReadDeadline(time.Now().Add(idle))
			}
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, r.Body)
			if r.URL.Path == "/v1/chat/completions" {
				if counted && idle < 0 {
					return
				}
				if !counted {
					counted = true
					accepted.Add(1)
				}
				if hold != nil {
					hold()
				}
			}
			body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	return addr, accepted
}

// holdFirst is a keepAlivePod that holds its first completion until release
// is closed; held gets a value once it does.
func holdFirst(t *testing.T) (addr string, held <-chan struct{}, release chan struct{}) {
	h := make(chan struct{}, 1)
	release = make(chan struct{})
	var first atomic.Bool
	addr, _ = keepAlivePod(t, 0, func() {
		if first.CompareAndSwap(false, true) {
			h <- struct{}{}
			<-release
		}
	})
	return addr, h, release
}

func gnetGateway(t *testing.T, pods []config.Pod, edit func(*config.Config)) *lb.Server {
	t.Helper()
	return testGateway(t, pods, func(c *config.Config) {
		c.Frontend = "gnet"
		c.Health.Interval = time.Hour
		if edit != nil {
			edit(c)
		}
	})
}

func TestLoopKeepAlive(t *testing.T) {
	addr, accepted := keepAlivePod(t, 0, nil)
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: addr}}, nil)
	kc := &http.Client{Timeout: 10 * time.Second}
	defer kc.CloseIdleConnections()
	for i := 0; i < 50; i++ {
		resp, err := kc.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"ok"`) {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	// One client connection, one request at a time: one connection to the
	// pod carries them all.
	if n := accepted.Load(); n != 1 {
		t.Fatalf("the pod accepted %d connections for 50 sequential requests; want 1", n)
	}
	waitIdle(t, s)
}

func TestLoopPipelinedOrder(t *testing.T) {
	sims := testFleet(t, "m", 1, 100)
	s := gnetGateway(t, podsOf("m", sims...), nil)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Whole, stream, whole, whole in one write: the first goes out on the
	// loop, the stream on a worker, and the answers come back in order.
	var req strings.Builder
	for i, stream := range []bool{false, true, false, false} {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi %d"}],"max_tokens":4,"stream":%v}`, i, stream)
		fmt.Fprintf(&req, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: r%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", i, len(body), body)
	}
	if _, err := io.WriteString(c, req.String()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i, want := range []string{"application/json", "text/event-stream", "application/json", "application/json"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != fmt.Sprintf("r%d", i) || !strings.HasPrefix(resp.Header.Get("Content-Type"), want) {
			t.Fatalf("response %d: %d id %q type %q: %s", i, resp.StatusCode, resp.Header.Get("X-Request-Id"), resp.Header.Get("Content-Type"), b)
		}
	}
	waitIdle(t, s)
}

// TestLoopClientGone: a client that leaves before its answer came takes
// the pod's connection with it, which is how the pod learns to stop (as
// behind nginx). The request counts as 499, the pod is not blamed, nothing
// stays charged, and the gateway serves on. Whole answers and streams
// alike: a stream's first byte comes only after the prefill.
//
// On fasthttp too, which reads nothing while a handler runs: a whole
// answer's client was not seen leaving until the pod had generated all
// of it (the watch of its connection, once the answer has taken a
// while, sees it now).
func TestLoopClientGone(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", fe, stream), func(t *testing.T) { testClientGone(t, fe, stream) })
		}
	}
}

func testClientGone(t *testing.T, fe string, stream bool) {
	sims := testFleet(t, "m", 1, 1)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) { c.Frontend = fe })
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":3000,"stream":%v}`, strings.Repeat("a long prompt to prefill ", 2000), stream)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	testwait.For(t, "the pod to take the request", func() bool { return sims[0].Stats().Running == 1 })
	c.Close()
	waitClientGone(t, s, sims[0])
	if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
		t.Fatalf("after a client left: %d %s", resp.StatusCode, b)
	}
}

// waitClientGone waits for pod to abort the one request it runs, whose
// client left, and checks that s counted it 499 without blaming the pod.
func waitClientGone(t *testing.T, s *lb.Server, pod *sim.Pod) {
	t.Helper()
	testwait.For(t, "the pod to abort the request", func() bool {
		st := pod.Stats()
		return st.Aborted == 1 && st.Running+st.Waiting == 0
	})
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_requests_total{model="m",code="499"}`); n != 1 {
		t.Fatalf("%v requests counted 499, want 1", n)
	}
	if n := metricValue(t, s, "pdlb_upstream_errors_total"); n != 0 {
		t.Fatalf("the pod was charged %v failures for a client that left", n)
	}
}

func TestLoopConnectionCap(t *testing.T) {
	addr, held, release := holdFirst(t)
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: addr}}, func(c *config.Config) {
		c.Upstream.MaxConnsPerPod = 1
		c.Health.EjectAfterFailures = 1
	})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the gateway's shutdown waits for the held request
	type result struct {
		status int
		body   string
	}
	slow := make(chan result, 1)
	go func() {
		resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			slow <- result{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- result{resp.StatusCode, string(b)}
	}()
	<-held
	// The pod's one connection is busy: the next request is refused at
	// once, not queued behind it (with no other pod to retry on).
	resp, b := post(t, s, "/v1/chat/completions", chatBody)
	if resp.StatusCode != 503 || !strings.Contains(b, "max_conns_per_pod: 1") {
		t.Fatalf("over the cap: %d %s; want 503 naming upstream.max_conns_per_pod", resp.StatusCode, b)
	}
	// The gateway's own cap is no failure of the pod's: one failure would
	// have ejected it here.
	if m := get(t, "http://"+s.AdminAddr()+"/admin/pods"); !strings.Contains(m, `"ejected": false`) {
		t.Fatalf("the pod was charged a failure for the cap: %s", m)
	}
	free()
	if r := <-slow; r.status != 200 {
		t.Fatalf("the held request: %d %s", r.status, r.body)
	}
	waitIdle(t, s)
}

// TestLoopAnswerShapes: answers the loop must read whole however they come:
// large, chunked, and in pieces with pauses between them.
func TestLoopAnswerShapes(t *testing.T) {
	big := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("x", 300_000) + `"},"finish_reason":"stop"}]}`
	pieces := func(c net.Conn, parts ...string) {
		for _, p := range parts {
			io.WriteString(c, p)
			time.Sleep(20 * time.Millisecond)
		}
	}
	shapes := map[string]struct {
		serve func(c net.Conn, _ *http.Request)
		want  string
	}{
		"large": {func(c net.Conn, _ *http.Request) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(big), big)
		}, big},
		"chunked": {func(c net.Conn, _ *http.Request) {
			pieces(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
				"5\r\n{\"id\"\r\n", "3\r\n:1}\r\n", "0\r\n\r\n")
		}, `{"id":1}`},
		"in pieces": {func(c net.Conn, _ *http.Request) {
			pieces(c, "HTTP/1.1 200 OK\r\nContent-Ty", "pe: application/json\r\nContent-Length: 8\r\n\r", "\n{\"id\"", ":1}")
		}, `{"id":1}`},
		"early hints": {func(c net.Conn, _ *http.Request) {
			pieces(c, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n",
				"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"id\":1}")
		}, `{"id":1}`},
		// No length and not chunked: the body ends where the pod closes.
		"until close": {func(c net.Conn, _ *http.Request) {
			pieces(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", "{\"id\"", ":1}")
		}, `{"id":1}`},
		// Gathered over many reads (see upConn.read).
		"chunked large": {func(c net.Conn, _ *http.Request) { writeChunked(c, "", big) }, big},
		"chunked with a trailer": {func(c net.Conn, _ *http.Request) {
			pieces(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: X-Done\r\n\r\n",
				"8\r\n{\"id\":1}\r\n0\r\nX-Done: 1\r\n", "\r\n")
		}, `{"id":1}`},
	}
	var pods []config.Pod
	for name, shape := range shapes {
		pods = append(pods, config.Pod{Model: strings.ReplaceAll(name, " ", "-"), Address: fakePod(t, shape.serve)})
	}
	s := gnetGateway(t, pods, nil)
	kc := &http.Client{Timeout: 10 * time.Second}
	defer kc.CloseIdleConnections()
	for name, shape := range shapes {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, strings.ReplaceAll(name, " ", "-"))
		resp, err := kc.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != shape.want {
			t.Fatalf("%s: %d, %d bytes (want %d): %.200s", name, resp.StatusCode, len(b), len(shape.want), b)
		}
	}
	waitIdle(t, s)
}

// TestLoopTimeouts: exchanges that time out together, on the same loops,
// each get their 504, and nothing stays charged.
func TestLoopTimeouts(t *testing.T) {
	hang := make(chan struct{})
	addr, _ := keepAlivePod(t, 0, func() { <-hang })
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: addr}}, func(c *config.Config) {
		c.Upstream.ResponseTimeout = 300 * time.Millisecond
		c.Upstream.WholeResponseTimeout = 300 * time.Millisecond
	})
	t.Cleanup(func() { close(hang) })
	const n = 6 // more than one per loop
	codes := make(chan int, n)
	for range n {
		go func() {
			kc := &http.Client{Timeout: 10 * time.Second}
			defer kc.CloseIdleConnections()
			resp, err := kc.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for range n {
		if c := <-codes; c != 504 {
			t.Fatalf("a hung exchange answered %d, want 504", c)
		}
	}
	waitIdle(t, s)
}

// TestWholeAnswersWaitLonger: a non-streaming answer comes only when the
// whole generation is done, so upstream.response_timeout (a stream's
// headers, about its time to first token) does not bound it;
// upstream.whole_response_timeout does.
func TestWholeAnswersWaitLonger(t *testing.T) {
	addr, _ := keepAlivePod(t, 0, func() { time.Sleep(600 * time.Millisecond) })
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = frontend
				c.Upstream.ResponseTimeout = 300 * time.Millisecond
			})
			ask := func(stream bool) (int, string) {
				resp, b := post(t, s, "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":%v}`, stream))
				return resp.StatusCode, b
			}
			if code, b := ask(false); code != 200 {
				t.Fatalf("a whole answer after 600 ms: %d %s; want 200 (whole_response_timeout 10m)", code, b)
			}
			if code, b := ask(true); code != 504 || !strings.Contains(b, "within 300ms") {
				t.Fatalf("a stream's headers after 600 ms: %d %s; want 504 (response_timeout 300ms)", code, b)
			}
			waitIdle(t, s)
		})
	}
}

// TestLoopStreamClientGone: a client that leaves a stream relayed on the
// loop gets the pod's connection closed (which tells the pod to stop), and
// nothing stays charged.
func TestLoopStreamClientGone(t *testing.T) {
	stopped := make(chan struct{})
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
		for {
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev); err != nil {
				close(stopped)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: pod}}, nil)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	c.Close()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the pod still streams 10 s after its client left")
	}
	waitIdle(t, s)
}

// TestPodClosesIdleConnections: the engines' HTTP servers (uvicorn, under
// vLLM, SGLang and trtllm-serve) close a keep-alive connection idle for 5 s,
// and a pod that crashes or restarts closes every one. No request may go
// out on a connection the pod closed: it would answer 502. The pods'
// clients let theirs go first (upstream.keepalive_timeout); the event loop
// sees the pod's close as it comes; the pods' clients (fasthttp's front
// end, prefill/decode legs) look at a kept connection before each request
// and dial anew when the pod closed it. So even a keep-alive longer than
// the pod's loses nothing.
func TestPodClosesIdleConnections(t *testing.T) {
	const ours = 150 * time.Millisecond
	for _, tc := range []struct {
		name             string
		frontend         string
		podIdle, ourIdle time.Duration // 0: the pod never closes
	}{
		{"fasthttp/ours shorter", "fasthttp", 300 * time.Millisecond, ours},
		// The pod closes first: fasthttp's client would send into the
		// closed connection (it answered 502 before the peek).
		{"fasthttp/ours longer", "fasthttp", 300 * time.Millisecond, config.DefaultKeepaliveTimeout},
		// The loop sees the pod's close as it comes.
		{"gnet/ours longer", "gnet", 300 * time.Millisecond, config.DefaultKeepaliveTimeout},
		// Ours is honoured: a pod that never closes still gets a new
		// connection after each idle gap.
		{"fasthttp/pod never closes", "fasthttp", 0, ours},
		{"gnet/pod never closes", "gnet", 0, ours},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, accepted := keepAlivePod(t, tc.podIdle, nil)
			s := testGateway(t, []config.Pod{{Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = tc.frontend
				c.Health.Interval = time.Hour
				c.Upstream.KeepaliveTimeout = tc.ourIdle
			})
			for i := 0; i < 3; i++ {
				if i > 0 {
					time.Sleep(500 * time.Millisecond)
				}
				resp, body := post(t, s, "/v1/chat/completions", chatBody)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d after an idle gap: %d %s", i, resp.StatusCode, body)
				}
			}
			if n := accepted.Load(); n != 3 {
				t.Fatalf("the pod accepted %d connections for 3 requests half a second apart; want 3", n)
			}
		})
	}
}

// TestPodClosesAsTheRequestComes: a pod whose idle timeout closes a kept
// connection just as the gateway's next request on it arrives (the close
// and the request cross on the wire) never saw that request, so it goes
// again on a new connection to the same pod, on both front ends: not a
// reset, which would spend a retry (none is left here, so the client got
// 502) and count against the pod.
func TestPodClosesAsTheRequestComes(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			addr, accepted := keepAlivePod(t, -1, nil)
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
			})
			// One client connection: on gnet, one loop and its pod connections.
			kc := &http.Client{Timeout: 20 * time.Second}
			defer kc.CloseIdleConnections()
			for i := range 3 {
				if resp, body := postVia(t, kc, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
				}
			}
			if n := accepted.Load(); n != 3 {
				t.Fatalf("the pod accepted %d connections; want 3, one per request after its first closed", n)
			}
			for _, m := range []string{`pdlb_upstream_retries_total{reason="reset"}`, `pdlb_upstream_errors_total{pod="p"}`} {
				if n := metricValue(t, s, m); n != 0 {
					t.Fatalf("%s %v, want 0", m, n)
				}
			}
		})
	}
}

// TestLoopBodilessAnswers: a 204 or 304 has no body whatever its header
// says (RFC 9112 6.3), on a connection the pod keeps open: the loop must
// not wait for one until the exchange times out.
func TestLoopBodilessAnswers(t *testing.T) {
	for _, tc := range []struct {
		answer string
		status int
	}{
		{"HTTP/1.1 204 No Content\r\n\r\n", 204},
		{"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", 304},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			hold := make(chan struct{})
			pod := fakePod(t, func(c net.Conn, _ *http.Request) {
				io.WriteString(c, tc.answer)
				<-hold
			})
			t.Cleanup(func() { close(hold) }) // before the pod's cleanup waits
			s := gnetGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) {
				c.Upstream.WholeResponseTimeout = 2 * time.Second
			})
			if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != tc.status {
				t.Fatalf("%q: %d %s; want %d", tc.answer, resp.StatusCode, b, tc.status)
			}
			waitIdle(t, s)
		})
	}
}

// TestLoopIdleAfterLongStream: a stream relayed on the loop for longer
// than client_idle_timeout leaves its keep-alive connection open for the
// client's next request: the idle time runs from the answer's end.
func TestLoopIdleAfterLongStream(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
		for range 4 {
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			time.Sleep(time.Second)
		}
		io.WriteString(c, "0\r\n\r\n")
	})
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) {
		c.ClientIdleTimeout = 3 * time.Second
	})
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	for i := range 2 {
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || err != nil {
			t.Fatalf("request %d: %d %v %s", i, resp.StatusCode, err, b)
		}
		// Past a tick of the idle sweep, well within the idle timeout.
		time.Sleep(1100 * time.Millisecond)
	}
	waitIdle(t, s)
}

// TestLoopEmptyStream: a stream's answer with Content-Length: 0 ends with
// its header; the relay must not wait for a byte until its idle timeout
// and then end it as a pod that stopped answering, but end it at once as
// a stream cut before its [DONE].
func TestLoopEmptyStream(t *testing.T) {
	hold := make(chan struct{})
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n")
		<-hold
	})
	t.Cleanup(func() { close(hold) }) // before the pod's cleanup waits
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) {
		c.Upstream.StreamIdleTimeout = 2 * time.Second
	})
	resp, b := postStream(t, s)
	if resp.StatusCode != 200 || !strings.HasPrefix(b, `data: {"error"`) || !strings.Contains(b, "unexpected EOF") {
		t.Fatalf("an empty stream: %d %q; want 200 and an error event for the cut", resp.StatusCode, b)
	}
	waitIdle(t, s)
}

// TestLoopStreamAfterEarlyHints: a stream's 200 that follows an interim
// answer (103 Early Hints) is relayed as it comes, not read whole (which
// outlasts response_timeout, the wait for a stream's header).
func TestLoopStreamAfterEarlyHints(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		ev := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
		for range 4 {
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			time.Sleep(500 * time.Millisecond)
		}
		io.WriteString(c, "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
	})
	s := gnetGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) {
		c.Upstream.ResponseTimeout = time.Second
	})
	resp, b := postStream(t, s)
	if resp.StatusCode != 200 || strings.Count(b, "data: ") != 5 || !strings.HasSuffix(b, "data: [DONE]\n\n") {
		t.Fatalf("a stream after 103: %d %.200q; want 200, 4 events and [DONE]", resp.StatusCode, b)
	}
	waitIdle(t, s)
}

// postStream asks s for a streamed chat completion over a connection it
// keeps (so the loop relays the stream), and reads the whole answer.
func postStream(t *testing.T, s *lb.Server) (*http.Response, string) {
	t.Helper()
	kc := &http.Client{Timeout: 10 * time.Second}
	defer kc.CloseIdleConnections()
	return postVia(t, kc, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
}

// TestStreamHeadThenCloseIsNotSentAgain: a stream whose head came on a
// kept connection before the pod closed it was taken by the pod (engines
// send the head before the prefill), so the close is the pod's failure,
// not a kept connection's close crossing the request: it is not sent to
// the pod again on a new connection.
func TestStreamHeadThenCloseIsNotSentAgain(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			var completions atomic.Int32
			addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, r.Body)
					if r.URL.Path != "/v1/chat/completions" {
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
						continue
					}
					if completions.Add(1) > 1 {
						// A stream's head, then the pod's close.
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
						return
					}
					body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			})
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Upstream.Retries = 0
			})
			kc := &http.Client{Timeout: 20 * time.Second}
			defer kc.CloseIdleConnections()
			if resp, body := postVia(t, kc, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
				t.Fatalf("the first request: %d %s", resp.StatusCode, body)
			}
			stream := strings.Replace(chatBody, `"max_tokens":8`, `"max_tokens":8,"stream":true`, 1)
			postVia(t, kc, s, "/v1/chat/completions", stream)
			if n := completions.Load(); n != 2 {
				t.Fatalf("the pod got %d completions; want 2: the stream it began answering is not sent again", n)
			}
		})
	}
}

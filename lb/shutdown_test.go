package lb_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"strings"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

func TestShutdownLetsStreamsFinish(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1)...), nil)
	// About half a second of tokens at speedup 1.
	resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"stream"}],"max_tokens":50,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	br.ReadString('\n')
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	// The gateway stops accepting at once...
	testwait.For(t, "new connections to be refused", func() bool {
		_, err := client.Get("http://" + s.Addr() + "/health")
		return err != nil
	})
	// ...and the stream in flight runs to its end.
	rest, err := io.ReadAll(br)
	if err != nil || !streamWhole(string(rest)) {
		t.Fatalf("the stream was not let finish: %v %q", err, rest)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestShutdownDeadlineEndsStreams(t *testing.T) {
	bothClients(t, testShutdownDeadlineEndsStreams)
	// An HTTP/2 connection's streams too: its server closed the
	// connection at the grace's end, before the streams were ended.
	t.Run("h2c", func(t *testing.T) { testShutdownDeadlineEndsStreams(t, h2cClient()) })
}

func testShutdownDeadlineEndsStreams(t *testing.T, via *http.Client) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 1)...), nil)
	// Twenty seconds of tokens: longer than the grace the shutdown gives.
	resp, err := via.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"stream"}],"max_tokens":2000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	br.ReadString('\n')
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s.Shutdown(ctx)
	// The client is not left hanging: its stream ends soon after the grace,
	// with an error event that says why.
	rest, _ := io.ReadAll(br)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the stream outlived the shutdown deadline by %v", d)
	}
	if !strings.Contains(string(rest), `data: {"error":{"message":"The gateway is shutting down`) {
		t.Fatalf("the cut stream ended without the error event: %q", rest[max(0, len(rest)-300):])
	}
}

// TestShutdownDeadlineEndsSilentStreams: a stream whose pod says nothing
// more when the grace ends (a long prefill, a stalled engine) gets its
// error event then, on a worker (a client that closes its connection) or
// on an event loop (one that keeps it), not at its idle timeout, and gives
// back what it held.
func TestShutdownDeadlineEndsSilentStreams(t *testing.T) {
	event := `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n"
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(event), event)
		// Then nothing, until the gateway closes the connection.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, c)
	})
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			bothClients(t, func(t *testing.T, via *http.Client) {
				s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = fe })
				resp, err := via.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				br.ReadString('\n')
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				start := time.Now()
				s.Shutdown(ctx)
				rest, _ := io.ReadAll(br)
				if d := time.Since(start); d > 1500*time.Millisecond {
					t.Errorf("the stream ended %v after the shutdown began, the grace being 300ms", d)
				}
				if !strings.Contains(string(rest), `data: {"error":{"message":"The gateway is shutting down`) {
					t.Errorf("the cut stream ended without the error event: %q", rest)
				}
				wantNothingHeld(t, s, "p")
			})
		})
	}
}

// wantNothingHeld fails t for a request s's gateway still counts in
// flight, or one on pod, once it shut down (its admin listener is gone:
// the metrics are read from the gateway).
func wantNothingHeld(t *testing.T, s *lb.Server, pod string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Gateway.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if (strings.HasPrefix(line, "pdlb_requests_in_flight ") || strings.HasPrefix(line, `pdlb_pod_in_flight{pod="`+pod+`"}`)) && !strings.HasSuffix(line, " 0") {
			t.Errorf("after the shutdown: %s", line)
		}
	}
}

// TestShutdownDeadlineAnswersWholeRequests: a request whose whole answer
// is still coming when the grace ends gets the shutdown's 503, which tells
// the client to retry, not a closed connection; its pod call is cut, so
// the pod stops, and it gives back what it held: on the event loops, on
// fasthttp's workers, and over HTTP/2 (on workers on both front ends).
func TestShutdownDeadlineAnswersWholeRequests(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			each := func(t *testing.T, via *http.Client) {
				sims := testFleet(t, "m", 1, 1)
				s := testGateway(t, podsOf("m", sims...), func(c *config.Config) { c.Frontend = fe })
				// Twenty seconds of tokens at speedup 1, answered whole.
				wantShutdownAnswer(t, s, via, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2000}`, sims[0])
				wantNothingHeld(t, s, "m-0")
			}
			bothClients(t, each)
			t.Run("h2c", func(t *testing.T) { each(t, h2cClient()) })
		})
	}
}

// TestShutdownDeadlineAnswersPD: the same for a PD pair's whole answer,
// whose legs run on workers, cut in its prefill or its decode leg, with a
// sequential engine's exchange and a concurrent one's.
func TestShutdownDeadlineAnswersPD(t *testing.T) {
	for _, e := range pdEngines[:2] {
		for _, during := range []string{"prefill", "decode"} {
			t.Run(e.name+"/"+during, func(t *testing.T) {
				slow := func(c *sim.Config) { c.Speedup = 1 }
				pre := startSim(t, e, "pre", sim.RolePrefill, slow)
				dec := startSim(t, e, "dec", sim.RoleDecode, slow)
				s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "g"), pdPod(dec, dec.Addr(), "g")}, nil)
				prompt, busy := "x", dec
				if during == "prefill" {
					prompt, busy = strings.Repeat("a long prompt to prefill ", 2000), pre
				}
				wantShutdownAnswer(t, s, client, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":3000}`, prompt), busy)
				wantNothingHeld(t, s, "pre")
				wantNothingHeld(t, s, "dec")
			})
		}
	}
}

// wantShutdownAnswer posts body to path of s via the client, shuts s down
// with a grace of 300 ms once pod busy works on the request, and fails t
// unless the client then got the shutdown's 503 at once and busy stops.
func wantShutdownAnswer(t *testing.T, s *lb.Server, via *http.Client, path, body string, busy *sim.Pod) {
	t.Helper()
	wantShutdownAnswerAt(t, s, via, path, body, func() {
		testwait.For(t, "the request to reach its pod", func() bool { return busy.Stats().Running == 1 })
	})
	testwait.For(t, "pod "+busy.Config().Name+" to stop working on the request", func() bool { return busy.Stats().Running == 0 })
}

// wantShutdownAnswerAt posts body to path of s via the client, shuts s
// down with a grace of 300 ms once arrived returns (the request is where
// the test wants it), and fails t unless the client then got the
// shutdown's 503 at once.
func wantShutdownAnswerAt(t *testing.T, s *lb.Server, via *http.Client, path, body string, arrived func()) {
	t.Helper()
	// status and answer are the goroutine's until done.
	var status int
	var answer []byte
	done := make(chan error, 1)
	go func() {
		resp, err := via.Post("http://"+s.Addr()+path, "application/json", strings.NewReader(body))
		if err == nil {
			status = resp.StatusCode
			answer, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	arrived()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s.Shutdown(ctx)
	err := <-done
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("answered %v after the shutdown began, the grace being 300ms", d)
	}
	if err != nil || status != 503 || !strings.Contains(string(answer), "The gateway is shutting down") {
		t.Errorf("got %d %q %v, want the shutdown's 503", status, answer, err)
	}
}

// TestShutdownDeadlineAnswersDeferred: a request still waiting for
// admission when the grace ends is answered the shutdown's 503 then, on
// its own model (a shutdown is not the model's failure: no fallback), and
// gives back what it held, on both front ends.
func TestShutdownDeadlineAnswersDeferred(t *testing.T) {
	fallback := testFleet(t, "n", 1, 100)
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			pod := physicsPod(t, "slow", 1, func(p *sim.Physics) { p.PrefillTokensPerSec = 2000 })
			s := testGateway(t, append([]config.Pod{{Name: "slow", Model: "m", Address: pod.Addr(), PrefillTokensPerSec: 2000}}, podsOf("n", fallback...)...), func(c *config.Config) {
				c.Frontend = fe
				c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n"}}
				c.Admission.Enabled = true
				c.Admission.Batch.TTFTSLO = 0.5
				c.Admission.Batch.MaxWait = 60
			})
			// ~1,600 tokens: 0.8 s of prefill, so the prediction never clears.
			c := sendBatch(t, s, chat(strings.Repeat("x", 6400), "hi", 2, false))
			defer c.Close()
			testwait.For(t, "the request to wait for admission", func() bool {
				return metricValue(t, s, `pdlb_admission_waiting{class="batch"}`) == 1
			})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			s.Shutdown(ctx)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("answered %v after the shutdown began, the grace being 300ms", d)
			}
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
			}
			switch {
			case err != nil:
				t.Errorf("got %v, want the shutdown's 503", err)
			case resp.StatusCode != 503 || !strings.Contains(string(body), "The gateway is shutting down"):
				t.Errorf("got %d %q, want the shutdown's 503", resp.StatusCode, body)
			case resp.Header.Get("x-pdlb-model") != "m":
				t.Errorf("answered by model %q, want m: a shutdown is no reason to fall back", resp.Header.Get("x-pdlb-model"))
			}
			wantNothingHeld(t, s, "slow")
		})
	}
}

// TestShutdownClosesWhatIsLeft: once Shutdown returned, no connection of
// its front end serves on: not a kept one whose stream the grace's end
// cut (fasthttp's own shutdown left those serving), nor one that never
// sent a byte, plain or in a TLS handshake (fasthttp's never saw those).
func TestShutdownClosesWhatIsLeft(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	ca := newCA(t)
	leaf := issueLeaf(t, ca, time.Time{}, time.Time{}, "localhost", "127.0.0.1")
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, kind := range []string{"plain", "h2-off", "tls"} {
			t.Run(fe+"/"+kind, func(t *testing.T) {
				s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
					c.Frontend = fe
					c.HTTP2.Disabled = kind == "h2-off"
					if kind == "tls" {
						c.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}}
					}
				})
				silent, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer silent.Close()
				var kept net.Conn
				var stream, br *bufio.Reader
				if kind != "tls" {
					// A kept connection with a stream longer than the grace.
					if kept, err = net.Dial("tcp", s.Addr()); err != nil {
						t.Fatal(err)
					}
					defer kept.Close()
					body := `{"model":"m","messages":[{"role":"user","content":"stream"}],"max_tokens":2000,"stream":true}`
					fmt.Fprintf(kept, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					br = bufio.NewReader(kept)
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					stream = bufio.NewReader(resp.Body)
					stream.ReadString('\n')
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				s.Shutdown(ctx)
				_ = silent.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := silent.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
					t.Error("a connection that sent nothing is still open 2 s after Shutdown returned")
				}
				if kept != nil {
					_ = kept.SetDeadline(time.Now().Add(3 * time.Second))
					io.ReadAll(stream)
					fmt.Fprintf(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
					if r, err := http.ReadResponse(br, nil); err == nil {
						t.Errorf("the kept connection served a request after Shutdown returned: %s", r.Status)
					}
				}
			})
		}
	}
}

// TestDrainMovesH2Clients: while the gateway drains, every answer ends
// its connection so its client reconnects elsewhere; an HTTP/2 client is
// told with GOAWAY, on either front end.
func TestDrainMovesH2Clients(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) { c.Frontend = fe })
			c := h2cClient()
			defer c.CloseIdleConnections()
			// reused says whether the request went on a connection
			// the client kept.
			reused := func() bool {
				var kept bool
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { kept = i.Reused }})
				req, err := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(chatBody))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				return kept
			}
			reused()
			if !reused() {
				t.Fatal("the h2 client did not keep its connection before the drain")
			}
			s.Drain()
			reused()
			testwait.For(t, "the h2 client to take a new connection", func() bool { return !reused() })
		})
	}
}

// TestUpgradeInPlace: a second gateway starts with the first one's
// configuration, its API and admin addresses included, as the new binary
// of an in-place upgrade does (docs/tuning.md), and serves the API alone
// once the first shuts down.
func TestUpgradeInPlace(t *testing.T) {
	pods := podsOf("m", testFleet(t, "m", 1, 100)...)
	var oldLog, nextLog testlog.Buffer
	old := lbtest.StartGatewayLog(t, pods, nil, slog.New(slog.NewTextHandler(&oldLog, nil)))
	next := lbtest.StartGatewayLog(t, pods, func(c *config.Config) { c.Listen, c.Admin = old.Addr(), old.AdminAddr() },
		slog.New(slog.NewTextHandler(&nextLog, nil)))
	// Sharing the ports is the point here, and it is said, naming who
	// holds them; a gateway alone on its ports says nothing of it.
	owner := fmt.Sprintf("pid %d", os.Getpid())
	for _, l := range []struct{ name, addr string }{{"listen", old.Addr()}, {"admin", old.AdminAddr()}} {
		if !strings.Contains(nextLog.String(), "listener="+l.name+" address="+l.addr+` with="`+owner) {
			t.Errorf("no warning that %s %s is shared with %s:\n%s", l.name, l.addr, owner, nextLog.String())
		}
	}
	if strings.Contains(oldLog.String(), "already listens") {
		t.Errorf("a gateway alone on its ports warned of sharing them:\n%s", oldLog.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := old.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if resp, b := post(t, next, "/v1/chat/completions", chatBody); resp.StatusCode != 200 {
			t.Fatalf("after the old gateway left: %d %s", resp.StatusCode, b)
		}
	}
}

// TestShutdownDeadlineAnswersAdapterWait: a request waiting for its LoRA
// adapter to load on its pod (up to adapter_load_timeout, 30 s by
// default) when the grace ends is answered the shutdown's 503 then, and
// gives back what it held, on both front ends.
func TestShutdownDeadlineAnswersAdapterWait(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			loading, stop := make(chan struct{}, 1), make(chan struct{})
			addr := fakePod(t, func(c net.Conn, r *http.Request) {
				switch r.URL.Path {
				case "/v1/models":
					answerJSON(c, 200, `{"object":"list","data":[{"id":"m","object":"model","root":"m"}]}`)
				case "/v1/load_lora_adapter":
					loading <- struct{}{}
					<-stop // a load that takes its time
				default:
					answerJSON(c, 404, `{"error":{"message":"not found"}}`)
				}
			})
			t.Cleanup(func() { close(stop) })
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: addr}}, func(c *config.Config) {
				c.Frontend = fe
				c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "fin", Path: "/loras/fin"}}, LoadAdapters: true, MaxLoras: 2}}}
			})
			wantShutdownAnswerAt(t, s, client, "/v1/completions", `{"model":"fin","prompt":"hello","max_tokens":2}`, func() { <-loading })
			wantNothingHeld(t, s, "p")
		})
	}
}

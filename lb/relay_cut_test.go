package lb_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"pdlb/engines/sim"
	"pdlb/internal/testaudio"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// TestStreamCutMidEvent: a pod whose stream has no length and is not
// chunked ends it by closing its connection, and one that closes midway
// through an event broke: the client gets the whole events, then an error
// event, never the half event nor a clean end, and the request counts as
// failed, on both front ends and both of gnet's relays.
func TestStreamCutMidEvent(t *testing.T) {
	cut := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		io.WriteString(c, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n"+`data: {"choi`)
	})
	// A stray blank line after the last event cuts nothing.
	whole := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		io.WriteString(c, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\ndata: [DONE]\n\n\n")
	})
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Model: "m", Address: cut}, {Model: "whole", Address: whole}}, func(c *config.Config) { c.Frontend = frontend })
		resp, b := postVia(t, via, s, "/v1/chat/completions", `{"model":"whole","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if resp.StatusCode != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("whole stream relayed badly: %d %q", resp.StatusCode, b)
		}
		resp, b = postVia(t, via, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if resp.StatusCode != 200 || !strings.HasPrefix(b, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n") || strings.Contains(b, `{"choi`+"\n") {
			t.Fatalf("cut stream relayed badly: %d %q", resp.StatusCode, b)
		}
		if !strings.Contains(b, `data: {"error"`) {
			t.Errorf("a stream cut mid-event ended without an error event: %q", b)
		}
		if n := metricValue(t, s, `pdlb_requests_total{model="m",code="200"}`); n != 0 {
			t.Errorf("a stream cut mid-event counted as %v successes", n)
		}
		waitIdle(t, s)
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestStreamEndsWithoutDone: vLLM, SGLang and TensorRT-LLM end every
// stream with "data: [DONE]", after an error event too, so a stream whose
// body ends cleanly between events without it was cut: closed early on a
// stream without length, or a chunked one ended early. The client gets the
// events, then an error event, and the request counts as failed, on both
// front ends and both of gnet's relays.
func TestStreamEndsWithoutDone(t *testing.T) {
	const events = `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	closed := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+events)
	})
	chunked := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(events), events)
	})
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Model: "closed", Address: closed}, {Model: "chunked", Address: chunked}}, func(c *config.Config) { c.Frontend = frontend })
		for _, model := range []string{"closed", "chunked"} {
			resp, b := postVia(t, via, s, "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"stream":true}`)
			if resp.StatusCode != 200 || !strings.HasPrefix(b, events) {
				t.Fatalf("%s: stream relayed badly: %d %q", model, resp.StatusCode, b)
			}
			if !strings.Contains(b, `data: {"error"`) {
				t.Errorf("%s: a stream without [DONE] ended without an error event: %q", model, b)
			}
			waitIdle(t, s)
			if n := metricValue(t, s, `pdlb_requests_total{model="`+model+`",code="200"}`); n != 0 {
				t.Errorf("%s: a stream without [DONE] counted as %v successes", model, n)
			}
		}
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestStreamEngineErrorEvent: an engine that fails a stream after its 200
// (vLLM and SGLang send {"error": {..., "code": 500}}, then [DONE]) has
// its events relayed as they came, and the request counts with the
// event's status, not as a success, and teaches no TPOT, on both front
// ends and both of gnet's relays.
func TestStreamEngineErrorEvent(t *testing.T) {
	const errEvent = `data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"
	const stream = `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" +
		`data: {"choices":[{"delta":{"content":"b"}}]}` + "\n\n" + errEvent + "data: [DONE]\n\n"
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+stream)
	})
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = frontend })
		resp, b := postVia(t, via, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if resp.StatusCode != 200 || b != stream {
			t.Fatalf("the stream relayed as %d %q; want 200 and the pod's bytes", resp.StatusCode, b)
		}
		waitIdle(t, s)
		if n := metricValue(t, s, `pdlb_requests_total{model="m",code="200"}`); n != 0 {
			t.Errorf("a stream the engine failed counted as %v successes", n)
		}
		if n := metricValue(t, s, `pdlb_requests_total{model="m",code="500"}`); n != 1 {
			t.Errorf("a stream the engine failed with code 500 counted %v times as 500; want 1", n)
		}
		if n := metricValue(t, s, `pdlb_time_per_output_token_seconds_count{model="m"}`); n != 0 {
			t.Errorf("a failed stream taught %v TPOT samples", n)
		}
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestTranscriptionStreamEnds: vLLM's speech-to-text streams end with
// "data: [DONE]" as its completions' do, after its error event too
// (speech_to_text.py's stream generator), so one closed cleanly without
// it was cut and one carrying the error event failed with its code: the
// relay judges them as a completion's, on both front ends and both of
// gnet's relays. Their text is no output counted: vLLM's usage for them
// is the audio's duration, or none.
func TestTranscriptionStreamEnds(t *testing.T) {
	chunk := func(object, text string) string {
		return `data: {"id":"trsc-1","object":"` + object + `","created":1,"model":"m","choices":[{"delta":{"content":"` + text + `"}}]}` + "\n\n"
	}
	const errEvent = `data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"
	cut := chunk("transcription.chunk", " Hello")
	failed := chunk("translation.chunk", " Hello") + errEvent + "data: [DONE]\n\n"
	whole := chunk("transcription.chunk", " Hello") + `data: {"id":"trsc-1","object":"transcription.chunk","created":1,"model":"m","choices":[{"delta":{"content":" world."},"finish_reason":"stop","stop_reason":null}]}` + "\n\n" + "data: [DONE]\n\n"
	podFor := func(stream string) string {
		return fakePod(t, func(c net.Conn, _ *http.Request) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+stream)
		})
	}
	pods := []config.Pod{{Model: "cut", Address: podFor(cut)}, {Model: "failed", Address: podFor(failed)}, {Model: "whole", Address: podFor(whole)}}
	post := func(t *testing.T, via *http.Client, s *lb.Server, path, model string) string {
		t.Helper()
		form, formType := testaudio.Form(testaudio.WAV(1, 0), "model", model, "stream", "true")
		resp, b := send(t, via, s, "POST", path, string(form), "Content-Type", formType)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %q", model, resp.StatusCode, b)
		}
		return b
	}
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, pods, func(c *config.Config) { c.Frontend = frontend })
		if b := post(t, via, s, "/v1/audio/transcriptions", "cut"); !strings.HasPrefix(b, cut) || !strings.Contains(b[len(cut):], `data: {"error"`) {
			t.Errorf("a transcription stream closed without [DONE] relayed as %q; want its event, then an error event", b)
		}
		if b := post(t, via, s, "/v1/audio/translations", "failed"); b != failed {
			t.Errorf("a translation stream the engine failed relayed as %q; want the pod's bytes", b)
		}
		if b := post(t, via, s, "/v1/audio/transcriptions", "whole"); b != whole {
			t.Errorf("a whole transcription stream relayed as %q; want the pod's bytes", b)
		}
		waitIdle(t, s)
		for _, c := range []struct {
			series string
			want   float64
		}{
			{`pdlb_requests_total{model="cut",code="200"}`, 0},
			{`pdlb_requests_total{model="failed",code="200"}`, 0},
			{`pdlb_requests_total{model="failed",code="500"}`, 1},
			{`pdlb_requests_total{model="whole",code="200"}`, 1},
			{`pdlb_completion_tokens_total{model="whole"}`, 0},
		} {
			if n := metricValue(t, s, c.series); n != c.want {
				t.Errorf("%s = %v; want %v", c.series, n, c.want)
			}
		}
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestStreamBrokenEndsAsEngine: a stream the gateway ends because its pod
// broke ends as vLLM and SGLang end one whose generation failed (their
// streaming generators): the error event, then "data: [DONE]", which
// clients that read to it (async-openai, a curl user) stop at. On chat,
// completions and transcriptions, on both front ends, both of gnet's
// relays and HTTP/2.
func TestStreamBrokenEndsAsEngine(t *testing.T) {
	const first = `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	cut := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+first+`data: {"choi`)
	})
	form, formType := testaudio.Form(testaudio.WAV(1, 0), "model", "m", "stream", "true")
	requests := []struct{ path, body, contentType string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, "application/json"},
		{"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, "application/json"},
		{"/v1/audio/transcriptions", string(form), formType},
	}
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Model: "m", Address: cut}}, func(c *config.Config) { c.Frontend = frontend })
		for _, r := range requests {
			resp, b := send(t, via, s, "POST", r.path, r.body, "Content-Type", r.contentType)
			events := strings.Split(strings.TrimSuffix(b, "\n\n"), "\n\n")
			if resp.StatusCode != 200 || !strings.HasPrefix(b, first) || len(events) != 3 {
				t.Errorf("%s: relayed as %d %q; want the pod's event, an error event and [DONE]", r.path, resp.StatusCode, b)
				continue
			}
			var ev struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			if data, ok := strings.CutPrefix(events[1], "data: "); !ok || json.Unmarshal([]byte(data), &ev) != nil || ev.Error.Message == "" {
				t.Errorf("%s: the pod's event is followed by %q, not an error event", r.path, events[1])
			}
			if events[2] != "data: [DONE]" {
				t.Errorf("%s: the error event is followed by %q, not data: [DONE] as the engines' are", r.path, events[2])
			}
		}
		waitIdle(t, s)
	}
	t.Run("fasthttp", func(t *testing.T) {
		check(t, "fasthttp", client)
		t.Run("h2", func(t *testing.T) { check(t, "fasthttp", h2cClient()) })
	})
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
		t.Run("h2", func(t *testing.T) { check(t, "gnet", h2cClient()) })
	})
}

// TestStreamChoicesTPOT: a stream of n choices brings each step's tokens
// as n events, and its usage counts them all; its TPOT is the time
// between one choice's tokens, not n times less.
func TestStreamChoicesTPOT(t *testing.T) {
	streamTPOT(t, "/v1/chat/completions", `{"model":"m","n":2,"messages":[{"role":"user","content":"hi"}],"stream":true}`, 2)
}

// TestStreamBatchTPOT: a completion batch of k prompts with n choices
// each streams k×n choices a step, as vLLM indexes them (prompt×n+j).
func TestStreamBatchTPOT(t *testing.T) {
	streamTPOT(t, "/v1/completions", `{"model":"m","n":2,"prompt":["hi","ho"],"stream":true}`, 4)
}

// streamTPOT posts body to a pod that streams each step's token of every
// one of choices, steps at least 20 ms apart, and checks the one TPOT
// sample the gateway takes is a step's time.
func streamTPOT(t *testing.T, path, body string, choices int) {
	t.Helper()
	const steps, step = 5, 20 * time.Millisecond
	// The gateway times a token when it reads it, so a relay that read the
	// first step late, together with the next, timed less than the pod's
	// steps: the pod paces the rest only once the client has the first
	// token, which the gateway timed before relaying it.
	firstRead := make(chan struct{})
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		for i := range steps {
			if i == 1 {
				select {
				case <-firstRead:
				case <-t.Context().Done():
					return
				}
			}
			if i > 0 {
				time.Sleep(step)
			}
			for j := range choices {
				fmt.Fprintf(c, `data: {"choices":[{"index":%d,"delta":{"content":"a"}}]}`+"\n\n", j)
			}
		}
		io.WriteString(c, "data: [DONE]\n\n")
	})
	s := testGateway(t, []config.Pod{{Model: "m", Address: pod}}, nil)
	resp, err := client.Post("http://"+s.Addr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := 0
	readEvents(t, resp.Body, func(string, time.Time) {
		if events++; events == 1 {
			close(firstRead)
		}
	})
	if want := steps*choices + 1; events != want {
		t.Fatalf("%d events relayed; want %d", events, want)
	}
	waitIdle(t, s)
	if n := metricValue(t, s, `pdlb_time_per_output_token_seconds_count{model="m"}`); n != 1 {
		t.Fatalf("%v TPOT samples; want 1", n)
	}
	// Between the first token's timing and the last's the pod slept
	// steps-1 times at least step.
	if tpot := metricValue(t, s, `pdlb_time_per_output_token_seconds_sum{model="m"}`); tpot < step.Seconds() {
		t.Errorf("TPOT %.1f ms of steps at least %v apart", tpot*1000, step)
	}
}

// TestStreamChunkFramingSplit: a chunked stream whose framing arrives in
// pieces (a chunk-size line split from its CRLF, the last chunk's CRLF
// split in two) is relayed whole, on both front ends and both of gnet's
// relays.
func TestStreamChunkFramingSplit(t *testing.T) {
	event := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	done := "data: [DONE]\n\n"
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		parts := []string{
			"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x", len(event)),
			"\r\n" + event + "\r\n" + fmt.Sprintf("%x", len(done)),
			"\r\n" + done + "\r",
			"\n0\r\n\r\n",
		}
		for _, p := range parts {
			io.WriteString(c, p)
			time.Sleep(30 * time.Millisecond)
		}
	})
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = frontend })
		resp, b := postVia(t, via, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if resp.StatusCode != 200 || b != event+done {
			t.Fatalf("stream relayed as %d %q, want 200 %q", resp.StatusCode, b, event+done)
		}
		waitIdle(t, s)
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestStreamEventsLeaveTogether: events a pod sent together (one write,
// a chunk each, as engines frame them) reach the client together, in one
// chunk, when a goroutine relays them (fasthttp, and gnet for a client
// that closes after the answer): the relay sends what it gathered when it
// must read the pod again, not after every chunk it took from the pod.
func TestStreamEventsLeaveTogether(t *testing.T) {
	event := func(s string) string { return `data: {"choices":[{"delta":{"content":"` + s + `"}}]}` + "\n\n" }
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	together := event("a") + event("b") + event("c")
	// A token per subtest, buffered: one that fails before it releases
	// the pod still does (deferred), so the pod's cleanup does not wait.
	release := make(chan struct{}, 2)
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			chunk(event("a"))+chunk(event("b"))+chunk(event("c")))
		<-release
		io.WriteString(c, chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = fe })
			c, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			free := sync.OnceFunc(func() { release <- struct{}{} })
			defer free()
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			br := bufio.NewReader(c)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.TransferEncoding == nil {
				t.Fatalf("answer %d, transfer encoding %v", resp.StatusCode, resp.TransferEncoding)
			}
			// The raw chunks, not the body http would join up.
			size, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			var n int
			fmt.Sscanf(size, "%x", &n)
			first := make([]byte, n)
			if _, err := io.ReadFull(br, first); err != nil {
				t.Fatal(err)
			}
			if string(first) != together {
				t.Errorf("first chunk to the client %q, want the three events the pod sent together", first)
			}
			free()
			rest, _ := io.ReadAll(br)
			if !strings.Contains(string(rest), "data: [DONE]") || !strings.HasSuffix(string(rest), "0\r\n\r\n") {
				t.Errorf("the stream went on as %q", rest)
			}
			waitIdle(t, s)
		})
	}
}

// TestClientGoneBeforeStreamHead: a client that asked for a stream and
// reset its connection before the pod's head came has the pod's call cut
// and every charge given back, over HTTP/1.1 and HTTP/1.0 (on a new
// connection and on a kept one) on both front ends (fasthttp's HTTP/1.0
// stream never ran its writer when the head's write failed, and gathered
// a kept connection's: the pod streamed on for nobody, charges taken).
func TestClientGoneBeforeStreamHead(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		for _, tc := range []struct {
			name, proto string
			kept        bool // an answer came on the connection before
		}{{"HTTP/1.1", "HTTP/1.1", false}, {"HTTP/1.0", "HTTP/1.0", false}, {"HTTP/1.0 kept", "HTTP/1.0", true}} {
			t.Run(fe+"/"+tc.name, func(t *testing.T) {
				got, release, podDone := make(chan struct{}, 1), make(chan struct{}), make(chan error, 1)
				pod := fakePod(t, func(c net.Conn, _ *http.Request) {
					got <- struct{}{}
					<-release
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
					ev := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
					for i := 0; i < 200; i++ {
						if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev); err != nil {
							podDone <- err
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
					podDone <- nil
				})
				s := testGateway(t, []config.Pod{{Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = fe })
				body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
				c, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				keep := ""
				if tc.kept {
					keep = "Connection: keep-alive\r\n"
					io.WriteString(c, "GET /health HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil || resp.Close {
						t.Fatalf("first answer on the kept connection: %v", err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
				}
				fmt.Fprintf(c, "POST /v1/chat/completions %s\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", tc.proto, keep, len(body), body)
				<-got
				_ = c.(*net.TCPConn).SetLinger(0)
				c.Close() // a reset
				time.Sleep(50 * time.Millisecond)
				close(release)
				select {
				case err := <-podDone:
					if err == nil {
						t.Error("the pod streamed all its events (4 s) to a client that had left")
					}
				case <-time.After(8 * time.Second):
					t.Error("the pod's connection still open 8 s after the client left")
				}
				waitIdle(t, s)
			})
		}
	}
}

// TestH2ResetCutsPod: an HTTP/2 client that cancels its stream
// (RST_STREAM) while the pod is still prefilling has the pod's request
// cut, whether the pod holds its head back until the first token (the
// sim's fasthttp) or sends it at once, as uvicorn does under vLLM and
// SGLang, and the relay waits for the first event; on both front ends,
// over TLS and h2c. The request counts as the client's leaving (499),
// its charges given back.
func TestH2ResetCutsPod(t *testing.T) {
	ca := newCA(t)
	leaf := issueLeaf(t, ca, time.Time{}, time.Time{}, "127.0.0.1")
	// A prompt the sim prefills for minutes.
	slow := testFleet(t, "m", 1, 0.0001)[0]
	body := `{"model":"m","messages":[{"role":"user","content":"hello there"}],"stream":true,"max_tokens":4}`
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, overTLS := range []bool{false, true} {
			for _, pod := range []string{"sim", "head first"} {
				t.Run(fmt.Sprintf("%s/tls=%v/%s", fe, overTLS, pod), func(t *testing.T) {
					closed := make(chan struct{}, 1)
					pods := []config.Pod{{Name: "p", Model: "m", Address: fakePod(t, func(c net.Conn, _ *http.Request) {
						// A comment the client reads shows it the relay under way.
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
						fmt.Fprintf(c, "%x\r\n%s\r\n", len(": prefilling\n\n"), ": prefilling\n\n")
						// Nothing more comes until the gateway closes the
						// connection (or the test gives up on it).
						_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
						if _, err := c.Read(make([]byte, 1)); err == io.EOF {
							closed <- struct{}{}
						}
					})}}
					if pod == "sim" {
						pods = podsOf("m", slow)
					}
					s := testGateway(t, pods, func(c *config.Config) {
						c.Frontend = fe
						c.Upstream.Retries = 0
						if overTLS {
							c.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}}
						}
					})
					via, url := h2cClient(), "http://"+s.Addr()
					if overTLS {
						via, url = &http.Client{Transport: &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}, "https://"+s.Addr()
					}
					aborted := slow.Stats().Aborted
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
					if pod == "sim" {
						go func() {
							if resp, err := via.Do(req); err == nil {
								resp.Body.Close()
							}
						}()
						testwait.For(t, "the sim prefilling the request", func() bool { return slow.Stats().Running > 0 })
						cancel() // the transport resets the stream
						testwait.For(t, "the sim aborting the request", func() bool { return slow.Stats().Aborted > aborted })
					} else {
						resp, err := via.Do(req)
						if err != nil {
							t.Fatal(err)
						}
						line, err := bufio.NewReader(resp.Body).ReadString('\n')
						if err != nil || line != ": prefilling\n" {
							t.Fatalf("the stream began %q, %v", line, err)
						}
						cancel()
						resp.Body.Close()
						select {
						case <-closed:
						case <-time.After(5 * time.Second):
							t.Fatal("the pod's connection still open 5 s after the client reset its stream")
						}
					}
					waitIdle(t, s)
					if n := metricValue(t, s, `pdlb_requests_total{model="m",code="499"}`); n != 1 {
						t.Errorf("counted %v times as 499; want 1", n)
					}
				})
			}
		}
	}
}

// TestHTTP1ClientLeavesStream: an HTTP/1.1 client that closes its
// connection while the pod is still prefilling its stream has the pod's
// request cut where a worker relays the stream (on gnet a stream that is
// the connection's last answer, and a PD exchange's decode leg; on
// fasthttp every stream), whether the pod holds its head back until the
// first token (the sim's fasthttp) or sends it at once, as uvicorn does
// under vLLM and SGLang. The request counts as the client's leaving (499).
func TestHTTP1ClientLeavesStream(t *testing.T) {
	const comment = ": prefilling\n\n"
	// A prompt the sim prefills for minutes.
	slow := testFleet(t, "m", 1, 0.0001)[0]
	for _, fe := range []string{"gnet", "fasthttp"} {
		for _, pod := range []string{"sim", "head first", "head first pd"} {
			t.Run(fe+"/"+pod, func(t *testing.T) {
				closed := make(chan struct{}, 1)
				addr := fakePod(t, func(c net.Conn, _ *http.Request) {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
					fmt.Fprintf(c, "%x\r\n%s\r\n", len(comment), comment)
					// Nothing more comes until the gateway closes the
					// connection (or the test gives up on it).
					_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
					if _, err := c.Read(make([]byte, 1)); err == io.EOF {
						closed <- struct{}{}
					}
				})
				pods := []config.Pod{{Name: "p", Model: "m", Address: addr}}
				switch pod {
				case "sim":
					pods = podsOf("m", slow)
				case "head first pd":
					pre := startSim(t, pdEngines[0], "pre", sim.RolePrefill, nil)
					pods = []config.Pod{pdPod(pre, pre.Addr(), "g"), {Name: "p", Model: "m", Address: addr, Role: config.RoleDecode, Roleset: "g"}}
				}
				s := testGateway(t, pods, func(c *config.Config) {
					c.Frontend = fe
					c.Upstream.Retries = 0
				})
				body := `{"model":"m","messages":[{"role":"user","content":"hello there"}],"stream":true,"max_tokens":4}`
				c, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				// The connection's last answer: gnet's loop hands its
				// stream to a worker.
				fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				if pod == "sim" {
					aborted := slow.Stats().Aborted
					testwait.For(t, "the sim prefilling the request", func() bool { return slow.Stats().Running > 0 })
					c.Close()
					testwait.For(t, "the sim aborting the request", func() bool { return slow.Stats().Aborted > aborted })
				} else {
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						t.Fatal(err)
					}
					if want := pod == "head first pd"; (resp.Header.Get("x-pdlb-prefill-pod") == "pre") != want {
						t.Fatalf("prefill pod %q; want a PD exchange: %v", resp.Header.Get("x-pdlb-prefill-pod"), want)
					}
					line, err := bufio.NewReader(resp.Body).ReadString('\n')
					if err != nil || line != ": prefilling\n" {
						t.Fatalf("the stream began %q, %v", line, err)
					}
					c.Close()
					select {
					case <-closed:
					case <-time.After(5 * time.Second):
						t.Fatal("the pod's connection still open 5 s after the client closed its own")
					}
				}
				waitIdle(t, s)
				if n := metricValue(t, s, `pdlb_requests_total{model="m",code="499"}`); n != 1 {
					t.Errorf("counted %v times as 499; want 1", n)
				}
			})
		}
	}
}

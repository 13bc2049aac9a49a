package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/racebuild"
	"pdlb/internal/testnet"
)

// answersPod answers each request on a connection with answer(path),
// written as it is, then closes the connection when closes; "" closes it
// unanswered. It counts the connections it accepted.
func answersPod(t *testing.T, answer func(path string) (a string, closes bool)) (client *fasthttp.HostClient, conns *atomic.Int32) {
	conns = new(atomic.Int32)
	addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			a, closes := answer(req.URL.Path)
			if a == "" {
				return
			}
			if _, err := io.WriteString(c, a); err != nil || closes {
				return
			}
		}
	})
	client = &fasthttp.HostClient{Addr: addr, MaxResponseBodySize: 1 << 10, ReadBufferSize: 512, DisableHeaderNamesNormalizing: true,
		Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
	return client, conns
}

// callPath makes a whole call of path through DoCut, watched by cut.
func callPath(client *fasthttp.HostClient, path string, head *AnswerHead, cut Cut) (*fasthttp.Response, error) {
	up := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(up)
	up.Header.SetMethod("POST")
	up.SetRequestURI("http://pod" + path)
	up.SetBodyString(`{"prompt":"hi"}`)
	resp := new(fasthttp.Response)
	deadline := time.Now().Add(5 * time.Second)
	_, err := DoCut(client, up, resp, head, deadline, deadline, nil, cut)
	return resp, err
}

const vllmAnswer = "HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"

// TestWholePlainHead: a plain answer's header lines come back as the pod
// sent them, the response's header holds its status and length, and the
// connection serves the calls that follow; without a head to take them,
// every field is in the response's header.
func TestWholePlainHead(t *testing.T) {
	client, conns := answersPod(t, func(string) (string, bool) { return vllmAnswer, false })
	for _, cut := range []Cut{nil, ChanCut(make(chan struct{}))} {
		for i := range 3 {
			var head AnswerHead
			resp, err := callPath(client, "/v1/completions", &head, cut)
			if err != nil || resp.StatusCode() != 200 || string(resp.Body()) != "{}" || resp.Header.ContentLength() != 2 {
				t.Fatalf("call %d: %v %d %q", i, err, resp.StatusCode(), resp.Body())
			}
			if !head.Raw || string(head.Lines) != "date: Wed, 02 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n" {
				t.Fatalf("call %d: head %v %q", i, head.Raw, head.Lines)
			}
		}
		resp, err := callPath(client, "/v1/completions", nil, cut)
		fields := map[string]string{}
		for k, v := range resp.Header.All() {
			fields[strings.ToLower(string(k))] = string(v)
		}
		if err != nil || fields["content-type"] != "application/json" || fields["server"] != "uvicorn" {
			t.Fatalf("without a head: %v %q", err, resp.Header.Header())
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("8 calls took %d connections, want 1", n)
	}
}

// TestWholeParsed: answers whose head is not plain, or whose body has no
// length, are read by fasthttp's parser, each field in the response's
// header; the connection is kept when the answer ends where it should.
func TestWholeParsed(t *testing.T) {
	answers := map[string]string{
		"/chunked": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n",
		"/interim": "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		"/folded":  "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
	}
	client, conns := answersPod(t, func(path string) (string, bool) { return answers[path], false })
	for path := range answers {
		var head AnswerHead
		resp, err := callPath(client, path, &head, nil)
		if err != nil || resp.StatusCode() != 200 || string(resp.Body()) != "{}" || head.Raw ||
			string(resp.Header.Peek("Content-Type")) != "application/json" {
			t.Errorf("%s: %v %d %q raw %v %q", path, err, resp.StatusCode(), resp.Body(), head.Raw, resp.Header.Header())
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("3 calls took %d connections, want 1", n)
	}
}

// TestWholeFailures: each way a whole answer fails has the error the
// gateway tells apart, the pod's bytes quoted in none; a connection an
// answer left out of step is not used again.
func TestWholeFailures(t *testing.T) {
	answers := map[string]string{
		"/ok":        vllmAnswer,
		"/extra":     vllmAnswer + "HTTP/1.1 200 OK\r\n",
		"/close":     "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
		"/no-body":   "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
		"/big-body":  "HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("x", 2000),
		"/big-head":  "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", 600) + "\r\nContent-Length: 2\r\n\r\n{}",
		"/bad-head":  "HTTP/1.1 200 OK\r\nsecret\r\nContent-Length: 2\r\n\r\n{}",
		"/short":     "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}",
		"/half-head": "HTTP/1.1 200 OK\r\nContent-Le",
	}
	client, conns := answersPod(t, func(path string) (string, bool) {
		return answers[path], path == "/short" || path == "/half-head"
	})
	var small *fasthttp.ErrSmallBuffer
	for _, c := range []struct {
		path  string
		ok    func(error) bool
		conns int32 // after the call
	}{
		{"/ok", func(err error) bool { return err == nil }, 1},
		{"/extra", func(err error) bool { return err == nil }, 1},
		{"/ok", func(err error) bool { return err == nil }, 2},
		{"/close", func(err error) bool { return err == nil }, 2},
		{"/no-body", func(err error) bool { return err == nil }, 3},
		{"/ok", func(err error) bool { return err == nil }, 3},
		{"/big-body", func(err error) bool { return err == fasthttp.ErrBodyTooLarge }, 3},
		{"/big-head", func(err error) bool { return errors.As(err, &small) }, 4},
		{"/bad-head", func(err error) bool { return err == ErrPodHead }, 5},
		{"/short", func(err error) bool { return err == io.ErrUnexpectedEOF }, 6},
		{"/half-head", func(err error) bool { return err == io.ErrUnexpectedEOF }, 7},
	} {
		var head AnswerHead
		resp, err := callPath(client, c.path, &head, nil)
		if !c.ok(err) || err != nil && strings.Contains(err.Error(), "secret") {
			t.Fatalf("%s: %v", c.path, err)
		}
		if c.path == "/no-body" && (resp.StatusCode() != 204 || len(resp.Body()) != 0) {
			t.Fatalf("%s: %d %q", c.path, resp.StatusCode(), resp.Body())
		}
		if n := conns.Load(); n != c.conns {
			t.Fatalf("after %s the pod accepted %d connections, want %d", c.path, n, c.conns)
		}
	}
}

// TestWholeCut: a call cut while it waits for its answer closes its
// connection (the engine's signal to abort) and returns ErrCut.
func TestWholeCut(t *testing.T) {
	closed := make(chan struct{})
	addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		// Wait for the gateway's close.
		_, _ = c.Read(make([]byte, 1))
		close(closed)
	})
	client := &fasthttp.HostClient{Addr: addr, Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
	gone := make(chan struct{})
	time.AfterFunc(50*time.Millisecond, func() { close(gone) })
	if _, err := callPath(client, "/v1/completions", new(AnswerHead), ChanCut(gone)); err != ErrCut {
		t.Fatalf("a call cut as it waited: %v, want ErrCut", err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the pod's connection is still open after the cut")
	}
}

// TestWholeAllocs: a whole call on a kept connection allocates only its
// watch, whose cut registries keep it by identity.
func TestWholeAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	// A pod that allocates nothing: AllocsPerRun counts every goroutine's.
	addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		buf, answer, prompt := make([]byte, 4096), []byte(vllmAnswer), []byte(`{"prompt":"hi"}`)
		for n := 0; ; {
			m, err := c.Read(buf[n:])
			if err != nil {
				return
			}
			if n += m; bytes.HasSuffix(buf[:n], prompt) {
				n = 0
				if _, err := c.Write(answer); err != nil {
					return
				}
			}
		}
	})
	client := &fasthttp.HostClient{Addr: addr, Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
	up := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(up)
	up.Header.SetMethod("POST")
	up.SetRequestURI("http://pod/v1/completions")
	up.SetBodyString(`{"prompt":"hi"}`)
	var resp fasthttp.Response
	resp.KeepBodyBuffer = true
	var head AnswerHead
	for _, c := range []struct {
		cut  Cut
		want float64
	}{{nil, 0}, {nopCut{}, 1}} {
		call := func() {
			deadline := time.Now().Add(5 * time.Second)
			if _, err := DoCut(client, up, &resp, &head, deadline, deadline, nil, c.cut); err != nil {
				t.Fatal(err)
			}
		}
		call()
		if n := testing.AllocsPerRun(200, call); n > c.want {
			t.Errorf("watched %v: %.1f allocations a call, want %v at most", c.cut != nil, n, c.want)
		}
	}
}

// nopCut watches and never cuts.
type nopCut struct{}

func (nopCut) Watch(Cutter)   {}
func (nopCut) Unwatch(Cutter) {}

// TestWholeLargeBody: a body many times the reader's buffer comes back
// whole, and the connection serves the next call.
func TestWholeLargeBody(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 20<<10)
	client, conns := answersPod(t, func(string) (string, bool) {
		return "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body, false
	})
	client.MaxResponseBodySize = 1 << 20
	for i := range 2 {
		var head AnswerHead
		resp, err := callPath(client, "/v1/completions", &head, nil)
		if err != nil || string(resp.Body()) != body || !head.Raw {
			t.Fatalf("call %d: %v, %d bytes of %d, raw %v", i, err, len(resp.Body()), len(body), head.Raw)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("2 calls took %d connections, want 1", n)
	}
}

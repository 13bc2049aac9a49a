package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/testnet"
)

// TestDoCutBody: a watched call sends the request's body as it is, whole
// answers come back whole, and the body is still the request's after a
// call that failed, for a retry on another pod, whether it lives in the
// request's own buffer (as a prefill leg's rewritten body does) or is
// borrowed (SetBodyRaw, as the client's body is).
func TestDoCutBody(t *testing.T) {
	body := strings.Repeat(`{"prompt":"kv"}`, 100)
	// fails reads a request and closes the connection unanswered.
	fails := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
	})
	// echoes answers each request with its body.
	echoes := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			b, _ := io.ReadAll(req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+
				strconv.Itoa(len(b))+"\r\n\r\n"+string(b))
		}
	})
	client := func(addr string) *fasthttp.HostClient {
		return &fasthttp.HostClient{Addr: addr, MaxResponseBodySize: 1 << 20, Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
	}
	// One P: the other request's buffer comes from the pool's shard that
	// up's would have gone back to.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	never := ChanCut(make(chan struct{}))
	for _, borrowed := range []bool{false, true} {
		up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		up.Header.SetMethod("POST")
		up.SetRequestURI("http://pod/v1/completions")
		if borrowed {
			up.SetBodyRaw([]byte(body))
		} else {
			up.SetBody([]byte(body))
		}
		deadline := time.Now().Add(5 * time.Second)
		if _, err := DoCut(client(fails), up, resp, nil, deadline, deadline, nil, never); err == nil {
			t.Fatal("a pod that closed the connection unanswered: no error")
		}
		// Another request on this goroutine takes a body buffer from the
		// pool: it must not be the one up's body lives in.
		other := fasthttp.AcquireRequest()
		other.SetBody(bytes.Repeat([]byte("x"), len(body)))
		if got := string(up.Body()); got != body {
			t.Fatalf("borrowed %v: after a failed call the body is %d bytes %.40q…, want the request's %d", borrowed, len(got), got, len(body))
		}
		resp.Reset()
		if _, err := DoCut(client(echoes), up, resp, nil, deadline, deadline, nil, never); err != nil {
			t.Fatalf("borrowed %v: retry: %v", borrowed, err)
		}
		if !bytes.Equal(resp.Body(), []byte(body)) || string(up.Body()) != body {
			t.Fatalf("borrowed %v: the pod got %d bytes, the request holds %d; want %d", borrowed, len(resp.Body()), len(up.Body()), len(body))
		}
		if up.KeepBodyBuffer {
			t.Fatal("DoCut left KeepBodyBuffer set")
		}
		fasthttp.ReleaseRequest(other)
		fasthttp.ReleaseRequest(up)
		fasthttp.ReleaseResponse(resp)
	}
}

// TestDoCutBodyWrites: a watched call's body of 48 KB reaches the pod in
// at most two writes (the head's buffer filled and flushed, then the
// rest), not fasthttp's 4 KB a write.
func TestDoCutBodyWrites(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 3<<10)
	echoes := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(b))+"\r\n\r\n"+string(b))
	})
	var writes countingConn
	client := &fasthttp.HostClient{Addr: echoes, MaxResponseBodySize: 1 << 20, Dial: func(a string) (net.Conn, error) {
		c, err := net.Dial("tcp", a)
		writes.Conn = c
		return &writes, err
	}}
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(up)
	defer fasthttp.ReleaseResponse(resp)
	up.Header.SetMethod("POST")
	up.SetRequestURI("http://pod/v1/completions")
	up.SetBodyRaw([]byte(body))
	deadline := time.Now().Add(5 * time.Second)
	if _, err := DoCut(client, up, resp, nil, deadline, deadline, nil, ChanCut(make(chan struct{}))); err != nil {
		t.Fatal(err)
	}
	if string(resp.Body()) != body || writes.n > 2 {
		t.Fatalf("the pod got %d bytes of %d in %d writes, want all in at most 2", len(resp.Body()), len(body), writes.n)
	}
}

// countingConn counts its writes.
type countingConn struct {
	net.Conn
	n int
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.n++
	return c.Conn.Write(p)
}

// TestDoCutStreamFirstByte: a streamed answer's first body bytes are due
// by headBy with its head, and read into first; a head alone (engines
// send it before the prefill) fails as no answer would, watched or not.
func TestDoCutStreamFirstByte(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	const event = "data: {}\n\n"
	prefilling := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = io.WriteString(c, head)
		_, _ = io.Copy(io.Discard, c) // until the call gives up
	})
	streams := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = io.WriteString(c, head)
		time.Sleep(50 * time.Millisecond) // the head goes on its own
		_, _ = io.WriteString(c, strconv.FormatInt(int64(len(event)), 16)+"\r\n"+event+"\r\n0\r\n\r\n")
	})
	for _, cut := range []Cut{nil, ChanCut(make(chan struct{}))} {
		call := func(addr string, first []byte) (*fasthttp.Response, int, error) {
			client := &fasthttp.HostClient{Addr: addr, Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
			up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			t.Cleanup(func() { fasthttp.ReleaseRequest(up) })
			up.Header.SetMethod("POST")
			up.SetRequestURI("http://pod/v1/completions")
			up.SetBodyString(`{"stream":true}`)
			resp.StreamBody = true
			now := time.Now()
			n, err := DoCut(client, up, resp, nil, now.Add(200*time.Millisecond), now.Add(time.Minute), first, cut)
			return resp, n, err
		}
		var first [1]byte
		if _, n, err := call(prefilling, first[:]); err != fasthttp.ErrTimeout || n != 0 {
			t.Fatalf("watched %v: a head and no event by headBy: %d bytes, %v; want fasthttp.ErrTimeout", cut != nil, n, err)
		}
		resp, n, err := call(streams, first[:])
		if err != nil || n != 1 {
			t.Fatalf("watched %v: a head, then an event: %d bytes, %v", cut != nil, n, err)
		}
		rest, err := io.ReadAll(resp.BodyStream())
		if got := string(first[:n]) + string(rest); err != nil || got != event {
			t.Fatalf("watched %v: the body read %q, %v; want %q", cut != nil, got, err, event)
		}
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
	}
}

// TestDoCutKeptClosed: a pod that closes a kept connection as the next
// request on it comes (its idle timeout ran out then) never took that
// request, and DoCut sends it again on a new connection, watched or not;
// a new connection the pod closes unanswered fails the call, sent once.
func TestDoCutKeptClosed(t *testing.T) {
	var calls atomic.Int32
	// closesKept answers a connection's first request and closes it at
	// the second; a request to /fail it closes unanswered.
	closesKept := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			calls.Add(1)
			if i > 0 || req.URL.Path == "/fail" {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	client := &fasthttp.HostClient{Addr: closesKept, MaxResponseBodySize: 1 << 20, Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
	for _, cut := range []Cut{nil, ChanCut(make(chan struct{}))} {
		up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		up.Header.SetMethod("POST")
		up.SetRequestURI("http://pod/v1/completions")
		up.SetBodyString(`{"prompt":"hi"}`)
		for i := range 3 {
			deadline := time.Now().Add(5 * time.Second)
			if _, err := DoCut(client, up, resp, nil, deadline, deadline, nil, cut); err != nil || string(resp.Body()) != "ok" {
				t.Fatalf("watched %v, call %d: %v %q", cut != nil, i, err, resp.Body())
			}
		}
		client.CloseIdleConnections()
		calls.Store(0)
		up.SetRequestURI("http://pod/fail")
		deadline := time.Now().Add(5 * time.Second)
		if _, err := DoCut(client, up, resp, nil, deadline, deadline, nil, cut); err == nil || calls.Load() != 1 {
			t.Fatalf("watched %v: a new connection closed unanswered: %v after %d requests; want an error after 1", cut != nil, err, calls.Load())
		}
		fasthttp.ReleaseRequest(up)
		fasthttp.ReleaseResponse(resp)
	}
}

// TestDoCutClosedAfterAnswer: a pod that closes each connection as soon as
// it answered gets a watched call, sent at once after the last answer
// (unlooked-at, peekAfter), on a new connection, once: the write to the
// closed one fails it as Stale, and DoCut sends it again.
func TestDoCutClosedAfterAnswer(t *testing.T) {
	var calls atomic.Int32
	closes := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		calls.Add(1)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	client := &fasthttp.HostClient{Addr: closes, MaxResponseBodySize: 1 << 20, Dial: func(a string) (net.Conn, error) { return Dialer(nil)(a, time.Second, nil) }}
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(up)
	defer fasthttp.ReleaseResponse(resp)
	up.Header.SetMethod("POST")
	up.SetRequestURI("http://pod/v1/completions")
	up.SetBodyString(`{"prompt":"hi"}`)
	for i := range 3 {
		deadline := time.Now().Add(5 * time.Second)
		if _, err := DoCut(client, up, resp, nil, deadline, deadline, nil, ChanCut(make(chan struct{}))); err != nil || string(resp.Body()) != "ok" {
			t.Fatalf("call %d: %v %q", i, err, resp.Body())
		}
		if n := calls.Load(); n != int32(i+1) {
			t.Fatalf("after call %d the pod took %d requests, want %d", i, n, i+1)
		}
		time.Sleep(20 * time.Millisecond) // the pod's FIN arrives
	}
}

// TestDoCutAlreadyCut: a call whose client left before it went is not
// sent, and no connection is dialed for it: fasthttp dials before it
// reads the body, where the cut showed.
func TestDoCutAlreadyCut(t *testing.T) {
	pod := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	var dials atomic.Int32
	client := &fasthttp.HostClient{Addr: pod, Dial: func(a string) (net.Conn, error) {
		dials.Add(1)
		return net.Dial("tcp", a)
	}}
	up, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(up)
	defer fasthttp.ReleaseResponse(resp)
	up.Header.SetMethod("POST")
	up.SetRequestURI("http://pod/v1/completions")
	up.SetBodyRaw([]byte(`{"prompt":"kv"}`))
	deadline := time.Now().Add(5 * time.Second)
	// Whole, and a stream whose first bytes are read with its head.
	for _, first := range [][]byte{nil, make([]byte, 8)} {
		resp.StreamBody = first != nil
		if _, err := DoCut(client, up, resp, nil, deadline, deadline, first, leftCut{}); err != ErrCut {
			t.Fatalf("a call cut before it went (first %d bytes): %v, want ErrCut", len(first), err)
		}
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("a call cut before it went dialed the pod %d times, want none", n)
	}
	if string(up.Body()) != `{"prompt":"kv"}` {
		t.Fatalf("the request's body after the cut: %q", up.Body())
	}
}

// leftCut is the Cut of a client that left already: it cuts a watcher at
// once, as the front ends' do.
type leftCut struct{}

func (leftCut) Watch(c Cutter) { c.Cut() }
func (leftCut) Unwatch(Cutter) {}

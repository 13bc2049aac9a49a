package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
)

// startStub serves a stub on a loopback port and returns its address.
func startStub(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stub{events: 3, interval: time.Millisecond}
	srv := &fasthttp.Server{Handler: s.serve}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return ln.Addr().String()
}

func do(t *testing.T, addr, method, path, body string, headers ...string) *fasthttp.Response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + addr + path)
	req.SetBodyString(body)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp := &fasthttp.Response{}
	if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestStub(t *testing.T) {
	addr := startStub(t)

	t.Run("completion", func(t *testing.T) {
		resp := do(t, addr, "POST", "/v1/chat/completions", `{"model":"bench","stream":false}`)
		var c struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if err := json.Unmarshal(resp.Body(), &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content == "" {
			t.Fatalf("body %q: %v", resp.Body(), err)
		}
		if n := len(resp.Body()); n < 900 || n > 1200 {
			t.Errorf("body is %d bytes, want about 1 KB", n)
		}
	})

	t.Run("stream", func(t *testing.T) {
		f := func(body string, headers []string, wantEvents int) {
			t.Helper()
			resp := do(t, addr, "POST", "/v1/completions", body, headers...)
			var stamps []int64
			sc := bufio.NewScanner(bytes.NewReader(resp.Body()))
			sawDone := false
			for sc.Scan() {
				line, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				if line == "[DONE]" {
					sawDone = true
					continue
				}
				var ev struct {
					SentNS int64 `json:"sent_ns"`
				}
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("event %q: %v", line, err)
				}
				stamps = append(stamps, ev.SentNS)
			}
			if len(stamps) != wantEvents || !sawDone {
				t.Fatalf("%d events (done %v), want %d then [DONE]", len(stamps), sawDone, wantEvents)
			}
			for i := 1; i < len(stamps); i++ {
				if stamps[i] < stamps[i-1] {
					t.Fatalf("stamps go back in time: %v", stamps)
				}
			}
		}
		f(`{"stream":true}`, nil, 3)
		f(`{"stream": true}`, []string{"X-Stub-Events", "5", "X-Stub-Interval", "0s"}, 5)
	})

	t.Run("bad stream headers", func(t *testing.T) {
		for _, h := range [][]string{{"X-Stub-Events", "-1"}, {"X-Stub-Interval", "soon"}} {
			if resp := do(t, addr, "POST", "/v1/completions", `{"stream":true}`, h...); resp.StatusCode() != fasthttp.StatusBadRequest {
				t.Errorf("%v: status %d, want 400", h, resp.StatusCode())
			}
		}
	})

	t.Run("health and metrics", func(t *testing.T) {
		if resp := do(t, addr, "GET", "/health", ""); resp.StatusCode() != fasthttp.StatusOK {
			t.Errorf("/health: status %d", resp.StatusCode())
		}
		resp := do(t, addr, "GET", "/metrics", "")
		if _, ok := engines.ParseMetrics(engines.VLLM, resp.Body()); !ok {
			t.Errorf("pdlb's scraper reads no vLLM load from %q", resp.Body())
		}
	})
}

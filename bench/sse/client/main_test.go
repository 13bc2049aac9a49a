package main

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

func TestStampOf(t *testing.T) {
	f := func(ev string, want int64, wantOK bool) {
		t.Helper()
		got, ok := stampOf([]byte(ev))
		if got != want || ok != wantOK {
			t.Errorf("stampOf(%q) = %d, %v; want %d, %v", ev, got, ok, want, wantOK)
		}
	}
	f(`{"id":"x","sent_ns":1700000000123456789,"choices":[]}`, 1700000000123456789, true)
	f(`{"sent_ns":42}`, 42, true)
	f(`{"id":"x"}`, 0, false)
	f(`{"sent_ns":}`, 0, false)
}

// sseServer streams events stamped like the stub's, the first n requests
// whole and every later one cut after one event.
func sseServer(t *testing.T, n int) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{}, n)
	for range n {
		served <- struct{}{}
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		events, _ := strconv.Atoi(r.Header.Get("X-Stub-Events"))
		whole := false
		select {
		case <-served:
			whole = true
		default:
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "data: {\"sent_ns\":%d}\n\n", time.Now().UnixNano())
			w.(http.Flusher).Flush()
			if !whole && i == 0 {
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &url.URL{Scheme: "http", Host: ln.Addr().String(), Path: "/v1/chat/completions"}
}

func TestRun(t *testing.T) {
	c := config{target: sseServer(t, 3), streams: 4, events: 5, interval: time.Millisecond, dialRate: 1000, timeout: 10 * time.Second}
	r := run(c)
	// Three whole streams of five events, one cut after its first event.
	if r.Streams != 4 || r.Failed != 1 || r.Events != 16 || r.FirstErr == "" {
		t.Fatalf("result %+v; want 4 streams, 1 failed, 16 events", r)
	}
	if r.P50 <= 0 || r.P50 > r.P99 || r.P99 > r.Max {
		t.Errorf("percentiles out of order: %+v", r)
	}
}

// Command client holds many concurrent SSE streams open against the proxy
// benchmark's stub (bench/proxy/stub), directly or through a proxy, and
// measures how late each event arrives: receive time minus the "sent_ns"
// stamp the stub wrote just before sending it. Both run on one machine, so
// their wall clocks are the same clock.
//
// It prints two lines on stdout:
//
//	open OK FAILED          once every stream has had its first event or failed
//	result {json}           at the end: streams, failures, events, latency percentiles (µs)
//
// The first line lets a script sample the proxy's memory while all the
// streams are held. Each stream is one connection with one request, read
// through small buffers, so the client stays cheap beside the proxy it
// measures.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

type config struct {
	target   *url.URL
	streams  int
	events   int
	interval time.Duration
	dialRate int
	timeout  time.Duration
}

// result is the end-of-run summary; latencies are microseconds.
type result struct {
	Streams  int     `json:"streams"`
	Failed   int     `json:"failed"`
	FirstErr string  `json:"first_error,omitempty"`
	Events   int     `json:"events"`
	P50      float64 `json:"p50_us"`
	P90      float64 `json:"p90_us"`
	P99      float64 `json:"p99_us"`
	P999     float64 `json:"p999_us"`
	Max      float64 `json:"max_us"`
}

var stampKey = []byte(`"sent_ns":`)

func main() {
	var c config
	var target string
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	fs.StringVar(&target, "url", "http://127.0.0.1:8001/v1/chat/completions", "chat completions URL of the stub or of a proxy in front of it")
	fs.IntVar(&c.streams, "streams", 100, "concurrent streams")
	fs.IntVar(&c.events, "events", 100, "events per stream (the stub's X-Stub-Events)")
	fs.DurationVar(&c.interval, "interval", 10*time.Millisecond, "gap between a stream's events (the stub's X-Stub-Interval)")
	fs.IntVar(&c.dialRate, "dial-rate", 2000, "streams opened per second, so the listen backlog never overflows")
	fs.DurationVar(&c.timeout, "timeout", 0, "deadline of a whole stream (default: events × interval + 60s)")
	_ = fs.Parse(os.Args[1:])
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		fmt.Fprintf(os.Stderr, "client: --url %q is not an http URL\n", target)
		os.Exit(2)
	}
	c.target = u
	if c.timeout == 0 {
		c.timeout = time.Duration(c.events)*c.interval + time.Minute
	}
	r := run(c)
	b, _ := json.Marshal(r)
	fmt.Printf("result %s\n", b)
}

// run opens the streams at the dial rate, reads them all to the end and
// summarises their latencies.
func run(c config) result {
	req := request(c)
	var (
		mu        sync.Mutex
		latencies []int64
		failed    int
		firstErr  error
		wg        sync.WaitGroup
		settled   atomic.Int64 // streams that had their first event or failed
		ok        atomic.Int64
	)
	openOnce := func() {
		if settled.Add(1) == int64(c.streams) {
			fmt.Printf("open %d %d\n", ok.Load(), int64(c.streams)-ok.Load())
		}
	}
	tick := time.NewTicker(time.Second / time.Duration(max(c.dialRate, 1)))
	defer tick.Stop()
	for i := 0; i < c.streams; i++ {
		if i > 0 {
			<-tick.C
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			lat, err := stream(c, req, func() {
				ok.Add(1)
				first = false
				openOnce()
			})
			if first {
				openOnce()
			}
			mu.Lock()
			latencies = append(latencies, lat...)
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	r := result{Streams: c.streams, Failed: failed, Events: len(latencies)}
	if firstErr != nil {
		r.FirstErr = firstErr.Error()
	}
	if len(latencies) > 0 {
		slices.Sort(latencies)
		at := func(q float64) float64 {
			return float64(latencies[min(int(q*float64(len(latencies))), len(latencies)-1)]) / 1e3
		}
		r.P50, r.P90, r.P99, r.P999 = at(0.50), at(0.90), at(0.99), at(0.999)
		r.Max = float64(latencies[len(latencies)-1]) / 1e3
	}
	return r
}

// request renders the one HTTP/1.1 request every stream sends.
func request(c config) []byte {
	body := `{"model":"bench","stream":true,"max_tokens":` + strconv.Itoa(c.events) +
		`,"messages":[{"role":"user","content":"hold this stream open"}]}`
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n", c.target.RequestURI(), c.target.Host)
	fmt.Fprintf(&b, "X-Stub-Events: %d\r\nX-Stub-Interval: %s\r\nContent-Length: %d\r\n\r\n%s", c.events, c.interval, len(body), body)
	return b.Bytes()
}

// stream sends req on a new connection and reads the SSE answer to
// [DONE], returning the latency of each stamped event in nanoseconds.
// first runs when the first event arrives.
func stream(c config, req []byte, first func()) ([]int64, error) {
	conn, err := net.DialTimeout("tcp", c.target.Host, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(c.timeout))
	if _, err := conn.Write(req); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 4096), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	lat := make([]int64, 0, c.events)
	lines := bufio.NewReaderSize(resp.Body, 4096)
	for {
		line, err := lines.ReadSlice('\n')
		now := time.Now().UnixNano()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return lat, fmt.Errorf("after %d events: %w", len(lat), err)
		}
		payload, isData := bytes.CutPrefix(line, []byte("data: "))
		if !isData {
			continue
		}
		if bytes.HasPrefix(payload, []byte("[DONE]")) {
			return lat, nil
		}
		sent, ok := stampOf(payload)
		if !ok {
			return lat, fmt.Errorf("event without a sent_ns stamp: %q", line)
		}
		if len(lat) == 0 {
			first()
		}
		lat = append(lat, now-sent)
	}
}

// stampOf reads the integer after "sent_ns": in an event.
func stampOf(ev []byte) (int64, bool) {
	i := bytes.Index(ev, stampKey)
	if i < 0 {
		return 0, false
	}
	ev = ev[i+len(stampKey):]
	end := 0
	for end < len(ev) && ev[end] >= '0' && ev[end] <= '9' {
		end++
	}
	v, err := strconv.ParseInt(string(ev[:end]), 10, 64)
	return v, err == nil
}

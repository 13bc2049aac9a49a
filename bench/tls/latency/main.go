// Command latency sends the proxy benchmark's chat completion over a few
// HTTPS keep-alive connections at a fixed pace and measures each
// request's time to its whole answer: bench/tls/run.sh runs it alone and
// then while full handshakes hammer the same server, to show what those
// handshakes cost the connections already open.
//
// It prints one line on stdout at the end:
//
//	result {"requests":N,"errors":E,"p50_us":...,"p99_us":...,"max_us":...}
package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

func main() {
	url := flag.String("url", "", "the HTTPS URL to POST to")
	body := flag.String("body", "", "file with the request body (JSON)")
	conns := flag.Int("conns", 8, "keep-alive connections, each with one request at a time")
	every := flag.Duration("every", 5*time.Millisecond, "how often each connection sends (a request late past it waits for the next tick)")
	duration := flag.Duration("duration", 4*time.Second, "how long to send")
	flag.Parse()
	b, err := os.ReadFile(*body)
	if err != nil || *url == "" {
		fmt.Fprintln(os.Stderr, "latency: --url and a readable --body are needed:", err)
		os.Exit(2)
	}
	// HTTP/1.1 only (no h2 by ALPN); the benchmark's certificate is
	// self-signed.
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		MaxIdleConnsPerHost: *conns,
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var (
		mu     sync.Mutex
		took   []time.Duration
		errors int
		wg     sync.WaitGroup
	)
	end := time.Now().Add(*duration)
	for range *conns {
		wg.Go(func() {
			tick := time.NewTicker(*every)
			defer tick.Stop()
			for now := range tick.C {
				if now.After(end) {
					return
				}
				d, err := post(client, *url, b)
				mu.Lock()
				if err != nil {
					errors++
				} else {
					took = append(took, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r := struct {
		Requests int   `json:"requests"`
		Errors   int   `json:"errors"`
		P50      int64 `json:"p50_us"`
		P99      int64 `json:"p99_us"`
		Max      int64 `json:"max_us"`
	}{Requests: len(took), Errors: errors}
	if len(took) > 0 {
		slices.Sort(took)
		at := func(q float64) int64 { return took[min(int(q*float64(len(took))), len(took)-1)].Microseconds() }
		r.P50, r.P99, r.Max = at(0.50), at(0.99), took[len(took)-1].Microseconds()
	}
	out, _ := json.Marshal(r)
	fmt.Printf("result %s\n", out)
}

// post sends one request and reads its whole answer, which must be a 200.
func post(client *http.Client, url string, body []byte) (time.Duration, error) {
	start := time.Now()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return time.Since(start), nil
}

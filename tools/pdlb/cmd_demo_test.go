package main

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"pdlb/internal/testlog"
)

// demoCompletion is one of the completion lines pdlb demo prints: its
// URL, a header it sets (or none) and its body.
var demoCompletion = regexp.MustCompile(`curl (?:-i |-N )?(\S+/(?:v1/(?:chat/)?completions|tokenize|v1/responses))(?: -H '([^:]+): ([^']+)')? -d '([^']+)'`)

// TestDemoCurlLines: every completion the demo prints answers 200, as a
// user pasting it would see. The adapter lines answered 404 and 503: the
// model's prefill/decode pods, which the routing may pick for an
// adapter's request, did not serve the adapters.
func TestDemoCurlLines(t *testing.T) {
	var out testlog.Buffer
	done := make(chan error, 1)
	go func() {
		done <- cmdDemo([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--speedup", "50"}, &out)
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "Ctrl-C"); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("demo: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo not started after 30 s:\n%s", out.String())
		}
	}
	defer func() {
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	lines := demoCompletion.FindAllStringSubmatch(out.String(), -1)
	if len(lines) < 7 {
		t.Fatalf("%d completion lines in the demo's output:\n%s", len(lines), out.String())
	}
	client := &http.Client{Timeout: 20 * time.Second}
	for _, l := range lines {
		// Twice: an adapter loads on a pod at its first request.
		for range 2 {
			req, err := http.NewRequest("POST", "http://"+l[1], strings.NewReader(l[4]))
			if err != nil {
				t.Fatal(err)
			}
			if l[2] != "" {
				req.Header.Set(l[2], l[3])
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", l[0], err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d %s", l[0], resp.StatusCode, b)
			}
		}
	}
}

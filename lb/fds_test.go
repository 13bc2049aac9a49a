package lb_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"pdlb/lb"
	"pdlb/lb/config"
)

// fdsLimit is the open-files limit of TestOpenFilesLimit's gateway: a
// reserve of 16, so client connections stop at descriptor 112 and
// upstream dials at 120.
const fdsLimit = 128

// TestOpenFilesLimit runs a gateway in a process of its own whose
// open-files limit is fdsLimit, floods it with client connections, then
// sends a request on every connection it kept while the pod holds the
// answers, so that each needs an upstream connection of its own. On gnet,
// one accept at the limit (EMFILE) used to stop the whole engine: every
// connection dropped, the port closed, the process running on. Now the
// connections over the reserve are reset at once, the requests that find
// no descriptor for their pod get a 503 that says so, the rest their
// answer, the pod is not blamed, and the gateway serves on.
func TestOpenFilesLimit(t *testing.T) {
	if fe := os.Getenv("PDLB_FDS_FRONTEND"); fe != "" {
		fdsChild(t, fe, os.Getenv("PDLB_FDS_POD"))
		return
	}
	const answer = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			pod := fakePod(t, func(c net.Conn, _ *http.Request) {
				<-release
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
			})
			t.Cleanup(open)
			addr, admin := startFDsChild(t, fe, pod)
			// The flood: twice as many connections as the limit allows.
			// A connection over the reserve may be reset before its dial
			// returns (on a busy machine most are): a reset all the same.
			var conns []net.Conn
			dialResets := 0
			for i := 0; i < 2*fdsLimit; i++ {
				c, err := net.Dial("tcp", addr)
				switch {
				case err == nil:
					conns = append(conns, c)
				case errors.Is(err, syscall.ECONNRESET):
					dialResets++
				default:
					t.Fatal(err)
				}
			}
			request := "POST /v1/chat/completions HTTP/1.1\r\nHost: pdlb\r\nContent-Type: application/json\r\nContent-Length: " +
				fmt.Sprint(len(chatBody)) + "\r\n\r\n" + chatBody
			outcomes := make(chan string, len(conns))
			for _, c := range conns {
				go func() {
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(20 * time.Second))
					if _, err := io.WriteString(c, request); err != nil {
						outcomes <- "reset"
						return
					}
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
							outcomes <- "reset"
						} else {
							outcomes <- err.Error()
						}
						return
					}
					b, _ := io.ReadAll(resp.Body)
					switch {
					case resp.StatusCode == 200:
						outcomes <- "200"
					case resp.StatusCode == 503 && bytes.Contains(b, []byte("open-files limit (128)")):
						outcomes <- "503 open-files"
					default:
						outcomes <- fmt.Sprintf("%d %s", resp.StatusCode, b)
					}
				}()
			}
			// The answers wait until the requests that could be sent are
			// at the pod and the others were refused.
			count := map[string]int{}
			deadline := time.After(20 * time.Second)
			for n := 0; n < len(conns); n++ {
				select {
				case o := <-outcomes:
					count[o]++
				case <-time.After(500 * time.Millisecond):
					open()
					n--
				case <-deadline:
					t.Fatalf("outcomes so far: %v of %d connections", count, len(conns))
				}
			}
			t.Logf("%d connections, %d more reset as they were dialed: %v", len(conns), dialResets, count)
			count["reset"] += dialResets
			if count["reset"] == 0 || count["503 open-files"] == 0 || count["200"] == 0 || count["reset"]+count["503 open-files"]+count["200"] != len(conns)+dialResets {
				t.Fatalf("outcomes %v; want resets, 503s naming the limit and answers, nothing else", count)
			}
			// The gateway serves on, and the pod was not blamed.
			resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				t.Fatalf("after the flood: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("after the flood: %d", resp.StatusCode)
			}
			for _, series := range []string{`pdlb_fd_limit_refused_total{at="accept"}`, `pdlb_fd_limit_refused_total{at="dial"}`} {
				if v := adminMetric(t, admin, series); v == 0 {
					t.Errorf("%s 0, want above 0", series)
				}
			}
			if v := adminMetric(t, admin, `pdlb_upstream_errors_total{pod="pod"}`); v != 0 {
				t.Errorf("the pod was charged with %v failures", v)
			}
			if !strings.Contains(get(t, "http://"+admin+"/metrics"), "\npdlb_client_conns_open ") {
				t.Errorf("pdlb_client_conns_open absent")
			}
		})
	}
}

// startFDsChild starts the test binary as TestOpenFilesLimit's gateway on
// front end fe and returns its API and admin addresses; the gateway stops
// when the test ends, and must exit cleanly.
func startFDsChild(t *testing.T, fe, pod string) (addr, admin string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenFilesLimit$")
	cmd.Env = append(os.Environ(), "PDLB_FDS_FRONTEND="+fe, "PDLB_FDS_POD="+pod)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("gateway process: %v\n%s", err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("gateway process did not stop\n%s", stderr.String())
		}
	})
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		cmd.Process.Kill()
		t.Fatalf("gateway process said nothing\n%s", stderr.String())
	}
	go func() {
		for lines.Scan() {
		}
		exited <- cmd.Wait()
	}()
	if _, err := fmt.Sscan(lines.Text(), &addr, &admin); err != nil {
		t.Fatalf("gateway process: %q: %v", lines.Text(), err)
	}
	return addr, admin
}

// fdsChild is the gateway process: at fdsLimit open files, on front end
// fe, over pod; it prints its addresses and serves until stdin closes.
func fdsChild(t *testing.T, fe, pod string) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	rl.Cur = fdsLimit
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Listen, cfg.Admin, cfg.Frontend = "127.0.0.1:0", "127.0.0.1:0", fe
	cfg.Pods = []config.Pod{{Name: "pod", Model: "m", Address: pod}}
	cfg.Health.Interval = time.Hour
	s, err := lb.Start(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(s.Addr(), s.AdminAddr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// Package hardening sends malformed, hostile and slow HTTP to a live
// gateway over raw TCP and checks that each gets a clean 4xx in OpenAI's
// error shape (or a closed connection where HTTP requires one) and that
// nothing reaches a pod. Every case runs on both front ends.
package hardening

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/lb"
	"pdlb/lb/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, lbtest.LeakOptions()...) }

// Limits the gateway under test runs with: small enough that the tests
// cross them cheaply.
const (
	maxBody        = 64 << 10
	maxHeader      = 4 << 10
	readTimeout    = 300 * time.Millisecond
	answerDeadline = 10 * time.Second
	// quiet is how long a connection must stay silent after a response
	// for the test to conclude no second response (a smuggled request's)
	// follows.
	quiet = 500 * time.Millisecond
)

// upstream is a sim pod behind a counting reverse proxy, so every request
// the gateway sends to the API is seen whatever the pod answers.
type upstream struct {
	pod      *sim.Pod
	addr     string
	requests atomic.Int64
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	pod, err := sim.Start(sim.Config{Name: "m-0", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	u := &upstream{pod: pod}
	u.addr = lbtest.Proxy(t, pod.Addr(), func(_ http.ResponseWriter, r *http.Request) bool {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			u.requests.Add(1)
		}
		return false
	})
	return u
}

func startGateway(t *testing.T, frontend string, up *upstream) *lb.Server {
	t.Helper()
	return lbtest.StartGateway(t, []config.Pod{{Name: "m-0", Model: "m", Address: up.addr}}, func(cfg *config.Config) {
		cfg.Admin, cfg.Frontend = "", frontend
		cfg.MaxBodyBytes, cfg.MaxHeaderBytes, cfg.ClientReadTimeout = maxBody, maxHeader, readTimeout
		cfg.Health.MetricsInterval = 0
	})
}

// answer is what came back on a connection: the responses read in order,
// then whether the server closed it.
type answer struct {
	responses []*http.Response
	bodies    []string
	closed    bool
	err       error
}

// exchange runs send (a function, so it can drip bytes) on a fresh
// connection while reading responses, until the server closes the
// connection, or has been silent for quiet after a response (it keeps the
// connection open and sent nothing more), or answerDeadline passes.
func exchange(t *testing.T, addr string, send sender) answer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(answerDeadline))
	writeErr := make(chan error, 1)
	go func() { writeErr <- send(c) }()
	var a answer
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err):
				a.closed = true
			case len(a.responses) > 0 && errors.As(err, &ne) && ne.Timeout():
				// Quiet after an answer: the connection stays open.
			default:
				a.err = err
			}
			break
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.responses = append(a.responses, resp)
		a.bodies = append(a.bodies, string(body))
		if err != nil {
			a.err = err
			break
		}
		_ = c.SetReadDeadline(time.Now().Add(quiet))
	}
	_ = c.Close()
	<-writeErr
	return a
}

// isReset reports a connection the server reset: an error that is not a
// timeout.
func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// sender writes a request on a connection.
type sender func(c net.Conn) error

// raw sends b in one write.
func raw(b string) sender {
	return func(c net.Conn) error { _, err := io.WriteString(c, b); return err }
}

// drip sends head at once, then rest a byte at a time every gap.
func drip(head, rest string, gap time.Duration) sender {
	return func(c net.Conn) error {
		if _, err := io.WriteString(c, head); err != nil {
			return err
		}
		for i := 0; i < len(rest); i++ {
			time.Sleep(gap)
			if _, err := c.Write([]byte{rest[i]}); err != nil {
				return err
			}
		}
		return nil
	}
}

func post(path, headers, body string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + headers +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

// openAIError reports whether body is {"error":{"message":...,"type":...}}.
func openAIError(body string) bool {
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal([]byte(body), &e) == nil && e.Error != nil && e.Error.Message != "" && e.Error.Type != ""
}

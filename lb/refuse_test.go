package lb_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"pdlb/lb/config"
)

// TestConnCapAnswers: a connection over its address's cap
// (limits.max_conns_per_ip) gets a 429 in OpenAI's error shape that a
// client which sent its request first reads whole, then EOF: not a reset,
// on both front ends. The connection within the cap keeps working.
func TestConnCapAnswers(t *testing.T) {
	pods := podsOf("m", testFleet(t, "m", 1, 100)...)
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, pods, func(c *config.Config) {
				c.Frontend = fe
				c.Access.Conns.MaxConnsPerIP = 1
			})
			held, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			ask := func(c net.Conn) (*http.Response, string, error) {
				t.Helper()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
				if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: pdlb\r\nContent-Type: application/json\r\nContent-Length: "+
					strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
					return nil, "", err
				}
				r := bufio.NewReader(c)
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					return nil, "", err
				}
				b, err := io.ReadAll(io.LimitReader(resp.Body, int64(max(resp.ContentLength, 0))))
				resp.Body.Close()
				return resp, string(b), err
			}
			if resp, b, err := ask(held); err != nil || resp.StatusCode != 200 {
				t.Fatalf("the connection within the cap: %v %v %s", resp, err, b)
			}

			over, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer over.Close()
			resp, b, err := ask(over)
			if err != nil || resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, `"error":{`) || !strings.Contains(b, "max_conns_per_ip") ||
				resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("the connection over the cap: %v %v %s", resp, err, b)
			}
			if n, err := over.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Fatalf("after the 429: read %d bytes, %v; want EOF", n, err)
			}
			if resp, b, err := ask(held); err != nil || resp.StatusCode != 200 {
				t.Fatalf("the connection within the cap, again: %v %v %s", resp, err, b)
			}
			if n := metricValue(t, s, "pdlb_client_conns_refused_total"); n != 1 {
				t.Fatalf("%v connections refused, want 1", n)
			}
		})
	}
}

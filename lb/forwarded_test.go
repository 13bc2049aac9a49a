package lb_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"pdlb/lb/config"
)

// TestForwardedFor: pods get the client's address appended to the
// X-Forwarded-For chain (its several fields joined as one), or, with
// upstream.x_forwarded_for off, the client's header as it was.
func TestForwardedFor(t *testing.T) {
	// The pod answers with the X-Forwarded-For fields it got.
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		got := strings.Join(r.Header.Values("X-Forwarded-For"), "|")
		io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(got), got))
	})
	for _, frontend := range []string{"fasthttp", "gnet"} {
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/%v", frontend, on), func(t *testing.T) {
				s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) {
					c.Frontend = frontend
					c.Upstream.XForwardedFor = on
				})
				for _, tc := range []struct {
					sent     []string
					want, is string
				}{
					{nil, "127.0.0.1", ""},
					{[]string{"203.0.113.7"}, "203.0.113.7, 127.0.0.1", "203.0.113.7"},
					{[]string{"203.0.113.7", "10.0.0.1, 10.0.0.2"}, "203.0.113.7, 10.0.0.1, 10.0.0.2, 127.0.0.1", "203.0.113.7|10.0.0.1, 10.0.0.2"},
				} {
					req, err := newPost(s, chatBody)
					if err != nil {
						t.Fatal(err)
					}
					for _, v := range tc.sent {
						req.Header.Add("X-Forwarded-For", v)
					}
					resp, err := client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					want := tc.want
					if !on {
						want = tc.is
					}
					if resp.StatusCode != 200 || string(b) != want {
						t.Fatalf("sent %q: the pod got %q (%d), want %q", tc.sent, b, resp.StatusCode, want)
					}
				}
			})
		}
	}
}

// TestRequestIDToPods: the pods and the client see one X-Request-Id: the
// client's, or one the gateway made when the client sent none or an empty
// one.
func TestRequestIDToPods(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		got := strings.Join(r.Header.Values("X-Request-Id"), "|")
		io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nConnection: close\r\nX-Request-Id: pod-own\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(got), got))
	})
	made := regexp.MustCompile(`^[0-9a-f]+-[0-9a-f]+$`)
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = frontend })
			for _, sent := range [][]string{nil, {"abc-123"}, {""}} {
				req, err := newPost(s, chatBody)
				if err != nil {
					t.Fatal(err)
				}
				if sent != nil {
					req.Header["X-Request-Id"] = sent
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				ids := resp.Header.Values("X-Request-Id")
				ok := resp.StatusCode == 200 && len(ids) == 1 && string(b) == ids[0]
				if len(sent) == 1 && sent[0] != "" {
					ok = ok && ids[0] == sent[0]
				} else {
					ok = ok && made.MatchString(ids[0])
				}
				if !ok {
					t.Fatalf("sent %q: the pod got %q, the client %q (%d)", sent, b, ids, resp.StatusCode)
				}
			}
			// The answer carries the client's id as it came (on gnet, as
			// a line of its header block): one with a bare CR, which
			// would end that line early, is refused before it gets there.
			c, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\rInjected: 1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Injected") != "" {
				t.Fatalf("an id with a bare CR: %v %v", resp, err)
			}
		})
	}
}

// TestConnectionNominated: headers a Connection header names are
// hop-by-hop too (RFC 9110 section 7.6.1): the pod never gets those the
// client's names, the X-Forwarded-For chain included, and the client never
// gets those the pod's names; the rest pass, on both front ends.
func TestConnectionNominated(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		got := fmt.Sprintf("hop=%q keep=%q xff=%q", r.Header.Get("X-Hop"), r.Header.Get("X-Keep"), r.Header.Get("X-Forwarded-For"))
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close, x-pod-hop\r\nX-Pod-Hop: 1\r\nX-Pod-Keep: 2\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(got), got)
	})
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = frontend })
			req, err := newPost(s, chatBody)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Connection", "keep-alive, x-hop,x-forwarded-for")
			req.Header.Set("X-Hop", "1")
			req.Header.Set("X-Keep", "2")
			req.Header.Set("X-Forwarded-For", "203.0.113.7")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := `hop="" keep="2" xff="127.0.0.1"`; resp.StatusCode != 200 || string(b) != want {
				t.Fatalf("the pod got %q (%d), want %q", b, resp.StatusCode, want)
			}
			if hop, keep := resp.Header.Get("X-Pod-Hop"), resp.Header.Get("X-Pod-Keep"); hop != "" || keep != "2" {
				t.Fatalf("the client got X-Pod-Hop %q, X-Pod-Keep %q; want none and 2", hop, keep)
			}
		})
	}
}

// TestContentTypeAsSent: a pod gets the client's Content-Type, and none
// when the client sent none (as a client talking to vLLM directly
// would): FastAPI reads a body without one as JSON, and refuses a form's
// or octet-stream's with 422.
func TestContentTypeAsSent(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, r *http.Request) {
		got := fmt.Sprintf("%q", r.Header.Values("Content-Type"))
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(got), got)
	})
	for _, frontend := range []string{"fasthttp", "gnet"} {
		t.Run(frontend, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) { c.Frontend = frontend })
			f := func(sent, want string) {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(chatBody))
				if err != nil {
					t.Fatal(err)
				}
				if sent != "" {
					req.Header.Set("Content-Type", sent)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != want {
					t.Fatalf("sent Content-Type %q: the pod got %s (%d), want %s", sent, b, resp.StatusCode, want)
				}
			}
			f("", `[]`)
			f("application/json", `["application/json"]`)
			f("application/json; charset=utf-8", `["application/json; charset=utf-8"]`)
		})
	}
}

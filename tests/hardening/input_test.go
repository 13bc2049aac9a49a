package hardening

import (
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hardeningCase is one hostile request and what the gateway must do with
// it. It passes when no request reached the pod and either the first
// response has a status in want with an OpenAI error body, and is the
// only one (a second would be a smuggled request served), or there is no
// response, the connection was closed, and closeOK allows that. mustClose
// also requires the connection closed after the response: RFC 9112
// section 6.3 has the server close after a framing error, since it cannot
// know where the next request starts.
type hardeningCase struct {
	name      string
	send      sender
	want      []int
	closeOK   bool
	mustClose bool
}

func hardeningCases() []hardeningCase {
	smuggled := post("/v1/chat/completions", "", chat)
	chunkedThenRequest := "0\r\n\r\n" + smuggled
	bigHeader := "X-Big: " + strings.Repeat("a", 2*maxHeader) + "\r\n"
	var manyHeaders strings.Builder
	for i := range 300 {
		manyHeaders.WriteString("X-H" + strconv.Itoa(i) + ": v\r\n")
	}
	return []hardeningCase{
		// Request smuggling: message framing that two parsers could read
		// two ways.
		{name: "content-length and transfer-encoding", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: " + strconv.Itoa(len(chunkedThenRequest)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedThenRequest),
			want: []int{400}, mustClose: true},
		{name: "transfer-encoding and content-length", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: " + strconv.Itoa(len(chunkedThenRequest)) + "\r\n\r\n" + chunkedThenRequest),
			want: []int{400}, mustClose: true},
		{name: "two content-lengths", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nContent-Length: " + strconv.Itoa(len(chat)) + "\r\n\r\n" + chat),
			want: []int{400}, mustClose: true},
		{name: "content-length list", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5, " + strconv.Itoa(len(chat)) + "\r\n\r\n" + chat),
			want: []int{400}, mustClose: true},
		{name: "negative content-length", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: -1\r\n\r\n" + chat),
			want: []int{400}, mustClose: true},
		{name: "signed content-length", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: +" + strconv.Itoa(len(chat)) + "\r\n\r\n" + chat),
			want: []int{400}, mustClose: true},
		{name: "unknown transfer-encoding", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: xchunked\r\nContent-Length: " + strconv.Itoa(len(chat)) + "\r\n\r\n" + chat),
			want: []int{400, 501}, mustClose: true},
		{name: "transfer-encoding gzip, chunked", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + strconv.FormatInt(int64(len(chat)), 16) + "\r\n" + chat + "\r\n0\r\n\r\n"),
			want: []int{400, 501}, mustClose: true},
		{name: "space before colon", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding : chunked\r\nContent-Length: " + strconv.Itoa(len(chunkedThenRequest)) + "\r\n\r\n" + chunkedThenRequest),
			want: []int{400}, mustClose: true},
		{name: "bad chunk size", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + chat + "\r\n0\r\n\r\n"),
			want: []int{400}, mustClose: true},
		{name: "NUL in a header", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-A: b\x00c\r\nContent-Length: " + strconv.Itoa(len(chat)) + "\r\n\r\n" + chat),
			want: []int{400}, mustClose: true},

		// Header limits.
		{name: "oversized header", send: raw(post("/v1/chat/completions", bigHeader, chat)), want: []int{431}},
		{name: "too many headers", send: raw(post("/v1/chat/completions", manyHeaders.String(), chat)), want: []int{431}},

		// Bodies.
		{name: "invalid UTF-8 in JSON", send: raw(post("/v1/chat/completions", "", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}")), want: []int{400}},
		{name: "truncated JSON", send: raw(post("/v1/chat/completions", "", chat[:len(chat)/2])), want: []int{400}},
		{name: "empty body", send: raw(post("/v1/chat/completions", "", "")), want: []int{400}},
		{name: "not an object", send: raw(post("/v1/chat/completions", "", "[]")), want: []int{400}},
		{name: "empty messages", send: raw(post("/v1/chat/completions", "", `{"model":"m","messages":[]}`)), want: []int{400}},
		{name: "messages not an array", send: raw(post("/v1/chat/completions", "", `{"model":"m","messages":"hi"}`)), want: []int{400}},
		{name: "model not a string", send: raw(post("/v1/chat/completions", "", `{"model":5,"messages":[{"role":"user","content":"hi"}]}`)), want: []int{400}},
		{name: "unknown model", send: raw(post("/v1/chat/completions", "", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`)), want: []int{404}},
		{name: "body over max_body_bytes", send: raw(post("/v1/chat/completions", "", `{"model":"m","prompt":"`+strings.Repeat("x", maxBody)+`"}`)), want: []int{413}},
		{name: "huge content-length, no body", send: raw("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000000000000\r\n\r\n"), want: []int{413}, closeOK: true},

		// Request lines.
		{name: "garbage request line", send: raw("GARBAGE\r\n\r\n"), want: []int{400}, closeOK: true},
		{name: "wrong method", send: raw("DELETE /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\r\n"), want: []int{405}},
		// A whole preface is h2c (TestH2CPreface); one that breaks off
		// midway is an HTTP/1.1 request line nobody serves.
		{name: "broken HTTP/2 preface", send: raw("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"), want: []int{400, 404, 405, 505}, closeOK: true},

		// Slow clients: one byte every 50 ms, far slower than the 300 ms
		// read timeout allows for the whole request. They are told why
		// they were cut (408), not closed unanswered.
		{name: "slow headers", send: drip("POST /v1/chat/completions HTTP/1.1\r\n", "Host: gw\r\nX-Slow: "+strings.Repeat("a", 100)+"\r\n\r\n", 50*time.Millisecond),
			want: []int{408}},
		// A connection that never sends a byte (a preconnect, a TCP
		// health check) is closed after the read timeout with no answer.
		{name: "silent connection", send: raw(""), closeOK: true},
		{name: "slow body", send: drip("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: "+strconv.Itoa(len(chat))+"\r\n\r\n", chat, 50*time.Millisecond),
			want: []int{408}},
	}
}

func TestBadInput(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			up := startUpstream(t)
			s := startGateway(t, fe, up)
			// The control: a good request is served and counted.
			if a := exchange(t, s.Addr(), raw(post("/v1/chat/completions", "Connection: close\r\n", chat))); len(a.responses) != 1 || a.responses[0].StatusCode != 200 || up.requests.Load() != 1 {
				t.Fatalf("a good request: %+v, upstream %d", a, up.requests.Load())
			}
			for _, c := range hardeningCases() {
				t.Run(c.name, func(t *testing.T) {
					before := up.requests.Load()
					a := exchange(t, s.Addr(), c.send)
					if problem := c.check(a, up.requests.Load()-before); problem != "" {
						t.Error(problem)
					}
				})
			}
		})
	}
}

func (c hardeningCase) check(a answer, upstream int64) string {
	var problems []string
	if upstream != 0 {
		problems = append(problems, strconv.FormatInt(upstream, 10)+" request(s) reached the pod")
	}
	switch {
	case a.err != nil:
		problems = append(problems, "reading the answer: "+a.err.Error())
	case len(a.responses) == 0:
		if !a.closed || !c.closeOK {
			problems = append(problems, "no response (closed: "+strconv.FormatBool(a.closed)+")")
		}
	default:
		r, body := a.responses[0], a.bodies[0]
		if !slices.Contains(c.want, r.StatusCode) {
			problems = append(problems, "status "+strconv.Itoa(r.StatusCode)+", want "+strings.Join(statusStrings(c.want), " or "))
		}
		if r.StatusCode != http.StatusOK && !openAIError(body) {
			problems = append(problems, "body is not an OpenAI error: "+strconv.Quote(cut(body)))
		}
		if len(a.responses) > 1 {
			problems = append(problems, strconv.Itoa(len(a.responses))+" responses on one request: statuses "+strings.Join(statusStrings(statuses(a.responses)), ","))
		}
		if c.mustClose && !a.closed {
			problems = append(problems, "connection kept open after a framing error")
		}
	}
	return strings.Join(problems, "; ")
}

func statuses(rs []*http.Response) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.StatusCode
	}
	return out
}

func statusStrings(codes []int) []string {
	out := make([]string, len(codes))
	for i, c := range codes {
		out[i] = strconv.Itoa(c)
	}
	return out
}

func cut(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// TestH2CPreface: HTTP/2's preface on the plain port is h2c with prior
// knowledge, answered with the server's SETTINGS frame on both front ends,
// and reaches no pod.
func TestH2CPreface(t *testing.T) {
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			up := startUpstream(t)
			s := startGateway(t, fe, up)
			c, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(answerDeadline))
			if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			// A frame header: 3 bytes of length, its type, flags, stream id.
			head := make([]byte, 9)
			if _, err := io.ReadFull(c, head); err != nil {
				t.Fatalf("reading the server's first frame: %v", err)
			}
			if head[3] != 0x4 || head[4]&0x1 != 0 {
				t.Errorf("first frame %x, want a SETTINGS frame (type 4, not an ACK)", head)
			}
			if n := up.requests.Load(); n != 0 {
				t.Errorf("%d request(s) reached the pod", n)
			}
		})
	}
}

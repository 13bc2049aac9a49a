package upstream

import (
	"bufio"
	"bytes"
	"errors"

	"github.com/valyala/fasthttp"
)

// A pod's answer head, passed on as it came. fasthttp's parser checks,
// normalises and stores every field of the pod's head, the gateway adds
// each to the client's header, and the render writes each out again. The
// event loop's exchange and a worker's whole-answer call scan a plain head
// instead: status, framing and Connection are read, and the other lines
// go to the client byte for byte, as nginx and HAProxy pass an upstream's
// header. A head that is not plain (an interim answer, HTTP/1.0, folded
// lines, framing fasthttp must judge) is parsed by fasthttp.

// AnswerHead is the header block of a pod's answer as it was scanned
// (frontend.Upstream.Head, DoCut's head).
type AnswerHead struct {
	// Raw: Lines holds the head's header lines, each "name: value\r\n"
	// as the pod sent it, and the response's header only its status,
	// framing and Connection: close. False: the response's header holds
	// them all (fasthttp parsed the head).
	Raw   bool
	Lines []byte
}

// PlainHead is what ScanHead found in a plain head: its status, its
// body's framing (ContentLength's convention: the length, -1 chunked, -2
// until the pod closes), whether the pod closes the connection after it,
// the header lines, and the head's whole length.
type PlainHead struct {
	Status, Length int
	Close          bool
	Lines          []byte
	N              int
}

// Into sets resp's status, framing and Connection: close from h, and
// gives head h's lines (head.Raw): the response's header holds no other
// field.
func (h *PlainHead) Into(resp *fasthttp.Response, head *AnswerHead) {
	resp.SetStatusCode(h.Status)
	resp.Header.SetContentLength(h.Length)
	if h.Close {
		resp.SetConnectionClose()
	}
	head.Raw, head.Lines = true, append(head.Lines[:0], h.Lines...)
}

// ScanHead reads the head at the start of b when it is whole and plain:
// "HTTP/1.1", a final status, CRLF line ends, field names of token
// characters, values without control bytes, at most one Content-Length
// (digits) or one Transfer-Encoding (chunked) and not both. ok false
// leaves the head, whole or not, to fasthttp's parser.
func ScanHead(b []byte) (h PlainHead, ok bool) {
	const proto = "HTTP/1.1 "
	if len(b) < len(proto)+5 || string(b[:len(proto)]) != proto {
		return h, false
	}
	d := b[len(proto):]
	if !isDigit(d[0]) || !isDigit(d[1]) || !isDigit(d[2]) {
		return h, false
	}
	h.Status = int(d[0]-'0')*100 + int(d[1]-'0')*10 + int(d[2]-'0')
	if h.Status < 200 {
		return h, false
	}
	line, rest, ok := cutLine(d[3:])
	if !ok || len(line) > 0 && (line[0] != ' ' || !plainValue(line)) {
		return h, false
	}
	start := len(b) - len(rest)
	h.Length = -2
	var sawLength, chunked bool
	for {
		// plainValue and token refuse a CR within the line too.
		if line, rest, ok = cutLine(rest); !ok {
			return h, false
		}
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !token(line[:colon]) || !plainValue(line[colon+1:]) {
			return h, false
		}
		// Only framing and Connection are read, and told apart by
		// their names' lengths first.
		switch name := line[:colon]; len(name) {
		case len(headerContentLength):
			if !bytes.EqualFold(name, headerContentLength) {
				break
			}
			v := trimOWS(line[colon+1:])
			if sawLength || len(v) == 0 || len(v) > 18 {
				return h, false
			}
			n := 0
			for _, c := range v {
				if !isDigit(c) {
					return h, false
				}
				n = n*10 + int(c-'0')
			}
			h.Length, sawLength = n, true
		case len(headerTransferEncoding):
			if !bytes.EqualFold(name, headerTransferEncoding) {
				break
			}
			if chunked || !bytes.EqualFold(trimOWS(line[colon+1:]), chunkedToken) {
				return h, false
			}
			h.Length, chunked = -1, true
		case len(headerConnection):
			if bytes.EqualFold(name, headerConnection) {
				h.Close = h.Close || hasToken(line[colon+1:], closeToken)
			}
		}
	}
	if sawLength && chunked {
		return h, false
	}
	h.N = len(b) - len(rest)
	h.Lines = b[start : h.N-2]
	return h, true
}

// cutLine splits b at its first LF, which a CR must come before: false
// when there is none.
func cutLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return nil, nil, false
	}
	return b[:i-1], b[i+1:], true
}

// token reports whether b is an RFC 9110 token (a field name).
func token(b []byte) bool {
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// plainValue reports whether b has no control byte but tab: a field's
// value, or a status line's reason, that a header block may carry as it
// is.
func plainValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// trimOWS is v without the spaces and tabs around it (RFC 9110's OWS), as
// bytes.Trim(v, " \t") but a fifth of its time: that builds its cutset's
// table at each call, and a head's every value is trimmed.
func trimOWS(v []byte) []byte {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// hasToken reports whether the comma-separated list v names tok, whatever
// its case.
func hasToken(v, tok []byte) bool {
	for len(v) > 0 {
		t := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			t, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		if bytes.EqualFold(trimOWS(t), tok) {
			return true
		}
	}
	return false
}

var (
	headerContentLength    = []byte(fasthttp.HeaderContentLength)
	headerTransferEncoding = []byte(fasthttp.HeaderTransferEncoding)
	headerConnection       = []byte(fasthttp.HeaderConnection)
	chunkedToken           = []byte("chunked")
	closeToken             = []byte("close")
)

// EachField calls f with each field of lines, a head's header lines as
// AnswerHead holds them: its name, its value without the whitespace around
// it, and its whole line with the CRLF that ends it.
func EachField(lines []byte, f func(name, value, line []byte)) {
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n') + 1
		line := lines[:i]
		colon := bytes.IndexByte(line, ':')
		lines = lines[i:]
		f(line[:colon], trimOWS(line[colon+1:len(line)-2]), line)
	}
}

// ReadHead reads an answer's head from br into h with fasthttp's parser,
// skipping interim answers (103 Early Hints) to the final one, as
// fasthttp's whole read does: a stream's 200 comes after them. At most
// maxInterim of them: then ErrTooManyInterim.
func ReadHead(h *fasthttp.ResponseHeader, br *bufio.Reader) error {
	err := h.Read(br)
	for n := 0; err == nil && interim(h.StatusCode()); n++ {
		if n == maxInterim {
			return ErrTooManyInterim
		}
		err = h.Read(br)
	}
	return err
}

// interim reports whether code is an interim answer's, which a final one
// follows (101 Switching Protocols is final).
func interim(code int) bool {
	return code >= 100 && code < 200 && code != fasthttp.StatusSwitchingProtocols
}

// maxInterim bounds the interim answers before a final one (fasthttp's
// bound).
const maxInterim = 100

// ErrTooManyInterim fails an answer with more than maxInterim interim
// answers before its final one.
var ErrTooManyInterim = errors.New("upstream: too many interim answers from the pod")

// ErrPodHead fails an exchange whose answer's head does not parse. It names
// no byte of the head, which fasthttp's error quotes: the client's error
// says why the exchange failed, and the pod's fields are not its business.
var ErrPodHead = errors.New("its answer's head does not parse as HTTP/1.1")

package upstream

import (
	"bufio"
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestScanHead: a plain head is read as fasthttp reads it; any other is
// left to fasthttp's parser (ok false), whole or not.
func TestScanHead(t *testing.T) {
	const vllm = "HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"
	h, ok := ScanHead([]byte(vllm))
	if !ok || h.Status != 200 || h.Length != 2 || h.Close || h.N != len(vllm)-2 ||
		string(h.Lines) != "date: Wed, 02 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n" {
		t.Fatalf("vLLM's head: %+v %v", h, ok)
	}
	for _, c := range []struct {
		head           string
		status, length int
		close          bool
	}{
		{"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 503, 0, true},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nConnection: keep-alive, Close \r\n\r\n", 200, -1, true},
		{"HTTP/1.1 200\r\nX-A:\r\nX-B:\tv\t\r\n\r\n", 200, -2, false},
		{"HTTP/1.1 204 No Content\r\n\r\n", 204, -2, false},
	} {
		h, ok := ScanHead([]byte(c.head))
		if !ok || h.Status != c.status || h.Length != c.length || h.Close != c.close || h.N != len(c.head) {
			t.Errorf("%q: %+v %v", c.head, h, ok)
		}
	}
	for _, head := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",                                   // not whole
		"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",                               // HTTP/1.0
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",                             // interim
		"HTTP/1.1 2000 OK\r\n\r\n",                                                   // status
		"HTTP/1.1 200 OK\nContent-Length: 2\n\n",                                     // bare LF
		"HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\n",               // folded
		"HTTP/1.1 200 OK\r\nX-A : 1\r\n\r\n",                                         // space before the colon
		"HTTP/1.1 200 OK\r\nX-A: 1\r2\r\n\r\n",                                       // lone CR
		"HTTP/1.1 200 OK\r\nX-A: \x00\r\n\r\n",                                       // control byte
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",          // two lengths
		"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n",                              // not digits
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", // both framings
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",                // a coding
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		if h, ok := ScanHead([]byte(head)); ok {
			t.Errorf("%q taken as plain: %+v", head, h)
		}
	}
}

// FuzzScanHead: whatever ScanHead takes as plain, fasthttp's parser takes
// too, with the same status, framing, Connection: close, length and
// field values.
func FuzzScanHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nSet-Cookie: a=1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := ScanHead(b)
		if !ok {
			return
		}
		var fh fasthttp.ResponseHeader
		br := bufio.NewReaderSize(bytes.NewReader(b), len(b)+16)
		if err := fh.Read(br); err != nil {
			t.Fatalf("plain to ScanHead, refused by fasthttp: %v", err)
		}
		if used := len(b) - br.Buffered(); used != h.N {
			t.Fatalf("head of %d bytes, fasthttp read %d", h.N, used)
		}
		length := fh.ContentLength()
		if fh.StatusCode() != h.Status || length != h.Length && !(h.Status == 204 || h.Status == 304) || fh.ConnectionClose() != h.Close && h.Length != -2 {
			t.Fatalf("ScanHead: %d %d close %v; fasthttp: %d %d close %v", h.Status, h.Length, h.Close, fh.StatusCode(), length, fh.ConnectionClose())
		}
		values := map[string][]string{}
		for k, v := range fh.All() {
			values[strings.ToLower(string(k))] = append(values[strings.ToLower(string(k))], string(v))
		}
		EachField(h.Lines, func(name, value, _ []byte) {
			k := strings.ToLower(string(name))
			switch k {
			case "content-length", "transfer-encoding", "connection", "set-cookie", "trailer":
				return // framing, or kept apart by fasthttp
			}
			if len(value) > 0 && !slices.Contains(values[k], string(value)) {
				t.Fatalf("%s: %q, fasthttp has %q", name, value, values[k])
			}
		})
	})
}

// BenchmarkPodHead reads vLLM's answer head: fasthttp's parser, which
// the loop used for every answer, against the loop's scan of a plain one.
func BenchmarkPodHead(b *testing.B) {
	const head = "HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 1024\r\ncontent-type: application/json\r\n\r\n"
	b.Run("fasthttp", func(b *testing.B) {
		r := strings.NewReader(head)
		br := bufio.NewReader(r)
		var h fasthttp.ResponseHeader
		for b.Loop() {
			r.Reset(head)
			br.Reset(r)
			h.Reset()
			if err := h.Read(br); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan", func(b *testing.B) {
		var lines []byte
		buf := []byte(head)
		for b.Loop() {
			h, ok := ScanHead(buf)
			if !ok {
				b.Fatal("not plain")
			}
			lines = append(lines[:0], h.Lines...)
		}
	})
}

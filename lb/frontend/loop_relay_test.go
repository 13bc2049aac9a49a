package frontend

import (
	"bufio"
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// collectSink keeps the body bytes a relay hands it.
type collectSink struct{ got []byte }

func (s *collectSink) Body(_ *StreamWriter, p []byte) error {
	s.got = append(s.got, p...)
	return nil
}

func (s *collectSink) End(*StreamWriter, error) {}

// decodeIn feeds raw to the relay's decoder in pieces of the given sizes,
// keeping what it did not use for the next piece as the loop's inbound
// buffer does, and returns the body and whether it ended.
func decodeIn(t *testing.T, cl int, raw []byte, sizes []int) ([]byte, bool, error) {
	t.Helper()
	sink := &collectSink{}
	uc := &upConn{sink: sink}
	uc.startBody(cl)
	var pending []byte
	for len(raw) > 0 {
		n := min(sizes[0], len(raw))
		sizes = append(sizes[1:], sizes[0])
		pending = append(pending, raw[:n]...)
		raw = raw[n:]
		used, end, err := uc.decode(pending)
		pending = pending[used:]
		if err != nil || end {
			return sink.got, end, err
		}
	}
	return sink.got, false, nil
}

// TestRelayDecode: the loop's body decoder gives the bytes fasthttp's
// decoder reads from the same answer, however the answer arrives split.
func TestRelayDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300; i++ {
		var body []byte
		var wire strings.Builder
		for range r.IntN(6) {
			chunk := make([]byte, 1+r.IntN(300))
			for j := range chunk {
				chunk[j] = byte('a' + r.IntN(26))
			}
			body = append(body, chunk...)
			wire.WriteString(strconv.FormatInt(int64(len(chunk)), 16))
			if r.IntN(3) == 0 {
				wire.WriteString(";ext=1")
			}
			wire.WriteString("\r\n")
			wire.Write(chunk)
			wire.WriteString("\r\n")
		}
		wire.WriteString("0\r\n")
		if r.IntN(2) == 0 {
			wire.WriteString("X-Trailer: 1\r\n")
		}
		wire.WriteString("\r\n")
		raw := []byte(wire.String())

		// fasthttp's reading of the same bytes.
		var resp fasthttp.Response
		head := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
		if err := resp.Read(bufio.NewReader(bytes.NewReader(append([]byte(head), raw...)))); err != nil {
			t.Fatalf("case %d: fasthttp: %v", i, err)
		}
		if !bytes.Equal(resp.Body(), body) {
			t.Fatalf("case %d: fasthttp disagrees with the generator", i)
		}
		for _, sizes := range [][]int{{len(raw)}, {1}, {1 + r.IntN(7), 1 + r.IntN(40)}} {
			got, end, err := decodeIn(t, -1, raw, sizes)
			if err != nil || !end || !bytes.Equal(got, body) {
				t.Fatalf("case %d, pieces %v: end %v, err %v, %d bytes (want %d)", i, sizes, end, err, len(got), len(body))
			}
		}
	}
	// A body with a length ends at it; one without ends when the pod
	// closes (decode never says it ended).
	if got, end, err := decodeIn(t, 5, []byte("hello"), []int{2}); string(got) != "hello" || !end || err != nil {
		t.Fatalf("fixed length: %q %v %v", got, end, err)
	}
	if got, end, err := decodeIn(t, -2, []byte("hello"), []int{2}); string(got) != "hello" || end || err != nil {
		t.Fatalf("until close: %q %v %v", got, end, err)
	}
	for _, bad := range []string{"zz\r\nab\r\n0\r\n\r\n", "2\r\nabXX0\r\n\r\n", strings.Repeat("1", maxChunkLine+1)} {
		if _, _, err := decodeIn(t, -1, []byte(bad), []int{3}); err != errBadChunk {
			t.Fatalf("%.20q: %v, want errBadChunk", bad, err)
		}
	}
}

type panicSink struct{}

func (panicSink) Body(*StreamWriter, []byte) error { panic("sink bug") }
func (panicSink) End(*StreamWriter, error)         {}

// TestRelaySinkPanic: a sink that panics on the loop ends its own stream
// (cut, and logged), not the process with every other connection.
func TestRelaySinkPanic(t *testing.T) {
	uc := &upConn{sink: panicSink{}}
	uc.startBody(5)
	if _, _, err := uc.decode([]byte("hello")); err != errStreamPanic {
		t.Fatalf("decode with a panicking sink: %v, want errStreamPanic", err)
	}
}

package frontend

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// blockFrames encodes each of blocks as a HEADERS frame on its own odd
// stream, with one HPACK encoder, as a client sends them.
func blockFrames(t *testing.T, blocks ...[]hpack.HeaderField) []byte {
	t.Helper()
	var out, hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fr := http2.NewFramer(&out, nil)
	for i, fields := range blocks {
		hb.Reset()
		for _, f := range fields {
			if err := enc.WriteField(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(),
			EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

var chatFields = []hpack.HeaderField{
	{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
	{Name: ":authority", Value: "lb.example"}, {Name: ":path", Value: "/v1/chat/completions"},
	{Name: "content-type", Value: "application/json"}, {Name: "content-length", Value: "1024"},
	{Name: "authorization", Value: "Bearer sk-test"}, {Name: "user-agent", Value: "OpenAI/Python 1.54.0"},
}

// TestH2BlockAllocatesNothing: a request whose fields the client's HPACK
// table already holds, as every one after a connection's first, is
// decoded without an allocation.
func TestH2BlockAllocatesNothing(t *testing.T) {
	fr := http2.NewFramer(nil, bytes.NewReader(blockFrames(t, chatFields, chatFields)))
	b := newH2Block(DefaultMaxHeaderBytes)
	for range 2 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		hf := f.(*http2.HeadersFrame)
		if err := b.read(fr, hf); err != nil {
			t.Fatal(err)
		}
		if len(b.Fields) != len(chatFields) || b.PseudoValue("path") != "/v1/chat/completions" ||
			len(b.RegularFields()) != 4 || b.RegularFields()[3].Value != "OpenAI/Python 1.54.0" {
			t.Fatalf("stream %d: fields %v", hf.StreamID, b.Fields)
		}
		if hf.StreamID == 3 {
			if allocs := testing.AllocsPerRun(1000, func() { _ = b.read(fr, hf) }); allocs != 0 {
				t.Errorf("%.1f allocations per header block, want 0", allocs)
			}
		}
	}
}

// TestH2BlockMalformed: a malformed block is a stream error, which leaves
// the decoder in step for the next block; one over the limit is cut short
// and says so.
func TestH2BlockMalformed(t *testing.T) {
	bad := func(fields ...hpack.HeaderField) []hpack.HeaderField { return append(chatFields[:4:4], fields...) }
	for _, tc := range []struct {
		name   string
		fields []hpack.HeaderField
		want   error
	}{
		{"upper-case name", bad(hpack.HeaderField{Name: "X-Up", Value: "1"}), errH2FieldName},
		{"value with a newline", bad(hpack.HeaderField{Name: "x-a", Value: "a\nb"}), errH2FieldValue},
		{"pseudo after regular", bad(hpack.HeaderField{Name: "x-a", Value: "1"}, hpack.HeaderField{Name: ":protocol", Value: "x"}), errH2PseudoAfter},
		{"unknown pseudo", bad(hpack.HeaderField{Name: ":nope", Value: "1"}), errH2PseudoUnknown},
		{"repeated pseudo", bad(hpack.HeaderField{Name: ":path", Value: "/b"}), errH2PseudoRepeated},
		{"request and response", bad(hpack.HeaderField{Name: ":status", Value: "200"}), errH2PseudoMixed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fr := http2.NewFramer(nil, bytes.NewReader(blockFrames(t, tc.fields, chatFields)))
			b := newH2Block(DefaultMaxHeaderBytes)
			f, _ := fr.ReadFrame()
			var se http2.StreamError
			if err := b.read(fr, f.(*http2.HeadersFrame)); !errors.As(err, &se) || se.StreamID != 1 || se.Cause != tc.want {
				t.Fatalf("got %v, want a stream error on stream 1: %v", err, tc.want)
			}
			f, _ = fr.ReadFrame()
			if err := b.read(fr, f.(*http2.HeadersFrame)); err != nil || b.PseudoValue("method") != "POST" || len(b.Fields) != len(chatFields) {
				t.Fatalf("the next block: %v, fields %v", err, b.Fields)
			}
		})
	}
	t.Run("over the limit", func(t *testing.T) {
		fr := http2.NewFramer(nil, bytes.NewReader(blockFrames(t, bad(hpack.HeaderField{Name: "x-big", Value: strings.Repeat("a", 200)}))))
		b := newH2Block(300)
		f, _ := fr.ReadFrame()
		if err := b.read(fr, f.(*http2.HeadersFrame)); err != nil || !b.Truncated || len(b.Fields) != 4 {
			t.Fatalf("got %v, truncated %v, %d fields; want a truncated block of the 4 pseudo-headers", err, b.Truncated, len(b.Fields))
		}
	})
}

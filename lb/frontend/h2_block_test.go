package frontend

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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

// blockOutcome is what decoding one header block came to: its error's
// kind, or its fields and whether they were cut short.
type blockOutcome struct {
	err       string
	fields    string
	truncated bool
}

func outcomeOf(err error) blockOutcome {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		return blockOutcome{err: fmt.Sprintf("stream %d %v", se.StreamID, se.Code)}
	case errors.As(err, &ce):
		return blockOutcome{err: fmt.Sprintf("connection %v", http2.ErrCode(ce))}
	}
	return blockOutcome{err: err.Error()}
}

// decodeXNet decodes the header blocks of in as x/net's framer does with
// ReadMetaHeaders, up to the first connection error or the end of in.
func decodeXNet(in []byte, limit uint32) []blockOutcome {
	fr := http2.NewFramer(nil, bytes.NewReader(in))
	fr.MaxHeaderListSize = limit
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var out []blockOutcome
	for {
		f, err := fr.ReadFrame()
		switch {
		case err == nil:
			if mh, ok := f.(*http2.MetaHeadersFrame); ok {
				out = append(out, blockOutcome{fields: fmt.Sprint(mh.Fields), truncated: mh.Truncated})
			}
			continue
		case errors.Is(err, io.EOF):
			return out
		}
		if out = append(out, outcomeOf(err)); !errors.As(err, new(http2.StreamError)) {
			return out
		}
	}
}

// decodeBlocks decodes them with h2Block, as a connection does.
func decodeBlocks(in []byte, limit uint32) []blockOutcome {
	fr := http2.NewFramer(nil, bytes.NewReader(in))
	b := newH2Block(limit)
	var out []blockOutcome
	for {
		f, err := fr.ReadFrame()
		if hf, ok := f.(*http2.HeadersFrame); ok && err == nil {
			if err = b.read(fr, hf); err == nil {
				out = append(out, blockOutcome{fields: fmt.Sprint(b.Fields), truncated: b.Truncated})
				continue
			}
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, io.EOF):
			return out
		}
		if out = append(out, outcomeOf(err)); !errors.As(err, new(http2.StreamError)) {
			return out
		}
	}
}

// trailerNames is a "trailer" field value of short names, about size
// bytes long.
func trailerNames(size int) string {
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%c%c%d", 'a'+i/26%26, 'a'+i%26, i/676)
	}
	return b.String()
}

// TestH2BlockTrailerBudget: a "trailer" field is counted against a budget
// of its own, each name it announces as a field of its own, as x/net's
// framer counts it: a short one beside fields near the limit passes, and
// a few KB of short names are over a 4 KB limit.
func TestH2BlockTrailerBudget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     uint32
		fields    []hpack.HeaderField
		truncated bool
	}{
		{"beside fields near the limit", 400, []hpack.HeaderField{{Name: "x-pad", Value: strings.Repeat("p", 150)}, {Name: "trailer", Value: "x-checksum"}}, false},
		{"thousands of short names", DefaultMaxHeaderBytes, []hpack.HeaderField{{Name: "trailer", Value: trailerNames(3800)}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := blockFrames(t, append(chatFields[:4:4], tc.fields...))
			got, want := decodeBlocks(in, tc.limit), decodeXNet(in, tc.limit)
			if len(got) != 1 || got[0].truncated != tc.truncated || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got %v, want truncated %v, as x/net: %v", got, tc.truncated, want)
			}
		})
	}
}

// FuzzH2BlockDiff: any frames, at any header list limit, decode block by
// block to what x/net's framer makes of them: the same fields, cut short
// alike, or the same error of the same kind.
func FuzzH2BlockDiff(f *testing.F) {
	var hb, out bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, hf := range append(chatFields, hpack.HeaderField{Name: "trailer", Value: "a, b, c"}) {
		_ = enc.WriteField(hf)
	}
	frag := hb.Bytes()
	fr := http2.NewFramer(&out, nil)
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: frag[:5], EndStream: true})
	_ = fr.WriteContinuation(1, true, frag[5:])
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: frag, EndHeaders: true})
	for _, limit := range []uint16{100, 300, 8000} {
		f.Add(out.Bytes(), limit)
	}
	f.Fuzz(func(t *testing.T, in []byte, limit16 uint16) {
		limit := max(uint32(limit16), 1)
		if got, want := decodeBlocks(in, limit), decodeXNet(in, limit); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("limit %d:\nh2Block %v\nx/net   %v", limit, got, want)
		}
	})
}

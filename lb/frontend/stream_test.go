package frontend

import (
	"bytes"
	"testing"
)

// chunkRecorder keeps every chunk a StreamWriter sends, copied (the writer
// reuses its buffers).
type chunkRecorder struct{ chunks [][]byte }

func (r *chunkRecorder) Write(p []byte) (int, error) {
	r.chunks = append(r.chunks, bytes.Clone(p))
	return len(p), nil
}

// TestStreamWriterChunks pins where chunks break as a chunk outgrows the
// small buffer, then the full one, and that no byte moves or goes missing
// on the way.
func TestStreamWriterChunks(t *testing.T) {
	part := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	a, b, c, d, e := part('a', 100), part('b', smallBufferBytes), part('c', 3000), part('d', 1000), part('e', streamBufferBytes+1)
	var rec chunkRecorder
	n, err := streamBody(func(w *StreamWriter) {
		for _, p := range [][]byte{a, b, c} { // 100, then past the small buffer, then near the full one
			if _, err := w.Write(p); err != nil {
				t.Fatal(err)
			}
		}
		_, _ = w.Write(d) // past the full buffer: what was gathered goes first
		_ = w.Flush()
		_ = w.Flush() // nothing gathered: no empty chunk
		_, _ = w.Write(e)
	}).WriteTo(&rec)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]byte{bytes.Join([][]byte{a, b, c}, nil), d, e}
	if len(rec.chunks) != len(want) {
		t.Fatalf("%d chunks, want %d", len(rec.chunks), len(want))
	}
	for i := range want {
		if !bytes.Equal(rec.chunks[i], want[i]) {
			t.Fatalf("chunk %d: %d bytes, want %d", i, len(rec.chunks[i]), len(want[i]))
		}
	}
	if total := int64(len(a) + len(b) + len(c) + len(d) + len(e)); n != total {
		t.Fatalf("WriteTo reported %d bytes, want %d", n, total)
	}
}

package chat

import (
	"testing"
	"unicode/utf8"
)

// FuzzPlainRun checks the eight-bytes-a-step scan against a byte loop.
func FuzzPlainRun(f *testing.F) {
	f.Add([]byte(`hello world, "quoted" and \escaped`), 0)
	f.Add([]byte("plain ascii text that is long enough\x01"), 3)
	f.Add([]byte("ünïcödé 中文 🙂 text\"end"), 1)
	f.Fuzz(func(t *testing.T, data []byte, from int) {
		if from < 0 || from > len(data) {
			return
		}
		want := from
		for want < len(data) && data[want] != '"' && data[want] != '\\' && data[want] >= 0x20 {
			want++
		}
		wantASCII := true
		for _, c := range data[from:want] {
			wantASCII = wantASCII && c < utf8.RuneSelf
		}
		got, ascii := plainRun(data, from)
		if got != want || ascii != wantASCII {
			t.Fatalf("plainRun(%q, %d) = %d, %v; want %d, %v", data, from, got, ascii, want, wantASCII)
		}
	})
}

package openai

import (
	"strings"
	"testing"
)

// BenchmarkStr measures str alone on 4 KB strings of each prompt line in
// request_timing_test.go, and on a key, str's most frequent input.
func BenchmarkStr(b *testing.B) {
	for _, c := range []struct{ name, text string }{
		{"key", `role`},
		{"plain", strings.Repeat(plainLine, 4<<10/len(plainLine))},
		{"prose", strings.Repeat(proseLine, 4<<10/len(proseLine))},
		{"code", strings.Repeat(codeLine, 4<<10/len(codeLine))},
	} {
		body := []byte(`"` + c.text + `",`)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				s := scanner{b: body}
				if s.str(); s.bad {
					b.Fatal("bad")
				}
			}
		})
	}
}

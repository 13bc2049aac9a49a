package frontend

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2"
)

// FuzzResetCount: resetGuard.count finds every RST_STREAM among frames
// written by x/net's framer, however the bytes are split into reads.
func FuzzResetCount(f *testing.F) {
	f.Add([]byte{3, 0, 3, 3}, []byte{1, 9, 30})
	f.Add([]byte{0, 1, 2, 4, 6, 8}, []byte{24, 9})
	f.Fuzz(func(t *testing.T, kinds, splits []byte) {
		var buf bytes.Buffer
		buf.WriteString(http2.ClientPreface)
		fr := http2.NewFramer(&buf, nil)
		want := 0
		for i, k := range kinds {
			id := uint32(2*i + 1)
			switch k % 5 {
			case 0:
				_ = fr.WriteData(id, false, bytes.Repeat([]byte{'d'}, int(k)))
			case 1:
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte{0x83, 0x86}, EndHeaders: true})
			case 2:
				_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(k)})
			case 3:
				_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
				want++
			case 4:
				_ = fr.WriteWindowUpdate(id, uint32(k)+1)
			}
		}
		g := newResetGuard(nil, 1)
		b, got := buf.Bytes(), 0
		for _, s := range splits {
			if len(b) == 0 {
				break
			}
			n := min(int(s)+1, len(b))
			got += g.count(b[:n])
			b = b[n:]
		}
		got += g.count(b)
		if got != want {
			t.Fatalf("counted %d resets, wrote %d", got, want)
		}
	})
}

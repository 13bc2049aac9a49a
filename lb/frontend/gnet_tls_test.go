package frontend

import (
	"math/rand/v2"
	"testing"
)

// TestRecordFrames: the whole records counted after each piece of a
// connection's bytes are those that ended within them, however the
// bytes were cut (a header split across pieces included).
func TestRecordFrames(t *testing.T) {
	var wire []byte
	var ends []int
	for _, n := range []int{0, 1, 300, 16<<10 + 256, 5, 0, 258} {
		wire = append(wire, 23, 3, 3, byte(n>>8), byte(n))
		wire = append(wire, make([]byte, n)...)
		ends = append(ends, len(wire))
	}
	wholeBy := func(n int) (k int64) {
		for _, e := range ends {
			if e <= n {
				k++
			}
		}
		return k
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, cut := range []func() int{
		func() int { return 1 },
		func() int { return len(wire) },
		func() int { return 1 + rng.IntN(7) },
		func() int { return 1 + rng.IntN(2000) },
	} {
		var f recordFrames
		for at := 0; at < len(wire); {
			n := min(cut(), len(wire)-at)
			f.scan(wire[at : at+n])
			at += n
			if f.whole != wholeBy(at) {
				t.Fatalf("after %d of %d bytes: %d whole records, want %d", at, len(wire), f.whole, wholeBy(at))
			}
		}
	}
}

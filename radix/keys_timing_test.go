package radix

import "testing"

// BenchmarkBlockKeys hashes a 2,048-token prompt into its 128 chained keys
// (DefaultBlockSize), the gateway's per-request hashing.
func BenchmarkBlockKeys(b *testing.B) {
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i * 2654435761)
	}
	dst := make([]uint64, 0, 128)
	b.SetBytes(int64(len(toks) * 4))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendBlockKeys(dst[:0], 7, toks, DefaultBlockSize)
	}
}

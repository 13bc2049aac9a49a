//go:build !purego

package radix

// chain64 is chain64Go in assembly: Go's code generator moves every
// operand of its 64×64→128 multiplications through AX and DX and spills
// around them, and the hand-kept registers take about a fifth less time per
// block (BenchmarkBlockKeys). TestChain64 holds the two to the same keys.
func chain64(out []uint64, h uint64, raw []byte) {
	_ = raw[64*len(out)-1] // the assembly reads 64·len(out) bytes
	chain64Blocks(&out[0], len(out), h, &raw[0])
}

// chain64Blocks stores the keys of n ≥ 1 blocks of 64 bytes at raw, chained
// from h, at out[0..n).
//
//go:noescape
func chain64Blocks(out *uint64, n int, h uint64, raw *byte)

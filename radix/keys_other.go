//go:build !amd64 || purego

package radix

// chain64 is chain64Go where there is no assembly for it.
func chain64(out []uint64, h uint64, raw []byte) { chain64Go(out, h, raw) }

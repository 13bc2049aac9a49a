package radix

import (
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the number of tokens one block key covers (default 16,
// vLLM's default KV block size).
const DefaultBlockSize = 16

// Seed derives the first link of a key chain from the model name, so equal
// prompts sent to different models never share keys.
func Seed(model string) uint64 { return mix(xxhash.Sum64String(model)) }

// AppendBlockKeys appends one chained key per full block of blockSize tokens
// and returns the extended slice; a trailing partial block gets no key, as
// engines cache only full blocks. Key i depends on the seed and on every token
// of blocks 0..i, so equal keys mean equal prefixes (up to 64-bit collisions,
// which cost a wasted cache hit estimate, never a wrong answer).
func AppendBlockKeys(dst []uint64, seed uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 || len(tokens) < blockSize {
		return dst
	}
	// Token ids are hashed as their in-memory bytes: little-endian on every
	// platform Go supports for this project (amd64, arm64).
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
	return appendChain(dst, seed, raw, blockSize*4)
}

// AppendByteBlockKeys is the byte mode: keys over the rendered prompt itself,
// blockBytes per block, for engines whose tokenizer the gateway does not
// share. Only relative matches between requests mean anything in this mode.
func AppendByteBlockKeys(dst []uint64, seed uint64, prompt []byte, blockBytes int) []uint64 {
	if blockBytes <= 0 {
		return dst
	}
	return appendChain(dst, seed, prompt, blockBytes)
}

func appendChain(dst []uint64, h uint64, raw []byte, width int) []uint64 {
	for off := 0; off+width <= len(raw); off += width {
		h = mix(h ^ xxhash.Sum64(raw[off:off+width]))
		dst = append(dst, h)
	}
	return dst
}

// mix is splitmix64's finalizer: it spreads every input bit over the output so
// chaining by xor cannot cancel two blocks' hashes out.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

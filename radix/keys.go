package radix

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the number of tokens one block key covers (default 16,
// vLLM's default KV block size).
const DefaultBlockSize = 16

// Seed derives the first link of a key chain from the model name, so equal
// prompts sent to different models never share keys.
func Seed(model string) uint64 { return mix(xxhash.Sum64String(model)) }

// SeedWith returns the seed of a prompt the engine hashed with extra keys:
// a LoRA adapter's name (lora, "" for none) and a cache salt (cacheSalt,
// "" for none), folded into seed (the model's Seed). With neither it
// returns seed, so plain prompts keep their keys. vLLM hashes the
// adapter's name into every block and the salt into the prompt's first
// block only; folding both into the chain's start keys the same blocks
// apart, since every later key depends on it: a salted or adapter block
// never equals a plain one, nor one of another salt or adapter.
func SeedWith(seed uint64, lora, cacheSalt string) uint64 {
	if lora != "" {
		seed = Extend(seed, xxhash.Sum64String(lora)^loraTag)
	}
	if cacheSalt != "" {
		seed = Extend(seed, xxhash.Sum64String(cacheSalt)^saltTag)
	}
	return seed
}

// Extend folds an extra key x (a digest of whatever else the engine
// hashed into the next block: multimodal inputs, prompt embeddings) into
// the chain state h (a seed or the last block key), for the next block's
// key to chain from. Keys chained from Extend(h, x) share nothing with
// those chained from h, or from Extend(h, y) for another y (up to 64-bit
// collisions).
func Extend(h, x uint64) uint64 { return mix(h ^ mix(x^extendTag)) }

// Tags keep SeedWith's two strings and Extend's digest apart: an adapter
// named like a salt, or a digest equal to either's hash, gives another
// seed. They are 1, 2 and 3 times splitmix64's golden-ratio step.
const (
	loraTag   = 0x9e3779b97f4a7c15
	saltTag   = 0x3c6ef372fe94f82a
	extendTag = 0xdaa66d2c7ddf743f
)

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

// AppendBatchKeys appends the keys of each prompt of a completion batch,
// whose tokens lie one after another, prompt i's ending at ends[i]: each
// chained from seed, as the engine serves each prompt as a request of its
// own. For two or more prompts, chains gets where each prompt's keys end
// in dst; with fewer ends, tokens are one prompt, as AppendBlockKeys
// keys them.
func AppendBatchKeys(dst []uint64, chains []int, seed uint64, tokens []uint32, ends []int, blockSize int) ([]uint64, []int) {
	if len(ends) < 2 {
		return AppendBlockKeys(dst, seed, tokens, blockSize), chains
	}
	from := 0
	for _, end := range ends {
		dst = AppendBlockKeys(dst, seed, tokens[from:end], blockSize)
		chains = append(chains, len(dst))
		from = end
	}
	return dst, chains
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

// appendChain appends the key of each whole block of width bytes of raw,
// each chained from the one before (h for the first):
//
//	key_i = fold(key_{i-1} ^ block(raw_i), c3)
//	block(b) = width + Σ_j fold(le64(b[16j:]) ^ (c0 + j·c2), le64(b[16j+8:]) ^ c1)
//
// where fold(a, b) is the high word xor the low word of the 128-bit product
// a·b, and a last chunk shorter than 16 bytes is read zero-padded (every
// block of a chain has the same width, so padding never makes two
// blocks equal). A chunk's secret depends on its position, so reordering
// chunks changes the key. This is the multiply-fold construction of wyhash
// and XXH3's short inputs: five 64×64→128 multiplications per 64-byte
// block where xxhash64 needs thirty 64-bit ones, and the chain's serial
// dependency is one multiplication. It is not a cryptographic hash: a
// prompt can be crafted to collide, which, like any 64-bit collision, costs
// a wrong cache estimate, never a wrong answer.
func appendChain(dst []uint64, h uint64, raw []byte, width int) []uint64 {
	if width == 64 {
		return appendChain64(dst, h, raw)
	}
	for ; len(raw) >= width; raw = raw[width:] {
		b := raw[:width]
		acc, s := uint64(width), uint64(chainC0)
		for ; len(b) >= 64; b = b[64:] {
			acc += round64(b, s)
			s += 4 * chainC2 & math.MaxUint64 // four chunks on, mod 2⁶⁴
		}
		for ; len(b) >= 16; b = b[16:] {
			acc += fold(le64(b)^s, le64(b[8:])^chainC1)
			s += chainC2
		}
		if len(b) > 0 {
			var t [16]byte
			copy(t[:], b)
			acc += fold(le64(t[:])^s, le64(t[8:])^chainC1)
		}
		h = fold(h^acc, chainC3)
		dst = append(dst, h)
	}
	return dst
}

// appendChain64 is appendChain for width 64 (DefaultBlockSize tokens): one
// round and no tail per block. dst grows once; chain64 computes the keys,
// in assembly on amd64 (keys_amd64.s) and with chain64Go elsewhere.
func appendChain64(dst []uint64, h uint64, raw []byte) []uint64 {
	n0, n := len(dst), len(raw)/64
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)[:n0+n]
	chain64(dst[n0:], h, raw)
	return dst
}

// chain64Go stores in out (len(out) ≥ 1) the keys of the first len(out)
// 64-byte blocks of raw, chained from h. The loop body is the round
// written out with its secrets as constants, reading each block through a
// *[64]byte, so the compiler keeps h and the pointers in registers and
// checks no bounds: a call per round made it spill them around the call,
// and took a third longer per block.
func chain64Go(out []uint64, h uint64, raw []byte) {
	raw = raw[:64*len(out)]
	p := unsafe.Pointer(&raw[0])
	for i := range out {
		b := (*[64]byte)(unsafe.Add(p, i*64)) // i*64+64 ≤ len(raw)
		acc := fold(le64(b[0:])^chainC0, le64(b[8:])^chainC1) +
			fold(le64(b[16:])^chainS1, le64(b[24:])^chainC1) +
			fold(le64(b[32:])^chainS2, le64(b[40:])^chainC1) +
			fold(le64(b[48:])^chainS3, le64(b[56:])^chainC1)
		h = fold(h^(64+acc), chainC3)
		out[i] = h
	}
}

// round64 is appendChain's sum over the four 16-byte chunks of b[:64], the
// first chunk's secret being s. Its four multiplications are independent,
// so they overlap.
func round64(b []byte, s uint64) uint64 {
	b = b[:64]
	s1 := s + chainC2
	s2 := s1 + chainC2
	s3 := s2 + chainC2
	return fold(le64(b[0:])^s, le64(b[8:])^chainC1) +
		fold(le64(b[16:])^s1, le64(b[24:])^chainC1) +
		fold(le64(b[32:])^s2, le64(b[40:])^chainC1) +
		fold(le64(b[48:])^s3, le64(b[56:])^chainC1)
}

// The secrets of appendChain: odd 64-bit constants with well-spread bits
// (wyhash's), so no byte of the key is left unmixed.
const (
	chainC0 = 0xa0761d6478bd642f
	chainC1 = 0xe7037ed1a0b428db
	chainC2 = 0x8ebc6af09c88c6e3
	chainC3 = 0x589965cc75374cc3

	// The secrets of a round's second, third and fourth chunks, mod 2⁶⁴.
	chainS1 = (chainC0 + chainC2) & math.MaxUint64
	chainS2 = (chainC0 + 2*chainC2) & math.MaxUint64
	chainS3 = (chainC0 + 3*chainC2) & math.MaxUint64
)

// fold is the high word xor the low word of the 128-bit product a·b.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// le64 reads 8 bytes as a little-endian uint64.
func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// mix is splitmix64's finalizer: it spreads every input bit over the output so
// chaining by xor cannot cancel two blocks' hashes out.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

package tokenize

import "pdlb/radix"

// AppendBlockKeys appends the chained block keys of prompt's tokens: the
// same keys as radix.AppendBlockKeys(dst, seed, Append(nil, prompt),
// blockSize), without materialising the tokens.
//
// A token is four bytes of the prompt read as a little-endian uint32, which
// is how the token array lies in memory, so every block made only of whole
// tokens hashes exactly the prompt's own bytes. Only a last block ending in
// the padded partial token needs a copy.
func AppendBlockKeys(dst []uint64, seed uint64, prompt []byte, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	width := blockSize * BytesPerToken
	whole := len(prompt) / width * width
	n0 := len(dst)
	dst = radix.AppendByteBlockKeys(dst, seed, prompt[:whole], width)
	rest := prompt[whole:]
	if len(rest) <= width-BytesPerToken || len(rest) == 0 {
		// The tail is at most blockSize-1 tokens: a partial block, no key.
		return dst
	}
	// The tail makes exactly blockSize tokens, the last one partial.
	var tail [64]uint32
	var toks []uint32
	if blockSize <= len(tail) {
		toks = Append(tail[:0], rest)
	} else {
		toks = Append(make([]uint32, 0, blockSize), rest)
	}
	parent := seed
	if len(dst) > n0 {
		parent = dst[len(dst)-1]
	}
	return radix.AppendBlockKeys(dst, parent, toks, blockSize)
}

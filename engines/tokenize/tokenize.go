// Package tokenize is the tokenizer the gateway and the simulated engine
// share. It needs no model files and is deterministic, so the block keys the
// gateway computes for a prompt name exactly the blocks a sim pod reports in
// its KV events.
//
// A token is four bytes of the rendered prompt (the last one may be shorter),
// and its id is those bytes read as a little-endian uint32. That matches the
// "about 4 bytes per token" of real BPE vocabularies closely enough for load
// estimates, is injective (two different texts never share a token sequence),
// and is prefix-stable: appending text to a prompt never changes the ids of
// its earlier full tokens, which is what prefix caching relies on.
package tokenize

import "encoding/binary"

// BytesPerToken is the width of one token in bytes of rendered prompt.
const BytesPerToken = 4

// Count returns the number of tokens text has, without producing them.
func Count(text []byte) int { return (len(text) + BytesPerToken - 1) / BytesPerToken }

// CountLen is Count for a text of n bytes.
func CountLen(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }

// Append appends the token ids of text to dst and returns the extended slice.
// It allocates only when dst lacks capacity.
func Append(dst []uint32, text []byte) []uint32 {
	full := len(text) &^ (BytesPerToken - 1)
	for i := 0; i < full; i += BytesPerToken {
		dst = append(dst, binary.LittleEndian.Uint32(text[i:]))
	}
	if rest := text[full:]; len(rest) > 0 {
		var b [BytesPerToken]byte
		copy(b[:], rest)
		dst = append(dst, binary.LittleEndian.Uint32(b[:]))
	}
	return dst
}

// The chat template both sides render messages with. Each turn is
// "<|role|>\n" + content + "\n"; the prompt ends with the assistant header so
// the model continues as the assistant. Every earlier turn renders to the same
// bytes when a conversation grows, so multi-turn prompts share their prefix.
const (
	turnOpen  = "<|"
	turnClose = "|>\n"
	turnEnd   = "\n"

	// GenerationPrompt ends every rendered chat prompt.
	GenerationPrompt = "<|assistant|>\n"
)

// AppendTurn appends one rendered chat turn to dst.
func AppendTurn(dst, role, content []byte) []byte {
	dst = append(dst, turnOpen...)
	dst = append(dst, role...)
	dst = append(dst, turnClose...)
	dst = append(dst, content...)
	return append(dst, turnEnd...)
}

// AppendTurnOpen appends the header of a turn whose content the caller
// appends piece by piece (OpenAI content given as a list of parts); close it
// with AppendTurnClose.
func AppendTurnOpen(dst, role []byte) []byte {
	dst = append(dst, turnOpen...)
	dst = append(dst, role...)
	return append(dst, turnClose...)
}

// AppendTurnClose ends a turn opened with AppendTurnOpen.
func AppendTurnClose(dst []byte) []byte { return append(dst, turnEnd...) }

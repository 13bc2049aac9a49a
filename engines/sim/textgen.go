package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"pdlb/engines/prompt"
	"pdlb/engines/tokenize"
)

// words is the simulated model's vocabulary. Every word is a space and three
// letters, four bytes: one token of engines/tokenize when it falls on a token
// boundary, so an answer fed back in a multi-turn prompt costs about as many
// prompt tokens as it cost output tokens. 64 words, so a token is 6 bits of a
// hash.
var words = [64]string{
	" the", " and", " for", " are", " but", " not", " you", " all",
	" any", " can", " had", " her", " was", " one", " our", " out",
	" day", " get", " has", " him", " his", " how", " man", " new",
	" now", " old", " see", " two", " way", " who", " boy", " did",
	" its", " let", " put", " say", " she", " too", " use", " map",
	" key", " run", " set", " top", " end", " far", " low", " big",
	" few", " own", " try", " ask", " why", " yes", " sum", " row",
	" log", " net", " bit", " gpu", " job", " age", " air", " art",
}

// textStream yields the deterministic answer to one prompt. Token i is a
// function of (pod seed, prompt hash, i) only, never of the pod or of earlier
// tokens, so two pods with one seed answer alike and a decode pod can resume
// at any position a prefill pod stopped at.
type textStream struct{ base uint64 }

// newTextStream seeds the answer from the pod's seed and the prompt's tokens.
func newTextStream(seed uint64, tokens []uint32) textStream {
	var buf [4]byte
	d := xxhash.New()
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:], t)
		_, _ = d.Write(buf[:])
	}
	return textStream{base: splitmix(d.Sum64() ^ splitmix(seed))}
}

// sample is answer j of a request's n to the prompt: sampled answers
// differ, and the first is the prompt's n=1 answer.
func (s textStream) sample(j int) textStream {
	if j == 0 {
		return s
	}
	return textStream{base: splitmix(s.base ^ uint64(j))}
}

// word returns token i of the answer.
func (s textStream) word(i int) string { return words[s.index(i)] }

// index returns token i of the answer as its place in words.
func (s textStream) index(i int) int {
	return int(splitmix(s.base+uint64(i)*0x9e3779b97f4a7c15) >> 58)
}

// wordIDs returns the token id of each of words, the ids the pod caches
// for the answers it generates: as m's tokenizer encodes the word alone
// (nil: the stand-in's), which is how a chat template that keeps the
// answer's leading space encodes it again in the next turn's prompt. A
// word the tokenizer splits takes its first piece's id; the words are one
// token each in the Llama 3 and Qwen3 vocabularies.
func wordIDs(m *prompt.Model) *[len(words)]uint32 {
	var ids [len(words)]uint32
	var buf []uint32
	for i, w := range words {
		if m != nil {
			buf = m.Completion(buf[:0], []byte(w), false)
		} else {
			buf = tokenize.Append(buf[:0], []byte(w))
		}
		ids[i] = buf[0]
	}
	return &ids
}

// appendText appends tokens [from, to) of the answer.
func (s textStream) appendText(dst []byte, from, to int) []byte {
	for i := from; i < to; i++ {
		dst = append(dst, s.word(i)...)
	}
	return dst
}

// splitmix is splitmix64's finalizer (Steele, Lea and Flood 2014): a cheap
// bijection that spreads every input bit over the output.
func splitmix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

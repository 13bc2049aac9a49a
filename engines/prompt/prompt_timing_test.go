package prompt

import (
	"strconv"
	"testing"

	"pdlb/internal/tokfiles"
	"pdlb/radix"
)

// benchChat is the gateway's per-request work on a model with real files:
// parse the body, render the template, encode, and make the index's block
// keys (16 tokens a block), for a 2,048-token multi-turn chat.
func benchChat(b *testing.B, newTurn bool) {
	m := load(b, Config{Tokenizer: tokfiles.Dir(b, "qwen3")})
	bodies := [][]byte{multiTurn(b, "a question seen before")}
	if newTurn {
		// Every request ends in a turn the caches have not seen; the
		// earlier turns were seen.
		bodies = make([][]byte, 4096)
		for i := range bodies {
			bodies[i] = multiTurn(b, "question number "+strconv.Itoa(i))
		}
	}
	var ids []uint32
	var keys []uint64
	var err error
	if ids, err = m.Chat(ids, bodies[0], false); err != nil {
		b.Fatal(err)
	}
	seed := radix.Seed("qwen3")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if ids, err = m.Chat(ids[:0], bodies[i%len(bodies)], false); err != nil {
			b.Fatal(err)
		}
		keys = radix.AppendBlockKeys(keys[:0], seed, ids, 16)
		i++
	}
	b.ReportMetric(float64(len(ids)), "tokens")
}

// BenchmarkChatSeen: the same conversation again (a retry, or a client
// resending): every segment is in the tokenizer's cache.
func BenchmarkChatSeen(b *testing.B) { benchChat(b, false) }

// BenchmarkChatNewTurn: a conversation whose new user turn of about 300
// tokens is new (its words are not).
func BenchmarkChatNewTurn(b *testing.B) { benchChat(b, true) }

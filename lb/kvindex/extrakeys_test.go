package kvindex

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/lb/openai"
	"pdlb/radix"
)

// storeAsEngine feeds p the events an engine of block size bs sends for
// tokens (whole blocks only) under lora and salt: the first two blocks in
// one event that starts the prompt, carrying the salt, then one event per
// block chained to the one before, as decode fills them. Its block hashes
// are its own chain: they depend on lora and salt, as vLLM's do.
func storeAsEngine(p *Pod, tokens []uint32, bs int, lora, salt string) {
	hashes := radix.AppendBlockKeys(nil, radix.SeedWith(0xe16e, lora, salt), tokens, bs)
	first := min(2, len(hashes))
	p.BlockStored(0, false, hashes[:first], tokens[:first*bs], bs, engines.ExtraKeys{LoRA: lora, CacheSalt: salt})
	for i := first; i < len(hashes); i++ {
		p.BlockStored(hashes[i-1], true, hashes[i:i+1], tokens[i*bs:(i+1)*bs], bs, engines.ExtraKeys{LoRA: lora})
	}
}

// TestEventKeysAreRequestKeys: a request's keys (as the gateway computes
// them from its body, cache_salt included) equal the keys the index builds
// from the engine's BlockStored events for the same tokens, whether the
// engine's blocks are the gateway's size, larger or smaller; a request of
// another salt, or without one, matches none of them, and neither do an
// adapter's blocks a plain request.
func TestEventKeysAreRequestKeys(t *testing.T) {
	const pod = 7
	// requestKeys parses a chat request with salt (none if "") and
	// returns its tokens and block keys of gw tokens, as the gateway's
	// lookup does.
	question := strings.Repeat("Explain prefix caching with an example of two requests sharing a system prompt, then say why a cache salt keeps tenants apart. ", 12)
	requestKeys := func(t *testing.T, salt string, gw int) ([]uint32, []uint64) {
		t.Helper()
		body := `{"model":"m","messages":[{"role":"system","content":"You answer in one line."},` +
			`{"role":"user","content":"` + question + `"}]`
		if salt != "" {
			body += `,"cache_salt":"` + salt + `"`
		}
		var r openai.Request
		if err := r.Parse(openai.KindChat, []byte(body+"}")); err != nil {
			t.Fatal(err)
		}
		return tokenize.Append(nil, r.Prompt), tokenize.AppendBlockKeys(nil, r.KeySeed(radix.Seed(model)), r.Prompt, gw)
	}
	f := func(t *testing.T, engineBS, gw int) {
		fake, p := newPod(t, Config{BlockSize: gw})
		tokens, plain := requestKeys(t, "", gw)
		_, saltA := requestKeys(t, "tenant-a", gw)
		_, saltB := requestKeys(t, "tenant-b", gw)
		adapter := radix.AppendBlockKeys(nil, radix.SeedWith(radix.Seed(model), "sql-lora", ""), tokens, gw)
		adapterA := radix.AppendBlockKeys(nil, radix.SeedWith(radix.Seed(model), "sql-lora", "tenant-a"), tokens, gw)
		if len(plain) < 8 || len(saltA) != len(plain) {
			t.Fatalf("prompt of %d keys, want 8 at least", len(plain))
		}
		match := func(name string, keys []uint64, want int) {
			t.Helper()
			if got := fake.match(pod, keys); got != want {
				t.Fatalf("engine blocks of %d, gateway's of %d: %s matches %d of %d blocks, want %d", engineBS, gw, name, got, len(keys), want)
			}
		}
		storeAsEngine(p, tokens, engineBS, "", "tenant-a")
		match("salt a", saltA, len(saltA))
		match("salt b", saltB, 0)
		match("no salt", plain, 0)
		storeAsEngine(p, tokens, engineBS, "", "")
		match("no salt", plain, len(plain))
		match("salt b", saltB, 0)
		storeAsEngine(p, tokens, engineBS, "sql-lora", "")
		match("adapter", adapter, len(adapter))
		match("adapter with salt a", adapterA, 0)
		storeAsEngine(p, tokens, engineBS, "sql-lora", "tenant-a")
		match("adapter with salt a", adapterA, len(adapterA))
		if n := p.Counters.Mismatched.Load() + p.Counters.Orphans.Load(); n != 0 {
			t.Fatalf("%d events dropped", n)
		}
		// Every key the index holds is one of the requests'.
		all := slices.Concat(plain, saltA, adapter, adapterA)
		for k := range fake.held[pod] {
			if !slices.Contains(all, k) {
				t.Fatalf("engine blocks of %d, gateway's of %d: the index holds key %x no request has", engineBS, gw, k)
			}
		}
	}
	for _, sizes := range [][2]int{{16, 16}, {32, 16}, {16, 32}, {64, 16}, {4, 16}, {1, 16}} {
		t.Run(fmt.Sprintf("engine%d_gateway%d", sizes[0], sizes[1]), func(t *testing.T) { f(t, sizes[0], sizes[1]) })
	}
}

// TestMediaBlocksMatchNoText: a block the engine hashed with multimodal
// inputs, and every block chained after it, match no text request; the
// blocks before it still do, as their engine hashes equal a text prompt's.
func TestMediaBlocksMatchNoText(t *testing.T) {
	f := func(engineBS, gw, mediaBlock, want int) {
		t.Helper()
		fake, p := newPod(t, Config{BlockSize: gw})
		tokens := prompt(8*engineBS, 1)
		keys := gatewayKeys(tokens, gw)
		media := make([]uint64, 6)
		media[mediaBlock] = 0x1a6e
		hashes := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
		p.BlockStored(0, false, hashes[:6], tokens[:6*engineBS], engineBS, engines.ExtraKeys{Media: media})
		p.BlockStored(6, true, hashes[6:], tokens[6*engineBS:], engineBS, engines.ExtraKeys{})
		if got := fake.match(7, keys); got != want || len(fake.held[7]) != len(keys) {
			t.Fatalf("engine blocks of %d, gateway's of %d, media in block %d: text matches %d blocks (index holds %d), want %d (%d)",
				engineBS, gw, mediaBlock, got, len(fake.held[7]), want, len(keys))
		}
	}
	f(4, 4, 2, 2)
	f(4, 4, 0, 0)
	f(8, 4, 1, 2)
	f(4, 8, 2, 1) // engine block 2 lies in gateway block 1
	f(4, 8, 3, 1)
	// Digests that do not match the blocks are refused.
	_, p := newPod(t, Config{BlockSize: 4})
	p.BlockStored(0, false, []uint64{1, 2}, prompt(8, 1), 4, engines.ExtraKeys{Media: []uint64{1}})
	if p.Counters.Mismatched.Load() != 1 || p.Blocks() != 0 {
		t.Fatalf("mismatched %d blocks %d, want 1 0", p.Counters.Mismatched.Load(), p.Blocks())
	}
}

// TestSmallerEngineBlocks: with engine blocks smaller than the gateway's,
// the engine block that completes a gateway block holds its key, computed
// from its tokens and those of the blocks before it, which may have come
// in earlier events; removing it removes the key, removing another block
// removes none.
func TestSmallerEngineBlocks(t *testing.T) {
	fake, p := newPod(t, Config{BlockSize: 8})
	tokens := prompt(40, 1) // 10 engine blocks of 4, 5 gateway blocks of 8
	keys := gatewayKeys(tokens, 8)
	p.BlockStored(0, false, []uint64{1, 2, 3}, tokens[:12], 4, engines.ExtraKeys{})
	if got := fake.match(7, keys); got != 1 || len(fake.inserts) != 1 {
		t.Fatalf("3 engine blocks: match %d inserts %d, want 1 1", got, len(fake.inserts))
	}
	p.BlockStored(3, true, []uint64{4}, tokens[12:16], 4, engines.ExtraKeys{})
	p.BlockStored(4, true, []uint64{5}, tokens[16:20], 4, engines.ExtraKeys{}) // no key: not inserted
	if got := fake.match(7, keys); got != 2 || len(fake.inserts) != 2 || !slices.Equal(fake.inserts[1], keys[:2]) {
		t.Fatalf("5 engine blocks: match %d inserts %x, want 2 and chains %x", got, fake.inserts, keys[:2])
	}
	p.BlockStored(5, true, []uint64{6, 7, 8, 9, 10}, tokens[20:], 4, engines.ExtraKeys{})
	if got := fake.match(7, keys); got != 5 {
		t.Fatalf("10 engine blocks: match %d, want 5", got)
	}
	p.BlockRemoved([]uint64{10, 9})
	if got := fake.match(7, keys); got != 4 || len(fake.removes) != 1 || !slices.Equal(fake.removes[0], keys[4:]) {
		t.Fatalf("after removing blocks 10, 9: match %d removes %x, want 4 and %x", got, fake.removes, keys[4:])
	}
	p.BlockRemoved([]uint64{7}) // the first half of gateway block 3: its key stays with block 8
	if got := fake.match(7, keys); got != 4 || len(fake.removes) != 1 {
		t.Fatalf("after removing block 7: match %d removes %d, want 4 1", got, len(fake.removes))
	}
	p.BlockRemoved([]uint64{8, 6, 5, 4, 3, 2, 1})
	if got := fake.match(7, keys); got != 0 || p.Blocks() != 0 || len(p.byHash) != 0 || len(p.slots) != len(p.free) {
		t.Fatalf("after removing all: match %d blocks %d map %d, want all gone", got, p.Blocks(), len(p.byHash))
	}
	// Freed slots are reused, tokens and depth overwritten.
	other := prompt(16, 2)
	p.BlockStored(0, false, []uint64{11, 12, 13, 14}, other, 4, engines.ExtraKeys{})
	if got := fake.match(7, gatewayKeys(other, 8)); got != 2 {
		t.Fatalf("after reuse: match %d, want 2", got)
	}
}

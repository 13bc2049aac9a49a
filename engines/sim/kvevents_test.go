package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/internal/testwait"
	"pdlb/radix"
)

// kvEvent is one sink call, copied out of the pod's scratch slices.
type kvEvent struct {
	kind      string // stored, removed, cleared
	parent    uint64
	hasParent bool
	hashes    []uint64
	tokens    []uint32
	blockSize int
	salt      string
	lora      string
}

type recordingSink struct {
	mu     sync.Mutex
	events []kvEvent
}

func (s *recordingSink) BlockStored(parent uint64, hasParent bool, hashes []uint64, tokens []uint32, blockSize int, extra engines.ExtraKeys) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, kvEvent{"stored", parent, hasParent, slices.Clone(hashes), slices.Clone(tokens), blockSize, extra.CacheSalt, extra.LoRA})
}

func (s *recordingSink) BlockRemoved(hashes []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, kvEvent{kind: "removed", hashes: slices.Clone(hashes)})
}

func (s *recordingSink) AllBlocksCleared() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, kvEvent{kind: "cleared"})
}

// take returns and forgets the events so far.
func (s *recordingSink) take() []kvEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.events
	s.events = nil
	return e
}

// expectedEvents is what a vLLM pod whose cache is mirror must report when
// it serves a prompt of tokens with keys alone, to its first token:
// computed independently, from the shared cache and the stored/evicted
// keys it reports. vLLM's hit stops a token short of the prompt; the
// prompt's blocks, allocated beside it, evict cached ones (reported first),
// and those after the hit are cached anew.
func expectedEvents(mirror *PrefixCache, keys []uint64, tokens []uint32, bs int) []kvEvent {
	hit := min(mirror.Match(keys), (len(tokens)-1)/bs)
	nodes, _ := mirror.Hold(keys[:hit], hit, nil, nil)
	evicted := mirror.Evict((len(tokens)+bs-1)/bs, []uint64{})
	nodes, stored := mirror.Hold(keys[hit:], 0, nodes, []uint64{})
	mirror.Release(nodes)
	var out []kvEvent
	if len(evicted) > 0 {
		out = append(out, kvEvent{kind: "removed", hashes: evicted})
	}
	isNew := func(i int) bool { return slices.Contains(stored, keys[i]) }
	for i := 0; i < len(keys); i++ {
		if !isNew(i) {
			continue
		}
		j := i
		for j < len(keys) && isNew(j) {
			j++
		}
		e := kvEvent{kind: "stored", hasParent: i > 0, hashes: keys[i:j], tokens: tokens[i*bs : j*bs], blockSize: bs}
		if i > 0 {
			e.parent = keys[i-1]
		}
		out = append(out, e)
		i = j
	}
	return out
}

func TestKVEventsFollowTheCache(t *testing.T) {
	const bs, capacity, model, hashSeed = 16, 8, "m", 5
	phys := DefaultPhysics()
	phys.BlockSize, phys.CacheBlocks = bs, capacity
	sink := &recordingSink{}
	p := testPod(t, Config{Model: model, HashSeed: hashSeed, Physics: phys, MaxModelLen: bs * capacity, Speedup: fast, KVEvents: sink})
	c := testClient(t)
	url := "http://" + p.Addr() + "/v1/completions"
	mirror := NewPrefixCache(capacity)
	seed := engineSeed(model, hashSeed)

	// Prompts share three prefixes of two blocks and differ after, so the
	// cache hits, misses, evicts, and stores runs that start mid-prompt.
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := make([][]uint32, 3)
	for i := range prefixes {
		for range 2 * bs {
			prefixes[i] = append(prefixes[i], rng.Uint32N(1000))
		}
	}
	sawRemoved, sawParent := false, false
	for step := range 40 {
		tokens := slices.Clone(prefixes[rng.IntN(len(prefixes))])
		for range rng.IntN(3 * bs) {
			tokens = append(tokens, rng.Uint32N(1000))
		}
		if status, body := post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": 1}); status != 200 {
			t.Fatalf("step %d: %d %s", step, status, body)
		}
		keys := radix.AppendBlockKeys(nil, seed, tokens, bs)
		gatewayKeys := radix.AppendBlockKeys(nil, radix.Seed(model), tokens, bs)
		if slices.ContainsFunc(keys, func(k uint64) bool { return slices.Contains(gatewayKeys, k) }) {
			t.Fatal("engine block hashes equal the gateway's keys")
		}
		want, got := expectedEvents(mirror, keys, tokens, bs), sink.take()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("step %d:\n got %v\nwant %v", step, got, want)
		}
		for _, e := range got {
			sawRemoved = sawRemoved || e.kind == "removed"
			sawParent = sawParent || e.hasParent
		}
	}
	if !sawRemoved || !sawParent {
		t.Fatalf("the scenario never evicted (%v) or stored a run after a cached block (%v)", sawRemoved, sawParent)
	}

	if status, _ := post(t, c, "http://"+p.Addr()+"/reset_prefix_cache", map[string]any{}); status != 200 {
		t.Fatalf("reset_prefix_cache: %d", status)
	}
	mirror.Clear()
	tokens := prefixes[0]
	post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": 1})
	got := sink.take()
	want := append([]kvEvent{{kind: "cleared"}}, expectedEvents(mirror, radix.AppendBlockKeys(nil, seed, tokens, bs), tokens, bs)...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after reset:\n got %v\nwant %v", got, want)
	}
}

// TestKVEventsCopyABlockComputedAgain: a vLLM pod's prefix-cache hit stops
// a token short of the prompt, so a block-aligned prompt sent again has its
// last block computed and cached again beside the cached copy, with a
// BlockStored of its own; each copy is evicted, and reported, on its own.
// SGLang's radix tree keeps one copy and reports nothing the second time.
func TestKVEventsCopyABlockComputedAgain(t *testing.T) {
	const bs, capacity = 16, 4
	phys := DefaultPhysics()
	phys.BlockSize, phys.CacheBlocks = bs, capacity
	prompt := func(first uint32) []uint32 {
		tokens := make([]uint32, 2*bs)
		for i := range tokens {
			tokens[i] = first + uint32(i)
		}
		return tokens
	}
	a, b, c := prompt(100), prompt(200), prompt(300)
	run := func(engine engines.Kind, want [][]kvEvent) {
		t.Helper()
		sink := &recordingSink{}
		p := testPod(t, Config{Engine: engine, Model: "m", Physics: phys, MaxModelLen: bs * capacity, Speedup: fast, KVEvents: sink})
		client := testClient(t)
		for i, tokens := range [][]uint32{a, a, b, c} {
			if status, body := post(t, client, "http://"+p.Addr()+"/v1/completions", map[string]any{"prompt": tokens, "max_tokens": 1}); status != 200 {
				t.Fatalf("%s request %d: %d %s", engine, i, status, body)
			}
			if got := sink.take(); fmt.Sprint(got) != fmt.Sprint(want[i]) {
				t.Fatalf("%s request %d:\n got %v\nwant %v", engine, i, got, want[i])
			}
		}
	}
	keys := func(tokens []uint32) []uint64 { return radix.AppendBlockKeys(nil, engineSeed("m", 0), tokens, bs) }
	ka, kb, kc := keys(a), keys(b), keys(c)
	stored := func(tokens []uint32, k []uint64, from int) kvEvent {
		e := kvEvent{kind: "stored", hashes: k[from:], tokens: tokens[from*bs:], blockSize: bs}
		if from > 0 {
			e.parent, e.hasParent = k[from-1], true
		}
		return e
	}
	removed := func(hashes ...uint64) kvEvent { return kvEvent{kind: "removed", hashes: hashes} }
	run(engines.VLLM, [][]kvEvent{
		{stored(a, ka, 0)},
		{stored(a, ka, 1)}, // a's last block again: two copies
		{removed(ka[1]), stored(b, kb, 0)},
		{removed(ka[1], ka[0]), stored(c, kc, 0)},
	})
	run(engines.SGLang, [][]kvEvent{
		{stored(a, ka, 0)},
		nil, // a's blocks touched
		{stored(b, kb, 0)},
		{removed(ka[1], ka[0]), stored(c, kc, 0)},
	})
}

func TestPublishStoredRuns(t *testing.T) {
	sink := &recordingSink{}
	keys := []uint64{10, 11, 12, 13, 14}
	tokens := []uint32{0, 0, 1, 1, 2, 2, 3, 3, 4, 4}
	publishStored(sink, keys, 0, []uint64{11, 13, 14}, tokens, "s", "", 2)
	want := []kvEvent{
		{kind: "stored", parent: 10, hasParent: true, hashes: []uint64{11}, tokens: []uint32{1, 1}, blockSize: 2},
		{kind: "stored", parent: 12, hasParent: true, hashes: []uint64{13, 14}, tokens: []uint32{3, 3, 4, 4}, blockSize: 2},
	}
	if got := sink.take(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	publishStored(sink, keys, 0, keys[:2], tokens, "s", "", 2)
	if got := sink.take(); len(got) != 1 || got[0].hasParent || len(got[0].hashes) != 2 || got[0].salt != "s" {
		t.Fatalf("first blocks: %v", got)
	}
	publishStored(sink, keys, 3, keys[3:], tokens[6:], "s", "", 2)
	want = []kvEvent{{kind: "stored", parent: 12, hasParent: true, hashes: []uint64{13, 14}, tokens: []uint32{3, 3, 4, 4}, blockSize: 2}}
	if got := sink.take(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("from block 3: got %v, want %v", got, want)
	}
}

func TestEngineSeed(t *testing.T) {
	if engineSeed("m", 0) == engineSeed("m", 1) || engineSeed("m", 0) == engineSeed("n", 0) ||
		engineSeed("m", 0) != engineSeed("m", 0) || engineSeed("m", 0) == radix.Seed("m") {
		t.Fatal("engineSeed must depend on model and hash seed, and differ from the gateway's seed")
	}
}

// TestCacheSaltSeparatesBlocks: as in vLLM, a prompt's cached blocks serve
// only requests of the same cache_salt (none included), and the pod
// publishes the salt with the first block of each salted prompt.
func TestCacheSaltSeparatesBlocks(t *testing.T) {
	const bs = 16
	phys := DefaultPhysics()
	phys.BlockSize = bs
	sink := &recordingSink{}
	p := testPod(t, Config{Model: "m", Physics: phys, Speedup: fast, KVEvents: sink})
	c := testClient(t)
	url := "http://" + p.Addr() + "/v1/completions"
	// A token past four blocks: a hit computes none of them again (see
	// TestKVEventsCopyABlockComputedAgain).
	tokens := make([]uint32, 4*bs+1)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	// send posts the prompt with salt (nil: none) and returns the tokens
	// the pod found cached and the hashes it published as stored.
	send := func(salt any) (hit int64, stored []uint64) {
		t.Helper()
		before := p.Stats().HitTokens
		body := map[string]any{"prompt": tokens, "max_tokens": 1}
		if salt != nil {
			body["cache_salt"] = salt
		}
		if status, b := post(t, c, url, body); status != 200 {
			t.Fatalf("salt %v: %d %s", salt, status, b)
		}
		for _, e := range sink.take() {
			if e.kind != "stored" {
				continue
			}
			if want, _ := salt.(string); e.hasParent || e.salt != want {
				t.Fatalf("salt %v: published %+v, want a first block with salt %q", salt, e, want)
			}
			stored = append(stored, e.hashes...)
		}
		return p.Stats().HitTokens - before, stored
	}
	hitA, storedA := send("tenant-a")
	hitB, storedB := send("tenant-b")
	hitPlain, storedPlain := send(nil)
	if hitA != 0 || hitB != 0 || hitPlain != 0 || len(storedA) != 4 || len(storedB) != 4 || len(storedPlain) != 4 {
		t.Fatalf("different salts shared blocks: hits %d %d %d, stored %d %d %d", hitA, hitB, hitPlain, len(storedA), len(storedB), len(storedPlain))
	}
	if slices.Equal(storedA, storedB) || slices.Equal(storedA, storedPlain) {
		t.Fatal("salted blocks have the hashes of another salt's")
	}
	if hit, stored := send("tenant-a"); hit != 4*bs || len(stored) != 0 {
		t.Fatalf("same salt again: %d tokens hit, %d blocks stored; want %d and 0", hit, len(stored), 4*bs)
	}

	for _, salt := range []any{"", 5, "a/b", "a@b", `a\b`, "a\x00", strings.Repeat("s", 129)} {
		status, b := post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": 1, "cache_salt": salt})
		if status != 400 || !strings.Contains(string(b), "Parameter 'cache_salt' must") {
			t.Fatalf("cache_salt %q: %d %s, want vLLM's 400", salt, status, b)
		}
	}
}

// TestCacheSaltPerEngine: each engine takes or refuses a cache_salt by its
// own rule (engines.Kind.CacheSaltFault): vLLM a non-empty string of at
// most 128 characters without '@', '/', '\' or NUL; TensorRT-LLM's chat a
// string that is not blank, and its completion none at all; SGLang any
// string or empty list ("" and [] salt nothing, so they share the
// unsalted blocks), while its server fails a list of salts with a 500.
func TestCacheSaltPerEngine(t *testing.T) {
	const bs = 16
	phys := DefaultPhysics()
	phys.BlockSize = bs
	// A token past four blocks, so a hit takes all four.
	tokens := make([]int, 4*bs+1)
	for i := range tokens {
		tokens[i] = 1000 + i
	}
	ids, _ := json.Marshal(tokens)
	for _, e := range engines.Kinds {
		t.Run(string(e), func(t *testing.T) {
			p := testPod(t, Config{Engine: e, Physics: phys, Speedup: fast})
			c := testClient(t)
			base := "http://" + p.Addr()
			f := func(chat bool, salt string, want int) {
				t.Helper()
				path, body := "/v1/completions", `{"max_tokens":1,"prompt":`+string(ids)
				if chat {
					path, body = "/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]`
				}
				if salt != "" {
					body += `,"cache_salt":` + salt
				}
				status, b := post(t, c, base+path, json.RawMessage(body+"}"))
				if status != want {
					t.Errorf("%s cache_salt %s: %d %s, want %d", path, salt, status, b, want)
				}
			}
			long := `"` + strings.Repeat("s", 129) + `"`
			for _, chat := range []bool{false, true} {
				for _, c := range []struct {
					salt                 string
					vllm, sglang, trtllm int // TensorRT-LLM's chat; its completion refuses any
				}{
					{``, 200, 200, 200},
					{`null`, 200, 200, 200},
					{`"tenant-a"`, 200, 200, 200},
					{`""`, 400, 200, 400},
					{`" "`, 200, 200, 400},
					{`"a/b"`, 400, 200, 200},
					{`"a\u0000"`, 400, 200, 200},
					{long, 400, 200, 200},
					{`[]`, 400, 200, 400},
					{`["s1","s2"]`, 400, 500, 400},
					{`5`, 400, 400, 400},
				} {
					want := map[engines.Kind]int{engines.VLLM: c.vllm, engines.SGLang: c.sglang, engines.TRTLLM: c.trtllm}[e]
					if e == engines.TRTLLM && !chat && c.salt != "" {
						want = 400
					}
					f(chat, c.salt, want)
				}
			}
			if e == engines.SGLang {
				// "" and [] salt nothing: they hit the unsalted prompt's blocks.
				f(false, ``, 200)
				for _, salt := range []string{`""`, `[]`} {
					before := p.Stats().HitTokens
					f(false, salt, 200)
					if hit := p.Stats().HitTokens - before; hit != 4*bs {
						t.Errorf("cache_salt %s: %d tokens hit, want the unsalted prompt's %d", salt, hit, 4*bs)
					}
				}
			}
		})
	}
}

// TestEvictionTakesThePromptTailFirst: vLLM frees a finished request's
// blocks tail first onto its free queue and evicts from the queue's head
// (KVCacheManager.free), so a full cache drops a prompt's last block and
// keeps its head: the prefix still hits. SGLang's radix tree evicts leaves
// first, to the same effect. b's three blocks, its last partly filled,
// leave room for two of a's.
func TestEvictionTakesThePromptTailFirst(t *testing.T) {
	const bs, capacity = 16, 5
	phys := DefaultPhysics()
	phys.BlockSize, phys.CacheBlocks = bs, capacity
	prompt := func(first uint32, blocks int) []uint32 {
		tokens := make([]uint32, blocks*bs+1)
		for i := range tokens {
			tokens[i] = first + uint32(i)
		}
		return tokens
	}
	a, b := prompt(100, 3), prompt(200, 2)
	ka := radix.AppendBlockKeys(nil, engineSeed("m", 0), a, bs)
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang} {
		sink := &recordingSink{}
		p := testPod(t, Config{Engine: engine, Model: "m", Physics: phys, MaxModelLen: bs * capacity, Speedup: fast, KVEvents: sink})
		c := testClient(t)
		url := "http://" + p.Addr() + "/v1/completions"
		for _, tokens := range [][]uint32{a, b} {
			if status, body := post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": 1}); status != 200 {
				t.Fatalf("%s: %d %s", engine, status, body)
			}
		}
		var removed []uint64
		for _, e := range sink.take() {
			if e.kind == "removed" {
				removed = append(removed, e.hashes...)
			}
		}
		if !slices.Equal(removed, ka[2:]) {
			t.Fatalf("%s: evicted %x, want a's last block %x", engine, removed, ka[2])
		}
		before := p.Stats().HitTokens
		post(t, c, url, map[string]any{"prompt": a, "max_tokens": 1})
		if hit := p.Stats().HitTokens - before; hit != 2*bs {
			t.Fatalf("%s: a again hit %d tokens, want its first two blocks' %d", engine, hit, 2*bs)
		}
	}
}

// TestGeneratedBlocksAreCached: the engines cache the blocks the answer's
// tokens fill, not only the prompt's, so a follow-up prompt that carries
// the answer hits them. The KV of every token but the last one sampled is
// computed: prompt + answer - 1 tokens. vLLM caches each block as its
// tokens are computed (allocate_slots caches up to request.num_tokens,
// which counts the output), and publishes it chained to the block before;
// SGLang inserts the prompt and output ids into its radix tree when the
// request finishes (cache_finished_req).
func TestGeneratedBlocksAreCached(t *testing.T) {
	const bs, answer = 16, 40
	phys := DefaultPhysics()
	phys.BlockSize = bs
	tokens := make([]uint32, 2*bs+3)
	for i := range tokens {
		tokens[i] = 100 + uint32(i)
	}
	stored := func(seq []uint32, k []uint64, from, to int) kvEvent {
		e := kvEvent{kind: "stored", hashes: k[from:to], tokens: seq[from*bs : to*bs], blockSize: bs}
		if from > 0 {
			e.parent, e.hasParent = k[from-1], true
		}
		return e
	}
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang} {
		sink := &recordingSink{}
		p := testPod(t, Config{Engine: engine, Model: "m", Physics: phys, Speedup: fast, KVEvents: sink})
		c := testClient(t)
		url := "http://" + p.Addr() + "/v1/completions"
		status, b := post(t, c, url, map[string]any{"prompt": tokens, "max_tokens": answer})
		var resp struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.Unmarshal(b, &resp); status != 200 || err != nil || len(resp.Choices) != 1 {
			t.Fatalf("%s: %d %s", engine, status, b)
		}
		// The sim's words are one stand-in token each.
		seq := tokenize.Append(slices.Clone(tokens), []byte(resp.Choices[0].Text))
		if len(seq) != len(tokens)+answer {
			t.Fatalf("%s: answer %q is not %d tokens", engine, resp.Choices[0].Text, answer)
		}
		keys := radix.AppendBlockKeys(nil, engineSeed("m", 0), seq[:len(seq)-1], bs)
		want := []kvEvent{stored(seq, keys, 0, 2), stored(seq, keys, 2, 3), stored(seq, keys, 3, 4)}
		if engine == engines.SGLang {
			want = []kvEvent{stored(seq, keys, 0, 2), stored(seq, keys, 2, 4)}
		}
		if got := sink.take(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s:\n got %v\nwant %v", engine, got, want)
		}
		// The follow-up prompt carries the answer: its four blocks hit.
		before := p.Stats().HitTokens
		post(t, c, url, map[string]any{"prompt": append(seq, 7, 8, 9), "max_tokens": 1})
		if hit := p.Stats().HitTokens - before; hit != 4*bs {
			t.Fatalf("%s: the follow-up hit %d tokens, want %d", engine, hit, 4*bs)
		}
	}
}

// TestRunningRequestsBlocksStayCached: the blocks of a running request are
// in use, so the engines never evict them: vLLM's free queue holds only
// blocks whose ref_cnt is 0 (BlockPool.free_blocks), a hit takes its blocks
// out of it (BlockPool.touch), and a new block comes from its head
// (get_new_blocks); SGLang's radix tree evicts only unlocked nodes. Other
// prompts passing through a full cache evict one another while a long
// request decodes, and its prompt's blocks still hit; they are stored once.
func TestRunningRequestsBlocksStayCached(t *testing.T) {
	const bs, capacity = 16, 8
	phys := DefaultPhysics()
	phys.BlockSize, phys.CacheBlocks = bs, capacity
	phys.DecodeBaseSec = 1e6 // the long request's first decode step never ends
	prompt := func(first uint32) []uint32 {
		tokens := make([]uint32, 2*bs+1)
		for i := range tokens {
			tokens[i] = first + uint32(i)
		}
		return tokens
	}
	long := prompt(100)
	keys := radix.AppendBlockKeys(nil, engineSeed("m", 0), long, bs)
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang} {
		sink := &recordingSink{}
		p := testPod(t, Config{Engine: engine, Model: "m", Physics: phys, MaxModelLen: bs * capacity, Speedup: fast, KVEvents: sink})
		c := testClient(t)
		url := "http://" + p.Addr() + "/v1/completions"
		ctx, cancel := context.WithCancel(context.Background())
		running := make(chan struct{})
		go func() {
			defer close(running)
			b, _ := json.Marshal(map[string]any{"prompt": long, "max_tokens": 40, "stream": true})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		testwait.For(t, "the long request decoding", func() bool { return p.Stats().GeneratedTokens == 1 })
		for i := range 4 {
			if status, body := post(t, c, url, map[string]any{"prompt": prompt(uint32(1000 * (i + 1))), "max_tokens": 1}); status != 200 {
				t.Fatalf("%s: %d %s", engine, status, body)
			}
		}
		before := p.Stats().HitTokens
		post(t, c, url, map[string]any{"prompt": long, "max_tokens": 1})
		hit := p.Stats().HitTokens - before
		if p.Stats().Running != 1 {
			t.Fatalf("%s: the long request ended early", engine)
		}
		cancel()
		<-running
		testwait.For(t, "the long request gone", func() bool { return p.Stats().Running == 0 })
		stored, removed := 0, 0
		for _, e := range sink.take() {
			for _, h := range e.hashes {
				if !slices.Contains(keys, h) {
					continue
				}
				if e.kind == "stored" {
					stored++
				} else {
					removed++
				}
			}
		}
		if hit != 2*bs || stored != len(keys) || removed != 0 {
			t.Fatalf("%s: while it ran its prompt hit %d tokens, its blocks were stored %d times and removed %d; want %d, %d and 0",
				engine, hit, stored, removed, 2*bs, len(keys))
		}
	}
}

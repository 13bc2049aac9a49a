package kvindex

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"pdlb/engines"
	engprompt "pdlb/engines/prompt"
	"pdlb/engines/sim"
	"pdlb/engines/tokenize"
	"pdlb/engines/vllm"
	"pdlb/internal/testwait"
	"pdlb/internal/tokfiles"
	"pdlb/lb/openai"
	"pdlb/radix"
)

// TestMain checks for leaked goroutines, except the one zmq4 v0.17.0 leaves
// per PUB socket (see engines/vllm's TestMain) and fasthttp's process-wide
// date ticker, which a sim pod starts (see engines/sim's).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

// newPublisher starts a vLLM publisher on loopback ports, closed when the
// test ends.
func newPublisher(t *testing.T) *vllm.Publisher {
	t.Helper()
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{
		Endpoint:       "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0",
		FlushInterval:  time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// subscribe feeds pod from pub's events and returns once the subscription
// has reached the publisher; the subscriber closes when the test ends.
func subscribe(t *testing.T, pub *vllm.Publisher, pod *Pod) *vllm.Subscriber {
	t.Helper()
	sub, err := vllm.NewSubscriber(vllm.SubscriberConfig{
		Endpoint:       pub.Endpoint(),
		ReplayEndpoint: pub.ReplayEndpoint(),
	}, pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	// Until the subscription reaches the PUB socket, batches are dropped;
	// clears are harmless to repeat.
	testwait.For(t, "the subscription to reach the publisher", func() bool {
		pub.AllBlocksCleared()
		time.Sleep(5 * time.Millisecond)
		return pod.Counters.Clears.Load() > 0
	})
	return sub
}

// simPodFeed starts a sim pod of model with cfg's physics and limits,
// publishing its KV events over ZMQ into a new index's pod 0 (tree);
// sub counts what the index took. The test fails at its end if the index
// dropped any event of the pod's.
func simPodFeed(t *testing.T, cfg sim.Config) (*sim.Pod, *radix.Tree, *vllm.Subscriber) {
	t.Helper()
	pub := newPublisher(t)
	cfg.Name, cfg.Model, cfg.Listen, cfg.Speedup, cfg.KVEvents = "sim-0", model, "127.0.0.1:0", 1000, pub
	pod, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	tree := newTree(t)
	feed := newIndexer(t, tree, Config{}).Pod(0, model)
	sub := subscribe(t, pub, feed)
	t.Cleanup(func() {
		if feed.Counters.Mismatched.Load()+feed.Counters.Orphans.Load()+sub.Counters.Malformed.Load() != 0 {
			t.Errorf("events dropped: mismatched %d orphans %d malformed %d",
				feed.Counters.Mismatched.Load(), feed.Counters.Orphans.Load(), sub.Counters.Malformed.Load())
		}
	})
	return pod, tree, sub
}

// TestFeedFromPublisher runs the whole path on loopback: an engine's
// publisher sends vLLM-format events over ZMQ, a Subscriber decodes them and
// feeds a Pod, and the index (a radix.Tree, and the naive fake beside it)
// then holds exactly the keys the gateway computes for the same chat prompt,
// though the engine hashes blocks with a seed of its own.
func TestFeedFromPublisher(t *testing.T) {
	pub := newPublisher(t)

	f := newFake()
	tree := newTree(t)
	ix := newIndexer(t, both{f, tree}, Config{})
	pod := ix.Pod(3, model)
	sub := subscribe(t, pub, pod)

	rendered := tokenize.AppendTurn(nil, []byte("system"), []byte("You are a terse assistant. Answer in one line."))
	question := strings.Repeat("Explain prefix caching for LLM inference servers, with an example of two requests sharing a system prompt. ", 8)
	rendered = tokenize.AppendTurn(rendered, []byte("user"), []byte(question))
	rendered = append(rendered, tokenize.GenerationPrompt...)
	tokens := tokenize.Append(nil, rendered)
	const bs = radix.DefaultBlockSize
	n := len(tokens) / bs
	if n < 10 {
		t.Fatalf("prompt too short: %d blocks", n)
	}
	engineHashes := radix.AppendBlockKeys(nil, 0xe16e, tokens, bs) // the engine's own seed
	gateway := radix.AppendBlockKeys(nil, radix.Seed(model), tokens, bs)

	// Prefill stores the first blocks, decode adds the rest one at a time.
	pub.BlockStored(0, false, engineHashes[:2], tokens[:2*bs], bs, engines.ExtraKeys{})
	for i := 2; i < n; i++ {
		pub.BlockStored(engineHashes[i-1], true, engineHashes[i:i+1], tokens[i*bs:(i+1)*bs], bs, engines.ExtraKeys{})
	}
	match := func(want int) {
		t.Helper()
		out := make([]int32, 4)
		tree.Match(gateway, out)
		if got := f.match(3, gateway); got != want || out[3] != int32(want) {
			t.Fatalf("gateway match = %d blocks (tree %d), want %d", got, out[3], want)
		}
	}
	testwait.For(t, "the index to store the blocks", func() bool { return pod.Blocks() == n })
	match(n)
	pub.BlockRemoved(engineHashes[n-1:])
	testwait.For(t, "the index to drop the removed block", func() bool { return pod.Blocks() == n-1 })
	match(n - 1)
	if sub.Counters.Malformed.Load() != 0 || pod.Counters.Orphans.Load() != 0 {
		t.Fatalf("malformed %d orphans %d", sub.Counters.Malformed.Load(), pod.Counters.Orphans.Load())
	}
}

// both writes into two indexes.
type both [2]Index

func (b both) Insert(pod int32, keys []uint64) {
	b[0].Insert(pod, keys)
	b[1].Insert(pod, keys)
}

func (b both) Remove(pod int32, chain []uint64, n int) {
	b[0].Remove(pod, chain, n)
	b[1].Remove(pod, chain, n)
}

func (b both) RemovePod(pod int32) {
	b[0].RemovePod(pod)
	b[1].RemovePod(pod)
}

var _ Index = (*radix.Tree)(nil)

// TestSaltedPromptsFromASimPod runs a simulated vLLM pod publishing its
// KV events over ZMQ into the index: two requests with one prompt and
// different cache salts share no cached block in the pod nor in the index;
// a third with the first's salt hits the pod's cache, and the index holds
// every block of it under the keys the gateway computes for its body.
func TestSaltedPromptsFromASimPod(t *testing.T) {
	pod, tree, _ := simPodFeed(t, sim.Config{})

	question := strings.Repeat("Which tenant asked this, and does its cache show? ", 20)
	body := func(salt string) []byte {
		return []byte(`{"model":"` + model + `","max_tokens":1,"cache_salt":"` + salt + `",` +
			`"messages":[{"role":"user","content":"` + question + `"}]}`)
	}
	// parse is the gateway's reading of the request with salt.
	parse := func(salt string) *openai.Request {
		var r openai.Request
		if err := r.Parse(openai.KindChat, body(salt)); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	keys := func(salt string) []uint64 {
		r := parse(salt)
		return tokenize.AppendBlockKeys(nil, r.KeySeed(radix.Seed(model)), r.Prompt, radix.DefaultBlockSize)
	}
	indexed := func(salt string) int {
		out := make([]int32, 1)
		tree.Match(keys(salt), out)
		return int(out[0])
	}
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	// send posts the request with salt and returns the prompt tokens the
	// pod found cached.
	send := func(salt string) int64 {
		t.Helper()
		before := pod.Stats().HitTokens
		resp, err := client.Post("http://"+pod.Addr()+"/v1/chat/completions", "application/json", bytes.NewReader(body(salt)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("salt %s: %d %s", salt, resp.StatusCode, b)
		}
		return pod.Stats().HitTokens - before
	}
	n := len(keys("tenant-a"))
	if n < 8 {
		t.Fatalf("prompt of %d blocks, want 8 at least", n)
	}
	if hit := send("tenant-a"); hit != 0 {
		t.Fatalf("first request hit %d tokens", hit)
	}
	testwait.For(t, "the index to hold tenant a's blocks", func() bool { return indexed("tenant-a") == n })
	if got := indexed("tenant-b"); got != 0 {
		t.Fatalf("tenant b's request matches %d of tenant a's blocks in the index", got)
	}
	if hit := send("tenant-b"); hit != 0 {
		t.Fatalf("tenant b's request hit %d tokens of tenant a's in the pod", hit)
	}
	testwait.For(t, "the index to hold tenant b's blocks", func() bool { return indexed("tenant-b") == n })
	// The pod's hit stops a token short of the prompt, in whole blocks of
	// its own.
	want := (tokenize.Count(parse("tenant-a").Prompt) - 1) / sim.DefaultBlockSize * sim.DefaultBlockSize
	if hit := send("tenant-a"); hit != int64(want) {
		t.Fatalf("tenant a's second request hit %d tokens in the pod, want %d", hit, want)
	}
	if got := indexed("tenant-a"); got != n {
		t.Fatalf("tenant a's request matches %d of %d blocks in the index", got, n)
	}
}

// TestCopiesFromASimPod runs a simulated vLLM pod with a cache of four
// blocks publishing over ZMQ into the index. A block-aligned prompt sent
// twice has its last block computed again, a second copy with its own
// BlockStored; evicting the older copy leaves the prompt whole in the pod
// and in the index, and evicting the rest takes it out of both.
func TestCopiesFromASimPod(t *testing.T) {
	const bs = radix.DefaultBlockSize
	phys := sim.DefaultPhysics()
	phys.BlockSize, phys.CacheBlocks = bs, 4
	pod, tree, sub := simPodFeed(t, sim.Config{Physics: phys, MaxModelLen: 4 * bs})
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()

	prompt := func(first uint32) []uint32 {
		tokens := make([]uint32, 2*bs)
		for i := range tokens {
			tokens[i] = first + uint32(i)
		}
		return tokens
	}
	a := prompt(100)
	keysA := radix.AppendBlockKeys(nil, radix.Seed(model), a, bs)
	events := sub.Counters.Events.Load()
	// send posts tokens and waits for the index to have the n events the
	// pod publishes for them.
	send := func(tokens []uint32, n uint64) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": tokens, "max_tokens": 1})
		resp, err := client.Post("http://"+pod.Addr()+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		events += n
		testwait.For(t, "the pod's events to reach the index", func() bool { return sub.Counters.Events.Load() >= events })
	}
	indexed := func(want int) {
		t.Helper()
		out := make([]int32, 1)
		if tree.Match(keysA, out); out[0] != int32(want) {
			t.Fatalf("the index matches %d of the prompt's blocks, want %d", out[0], want)
		}
	}
	send(a, 1)           // stores a's two blocks
	send(a, 1)           // stores a's last block again
	send(prompt(200), 2) // stores two blocks, evicts the older copy
	indexed(2)
	send(prompt(300), 3) // stores two blocks, evicts a's first block and last copy
	indexed(0)
}

// TestAnAnswerHitsInTheNextTurn runs a chat over a sim pod with Qwen3's
// tokenizer and template: the pod caches, and publishes, the blocks its
// answer fills as well as the prompt's, so the index matches the next
// turn's prompt, which renders the answer again, past the first prompt's
// blocks: up to the prompt and answer less the last sampled token, whose
// KV no engine computed. Qwen3's template keeps an earlier answer as it
// was sent, and its tokenizer encodes each of the sim's words (a space and
// three letters) as the one id the pod generated for it.
func TestAnAnswerHitsInTheNextTurn(t *testing.T) {
	m, err := engprompt.Load(engprompt.Config{Tokenizer: tokfiles.Dir(t, "qwen3")})
	if err != nil {
		t.Fatal(err)
	}
	const bs, answer = radix.DefaultBlockSize, 3 * radix.DefaultBlockSize
	phys := sim.DefaultPhysics()
	phys.BlockSize = bs
	pod, tree, _ := simPodFeed(t, sim.Config{Physics: phys, Prompt: m})
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()

	first := []map[string]string{
		{"role": "system", "content": "You are a terse assistant."},
		{"role": "user", "content": strings.Repeat("Explain prefix caching for LLM inference servers. ", 4)},
	}
	body, _ := json.Marshal(map[string]any{"model": model, "messages": first, "max_tokens": answer})
	resp, err := client.Post("http://"+pod.Addr()+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Choices []struct{ Message struct{ Content string } }
		Usage   struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(b, &out); resp.StatusCode != http.StatusOK || err != nil || len(out.Choices) != 1 || out.Usage.CompletionTokens != answer {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	ids, err := m.Chat(nil, body, false)
	if err != nil {
		t.Fatal(err)
	}
	next := append(first, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content},
		map[string]string{"role": "user", "content": "And with two pods?"})
	body, _ = json.Marshal(map[string]any{"model": model, "messages": next})
	nextIDs, err := m.Chat(nil, body, false)
	if err != nil {
		t.Fatal(err)
	}
	keys := radix.AppendBlockKeys(nil, radix.Seed(model), ids, bs)
	nextKeys := radix.AppendBlockKeys(nil, radix.Seed(model), nextIDs, bs)
	want := (len(ids) + answer - 1) / bs
	if want <= len(keys) {
		t.Fatalf("BUG: a %d-token answer to a %d-token prompt fills no block of its own", answer, len(ids))
	}
	matched := func(k []uint64) int {
		out := make([]int32, 1)
		tree.Match(k, out)
		return int(out[0])
	}
	testwait.For(t, "the answer's blocks to reach the index", func() bool { return matched(nextKeys) >= want })
	if got := matched(nextKeys); got != want {
		t.Fatalf("the next turn matches %d blocks, want %d", got, want)
	}
	if got := matched(keys); got != len(keys) {
		t.Fatalf("the first prompt matches %d blocks, want its %d", got, len(keys))
	}
}

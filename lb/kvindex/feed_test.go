package kvindex

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/engines/vllm"
	"pdlb/internal/testwait"
	"pdlb/radix"
)

// TestMain checks for leaked goroutines, except the one zmq4 v0.17.0 leaves
// per PUB socket (see engines/vllm's TestMain).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// TestFeedFromPublisher runs the whole path on loopback: an engine's
// publisher sends vLLM-format events over ZMQ, a Subscriber decodes them and
// feeds a Pod, and the index (a radix.Tree, and the naive fake beside it)
// then holds exactly the keys the gateway computes for the same chat prompt,
// though the engine hashes blocks with a seed of its own.
func TestFeedFromPublisher(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{
		Endpoint:       "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0",
		FlushInterval:  time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	f := newFake()
	tree, err := radix.New(radix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := New(both{f, tree}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	pod := ix.Pod(3, model)
	sub, err := vllm.NewSubscriber(vllm.SubscriberConfig{
		Endpoint:       pub.Endpoint(),
		ReplayEndpoint: pub.ReplayEndpoint(),
	}, pod)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Until the subscription reaches the PUB socket, batches are dropped;
	// clears are harmless to repeat.
	testwait.For(t, "the subscription to reach the publisher", func() bool {
		pub.AllBlocksCleared()
		time.Sleep(5 * time.Millisecond)
		return pod.Counters.Clears.Load() > 0
	})

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

package vllm

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

// TestMain checks that no goroutine outlives the tests, except one zmq4
// leaks by design: zmq4 v0.17.0 starts a sender goroutine per PUB socket
// (pubMWriter.run) and its socket Close never stops it (nothing calls
// pubMWriter.Close), so each Publisher leaves one parked goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// recorder is a BlockEvents sink that logs each call as a line.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) BlockStored(parent uint64, hasParent bool, hashes []uint64, tokens []uint32, blockSize int, extra engines.ExtraKeys) {
	line := fmt.Sprintf("stored %d/%v %v %v %d", parent, hasParent, hashes, tokens, blockSize)
	if extra.LoRA != "" || extra.CacheSalt != "" || extra.Media != nil {
		line += fmt.Sprintf(" %+v", extra)
	}
	r.add(line)
}
func (r *recorder) BlockRemoved(hashes []uint64) { r.add(fmt.Sprintf("removed %v", hashes)) }
func (r *recorder) AllBlocksCleared()            { r.add("cleared") }

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// manualPublisher starts a Publisher on free loopback ports whose batches
// are cut by the test calling flush (the ticker never fires in a test).
func manualPublisher(t *testing.T, endpoint, replay string, bufferSteps int) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{
		Endpoint:       endpoint,
		ReplayEndpoint: replay,
		FlushInterval:  time.Hour,
		BufferSteps:    bufferSteps,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// joined publishes AllBlocksCleared batches until the subscriber delivers
// one: PUB drops messages sent before a subscription reaches it, so this is
// how a test knows the live stream is flowing.
func joined(t *testing.T, p *Publisher, rec *recorder) {
	t.Helper()
	testwait.For(t, "the subscription", func() bool {
		if len(rec.snapshot()) > 0 {
			return true
		}
		p.AllBlocksCleared()
		p.flush()
		time.Sleep(10 * time.Millisecond)
		return false
	})
}

// storeEvent publishes the i-th event of a chain of one-block stores and
// returns the line recorder logs for it.
func storeEvent(p *Publisher, i int) string {
	hashes := []uint64{uint64(100 + i)}
	tokens := []uint32{uint32(i), uint32(i + 1)}
	var parent uint64 // None for the chain's first block
	if i > 0 {
		parent = uint64(99 + i)
	}
	p.BlockStored(parent, i > 0, hashes, tokens, 2, engines.ExtraKeys{})
	return fmt.Sprintf("stored %d/%v %v %v %d", parent, i > 0, hashes, tokens, 2)
}

func TestPubSubGapReplayAndRestart(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
	rec := &recorder{}
	s, err := NewSubscriber(SubscriberConfig{
		Endpoint:       p.Endpoint(),
		ReplayEndpoint: p.ReplayEndpoint(),
		RedialInterval: 10 * time.Millisecond,
	}, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	joined(t, p, rec)
	testwait.For(t, "warm-up replays", func() bool { return s.Counters.Batches.Load() == uint64(p.nextSeq) })
	gaps, replayed := s.Counters.Gaps.Load(), s.Counters.Replayed.Load()
	base := len(rec.snapshot())

	// Six batches, one event each; the third never reaches the PUB socket.
	p.dropSeq(p.nextSeq + 2)
	var want []string
	for i := range 6 {
		want = append(want, storeEvent(p, i))
		p.flush()
	}
	p.BlockRemoved([]uint64{101, 100})
	p.flush()
	want = append(want, "removed [101 100]")
	testwait.For(t, "all events", func() bool { return len(rec.snapshot()) == base+len(want) })
	if got := rec.snapshot()[base:]; !slices.Equal(got, want) {
		t.Fatalf("events:\n got %q\nwant %q", got, want)
	}
	if g := s.Counters.Gaps.Load() - gaps; g != 1 {
		t.Fatalf("gaps = %d, want 1", g)
	}
	if r := s.Counters.Replayed.Load() - replayed; r != 1 {
		t.Fatalf("replayed = %d, want 1", r)
	}

	// Restart: a new publisher on the same ports counts from 0 again. The
	// subscriber must clear the pod, then deliver the new publisher's
	// events from its seq 0 on, whichever batch it happens to see first.
	// It may see the restart on reconnecting, before its subscription
	// reaches the new publisher; what that one holds comes with the first
	// live batch that gets through, so batches go on until one has.
	ep, rp := p.Endpoint(), p.ReplayEndpoint()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	base = len(rec.snapshot())
	want = []string{"cleared"}
	p2 := manualPublisher(t, ep, rp, 0)
	defer p2.Close()
	testwait.For(t, "the new publisher's events", func() bool {
		if got := rec.snapshot(); len(got) > base+1 && got[len(got)-1] == want[len(want)-1] {
			return true
		}
		want = append(want, storeEvent(p2, len(want)-1))
		p2.flush()
		time.Sleep(10 * time.Millisecond)
		return false
	})
	if got := rec.snapshot()[base:]; !slices.Equal(got, want) {
		t.Fatalf("after restart:\n got %q\nwant %q", got, want)
	}
	if n := s.Counters.Restarts.Load(); n != 1 {
		t.Fatalf("restarts = %d, want 1", n)
	}
	if n := s.Counters.Reconnects.Load(); n == 0 {
		t.Fatal("no reconnect counted")
	}
}

// TestDataParallelRanks: the ranks of an engine started with
// --data-parallel-size share one kv_events_config and rank r listens on
// its ports + r, tagging its batches with r; a subscriber told the rank
// follows that rank alone, live and through its own replay socket.
func TestDataParallelRanks(t *testing.T) {
	const n = 3
	pubs, err := StartRanks(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", FlushInterval: time.Hour}, n)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := splitTCP(pubs[0].Endpoint())
	_, replay, _ := splitTCP(pubs[0].ReplayEndpoint())
	subs, recs := make([]*Subscriber, n), make([]*recorder, n)
	for r, p := range pubs {
		t.Cleanup(func() { p.Close() })
		_, pp, _ := splitTCP(p.Endpoint())
		_, rp, _ := splitTCP(p.ReplayEndpoint())
		if pp != port+r || rp != replay+r {
			t.Fatalf("rank %d listens on %d and %d, want %d and %d", r, pp, rp, port+r, replay+r)
		}
		recs[r] = &recorder{}
		if subs[r], err = NewSubscriber(SubscriberConfig{Endpoint: pubs[0].Endpoint(), ReplayEndpoint: pubs[0].ReplayEndpoint(),
			DataParallelRank: int64(r), RedialInterval: 10 * time.Millisecond}, recs[r]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { subs[r].Close() })
		joined(t, p, recs[r])
		testwait.For(t, "warm-up replays", func() bool { return subs[r].Counters.Batches.Load() == uint64(p.nextSeq) })
	}
	base, wants := make([]int, n), make([][]string, n)
	for r, p := range pubs {
		base[r] = len(recs[r].snapshot())
		// The last rank's first batch reaches its subscriber only by
		// replay.
		if r == n-1 {
			p.dropSeq(p.nextSeq)
		}
		for i := range 2 {
			wants[r] = append(wants[r], storeEvent(p, 10*r+i))
			p.flush()
		}
	}
	for r, p := range pubs {
		want := wants[r]
		testwait.For(t, fmt.Sprintf("rank %d's events", r), func() bool { return len(recs[r].snapshot()) >= base[r]+len(want) })
		if got := recs[r].snapshot()[base[r]:]; !slices.Equal(got, want) {
			t.Fatalf("rank %d's subscriber got %q, want %q", r, got, want)
		}
		b, err := Decode(p.since(0)[0].payload)
		if err != nil || !b.HasDPRank || b.DPRank != int64(r) {
			t.Fatalf("rank %d's batch: data_parallel_rank %d (set %v), %v", r, b.DPRank, b.HasDPRank, err)
		}
	}
	if subs[n-1].Counters.Gaps.Load() == 0 {
		t.Fatal("the withheld batch made no gap")
	}
}

// subscriberAt builds a Subscriber that holds batch last (with a digest no
// publisher will match) without running its goroutine, so a test can drive
// onBatch against a real replay socket.
func subscriberAt(t *testing.T, p *Publisher, rec *recorder, last int64) *Subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}.withDefaults()
	return &Subscriber{cfg: cfg, sink: rec, ctx: ctx, last: last, lastDigest: 1}
}

func TestCatchUpRestartPastLastSeq(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
	defer p.Close()
	var want []string
	for i := range 6 {
		want = append(want, storeEvent(p, i))
		p.flush()
	}
	rec := &recorder{}
	s := subscriberAt(t, p, rec, 1)
	// The subscriber held seq 1 of an earlier publisher; this one's seq 1
	// has another payload, so live seq 5 is not a gap to fill but a new
	// life: clear, then 0..4 by replay, then 5.
	p.ringMu.Lock()
	live := p.ring[5].payload
	p.ringMu.Unlock()
	s.onBatch(5, live)
	if got, want := rec.snapshot(), append([]string{"cleared"}, want...); !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if s.Counters.Restarts.Load() != 1 || s.Counters.Replayed.Load() != 5 || s.Counters.Gaps.Load() != 1 {
		t.Fatalf("restarts %d replayed %d gaps %d, want 1 5 1",
			s.Counters.Restarts.Load(), s.Counters.Replayed.Load(), s.Counters.Gaps.Load())
	}
}

func TestCatchUpBufferOverrun(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 2)
	defer p.Close()
	var want []string
	for i := range 6 {
		want = append(want, storeEvent(p, i))
		p.flush()
	}
	rec := &recorder{}
	s := subscriberAt(t, p, rec, 1)
	p.ringMu.Lock()
	live := p.ring[5%2].payload
	p.ringMu.Unlock()
	// Batches 2..3 fell out of the two-batch buffer: the pod's history is
	// unknown, so clear it and keep what the buffer still has.
	s.onBatch(5, live)
	if got, want := rec.snapshot(), []string{"cleared", want[4], want[5]}; !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if s.Counters.Lost.Load() != 1 {
		t.Fatalf("lost = %d, want 1", s.Counters.Lost.Load())
	}
}

func TestReplayUnreachable(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
	storeEvent(p, 0)
	p.flush()
	rec := &recorder{}
	s := subscriberAt(t, p, rec, 3)
	s.cfg.ReplayTimeout = 200 * time.Millisecond
	p.ringMu.Lock()
	live := p.ring[0].payload
	p.ringMu.Unlock()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	s.onBatch(7, live) // a gap after 3 that nobody can fill
	if got := rec.snapshot(); len(got) != 2 || got[0] != "cleared" || !strings.HasPrefix(got[1], "stored") {
		t.Fatalf("got %q, want a clear then the live batch", got)
	}
	if s.Counters.Lost.Load() != 1 {
		t.Fatalf("lost = %d, want 1", s.Counters.Lost.Load())
	}
}

func TestConfigValidate(t *testing.T) {
	f := func(err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want it to mention %q", err, want)
		}
	}
	f(PublisherConfig{Endpoint: "ipc:///tmp/x"}.withDefaults().Validate(), `Endpoint "ipc:///tmp/x"`)
	f(PublisherConfig{ReplayEndpoint: "tcp://nohost"}.withDefaults().Validate(), `ReplayEndpoint "tcp://nohost"`)
	f(PublisherConfig{BufferSteps: -1}.withDefaults().Validate(), "BufferSteps -1")
	f(PublisherConfig{FlushInterval: -time.Second}.withDefaults().Validate(), `FlushInterval "-1s"`)
	f(PublisherConfig{Encoding: 7}.withDefaults().Validate(), "Encoding 7")
	f(PublisherConfig{Engine: "tgi"}.withDefaults().Validate(), `Engine "tgi"`)
	f(SubscriberConfig{}.withDefaults().Validate(), `Endpoint ""`)
	f(SubscriberConfig{Endpoint: "tcp://h:1", ReplayTimeout: -1}.withDefaults().Validate(), `ReplayTimeout "-1ns"`)
	f(SubscriberConfig{Endpoint: "tcp://h:port"}.withDefaults().Validate(), `Endpoint "tcp://h:port" is not tcp://host:port: port "port"`)
	f(PublisherConfig{DataParallelRank: -1}.withDefaults().Validate(), "PublisherConfig.DataParallelRank -1 is negative")
	f(SubscriberConfig{Endpoint: "tcp://h:65534", DataParallelRank: 2}.withDefaults().Validate(),
		`SubscriberConfig.Endpoint "tcp://h:65534": its port + DataParallelRank 2 is past 65535`)
	if _, err := StartRanks(PublisherConfig{}, 0); err == nil {
		t.Fatal("StartRanks started no rank")
	}
	if err := (SubscriberConfig{Endpoint: "tcp://10.0.0.1:5557"}).withDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	if got := (SubscriberConfig{Endpoint: "tcp://10.0.0.1:5557"}).withDefaults().ReplayEndpoint; got != "tcp://10.0.0.1:5558" {
		t.Fatalf("default replay endpoint %q", got)
	}
	if _, err := NewSubscriber(SubscriberConfig{Endpoint: "x"}, &recorder{}); err == nil {
		t.Fatal("NewSubscriber accepted a bad endpoint")
	}
	if _, err := NewPublisher(PublisherConfig{HWM: -1}); err == nil {
		t.Fatal("NewPublisher accepted a negative HWM")
	}
}

func TestPublisherCallsAfterCloseAreDropped(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p.BlockStored(0, false, []uint64{1}, []uint32{1}, 1, engines.ExtraKeys{})
	p.BlockRemoved([]uint64{1})
	p.AllBlocksCleared()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if len(p.pending) != 0 {
		t.Fatalf("%d events pending after Close", len(p.pending))
	}
}

func TestSubscriberCloseWhileUnreachable(t *testing.T) {
	// Nothing listens on port 1 of loopback: the subscriber keeps
	// redialing until Close, which must stop it promptly.
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", RedialInterval: 5 * time.Millisecond}, &recorder{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
}

func TestSubscriberCountsMalformed(t *testing.T) {
	pub := zmq4.NewPub(context.Background(), zmq4.WithLogger(discardLog))
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	// No replay socket (port 1 refuses): gaps just cannot be filled.
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://127.0.0.1:1"}, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var seq uint64
	testwait.For(t, "malformed messages counted", func() bool {
		// Rounds repeat until the subscription is up; seqs keep counting so
		// no round looks like a publisher restart.
		seqBytes := binary.BigEndian.AppendUint64(nil, seq)
		seq++
		_ = pub.Send(zmq4.NewMsgFrom([]byte(""), seqBytes, []byte{0xc1})) // not msgpack
		_ = pub.Send(zmq4.NewMsgFrom([]byte(""), []byte{1}, []byte{}))    // seq not 8 bytes
		time.Sleep(5 * time.Millisecond)
		return s.Counters.Malformed.Load() >= 2
	})
	if len(rec.snapshot()) != 0 {
		t.Fatalf("sink called for garbage: %q", rec.snapshot())
	}
}

// checkDeliver delivers b, encoded in map layout, to a fresh Subscriber
// and checks the sink's calls and that it skipped one event (which: the
// one meant to be).
func checkDeliver(t *testing.T, b Batch, want []string, which string) {
	t.Helper()
	payload, err := Encode(nil, &b, EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	s := &Subscriber{sink: rec, last: -1}
	if !s.deliver(0, payload) {
		t.Fatal("batch not delivered")
	}
	if got := rec.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("sink calls:\n got %q\nwant %q", got, want)
	}
	if n := s.Counters.Skipped.Load(); n != 1 {
		t.Fatalf("skipped %d events, want 1 (%s)", n, which)
	}
}

// TestDeliverJoinsRemovals: vLLM and SGLang send one BlockRemoved per
// evicted block. A run of them reaches the sink as one list (the index
// then removes a chain's blocks in one pass); any other event, one the
// index skips included, ends the run.
func TestDeliverJoinsRemovals(t *testing.T) {
	removed := func(h uint64, medium string) Event {
		return Event{Kind: BlockRemoved, BlockHashes: []uint64{h}, Medium: medium}
	}
	b := Batch{Events: []Event{
		removed(3, MediumGPU), removed(2, MediumGPU), removed(1, ""),
		removed(9, "CPU"),
		removed(5, MediumGPU),
		{Kind: BlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: MediumGPU},
		{Kind: BlockRemoved, BlockHashes: []uint64{7, 6}, Medium: MediumGPU}, removed(4, MediumGPU),
	}}
	want := []string{"removed [3 2 1]", "removed [5]", "stored 0/false [7] [1 2] 2", "removed [7 6 4]"}
	checkDeliver(t, b, want, "the CPU block")
}

// TestDeliverExtraKeys: the sink gets each BlockStored's extra keys; an
// adapter's blocks are delivered when the event names the adapter, and
// skipped when it gives only a lora_id (older vLLM), which no request's
// keys can be built from.
func TestDeliverExtraKeys(t *testing.T) {
	stored := func(h uint64, loraID int64, lora, salt string) Event {
		return Event{Kind: BlockStored, BlockHashes: []uint64{h}, TokenIDs: []uint32{1}, BlockSize: 1,
			Medium: MediumGPU, LoraID: loraID, LoraName: lora, CacheSalt: salt}
	}
	b := Batch{Events: []Event{stored(1, 0, "", "s"), stored(2, 3, "ad", ""), stored(3, 3, "", ""), stored(4, 3, "ad", "s")}}
	want := []string{
		"stored 0/false [1] [1] 1 {LoRA: CacheSalt:s Media:[]}",
		"stored 0/false [2] [1] 1 {LoRA:ad CacheSalt: Media:[]}",
		"stored 0/false [4] [1] 1 {LoRA:ad CacheSalt:s Media:[]}",
	}
	checkDeliver(t, b, want, "the unnamed adapter's")
}

// groupsFixture encodes, in vLLM's map layout, a batch in which each KV-
// cache group i of kinds[i] stores a prompt's block, then group 0 evicts
// it.
func groupsFixture(t testing.TB, kinds ...string) []byte {
	t.Helper()
	buf, e, must := fixtureEncoder(t)
	kv := func(k string, v any) {
		must(e.EncodeString(k))
		must(e.Encode(v))
	}
	must(e.EncodeMapLen(2))
	kv("ts", 1.0)
	must(e.EncodeString("events"))
	must(e.EncodeArrayLen(len(kinds) + 1))
	for group, kind := range kinds {
		must(e.EncodeMapLen(10))
		kv("type", "BlockStored")
		kv("block_hashes", []uint64{7})
		kv("parent_block_hash", nil)
		kv("token_ids", []uint32{1, 2})
		kv("block_size", 2)
		kv("lora_id", nil)
		kv("medium", "GPU")
		kv("lora_name", nil)
		kv("group_idx", group)
		kv("kv_cache_spec_kind", kind)
	}
	must(e.EncodeMapLen(4))
	kv("type", "BlockRemoved")
	kv("block_hashes", []uint64{7})
	kv("medium", "GPU")
	kv("group_idx", 0)
	return buf.Bytes()
}

// TestDeliverFullAttentionGroup: of a hybrid model's groups the index
// follows the first vLLM names a kind that keeps a whole prompt, whatever
// its group_idx; the other groups' stores and evictions do not reach it.
// gpt-oss, Gemma 3 and Qwen3.5 start with sliding-window or Mamba layers,
// so their group 0 is one of those: there group 0 evicting a block its
// window left behind must not take it from the index while the full
// attention group still holds it.
func TestDeliverFullAttentionGroup(t *testing.T) {
	f := func(kinds []string, want []string, skipped uint64) {
		t.Helper()
		rec := &recorder{}
		s := &Subscriber{sink: rec, last: -1}
		if !s.deliver(0, groupsFixture(t, kinds...)) {
			t.Fatal("batch not delivered")
		}
		if got := rec.snapshot(); !slices.Equal(got, want) {
			t.Fatalf("%q: sink calls:\n got %q\nwant %q", kinds, got, want)
		}
		if n := s.Counters.Skipped.Load(); n != skipped {
			t.Fatalf("%q: skipped %d events, want %d", kinds, n, skipped)
		}
	}
	stored, removed := "stored 0/false [7] [1 2] 2", "removed [7]"
	f([]string{"sliding_window", "full_attention", "mamba"}, []string{stored}, 3)
	f([]string{"mamba", "mamba", "mamba", "full_attention"}, []string{stored}, 4)
	// Dense models, MLA ones (DeepSeek) included, have one such group.
	f([]string{"full_attention"}, []string{stored, removed}, 0)
	f([]string{"mla_attention"}, []string{stored, removed}, 0)
}

// TestPublisherNamesTheGroup: a vLLM publisher's events name their
// KV-cache group on the wire as current vLLM's do for a model of one
// kind of layers (group_idx 0 on stores and removals, kv_cache_spec_kind
// on stores); an SGLang publisher's name none, as SGLang's.
func TestPublisherNamesTheGroup(t *testing.T) {
	f := func(engine engines.Kind, want map[string]map[string]any) {
		t.Helper()
		p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", FlushInterval: time.Hour, Engine: engine})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		p.BlockStored(0, false, []uint64{1}, []uint32{1, 2}, 2, engines.ExtraKeys{})
		p.BlockRemoved([]uint64{1})
		p.flush()
		var batch struct {
			Events []map[string]any `msgpack:"events"`
		}
		if err := msgpack.Unmarshal(p.since(0)[0].payload, &batch); err != nil || len(batch.Events) != 2 {
			t.Fatalf("%s: %d events (%v)", engine, len(batch.Events), err)
		}
		for _, ev := range batch.Events {
			typ := fmt.Sprint(ev["type"])
			for _, key := range []string{"group_idx", "kv_cache_spec_kind"} {
				got, ok := ev[key]
				w, wok := want[typ][key]
				if ok != wok || fmt.Sprint(got) != fmt.Sprint(w) {
					t.Errorf("%s: %s %s = %v (sent %v), want %v (sent %v)", engine, typ, key, got, ok, w, wok)
				}
			}
		}
	}
	f(engines.VLLM, map[string]map[string]any{
		"BlockStored":  {"group_idx": 0, "kv_cache_spec_kind": "full_attention"},
		"BlockRemoved": {"group_idx": 0},
	})
	f(engines.SGLang, nil)
}

// offloadFixture encodes, field by field as msgspec writes them, a batch
// as vLLM's scheduler publishes it with the OffloadingConnector: the block
// pool's GPU events and the connector's own in one batch. The connector
// stores its CPU copy of a block with no tokens and block_size 0; an event
// type this package does not know (array or map layout) stands beside
// them, as newer engines and their connectors add types.
func offloadFixture(t testing.TB, maps bool) []byte {
	t.Helper()
	buf, e, must := fixtureEncoder(t)
	kv := func(k string, v any) {
		must(e.EncodeString(k))
		must(e.Encode(v))
	}
	if maps {
		must(e.EncodeMapLen(2))
		kv("ts", 1.5)
		must(e.EncodeString("events"))
	} else {
		must(e.EncodeArrayLen(2))
		must(e.EncodeFloat64(1.5))
	}
	must(e.EncodeArrayLen(4))
	must(e.EncodeMapLen(8))
	kv("type", "BlockStored")
	kv("block_hashes", []uint64{0xbeef})
	kv("parent_block_hash", nil)
	kv("token_ids", []uint32{1, 2, 3, 4})
	kv("block_size", 4)
	kv("lora_id", nil)
	kv("medium", "GPU")
	kv("lora_name", nil)
	must(e.EncodeMapLen(8))
	kv("type", "BlockStored")
	kv("block_hashes", [][]byte{bytes.Repeat([]byte{7}, 32)})
	kv("parent_block_hash", nil)
	kv("token_ids", []uint32{})
	kv("block_size", 0)
	kv("lora_id", nil)
	kv("medium", "CPU")
	kv("lora_name", nil)
	if maps {
		// Keys a known event has, of other types: skipped unread.
		must(e.EncodeMapLen(4))
		kv("type", "CacheStoreCommitted")
		kv("block_hashes", "r-1")
		kv("medium", 7)
		kv("block_size", -1)
	} else {
		must(e.Encode([]any{"TransferInitiated", "r-1", "GPU", "CPU", 3}))
	}
	must(e.EncodeMapLen(3))
	kv("type", "BlockRemoved")
	kv("block_hashes", []uint64{0xbeef})
	kv("medium", "GPU")
	return buf.Bytes()
}

// TestDeliverOffloadBatch: the OffloadingConnector's CPU stores and event
// types the decoder does not know are skipped one by one; the GPU events
// of their batch reach the index. Rejecting them failed the whole batch,
// and the index missed every GPU block stored and evicted with them.
func TestDeliverOffloadBatch(t *testing.T) {
	for _, maps := range []bool{true, false} {
		rec := &recorder{}
		s := &Subscriber{sink: rec, last: -1}
		if !s.deliver(0, offloadFixture(t, maps)) {
			t.Fatalf("maps %v: batch not delivered (malformed %d)", maps, s.Counters.Malformed.Load())
		}
		want := []string{"stored 0/false [48879] [1 2 3 4] 4", "removed [48879]"}
		if got := rec.snapshot(); !slices.Equal(got, want) {
			t.Fatalf("maps %v: sink calls:\n got %q\nwant %q", maps, got, want)
		}
		if n := s.Counters.Skipped.Load(); n != 2 {
			t.Fatalf("maps %v: skipped %d events, want 2 (the CPU store, the unknown type)", maps, n)
		}
	}
}

// TestRestartWhileIdleClears: a pod whose engine restarts (its cache
// empty) and then publishes nothing, as an idle engine does, must not
// keep its blocks: the subscriber sees its connection drop and come back,
// and the restarted publisher's replay buffer no longer holds the batch
// the subscriber last had. Until the sink is told, the gateway's index
// keeps routing the pod's old prompts to it as cache hits.
func TestRestartWhileIdleClears(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
	rec := &recorder{}
	s, err := NewSubscriber(SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), RedialInterval: 10 * time.Millisecond}, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	joined(t, p, rec)
	want := storeEvent(p, 0)
	p.flush()
	testwait.For(t, "the stored block", func() bool { return slices.Contains(rec.snapshot(), want) })

	ep, rp := p.Endpoint(), p.ReplayEndpoint()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p2 := manualPublisher(t, ep, rp, 0)
	defer p2.Close()
	base := len(rec.snapshot())
	testwait.For(t, "the reconnection", func() bool { return s.Counters.Reconnects.Load() > 0 })
	// Give the subscriber time to look at the restarted publisher.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && !slices.Contains(rec.snapshot()[base:], "cleared") {
		time.Sleep(20 * time.Millisecond)
	}
	if got := rec.snapshot()[base:]; !slices.Contains(got, "cleared") {
		t.Fatalf("publisher restarted (reconnects %d, restarts %d) and the sink was not cleared; calls since: %q",
			s.Counters.Reconnects.Load(), s.Counters.Restarts.Load(), got)
	}
	if s.Counters.Restarts.Load() != 1 || s.Counters.Lost.Load() != 0 {
		t.Fatalf("restarts %d lost %d, want 1 0", s.Counters.Restarts.Load(), s.Counters.Lost.Load())
	}
}

// TestRecheck: after a reconnection the subscriber asks the publisher
// whether it still holds the last batch delivered, and clears the pod
// only when it does not: the same batch (a dropped connection) keeps it;
// another batch under that seq, or none that far, is a restart; batches
// past it without it, a lost history; replay unreachable leaves the check
// to the next live batch.
func TestRecheck(t *testing.T) {
	for _, c := range []struct {
		name             string
		buffer           int   // the publisher's replay buffer, in batches (0: its default)
		last             int64 // the batch the subscriber holds
		sameDigest       bool
		closed           bool // the replay socket is gone
		restarts, lost   uint64
		cleared, checked bool
	}{
		{name: "held", last: 3, sameDigest: true, checked: true},
		{name: "another batch", last: 3, restarts: 1, cleared: true, checked: true},
		{name: "not that far", last: 9, sameDigest: true, restarts: 1, cleared: true, checked: true},
		{name: "overrun", buffer: 2, last: 1, sameDigest: true, lost: 1, cleared: true, checked: true},
		{name: "unreachable", last: 3, sameDigest: true, closed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", c.buffer)
			defer p.Close()
			var digest uint64
			for i := range 6 {
				storeEvent(p, i)
				p.flush()
				if int64(i) == c.last {
					p.ringMu.Lock()
					digest = xxhash.Sum64(p.ring[i%len(p.ring)].payload)
					p.ringMu.Unlock()
				}
			}
			rec := &recorder{}
			s := subscriberAt(t, p, rec, c.last)
			s.cfg.ReplayTimeout = 200 * time.Millisecond
			if c.sameDigest && digest != 0 {
				s.lastDigest = digest
			}
			if c.closed {
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
			}
			s.suspect = true
			s.recheck()
			got := rec.snapshot()
			if cleared := slices.Equal(got, []string{"cleared"}); cleared != c.cleared || !cleared && len(got) > 0 {
				t.Fatalf("sink calls %q, want cleared %v and nothing else", got, c.cleared)
			}
			if s.Counters.Restarts.Load() != c.restarts || s.Counters.Lost.Load() != c.lost {
				t.Fatalf("restarts %d lost %d, want %d %d", s.Counters.Restarts.Load(), s.Counters.Lost.Load(), c.restarts, c.lost)
			}
			if s.suspect == c.checked {
				t.Fatalf("suspect %v after the check, want %v", s.suspect, !c.checked)
			}
		})
	}
}

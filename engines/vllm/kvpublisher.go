package vllm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"pdlb/engines"
)

// Defaults of vLLM's KVEventsConfig and ZmqEventPublisher, and of the
// publisher's batching.
const (
	// DefaultEventsPort is vLLM's PUB port (endpoint "tcp://*:5557").
	DefaultEventsPort = 5557
	// DefaultReplayPort is the replay ROUTER port deployments pair with it.
	DefaultReplayPort = engines.DefaultKVReplayPort
	// DefaultBufferSteps is how many batches vLLM keeps for replay.
	DefaultBufferSteps = 10_000
	// DefaultHWM is vLLM's PUB high-water mark in messages: beyond it
	// batches are dropped for the socket (subscribers see a gap and
	// replay) instead of growing the send queue.
	DefaultHWM = 100_000
	// DefaultFlushInterval is how long events wait to be batched. vLLM
	// publishes once per scheduler step (milliseconds); 5 ms keeps the
	// index about as fresh without one message per call.
	DefaultFlushInterval = 5 * time.Millisecond
)

// replayEnd is the seq of the frame that ends a replay (vLLM's END_SEQ,
// (-1).to_bytes(8, "big", signed=True)); its payload is empty.
const replayEnd = -1

// PublisherConfig configures a Publisher. The zero value listens on vLLM's
// default ports on loopback.
type PublisherConfig struct {
	// Endpoint is where the PUB socket listens, tcp://host:port (default
	// "tcp://127.0.0.1:5557"). Port 0 picks a free port; Publisher.Endpoint
	// reports it.
	Endpoint string
	// ReplayEndpoint is where the replay ROUTER listens (default
	// "tcp://127.0.0.1:5558"; port 0 allowed).
	ReplayEndpoint string
	// Topic is the first frame of every message (default "", vLLM's).
	Topic string
	// BufferSteps is the number of recent batches kept for replay (default
	// DefaultBufferSteps).
	BufferSteps int
	// HWM bounds the PUB send queue in messages (default DefaultHWM).
	HWM int
	// FlushInterval is how often pending events are sent as one batch
	// (default DefaultFlushInterval).
	FlushInterval time.Duration
	// Encoding is the payload layout (default EncodingMap, current vLLM's).
	Encoding Encoding
	// DataParallelRank is the engine rank publishing (default 0): it is
	// written as the batches' data_parallel_rank, and both sockets listen
	// on their ports + DataParallelRank, as each rank of a vLLM engine
	// started with --data-parallel-size offsets the kv_events_config
	// endpoints all ranks share (ports 0 stay free ports).
	DataParallelRank int64
	// Engine is the engine whose events these are (default vLLM). vLLM's
	// name their KV-cache group: group_idx on stores and removals and
	// kv_cache_spec_kind on stores, group 0 of full attention for a model
	// of one kind of attention layers, as the simulated pods are. SGLang's
	// name none.
	Engine engines.Kind
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.Endpoint == "" {
		c.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", DefaultEventsPort)
	}
	if c.ReplayEndpoint == "" {
		c.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", DefaultReplayPort)
	}
	if c.BufferSteps == 0 {
		c.BufferSteps = DefaultBufferSteps
	}
	if c.HWM == 0 {
		c.HWM = DefaultHWM
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	return c
}

// Validate reports the first bad field of c (after defaults), naming it and
// quoting its value.
func (c PublisherConfig) Validate() error {
	if err := validateTCP("Endpoint", c.Endpoint); err != nil {
		return err
	}
	if err := validateTCP("ReplayEndpoint", c.ReplayEndpoint); err != nil {
		return err
	}
	if _, _, err := rankEndpoints("PublisherConfig", c.DataParallelRank, c.Endpoint, c.ReplayEndpoint); err != nil {
		return err
	}
	if c.BufferSteps < 0 {
		return fmt.Errorf("vllm: PublisherConfig.BufferSteps %d is negative", c.BufferSteps)
	}
	if c.HWM < 0 {
		return fmt.Errorf("vllm: PublisherConfig.HWM %d is negative", c.HWM)
	}
	if c.FlushInterval < 0 {
		return fmt.Errorf("vllm: PublisherConfig.FlushInterval %q is negative", c.FlushInterval)
	}
	if c.Encoding > EncodingArray {
		return fmt.Errorf("vllm: PublisherConfig.Encoding %d is unknown", c.Encoding)
	}
	if _, err := engines.ParseKind(string(c.Engine)); err != nil {
		return fmt.Errorf("vllm: PublisherConfig.Engine %q is unknown", c.Engine)
	}
	return nil
}

// validateTCP checks that ep is tcp://host:port with a numeric port.
func validateTCP(field, ep string) error {
	if _, _, err := splitTCP(ep); err != nil {
		return fmt.Errorf("vllm: %s %q is not tcp://host:port: %w", field, ep, err)
	}
	return nil
}

// splitTCP splits tcp://host:port.
func splitTCP(ep string) (host string, port int, err error) {
	hostPort, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, errors.New("no tcp:// scheme")
	}
	host, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "", 0, err
	}
	if port, err = strconv.Atoi(p); err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not 0 to 65535", p)
	}
	return host, port, nil
}

// rankEndpoints returns a config's endpoints (config names it in errors)
// as data-parallel rank rank uses them: each port + rank, as vLLM's
// ZmqEventPublisher offsets them (offset_endpoint_port), but a port 0,
// which picks a free port, stays 0. Both must be valid tcp:// endpoints.
func rankEndpoints(config string, rank int64, ep, replay string) (string, string, error) {
	if rank < 0 {
		return "", "", fmt.Errorf("vllm: %s.DataParallelRank %d is negative", config, rank)
	}
	out := [2]string{ep, replay}
	for i, field := range [2]string{"Endpoint", "ReplayEndpoint"} {
		host, port, _ := splitTCP(out[i])
		if port == 0 || rank == 0 {
			continue
		}
		if int64(port)+rank > 65535 {
			return "", "", fmt.Errorf("vllm: %s.%s %q: its port + DataParallelRank %d is past 65535", config, field, out[i], rank)
		}
		out[i] = "tcp://" + net.JoinHostPort(host, strconv.FormatInt(int64(port)+rank, 10))
	}
	return out[0], out[1], nil
}

// discardLog silences zmq4's own logging; the counters and errors of this
// package say what went wrong.
var discardLog = log.New(io.Discard, "", 0)

// Publisher is vLLM's ZmqEventPublisher in Go: events given to its
// BlockEvents methods are batched for FlushInterval, encoded as one
// KVEventBatch and sent on a PUB socket as [topic, seq, payload] with seq
// counting from 0; the last BufferSteps batches are kept and re-sent to
// whoever asks the replay ROUTER for them.
//
// The BlockEvents methods are safe for concurrent use and never wait on the
// network: they copy the event into a pending batch under a mutex held for
// the copy only. Encoding and sending happen on the Publisher's goroutine.
type Publisher struct {
	cfg    PublisherConfig
	pub    zmq4.Socket
	router zmq4.Socket
	topic  []byte
	// specKind is the kv_cache_spec_kind of the stores' KV-cache group,
	// "" when the events name no group (see PublisherConfig.Engine).
	specKind string

	mu      sync.Mutex
	closed  bool
	pending []Event
	// hashes and tokens hold the pending events' slices back to back, so a
	// steady stream of events allocates nothing; events slice into them
	// with full slice expressions, and appends that grow them leave earlier
	// events' data where it was.
	hashes []uint64
	tokens []uint32
	// drop holds seqs to withhold from the PUB socket (still buffered for
	// replay): a test hook for gap recovery.
	drop map[int64]bool

	nextSeq int64 // guarded by mu

	// ring holds the last BufferSteps batches for replay (see remember);
	// guarded by ringMu, shared by the flush and replay goroutines.
	ringMu     sync.Mutex
	ring       []buffered
	ringLen    int
	ringNewest int64

	// The flush goroutine's swap buffers (see flush).
	encoded  []Event
	encHash  []uint64
	encToken []uint32

	done       chan struct{} // closed by Close
	flushed    chan struct{} // closed when the flush goroutine has sent the last batch
	replayDone chan struct{} // closed when the replay goroutine has returned
}

type buffered struct {
	seq     int64
	payload []byte
}

// NewPublisher validates cfg, binds both sockets and starts publishing.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Endpoint, cfg.ReplayEndpoint, _ = rankEndpoints("PublisherConfig", cfg.DataParallelRank, cfg.Endpoint, cfg.ReplayEndpoint)
	p := &Publisher{
		cfg:        cfg,
		topic:      []byte(cfg.Topic),
		specKind:   specKindOf(cfg.Engine),
		ring:       make([]buffered, cfg.BufferSteps),
		ringNewest: -1,
		done:       make(chan struct{}),
		flushed:    make(chan struct{}),
		replayDone: make(chan struct{}),
	}
	p.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(discardLog))
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("vllm: PUB high-water mark: %w", err)
	}
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("vllm: KV events PUB: %w", err)
	}
	p.router = zmq4.NewRouter(context.Background(), zmq4.WithLogger(discardLog))
	if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
		p.pub.Close()
		p.router.Close()
		return nil, fmt.Errorf("vllm: KV events replay ROUTER: %w", err)
	}
	go p.flushLoop()
	go p.replayLoop()
	return p, nil
}

// rankPortTries bounds StartRanks' draws of free ports.
const rankPortTries = 20

// StartRanks starts the publishers of an engine's n data-parallel ranks,
// which share cfg as vLLM's ranks share one kv_events_config: publisher r
// is rank r's (cfg.DataParallelRank is ignored), on cfg's ports + r. Where
// cfg has port 0, rank 0 listens on a free port and rank r on that + r; a
// port taken by then is drawn again.
func StartRanks(cfg PublisherConfig, n int) ([]*Publisher, error) {
	if n < 1 {
		return nil, fmt.Errorf("vllm: StartRanks: %d ranks, want at least 1", n)
	}
	cfg = cfg.withDefaults()
	_, port, _ := splitTCP(cfg.Endpoint)
	_, replay, _ := splitTCP(cfg.ReplayEndpoint)
	// The system may hand out the same free port at the next draw: the
	// ports of a draw that failed are held until the ranks are started.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for try := 1; ; try++ {
		pubs, drawn, err := startRanks(cfg, n)
		if err == nil || try == rankPortTries || port != 0 && replay != 0 {
			return pubs, err
		}
		for i, free := range [2]bool{port == 0, replay == 0} {
			if free && len(drawn) == 2 {
				if l, err := net.Listen("tcp", strings.TrimPrefix(drawn[i], "tcp://")); err == nil {
					held = append(held, l)
				}
			}
		}
	}
}

// startRanks starts n publishers on cfg's ports + their rank; failing, it
// also returns the endpoints rank 0 was given (drawn, where cfg had 0).
func startRanks(cfg PublisherConfig, n int) (pubs []*Publisher, drawn []string, err error) {
	pubs = make([]*Publisher, 0, n)
	for r := range n {
		c := cfg
		c.DataParallelRank = int64(r)
		if r > 0 {
			// Rank 0's ports, free ones as drawn.
			c.Endpoint, c.ReplayEndpoint = pubs[0].Endpoint(), pubs[0].ReplayEndpoint()
		}
		p, err := NewPublisher(c)
		if err != nil {
			err = fmt.Errorf("vllm: data-parallel rank %d: %w", r, err)
			if len(pubs) > 0 {
				drawn = []string{pubs[0].Endpoint(), pubs[0].ReplayEndpoint()}
			}
			for _, p := range pubs {
				err = errors.Join(err, p.Close())
			}
			return nil, drawn, err
		}
		pubs = append(pubs, p)
	}
	return pubs, nil, nil
}

// Endpoint is the PUB socket's address, tcp://host:port, with the port
// actually bound.
func (p *Publisher) Endpoint() string { return "tcp://" + p.pub.Addr().String() }

// ReplayEndpoint is the replay ROUTER's address, tcp://host:port.
func (p *Publisher) ReplayEndpoint() string { return "tcp://" + p.router.Addr().String() }

// BlockStored queues a BlockStored event (medium GPU). Its extra keys
// are published as vLLM publishes them, but for extra.Media, which Encode
// cannot write (see Event).
func (p *Publisher) BlockStored(parentHash uint64, hasParent bool, blockHashes []uint64, tokenIDs []uint32, blockSize int, extra engines.ExtraKeys) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	h0, t0 := len(p.hashes), len(p.tokens)
	p.hashes = append(p.hashes, blockHashes...)
	p.tokens = append(p.tokens, tokenIDs...)
	p.pending = append(p.pending, Event{
		Kind:        BlockStored,
		BlockHashes: p.hashes[h0:len(p.hashes):len(p.hashes)],
		ParentHash:  parentHash,
		HasParent:   hasParent,
		TokenIDs:    p.tokens[t0:len(p.tokens):len(p.tokens)],
		BlockSize:   blockSize,
		Medium:      MediumGPU,
		LoraName:    extra.LoRA,
		CacheSalt:   extra.CacheSalt,
		HasGroup:    p.specKind != "",
		SpecKind:    p.specKind,
	})
}

// specKindOf is the kv_cache_spec_kind of engine's stores, "" when its
// events name no KV-cache group: a plain model's one group holds full
// attention.
func specKindOf(engine engines.Kind) string {
	if engine == engines.SGLang {
		return ""
	}
	return "full_attention"
}

// BlockRemoved queues one BlockRemoved event (medium GPU) per block, as
// vLLM's block pool and SGLang's radix cache send them.
func (p *Publisher) BlockRemoved(blockHashes []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	h0 := len(p.hashes)
	p.hashes = append(p.hashes, blockHashes...)
	for i := h0; i < len(p.hashes); i++ {
		p.pending = append(p.pending, Event{
			Kind:        BlockRemoved,
			BlockHashes: p.hashes[i : i+1 : i+1],
			Medium:      MediumGPU,
			HasGroup:    p.specKind != "",
		})
	}
}

// AllBlocksCleared queues an AllBlocksCleared event.
func (p *Publisher) AllBlocksCleared() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.pending = append(p.pending, Event{Kind: AllBlocksCleared})
	}
}

// dropSeq makes the publisher withhold batch seq from the PUB socket while
// keeping it for replay, as if the network had lost it. Test hook.
func (p *Publisher) dropSeq(seq int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drop == nil {
		p.drop = make(map[int64]bool)
	}
	p.drop[seq] = true
}

// Close sends what is pending, then closes both sockets and waits for the
// Publisher's goroutines to return. Events given after Close are dropped.
// One goroutine outlives it, parked for good: zmq4 v0.17.0 starts a sender
// per PUB socket (pubMWriter.run) that its Close never stops.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.done)
	<-p.flushed // the last batch is queued before the PUB socket closes
	err := errors.Join(socketClosed(p.pub.Close()), socketClosed(p.router.Close()))
	<-p.replayDone
	return err
}

// socketClosed is a zmq4 socket's Close error, but for net.ErrClosed: a
// connection whose peer dropped it is closed when it fails and taken off
// the socket later by a reaper goroutine, and a Close in between closes it
// again and reports that (the first of its connections' errors).
func socketClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (p *Publisher) flushLoop() {
	defer close(p.flushed)
	t := time.NewTicker(p.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			p.flush()
			return
		case <-t.C:
			p.flush()
		}
	}
}

// flush sends the pending events as one batch. It swaps the pending buffers
// with the flush goroutine's own under the mutex, so callers wait only for
// the swap, never for encoding or the socket.
func (p *Publisher) flush() {
	p.mu.Lock()
	if len(p.pending) == 0 {
		p.mu.Unlock()
		return
	}
	events := p.pending
	p.pending, p.encoded = p.encoded[:0], events
	p.hashes, p.encHash = p.encHash[:0], p.hashes
	p.tokens, p.encToken = p.encToken[:0], p.tokens
	seq := p.nextSeq
	p.nextSeq++
	drop := p.drop[seq]
	delete(p.drop, seq)
	p.mu.Unlock()

	b := Batch{
		TS:        float64(time.Now().UnixNano()) / 1e9,
		Events:    events,
		DPRank:    p.cfg.DataParallelRank,
		HasDPRank: true,
	}
	// The payload is kept in the ring and handed to the socket, so it gets
	// its own allocation; Encode cannot fail for events built above.
	payload, err := Encode(nil, &b, p.cfg.Encoding)
	clear(events) // let the slices into the old arrays go
	if err != nil {
		panic("BUG: vllm: encoding a KV event batch: " + err.Error())
	}
	p.remember(seq, payload)
	if drop {
		return
	}
	var seqBytes [8]byte
	binary.BigEndian.PutUint64(seqBytes[:], uint64(seq))
	// A PUB send only queues the message (zmq4 writes from its own
	// goroutine, dropping beyond HWM); an error means the socket is closed.
	_ = p.pub.Send(zmq4.NewMsgFrom(p.topic, seqBytes[:], payload))
}

// remember adds a batch to the replay ring, overwriting the oldest once
// BufferSteps are held. Batches arrive in seq order (one flush goroutine),
// so the ring always holds the consecutive seqs ringNewest-ringLen+1 ..
// ringNewest, batch seq at index seq % BufferSteps.
func (p *Publisher) remember(seq int64, payload []byte) {
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	if len(p.ring) == 0 {
		return
	}
	p.ring[seq%int64(len(p.ring))] = buffered{seq, payload}
	p.ringNewest = seq
	p.ringLen = min(p.ringLen+1, len(p.ring))
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) since(start int64) []buffered {
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	var out []buffered
	for seq := max(start, p.ringNewest-int64(p.ringLen)+1); seq <= p.ringNewest; seq++ {
		out = append(out, p.ring[seq%int64(len(p.ring))])
	}
	return out
}

// replayLoop serves replay requests: a request is [identity, "", start]
// (REQ, or DEALER with vLLM's empty delimiter) or [identity, start] (bare
// DEALER), start being 8 bytes big-endian; the answer is one [seq, payload]
// message per buffered batch from start on, then [-1, ""], each behind the
// same envelope.
func (p *Publisher) replayLoop() {
	defer close(p.replayDone)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
				continue
			}
		}
		f := msg.Frames
		var envelope [][]byte
		switch {
		case len(f) == 3 && len(f[1]) == 0 && len(f[2]) == 8:
			envelope = f[:2]
		case len(f) == 2 && len(f[1]) == 8:
			envelope = f[:1]
		default:
			continue // not a replay request
		}
		start := int64(binary.BigEndian.Uint64(f[len(f)-1]))
		for _, b := range p.since(start) {
			if p.sendReplay(envelope, b.seq, b.payload) != nil {
				break
			}
		}
		_ = p.sendReplay(envelope, replayEnd, []byte{})
	}
}

func (p *Publisher) sendReplay(envelope [][]byte, seq int64, payload []byte) error {
	var seqBytes [8]byte
	binary.BigEndian.PutUint64(seqBytes[:], uint64(seq))
	frames := make([][]byte, 0, len(envelope)+2)
	frames = append(frames, envelope...)
	frames = append(frames, seqBytes[:], payload)
	return p.router.Send(zmq4.NewMsgFrom(frames...))
}

var _ BlockEvents = (*Publisher)(nil)

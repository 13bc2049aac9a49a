package vllm

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"pdlb/internal/mono"
	"pdlb/internal/spaced"
)

// Subscriber defaults.
const (
	// DefaultReplayTimeout bounds one replay exchange, dial to end marker.
	DefaultReplayTimeout = 2 * time.Second
	// DefaultRedialInterval is the wait between dials while a pod's
	// publisher is unreachable.
	DefaultRedialInterval = 250 * time.Millisecond
)

// handshakeTimeout bounds the ZMTP handshake of a live connection: a
// publisher greets at once (libzmq answers from its I/O thread, whatever
// the engine's Python does), so a peer silent that long (a frozen engine,
// another service on the port) is dropped and redialed. It is the
// DefaultReplayTimeout a whole replay exchange has, handshake included;
// libzmq's own limit (ZMQ_HANDSHAKE_IVL) is 30 s, which would leave the
// index that long without a feed.
const handshakeTimeout = DefaultReplayTimeout

// guardedTCP is the zmq4 transport a Subscriber dials: TCP whose
// connections close when their socket's context ends. zmq4 v0.17.0 reads
// the peer's greeting with no deadline and without watching the context
// (socket.go Dial, conn.go greet), and a socket's Close closes only the
// connections whose handshake completed, so a peer that accepts and never
// greets would hold Dial, and with it Subscriber.Close, forever.
const guardedTCP = "pdlb-guarded-tcp"

func init() {
	if err := zmq4.RegisterTransport(guardedTCP, guardedTransport{transport.New("tcp")}); err != nil {
		panic(err)
	}
}

type guardedTransport struct{ transport.Transport }

// handshakeKey keys a *handshake in a socket's context: its dials get a
// deadline for the handshake, which the dialing goroutine clears once
// Dial returns.
type handshakeKey struct{}

type handshake struct {
	conn net.Conn
	// failed is told each dial that failed, on the dialing goroutine:
	// zmq4 retries those within Dial, which then never returns while the
	// port refuses.
	failed func(error)
}

func (g guardedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	h, hooked := ctx.Value(handshakeKey{}).(*handshake)
	c, err := g.Transport.Dial(ctx, d, addr)
	if err != nil {
		if hooked {
			h.failed(err)
		}
		return nil, err
	}
	// Also closes what zmq4 leaves open when a handshake fails.
	context.AfterFunc(ctx, func() { _ = c.Close() })
	if hooked {
		_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
		h.conn = c
	}
	return c, nil
}

// guarded is a tcp:// endpoint dialed through guardedTCP.
func guarded(endpoint string) string {
	return guardedTCP + "://" + strings.TrimPrefix(endpoint, "tcp://")
}

// SubscriberConfig says where a pod publishes its KV events.
type SubscriberConfig struct {
	// Endpoint is the pod's PUB socket, tcp://host:port (the pod's
	// kv_events setting; vLLM's default port is DefaultEventsPort).
	Endpoint string
	// ReplayEndpoint is the pod's replay ROUTER (default: Endpoint's host
	// with port DefaultReplayPort).
	ReplayEndpoint string
	// Topic is the subscription prefix (default "": every topic).
	Topic string
	// ReplayTimeout bounds one replay exchange (default
	// DefaultReplayTimeout).
	ReplayTimeout time.Duration
	// RedialInterval is the wait between dials (default
	// DefaultRedialInterval).
	RedialInterval time.Duration
	// DataParallelRank is the engine rank followed (default 0): a vLLM
	// engine's rank r listens on Endpoint's and ReplayEndpoint's ports + r
	// (see PublisherConfig.DataParallelRank).
	DataParallelRank int64
	// Log gets the feed's changes of state, each once (default: none):
	// lost or unreachable, connected again, a replay that failed, a
	// publisher restart.
	Log *slog.Logger
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.ReplayEndpoint == "" {
		if host, _, err := net.SplitHostPort(strings.TrimPrefix(c.Endpoint, "tcp://")); err == nil {
			c.ReplayEndpoint = "tcp://" + net.JoinHostPort(host, strconv.Itoa(DefaultReplayPort))
		}
	}
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if c.RedialInterval == 0 {
		c.RedialInterval = DefaultRedialInterval
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first bad field of c (after defaults), naming it and
// quoting its value.
func (c SubscriberConfig) Validate() error {
	if err := validateTCP("Endpoint", c.Endpoint); err != nil {
		return err
	}
	if err := validateTCP("ReplayEndpoint", c.ReplayEndpoint); err != nil {
		return err
	}
	if _, _, err := rankEndpoints("SubscriberConfig", c.DataParallelRank, c.Endpoint, c.ReplayEndpoint); err != nil {
		return err
	}
	if c.ReplayTimeout < 0 {
		return fmt.Errorf("vllm: SubscriberConfig.ReplayTimeout %q is negative", c.ReplayTimeout)
	}
	if c.RedialInterval < 0 {
		return fmt.Errorf("vllm: SubscriberConfig.RedialInterval %q is negative", c.RedialInterval)
	}
	return nil
}

// SubscriberCounters are a Subscriber's plain atomic counters, for the
// gateway to export. They only grow.
type SubscriberCounters struct {
	// Batches and Events count what was delivered, live or replayed.
	Batches atomic.Uint64
	Events  atomic.Uint64
	// Skipped counts events not meant for the GPU prefix index: another
	// medium (CPU offload), another KV-cache group than the one followed
	// (see forIndex), the blocks of a LoRA adapter without a lora_name
	// (older vLLM), which cannot be keyed as a request for the adapter is,
	// or a type of event this package does not know.
	Skipped atomic.Uint64
	// Gaps counts sequence gaps seen on the live stream.
	Gaps atomic.Uint64
	// Replayed counts batches recovered through replay.
	Replayed atomic.Uint64
	// Restarts counts publisher restarts (seq going back, or a different
	// batch under a seq already seen); each one cleared the pod.
	Restarts atomic.Uint64
	// Lost counts gaps replay could not fill (buffer overrun, replay
	// unreachable); each one cleared the pod, whose history is unknown.
	Lost atomic.Uint64
	// Malformed counts messages dropped as undecodable.
	Malformed atomic.Uint64
	// Reconnects counts lost connections to the publisher.
	Reconnects atomic.Uint64
}

// Subscriber follows one pod's KV events: it subscribes to the pod's PUB
// socket, decodes every batch, detects sequence gaps and fills them from
// the pod's replay socket, and calls its sink with the events in
// publication order, from one goroutine. When the publisher restarts (its
// seq starts again from 0) the sink is told AllBlocksCleared first. It
// redials for as long as it runs.
type Subscriber struct {
	cfg      SubscriberConfig
	sink     BlockEvents
	Counters SubscriberCounters

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// connected: the live socket holds a greeted connection (see Connected).
	connected atomic.Bool

	// Owned by the run goroutine.
	last       int64  // seq of the last batch delivered; -1: none since the (re)start
	lastDigest uint64 // xxhash of that batch's payload
	// suspect is set by a reconnection: the publisher may have restarted,
	// so its replay buffer is asked at once (recheck) and, if that fails,
	// at the next batch even if its seq follows on.
	suspect bool
	// down: the feed's failure was logged, and no connection since; a
	// pod that stays down logs nothing more.
	down bool
	// replayFailed: the last replay exchange failed, and was logged.
	replayFailed bool
	// lostLog and restartLog space the lines of batches lost and of
	// publisher restarts (feedLogEvery): a lossy feed, or a publisher
	// restarting in a loop, resets the pod each time.
	lostLog, restartLog spaced.Lines

	removed []uint64 // scratch: a run of BlockRemoved events' hashes
	// group is the KV-cache group the index follows, once a store named
	// its kind (hasGroup); see forIndex.
	group    int64
	hasGroup bool
}

// NewSubscriber validates cfg and starts following the pod; it returns at
// once (the dial happens in the background, retried every RedialInterval).
func NewSubscriber(cfg SubscriberConfig, sink BlockEvents) (*Subscriber, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Endpoint, cfg.ReplayEndpoint, _ = rankEndpoints("SubscriberConfig", cfg.DataParallelRank, cfg.Endpoint, cfg.ReplayEndpoint)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{cfg: cfg, sink: sink, ctx: ctx, cancel: cancel, done: make(chan struct{}), last: -1}
	go s.run()
	return s, nil
}

// Connected says whether the Subscriber holds a connection to the pod's
// publisher whose ZMTP handshake completed: not while the pod is down, nor
// while its port accepts and never greets. An engine frozen after the
// handshake still counts: an idle publisher sends nothing either.
func (s *Subscriber) Connected() bool { return s.connected.Load() }

// Close stops following the pod and waits for the Subscriber's goroutine;
// no sink call happens after it returns.
func (s *Subscriber) Close() error {
	s.cancel()
	<-s.done
	return nil
}

func (s *Subscriber) run() {
	defer close(s.done)
	for s.ctx.Err() == nil {
		// zmq4 dials in this goroutine (Dial), so h is this goroutine's.
		h := &handshake{failed: func(err error) { s.failed("KV-event feed unreachable", err) }}
		sub := zmq4.NewSub(context.WithValue(s.ctx, handshakeKey{}, h),
			zmq4.WithLogger(discardLog),
			zmq4.WithDialerRetry(s.cfg.RedialInterval),
			zmq4.WithDialerMaxRetries(-1)) // until the pod is up or Close
		// The subscription is kept by the socket and sent on each
		// connection it makes.
		if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err == nil {
			if err := sub.Dial(guarded(s.cfg.Endpoint)); err == nil {
				// Greeted: the stream may now be idle for as long as
				// the engine is.
				_ = h.conn.SetDeadline(time.Time{})
				s.connected.Store(true)
				if s.down {
					s.down = false
					s.cfg.Log.Info("KV-event feed connected", "endpoint", s.cfg.Endpoint)
				}
				if s.suspect {
					s.recheck()
				}
				err = s.follow(sub)
				s.connected.Store(false)
				s.failed("KV-event feed lost", err)
			} else {
				s.failed("KV-event feed unreachable", err)
			}
		}
		sub.Close()
		if s.ctx.Err() != nil {
			return
		}
		s.Counters.Reconnects.Add(1)
		s.suspect = s.last >= 0
		select {
		case <-s.ctx.Done():
		case <-time.After(s.cfg.RedialInterval):
		}
	}
}

// failed logs the feed's failure as msg, unless it is down already or
// closing.
func (s *Subscriber) failed(msg string, err error) {
	if s.down || s.ctx.Err() != nil {
		return
	}
	s.down = true
	s.cfg.Log.Warn(msg, "endpoint", s.cfg.Endpoint, "err", err)
}

// follow handles live messages until the connection fails, and returns why.
func (s *Subscriber) follow(sub zmq4.Socket) error {
	for {
		msg, err := sub.Recv()
		if err != nil {
			return err
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 8 {
			s.Counters.Malformed.Add(1)
			continue
		}
		s.onBatch(int64(binary.BigEndian.Uint64(f[1])), f[2])
	}
}

// onBatch delivers live batch seq after whatever must come first: a clear if
// the publisher restarted, the missing batches if there is a gap.
func (s *Subscriber) onBatch(seq int64, payload []byte) {
	if seq < 0 {
		s.Counters.Malformed.Add(1)
		return
	}
	if seq <= s.last {
		// A publisher counts up from 0 when it starts: seq going back
		// means a new one.
		s.restarted()
	}
	if seq != s.last+1 || s.suspect {
		if s.last >= 0 && seq > s.last+1 {
			s.Counters.Gaps.Add(1)
		}
		s.catchUp(seq)
	}
	s.suspect = false
	s.deliver(seq, payload)
}

// reset forgets the pod's state: the sink clears it, counted in c. A
// restarted pod may serve another model, so its groups are learnt again.
func (s *Subscriber) reset(c *atomic.Uint64) {
	c.Add(1)
	s.sink.AllBlocksCleared()
	s.last = -1
	s.hasGroup = false
}

// feedLogEvery is the least time between two lines of batches lost, or
// of two publisher restarts, of one feed.
const feedLogEvery = time.Minute

// lost resets the pod after batches it cannot get back (why), and logs it
// with the losses since the last line, at most once every feedLogEvery.
func (s *Subscriber) lost(why string) {
	s.reset(&s.Counters.Lost)
	if held, ok := s.lostLog.Allow(mono.Now(), feedLogEvery); ok {
		s.cfg.Log.Warn("KV-event batches lost: the pod's blocks are cleared", "endpoint", s.cfg.Endpoint,
			"why", why, "losses", held+1)
	}
}

// restarted resets the pod, whose publisher started again, and logs it
// with the restarts since the last line, at most once every feedLogEvery.
func (s *Subscriber) restarted() {
	s.reset(&s.Counters.Restarts)
	if held, ok := s.restartLog.Allow(mono.Now(), feedLogEvery); ok {
		s.cfg.Log.Info("KV-event publisher restarted: the pod's blocks are cleared", "endpoint", s.cfg.Endpoint,
			"restarts", held+1)
	}
}

// recheck asks a publisher just reconnected to whether it still holds the
// last batch delivered. An engine that restarted (its cache empty) and
// then published nothing, as an idle one does, would otherwise keep the
// pod's old blocks in the index until its next batch. It delivers
// nothing: live batches may already be queued behind the check. Replay
// unreachable, the next live batch is checked instead (suspect stays).
func (s *Subscriber) recheck() {
	r := s.replay(s.last, s.last+1)
	switch {
	case r.err != nil:
		return
	case r.mismatch || !r.held && !r.newer:
		// A different batch under seq last, or none that far: the
		// publisher started again.
		s.restarted()
	case !r.held:
		// It counted past last without holding it: history lost.
		s.lost("the publisher counted past the last batch held without keeping it")
	}
	s.suspect = false
}

// catchUp replays the batches the subscriber lacks before live batch seq.
//
// Holding batch last, it asks from last, not last+1: the publisher must
// still hold that very batch (same payload digest), else it restarted and
// counted past last while we were away (clear, then replay from 0), or its
// buffer overran (clear: the history in between is unknown). Holding
// nothing, it takes whatever the buffer has from 0, e.g. a pod's history on
// the gateway's first connect.
func (s *Subscriber) catchUp(seq int64) {
	for range 2 { // a second round only after a restart or overrun reset
		if s.last < 0 && seq == 0 {
			return
		}
		r := s.replay(max(s.last, 0), seq)
		switch {
		case r.mismatch:
			s.restarted()
			continue
		case r.gone:
			s.lost("the publisher's replay buffer no longer holds them")
			continue
		case r.err != nil && s.last >= 0 && seq > s.last+1:
			s.lost("the replay failed")
		case r.err == nil && s.last >= 0 && seq > s.last+1:
			s.lost("the publisher's replay buffer ended or had a hole before them")
		}
		return
	}
}

// replayResult says how a replay went; the delivered batches are already
// with the sink.
type replayResult struct {
	mismatch bool  // the publisher's batch under seq last differs from ours
	gone     bool  // the publisher no longer holds batch last
	held     bool  // it holds batch last, as we had it (or we hold none)
	newer    bool  // it sent a batch past last
	err      error // the exchange failed (dial, timeout)
}

// replay asks the pod's ROUTER for its batches from start on and delivers
// those that continue s.last, up to (not including) seq, the live batch in
// hand; later ones will come live. The first of a run of failed exchanges
// is logged.
func (s *Subscriber) replay(start, seq int64) replayResult {
	r := s.exchange(start, seq)
	switch {
	case r.err == nil:
		if s.replayFailed {
			s.cfg.Log.Info("KV-event replay works again", "endpoint", s.cfg.ReplayEndpoint)
		}
		s.replayFailed = false
	case !s.replayFailed && s.ctx.Err() == nil:
		s.replayFailed = true
		s.cfg.Log.Warn("KV-event replay failed", "endpoint", s.cfg.ReplayEndpoint, "err", r.err)
	}
	return r
}

// exchange is one replay exchange. It always reads to the end marker:
// zmq4 sockets must be drained before they close, or their reader
// goroutine blocks on a full queue forever.
func (s *Subscriber) exchange(start, seq int64) replayResult {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(discardLog), zmq4.WithDialerMaxRetries(0))
	defer d.Close()
	// Through guardedTCP, ctx's end closes a connection still greeting.
	if err := d.Dial(guarded(s.cfg.ReplayEndpoint)); err != nil {
		return replayResult{err: err}
	}
	var startBytes [8]byte
	binary.BigEndian.PutUint64(startBytes[:], uint64(start))
	// [empty delimiter, start]: what a REQ socket sends, so vLLM's ROUTER
	// (which wants exactly [identity, "", start]) answers too.
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, startBytes[:])); err != nil {
		return replayResult{err: err}
	}
	var r replayResult
	verified := s.last < 0 // nothing held, nothing to verify
	stopped := false
	for {
		msg, err := d.Recv()
		if err != nil {
			r.err = err
			return r
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the delimiter
		}
		if len(f) != 2 || len(f[0]) != 8 {
			s.Counters.Malformed.Add(1)
			continue
		}
		rs := int64(binary.BigEndian.Uint64(f[0]))
		if rs == replayEnd {
			r.held = verified
			return r
		}
		r.newer = r.newer || rs > s.last
		if stopped || rs >= seq {
			continue
		}
		switch {
		case !verified && rs < s.last:
			continue // older than what we hold
		case !verified && rs == s.last:
			verified = xxhash.Sum64(f[1]) == s.lastDigest
			r.mismatch = !verified
			stopped = r.mismatch
			continue
		case !verified:
			r.gone = true
			stopped = true
			continue
		case s.last >= 0 && rs != s.last+1:
			stopped = true // a hole in the buffer
			continue
		}
		if s.deliver(rs, f[1]) {
			s.Counters.Replayed.Add(1)
		}
	}
}

// deliver decodes batch seq and gives its events to the sink. A batch that
// does not decode is counted and skipped (its seq still counts as seen, so
// it does not look like a gap forever).
func (s *Subscriber) deliver(seq int64, payload []byte) bool {
	s.last, s.lastDigest = seq, xxhash.Sum64(payload)
	b, err := Decode(payload)
	if err != nil {
		s.Counters.Malformed.Add(1)
		return false
	}
	s.Counters.Batches.Add(1)
	s.Counters.Events.Add(uint64(len(b.Events) + b.Unknown))
	s.Counters.Skipped.Add(uint64(b.Unknown))
	for i := 0; i < len(b.Events); i++ {
		ev := &b.Events[i]
		switch {
		case ev.Kind == AllBlocksCleared:
			s.sink.AllBlocksCleared()
		case !s.forIndex(ev):
			s.Counters.Skipped.Add(1)
		case ev.Kind == BlockStored:
			s.sink.BlockStored(ev.ParentHash, ev.HasParent, ev.BlockHashes, ev.TokenIDs, ev.BlockSize, ev.Extra())
		case ev.Kind == BlockRemoved:
			// vLLM and SGLang send one BlockRemoved per evicted block,
			// a prompt's deepest first. The sink gets a run of them as
			// one list: the index removes a chain's blocks in one pass,
			// where one call per block walks the chain once per block
			// (quadratic in a long prompt's length).
			removed := append(s.removed[:0], ev.BlockHashes...)
			for i+1 < len(b.Events) && b.Events[i+1].Kind == BlockRemoved && s.forIndex(&b.Events[i+1]) {
				i++
				removed = append(removed, b.Events[i].BlockHashes...)
			}
			s.sink.BlockRemoved(removed)
			s.removed = removed
		}
	}
	return true
}

// forIndex says whether a block event belongs in the gateway's prefix
// index: GPU blocks (or medium unspecified) of the KV-cache group it
// follows, without a LoRA adapter or with a named one (the index keys an
// adapter's blocks by its name, as vLLM hashes them; older vLLM named it
// by lora_id only).
//
// A hybrid model's groups hold the same blocks under the same hashes, but
// only full attention (MLA included) keeps a prompt's every block: a
// sliding-window group evicts the blocks behind its window and a Mamba
// group keeps state, not blocks, and vLLM numbers groups in layer order,
// so group 0 is one of those on models whose first layers are (gpt-oss,
// Gemma 3, Qwen3.5). The followed group is the first whose stores name
// (kv_cache_spec_kind) a kind that keeps the whole prompt; stores naming
// another kind are skipped. Group 0 until then, and for engines that name
// no kind.
func (s *Subscriber) forIndex(ev *Event) bool {
	if ev.Medium != "" && ev.Medium != MediumGPU || ev.LoraID != 0 && ev.LoraName == "" {
		return false
	}
	if ev.SpecKind != "" {
		if !keepsPrompt(ev.SpecKind) {
			return false
		}
		if !s.hasGroup {
			s.group, s.hasGroup = ev.GroupIdx, true
		}
	}
	return ev.GroupIdx == s.group
}

// keepsPrompt says whether a group of this kv_cache_spec_kind holds every
// block of a cached prompt (vLLM's KVCacheSpecKind): all but windowed
// attention and recurrent state do.
func keepsPrompt(kind string) bool {
	switch kind {
	case "sliding_window", "sliding_window_mla", "chunked_local_attention", "mamba":
		return false
	}
	return true
}

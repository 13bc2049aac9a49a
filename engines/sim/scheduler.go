package sim

import (
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"pdlb/engines"
	"pdlb/radix"
)

// request is one generation as the scheduler sees it. The handler fills the
// fields of the first group before submitting and never writes them again;
// the scheduler goroutine owns the last group. progress and notify are how
// the scheduler tells the handler: it stores progress, then signals notify.
type request struct {
	rid    string
	tokens []uint32 // the prompt
	text   textStream
	seed   uint64 // what keys chain from: engineSeed, salted
	// keys are the engine block keys of the prompt's full blocks; the
	// scheduler appends those of the blocks the answer fills.
	keys        []uint64
	salt        string // the request's cache_salt ("" for none)
	lora        string // the LoRA adapter it names ("" for none)
	maxTokens   int
	limitReason uint8 // finish reason at maxTokens: length when the client set it, stop for the sim's own length
	// remote marks a decode leg: its prompt's KV comes from a prefill pod.
	// Once admitted (slot and KV room reserved, admitted closed) it waits
	// in stateReceiving until the handler has pulled the KV and sent
	// msgKVReady; its prefill then computes nothing.
	remote   bool
	admitted chan struct{}
	// pin marks a prefill leg: when it finishes, its prompt's blocks stay
	// held (pinned) for a decode pod to pull, until msgUnpin.
	pin bool

	// progress is tokens produced | finish reason<<32; the reason is set
	// once, with the final count.
	progress atomic.Uint64
	notify   chan struct{} // capacity 1: progress changed

	state reqState
	// rank is the data-parallel rank serving it: when placed, the one the
	// handler set (named by the client, or by SGLang's bootstrap room),
	// else the scheduler's pick.
	rank      int
	placed    bool
	arrival   float64 // simulated seconds
	generated int
	hit       int // prompt blocks found cached when its prefill started
	// blocks are the nodes of its rank's prefix cache it holds (in use,
	// never evicted), of keys[:len(blocks)].
	blocks    []int32
	reserved  int // KV blocks reserved at admission: prompt plus maxTokens
	held      int // KV blocks the sequence holds now
	lastToken float64
	dirty     bool
	pinned    int // KV blocks held after finishing (pin)
}

type reqState uint8

const (
	stateNew reqState = iota
	stateWaiting
	stateReceiving // admitted decode leg whose KV is on its way
	statePrefill
	stateDecode
	stateDone
)

func newRequest() *request { return &request{notify: make(chan struct{}, 1)} }

// newRemoteRequest returns a decode leg's request (see request.remote).
func newRemoteRequest() *request {
	r := newRequest()
	r.remote = true
	r.admitted = make(chan struct{})
	return r
}

// load returns the tokens produced so far and the finish reason (finishNone
// while the request runs).
func (r *request) load() (produced int, reason uint8) {
	v := r.progress.Load()
	return int(uint32(v)), uint8(v >> 32)
}

type msgKind uint8

const (
	msgSubmit msgKind = iota
	msgCancel
	msgAbortRID
	msgAbortAll
	msgClearCache
	msgKVReady // a remote request's KV arrived
	msgUnpin   // a pinned request's KV was picked up, expired or dropped
)

type schedMsg struct {
	kind msgKind
	at   float64 // simulated seconds when the message was sent
	req  *request
	rid  string
}

// scheduler is a pod's engine loop: continuous batching over the
// global-scheduling study's timing model, run as a discrete-event
// simulation that keeps up with the wall clock (times Speedup).
//
// Requests wait in FIFO order until a batch slot (at most MaxBatch admitted)
// and KV room for prompt plus max tokens are free on their data-parallel
// rank. Each rank is an engine core of its own (vLLM's EngineCore, SGLang's
// Scheduler, per DP rank): its own slots, KV cache, prefill queue and
// decode batch, timed as below. A rank's admitted requests prefill one at
// a time in FIFO order, as the study's per-pod busy queue: the uncached
// part, after a prefix-cache match at prefill start, at PrefillTokensPerSec.
// A prefill's end produces the first token and stores the prompt's blocks in
// the prefix cache. Decode runs beside prefill, in steps of
// DecodeStepSec(batch) that advance every decoding sequence by one token; a
// sequence that finishes prefill mid-step joins the next step.
//
// Under PD disaggregation (pd.go) a prefill leg finishes after its first
// token with its prompt's blocks pinned (still counted against capacity)
// until msgUnpin, and a decode leg (remote) holds its slot and blocks in
// stateReceiving until msgKVReady, then prefills nothing.
//
// Events are applied at their exact simulated times even when the goroutine
// wakes late, so the timings are those of the model whatever the load on
// the machine; only delivery to clients lags: first tokens by scheduling
// noise, later tokens by at most Tick.
type scheduler struct {
	phys    Physics
	speedup float64
	tick    time.Duration
	start   time.Time
	ranks   []rankCore // one per data-parallel rank
	// balance: ranks are picked by load as vLLM's API server picks them,
	// else in turn (pickRank); pickFrom is where the next pick begins.
	balance  bool
	pickFrom int
	loads    []rankLoad // countLoads', one per rank
	m        *podMetrics

	inbox  chan schedMsg
	done   chan struct{} // closed by Pod.Close: abort everything and return
	exited chan struct{} // closed when run returns; progress is final then

	clock     float64 // simulated time of the last event applied
	waiting   []*request
	receiving []*request // admitted remote requests waiting for their KV
	pinned    int        // KV blocks of finished prefill legs awaiting pickup
	notifyQ   []*request

	stored, evicted []uint64 // scratch for KV events
	tokScratch      []uint32
	// vocab holds the token ids of the words the pod generates (wordIDs).
	vocab *[len(words)]uint32
	// copies: the pod plays vLLM, whose cache keeps a block computed again
	// as another copy (PrefixCache.Hold); SGLang's and TensorRT-LLM's
	// radix trees keep one.
	copies bool

	// slots are the pod's LoRA adapter slots (nil when it serves none),
	// lora their use as vllm:lora_requests_info reports it.
	slots *LoRASlots
	lora  atomic.Pointer[loraActive]
}

// rankCore is one data-parallel rank: its prefix cache, where its changes
// are published (nil: nowhere), the KV blocks its requests and pinned KV
// reserve and hold, and its prefill queue and decode batch.
type rankCore struct {
	rank     int // its index
	cache    *PrefixCache
	sink     KVEventSink
	held     int
	reserved int
	// slots and full are admit's: the rank's admitted requests, and
	// whether its queue's head waits for room.
	slots int
	full  bool

	prefill     []*request // admitted, FIFO; the head computes while prefillBusy
	prefillBusy bool
	prefillEnd  float64
	decoding    []*request
	batch       []*request // sequences of the decode step in flight
	stepping    bool
	stepStart   float64
	stepEnd     float64
}

// active appends each rank's admitted requests that compute, prefilling
// and decoding, to qs.
func (s *scheduler) active(qs ...[]*request) [][]*request {
	for i := range s.ranks {
		qs = append(qs, s.ranks[i].prefill, s.ranks[i].decoding)
	}
	return qs
}

// inboxSize bounds the messages in flight to the scheduler; senders block
// beyond it, which only a burst of thousands of arrivals in one tick does.
const inboxSize = 1024

func newScheduler(cfg Config, m *podMetrics, start time.Time) *scheduler {
	s := &scheduler{
		phys:    cfg.Physics,
		speedup: cfg.Speedup,
		tick:    cfg.Tick,
		start:   start,
		ranks:   make([]rankCore, cfg.DataParallelSize),
		loads:   make([]rankLoad, cfg.DataParallelSize),
		m:       m,
		copies:  cfg.Engine == engines.VLLM,
		balance: cfg.Engine == engines.VLLM,
		vocab:   wordIDs(cfg.Prompt),
		inbox:   make(chan schedMsg, inboxSize),
		done:    make(chan struct{}),
		exited:  make(chan struct{}),
	}
	if cfg.loraEnabled() {
		s.slots = &LoRASlots{Max: cfg.MaxLoras}
	}
	sinks := append([]KVEventSink{cfg.KVEvents}, cfg.RankKVEvents...)
	for i := range s.ranks {
		s.ranks[i].rank = i
		s.ranks[i].cache = NewPrefixCache(cfg.Physics.CacheBlocks)
		if i < len(sinks) && sinks[i] != nil {
			s.ranks[i].sink = sinks[i]
			// PrefixCache reports keys only into non-nil slices.
			s.stored, s.evicted = make([]uint64, 0, 64), make([]uint64, 0, 64)
		}
	}
	return s
}

// now is the simulated time in seconds since the pod started.
func (s *scheduler) now() float64 { return time.Since(s.start).Seconds() * s.speedup }

// send hands a message to the scheduler; false when the pod is closing.
func (s *scheduler) send(m schedMsg) bool {
	m.at = s.now()
	select {
	case <-s.done:
		return false
	default:
	}
	select {
	case s.inbox <- m:
		return true
	case <-s.done:
		return false
	}
}

func (s *scheduler) run() {
	defer close(s.exited)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := s.now()
		s.advance(now)
		s.publish()
		if next, rc, prefill := s.nextEvent(); rc != nil {
			d := time.Duration((next - now) / s.speedup * float64(time.Second))
			if !prefill {
				// Decode steps come every few milliseconds of wall time;
				// waking for each would burn a core, so their tokens are
				// delivered a tick at a time. A prefill's end, a first
				// token, is worth an exact wake-up: clients measure TTFT.
				d = max(d, s.tick)
			}
			timer.Reset(d)
		} else {
			timer.Stop()
		}
		select {
		case m := <-s.inbox:
			s.handle(m)
			for more := true; more; {
				select {
				case m := <-s.inbox:
					s.handle(m)
				default:
					more = false
				}
			}
		case <-timer.C:
		case <-s.done:
			s.abortAll()
			s.publish()
			return
		}
	}
}

// nextEvent is the simulated time of the next prefill or step end of any
// rank, the rank, and whether it is a prefill's; rc is nil when the pod
// is idle.
func (s *scheduler) nextEvent() (t float64, rc *rankCore, prefill bool) {
	t = math.Inf(1)
	for i := range s.ranks {
		c := &s.ranks[i]
		if c.prefillBusy && c.prefillEnd < t {
			t, rc, prefill = c.prefillEnd, c, true
		}
		if c.stepping && c.stepEnd < t {
			t, rc, prefill = c.stepEnd, c, false
		}
	}
	return t, rc, prefill
}

// advance applies every event due by simulated time until, in time order.
func (s *scheduler) advance(until float64) {
	for {
		t, rc, prefill := s.nextEvent()
		if rc == nil || t > until {
			return
		}
		s.clock = t
		if prefill {
			s.endPrefill(rc)
		} else {
			s.endStep(rc)
		}
		s.admit()
		s.kick()
	}
}

func (s *scheduler) handle(m schedMsg) {
	s.advance(m.at)
	s.clock = max(s.clock, m.at)
	switch m.kind {
	case msgSubmit:
		r := m.req
		r.arrival = s.clock
		r.state = stateWaiting
		if !r.placed {
			r.rank = s.pickRank()
		}
		s.waiting = append(s.waiting, r)
	case msgCancel:
		s.cancel(m.req)
	case msgAbortRID:
		// As SGLang: its tokenizer manager passes an abort on only for a
		// rid it holds (TokenizerManager.abort_request), and its
		// scheduler then drops every request whose rid starts with it.
		var hit []*request
		held := false
		for _, q := range s.active(s.waiting, s.receiving) {
			for _, r := range q {
				if strings.HasPrefix(r.rid, m.rid) {
					hit, held = append(hit, r), held || r.rid == m.rid
				}
			}
		}
		if m.rid != "" && held {
			for _, r := range hit {
				s.cancel(r)
			}
		}
	case msgAbortAll:
		s.abortRunning()
	case msgKVReady:
		if r := m.req; r.state == stateReceiving {
			s.receiving = slices.DeleteFunc(s.receiving, func(q *request) bool { return q == r })
			r.state = statePrefill
			rc := &s.ranks[r.rank]
			rc.prefill = append(rc.prefill, r)
		}
	case msgUnpin:
		s.unpin(m.req)
	case msgClearCache:
		for _, rc := range s.ranks {
			rc.cache.Clear()
			if rc.sink != nil {
				rc.sink.AllBlocksCleared()
			}
		}
	}
	s.admit()
	s.kick()
}

// pickRank is the rank of an arriving request that names none. vLLM's API
// server (DPLBAsyncMPClient.get_core_engine_for_request) takes the rank
// of the least waiting plus running requests, a waiting one weighing up
// to 3 more as its rank's KV usage goes from half to full; its stats are
// the ranks' own, fresh here where vLLM's coordinator sends them every
// 100 ms. Ties go to the first from a start that moves a rank each pick.
// SGLang's DataParallelController (--load-balance-method round_robin, its
// default but on prefill pods) and the sim's TensorRT-LLM take the ranks
// in turn.
func (s *scheduler) pickRank() int {
	n := len(s.ranks)
	first := s.pickFrom
	s.pickFrom = (first + 1) % n
	if !s.balance || n == 1 {
		return first
	}
	s.countLoads()
	best, bestScore := first, math.Inf(1)
	for k := range n {
		i := (first + k) % n
		l := s.loads[i]
		score := float64(l.waiting + l.running)
		if usage := float64(l.usedBlocks) / float64(s.phys.CacheBlocks); l.waiting > 0 && usage > 0.5 {
			score += float64(l.waiting) * 6 * (usage - 0.5)
		}
		if score < bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// admit moves waiting requests into the batch in FIFO order while a slot and
// KV room for their prompt and whole output are free on their rank. A
// rank's first waiting request blocks the rank's others, as in vLLM's
// first-come-first-served scheduling; the other ranks go on.
func (s *scheduler) admit() {
	for i := range s.ranks {
		rc := &s.ranks[i]
		rc.slots, rc.full = len(rc.prefill)+len(rc.decoding), false
	}
	for _, r := range s.receiving {
		s.ranks[r.rank].slots++
	}
	for i, full := 0, 0; i < len(s.waiting) && full < len(s.ranks); {
		r := s.waiting[i]
		rc := &s.ranks[r.rank]
		if rc.full {
			i++
			continue
		}
		// Blocks of its prefix that running requests hold cost no room
		// (vLLM's allocate_slots needs blocks only past a hit in use), so
		// it holds them from now on. Room counts each block once:
		// reservations less the blocks shared.
		shared := rc.cache.InUse(r.keys[:s.maxHit(r)])
		need := s.phys.Blocks(len(r.tokens) + r.maxTokens)
		if rc.slots >= s.phys.MaxBatch || rc.reserved-rc.cache.Shared()+need-shared > s.phys.CacheBlocks {
			rc.full = true
			full++
			i++
			continue
		}
		s.waiting = slices.Delete(s.waiting, i, i+1)
		rc.slots++
		r.reserved = need
		rc.reserved += need
		r.blocks, _ = rc.cache.Hold(r.keys[:shared], shared, r.blocks[:0], nil)
		s.setHeld(r, shared)
		if r.remote {
			// The KV lands in blocks allocated now, as vLLM's and
			// SGLang's decode sides allocate before receiving.
			s.setHeld(r, s.phys.Blocks(len(r.tokens)))
			r.state = stateReceiving
			s.receiving = append(s.receiving, r)
			close(r.admitted)
			continue
		}
		r.state = statePrefill
		rc.prefill = append(rc.prefill, r)
	}
}

// maxHit is the most prompt blocks r may find cached: all whole blocks
// short of its last token (see kick).
func (s *scheduler) maxHit(r *request) int {
	return min(len(r.keys), (len(r.tokens)-1)/s.phys.BlockSize)
}

// kick starts each rank's head prefill and decode step when they are due.
func (s *scheduler) kick() {
	for i := range s.ranks {
		s.kickRank(&s.ranks[i])
	}
}

func (s *scheduler) kickRank(rc *rankCore) {
	if !rc.prefillBusy && len(rc.prefill) > 0 {
		r := rc.prefill[0]
		prompt := len(r.tokens)
		// The hit stops a token short of the prompt, whose last token
		// must be computed for its logits, and counts whole blocks: vLLM's
		// max_cache_hit_length = num_tokens - 1 (get_computed_blocks),
		// SGLang's max_prefix_len = input_len - 1, page-aligned.
		// The hit blocks are in use from now on, before the prompt's own
		// blocks are allocated, as vLLM's allocate_slots touches them.
		// It holds the blocks admit found in use already.
		cache := rc.cache
		lo := len(r.blocks)
		r.hit = max(lo, min(cache.Match(r.keys), s.maxHit(r)))
		r.blocks, _ = cache.Hold(r.keys[lo:r.hit], r.hit-lo, r.blocks, nil)
		cached := r.hit * s.phys.BlockSize
		compute := prompt - cached
		if r.remote {
			compute = 0 // the prefill pod computed it; the first token comes at once
		}
		s.setHeld(r, s.phys.Blocks(prompt))
		rc.prefillBusy = true
		rc.prefillEnd = s.clock + s.phys.PrefillSec(compute)
		if r.lora != "" && s.slots != nil && s.slots.Use(r.lora) {
			rc.prefillEnd += s.phys.AdapterLoadSec
			s.m.adapterLoads.Add(1)
		}
		s.m.prefillStarted(r.rank, prompt, cached)
	}
	if !rc.stepping && len(rc.decoding) > 0 {
		rc.batch = append(rc.batch[:0], rc.decoding...)
		rc.stepping = true
		rc.stepStart = s.clock
		rc.stepEnd = s.clock + s.phys.DecodeStepSec(len(rc.batch))
	}
}

func (s *scheduler) endPrefill(rc *rankCore) {
	r := rc.prefill[0]
	rc.prefill = slices.Delete(rc.prefill, 0, 1)
	rc.prefillBusy = false
	from := len(r.keys)
	if s.copies {
		// vLLM caches every block it computed past its hit in a new block.
		from = r.hit
	}
	s.storeBlocks(r, from)
	r.generated = 1
	r.lastToken = s.clock
	s.m.firstToken(r.rank, len(r.tokens), s.clock-r.arrival)
	if r.generated >= r.maxTokens {
		s.finish(r, r.limitReason)
		return
	}
	s.setProgress(r, finishNone)
	r.state = stateDecode
	rc.decoding = append(rc.decoding, r)
}

func (s *scheduler) endStep(rc *rankCore) {
	rc.stepping = false
	n := 0
	for _, r := range rc.batch {
		if r.state != stateDecode {
			continue // cancelled during the step
		}
		n++
		r.generated++
		s.setHeld(r, s.phys.Blocks(len(r.tokens)+r.generated))
		s.m.token(r.rank, s.clock-r.lastToken)
		r.lastToken = s.clock
		if s.copies {
			// vLLM caches a block as soon as its tokens' KV is computed.
			s.extendKeys(r)
			s.storeBlocks(r, len(r.blocks))
		}
		if r.generated >= r.maxTokens {
			s.finish(r, r.limitReason)
		} else {
			s.setProgress(r, finishNone)
		}
	}
	s.m.decodeStep(rc.rank, n, rc.stepEnd-rc.stepStart)
	clear(rc.batch)
	rc.batch = rc.batch[:0]
	rc.decoding = slices.DeleteFunc(rc.decoding, func(r *request) bool { return r.state != stateDecode })
}

// storeBlocks puts r's blocks past those it holds in its rank's prefix
// cache, in use by r, those from keys[from] on computed anew
// (PrefixCache.Hold), and reports what it stored to the rank's sink.
func (s *scheduler) storeBlocks(r *request, from int) {
	lo := len(r.blocks)
	if lo == len(r.keys) {
		return
	}
	rc := s.ranks[r.rank]
	var stored []uint64
	r.blocks, stored = rc.cache.Hold(r.keys[lo:], from-lo, r.blocks, s.stored[:0])
	if rc.sink != nil && len(stored) > 0 {
		bs := s.phys.BlockSize
		s.tokScratch = s.appendTokens(s.tokScratch[:0], r, lo*bs, len(r.keys)*bs)
		publishStored(rc.sink, r.keys, lo, stored, s.tokScratch, r.salt, r.lora, bs)
	}
	s.stored = stored
}

// setHeld makes r hold blocks KV blocks. Blocks it takes are taken from
// those cached that no request uses, least recently used first: vLLM's
// get_new_blocks evicts the blocks it allocates from its free queue's head,
// and publishes their removal then.
func (s *scheduler) setHeld(r *request, blocks int) {
	d := blocks - r.held
	r.held = blocks
	rc := &s.ranks[r.rank]
	rc.held += d
	if d <= 0 {
		return
	}
	evicted := rc.cache.Evict(rc.held, s.evicted[:0])
	if rc.sink != nil && len(evicted) > 0 {
		rc.sink.BlockRemoved(evicted)
	}
	s.evicted = evicted
}

// release gives r's blocks back to its rank's prefix cache: its first
// evicted last, as the engines free them.
func (s *scheduler) release(r *request) {
	s.ranks[r.rank].cache.Release(r.blocks)
	r.blocks = nil
}

// extendKeys appends to r.keys the keys of the blocks its answer filled.
// The KV of every token but the last one sampled is computed, so they are
// the full blocks of its prompt and answer less one token, as vLLM
// (allocate_slots) and SGLang (cache_finished_req) cache them.
func (s *scheduler) extendKeys(r *request) {
	bs := s.phys.BlockSize
	full := (len(r.tokens) + r.generated - 1) / bs
	lo := len(r.keys)
	if full <= lo {
		return
	}
	parent := r.seed
	if lo > 0 {
		parent = r.keys[lo-1]
	}
	s.tokScratch = s.appendTokens(s.tokScratch[:0], r, lo*bs, full*bs)
	r.keys = radix.AppendBlockKeys(r.keys, parent, s.tokScratch, bs)
}

// appendTokens appends tokens [from, to) of r's prompt and answer to dst.
func (s *scheduler) appendTokens(dst []uint32, r *request, from, to int) []uint32 {
	p := len(r.tokens)
	if from < p {
		dst = append(dst, r.tokens[from:min(to, p)]...)
	}
	for i := max(from, p); i < to; i++ {
		dst = append(dst, s.vocab[r.text.index(i-p)])
	}
	return dst
}

// cancel removes a request wherever it is and finishes it as aborted.
func (s *scheduler) cancel(r *request) {
	remove := func(q []*request) []*request {
		if i := slices.Index(q, r); i >= 0 {
			return slices.Delete(q, i, i+1)
		}
		return q
	}
	switch r.state {
	case stateWaiting:
		s.waiting = remove(s.waiting)
	case stateReceiving:
		s.receiving = remove(s.receiving)
	case stateDone:
		// A finished prefill leg whose handler gave up before holding
		// its KV for pickup: nobody will pull it.
		s.unpin(r)
		return
	case statePrefill:
		rc := &s.ranks[r.rank]
		if rc.prefillBusy && rc.prefill[0] == r {
			rc.prefillBusy = false
		}
		rc.prefill = remove(rc.prefill)
	case stateDecode:
		rc := &s.ranks[r.rank]
		rc.decoding = remove(rc.decoding) // a step in flight skips it
	default:
		return
	}
	s.finish(r, finishAbort)
}

func (s *scheduler) finish(r *request, reason uint8) {
	if r.generated > 0 {
		// SGLang and TensorRT-LLM cache the answer's blocks now.
		s.extendKeys(r)
		s.storeBlocks(r, len(r.keys))
	}
	r.state = stateDone
	rc := &s.ranks[r.rank]
	rc.reserved -= r.reserved
	r.reserved = 0
	if r.pin && reason != finishAbort {
		// Its prompt's blocks stay in use until a decode pod pulls them.
		r.pinned = s.phys.Blocks(len(r.tokens))
		s.pinned += r.pinned
		rc.reserved += r.pinned
		s.setHeld(r, r.pinned)
	} else {
		s.setHeld(r, 0)
		s.release(r)
	}
	s.setProgress(r, reason)
	s.m.finish(r.rank, reason, s.clock-r.arrival)
}

// unpin frees a finished prefill leg's pinned blocks; a no-op the second
// time.
func (s *scheduler) unpin(r *request) {
	if r.pinned == 0 {
		return
	}
	s.pinned -= r.pinned
	s.ranks[r.rank].reserved -= r.pinned
	r.pinned = 0
	s.setHeld(r, 0)
	s.release(r)
}

// abortRunning aborts every request the pod holds, as SGLang's abort_all.
func (s *scheduler) abortRunning() {
	for _, q := range s.active(s.waiting, s.receiving) {
		for _, r := range slices.Clone(q) {
			s.cancel(r)
		}
	}
}

// abortAll ends the pod: it aborts what it holds and what is still in the
// inbox, so no handler waits on a request nobody will finish.
func (s *scheduler) abortAll() {
	s.clock = max(s.clock, s.now())
	s.abortRunning()
	for {
		select {
		case m := <-s.inbox:
			if m.kind == msgSubmit {
				s.finish(m.req, finishAbort)
			}
		default:
			return
		}
	}
}

func (s *scheduler) setProgress(r *request, reason uint8) {
	r.progress.Store(uint64(uint32(r.generated)) | uint64(reason)<<32)
	if !r.dirty {
		r.dirty = true
		s.notifyQ = append(s.notifyQ, r)
	}
}

// countLoads sets s.loads to each rank's load now. Requests waiting for
// their KV count as waiting, as vLLM's WAITING_FOR_REMOTE_KVS requests do,
// though they hold a slot. A shared block counts once, as the engines hold
// it (vLLM's ref_cnt, SGLang's radix node lock, TensorRT-LLM's block
// reuse).
func (s *scheduler) countLoads() {
	for i := range s.ranks {
		rc := &s.ranks[i]
		s.loads[i] = rankLoad{running: len(rc.prefill) + len(rc.decoding), usedBlocks: rc.held - rc.cache.Shared()}
	}
	for _, q := range [][]*request{s.waiting, s.receiving} {
		for _, r := range q {
			s.loads[r.rank].waiting++
		}
	}
}

// publish updates the gauges scrapes read, then wakes the handlers whose
// requests progressed, once per wake-up however many tokens they got; in
// that order, so a client that saw its request end sees it gone from the
// gauges too.
func (s *scheduler) publish() {
	s.countLoads()
	s.m.setLoads(s.loads)
	s.m.pinnedBlocks.Store(int64(s.pinned))
	prefilling := 0
	for i := range s.ranks {
		prefilling += len(s.ranks[i].prefill)
	}
	s.m.prefilling.Store(int64(prefilling))
	if s.slots != nil {
		s.lora.Store(&loraActive{running: activeAdapters(s.active()...), waiting: activeAdapters(s.waiting, s.receiving)})
	}
	for _, r := range s.notifyQ {
		r.dirty = false
		select {
		case r.notify <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	clear(s.notifyQ)
	s.notifyQ = s.notifyQ[:0]
}

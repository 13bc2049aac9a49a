// Package ledger keeps the gateway's token ledgers: how many prompt tokens
// each prefill pod is computing (active) and holding as KV (kv), and how many
// each decode pod holds (decode), charged when the router picks a pod and
// released as the request moves on. AIBrix's "Token Load Scoring Policy"
// defines the charges, the lifecycle and the knobs; the scorers that read
// these counters live in lb/route (token_load, hybrid_cache_load,
// decode_token_load). The ledger keeps score, it never picks.
//
// Hot path: a charge is one probe of a sharded hash table and a few atomic
// adds on the pod's own cache lines; a release is one probe and atomic
// subtractions; neither reads the clock (the caller passes the selection's
// reading) nor allocates. A request's Ticket keeps its charge in the shard
// of the pod it charged, so cores serving different pods share no cache
// line. Pods are addressed by the gateway's int32 pod ids, whose low
// IndexBits bits index a table, so no request ever hashes a pod name.
package ledger

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// podSlot is one pod's counters. Each slot is its own 128-byte allocation;
// Go's 128-byte size class starts objects on 128-byte boundaries, so two
// pods never share a cache line, nor the adjacent-line pair x86 prefetches
// together, and charges on different pods never contend.
type podSlot struct {
	active atomic.Int64 // prefill tokens being computed (tokens)
	kv     atomic.Int64 // prefill tokens whose KV is still resident (tokens)
	decode atomic.Int64 // prompt tokens held by decode requests (tokens)
	// decodeSeqs is the sequences of the outstanding decode charges: a
	// request generates a token a step for each choice (n) of each of its
	// prompts, and each of them holds its own output's KV.
	decodeSeqs atomic.Int64
	// routedMs is Σ seqs × routed_at over the outstanding decode charges,
	// in milliseconds of the ledger clock: the output-growth term needs
	// Σ seqs × (now − routed_at) = decodeSeqs × now − routedMs.
	// Milliseconds keep the sum far from overflow (2^63 ms is 292 million
	// years).
	routedMs atomic.Int64
	// ops counts charges, so the janitor can tell "untouched" without a
	// clock read on the hot path. Releases need not count: a pod seen at zero
	// by two sweeps with no charge between them held nothing in between.
	ops     atomic.Uint64
	dropped atomic.Bool // janitor dropped the pod's series; the next charge revives it
	// id is the pod's id (SetPods); immutable.
	id int32
	// remote is the other gateway replicas' load on this pod, from the
	// shared ledger's last sync; nil when there is none.
	remote atomic.Pointer[remoteLoad]
	_      [64]byte
}

// Compile-time check that podSlot fills its size class exactly.
var _ [0]struct{} = [unsafe.Sizeof(podSlot{}) - 128]struct{}{}

// remoteLoad is the other replicas' load on one pod: their decode charges
// as of the local clock asOfMs, their prefill charges, and the requests in
// flight and prefill tokens queued that their pods count.
type remoteLoad struct {
	tokens int64
	seqs   int64 // decode sequences (an older replica's: requests)
	ageMs  int64 // Σ seqs × (asOf − routed_at) over their decode charges
	asOfMs int64
	// active and kv are prefill charges (tokens), inFlight requests and
	// queued uncached prompt tokens.
	active, kv, inFlight, queued int64
}

// IndexBits is how many low bits of a pod id index the ledger's table.
// The bits above tell apart the pods that hold one index one after
// another: a pod keeps its id for its life, and a charge or a read that
// names the id of a pod that left finds no pod, even once another pod
// holds its index.
const IndexBits = 16

const indexMask = 1<<IndexBits - 1

// Member is a pod as SetPods takes it: its id, its name (the label of its
// series), the key the replicas sharing the ledger know it by, and its own
// load counters.
type Member struct {
	ID   int32
	Name string
	// Key names the pod to the other replicas: its Kubernetes UID where it
	// has one (default: Name).
	Key string
	// Load is the pod's own count of requests in flight and queued prefill
	// tokens, which the shared ledger publishes (nil: none).
	Load LocalLoad
}

// LocalLoad is the load a pod counts itself, outside the ledger, that the
// routing policies read: the gateway's pool.Pod.
type LocalLoad interface {
	InFlight() int64
	QueuedPrefill() int64
}

// pod is the slow-path registry entry of a pod; slot is its hot part.
type pod struct {
	slot *podSlot
	name string
	key  string    // Member.Key
	load LocalLoad // Member.Load, nil for none
	live bool      // in the current table; false once the gateway no longer has it
	// series are the metric names with this pod's label, built once.
	series [len(seriesFamilies)]string
	// Janitor state: ops as last seen, and since when the pod is known to
	// have sat at zero with no charge (-1: it is not).
	seenOps   uint64
	zeroSince int64
	// carried are the charges of pods of this name the janitor forgot,
	// so the name's charges counter never goes down (metrics.go).
	carried uint64
}

// Prompt is what a prefill charge is computed from. The caller owns it.
type Prompt struct {
	// Tokens is prompt_tokens (tokens).
	Tokens int64
	// Sequences is how many sequences the request decodes, each growing
	// its own output: n for each of its prompts (0 counts as 1).
	Sequences int64
	// Model and SessionKey key the session-delta rule; SessionKey is the
	// caller-owned session header, "" for none. Both are copied when stored.
	Model      string
	SessionKey string
	// Matched says the prompt was looked up in the prefix index (for
	// hybrid_cache_load, say); MatchPct is then the selected pod's match,
	// in percent of the prompt.
	Matched  bool
	MatchPct float64
}

// Env is what a Ledger needs from its surroundings; every field is
// optional.
type Env struct {
	// Now returns monotonic nanoseconds (default: time since New). Tests
	// inject a fake clock.
	Now func() int64
	// Logger receives the TTL force-release warnings (default slog.Default()).
	Logger *slog.Logger
	// OnDrop is called by the janitor, outside any lock, after it dropped a
	// pod's counters, so the gateway can drop other per-pod state. The
	// ledger's own series disappear from WritePrometheus by themselves.
	OnDrop func(name string)
}

// Ledger is the prefill and decode token ledger of one gateway. Safe for
// concurrent use.
type Ledger struct {
	requestCost int64
	minMatchPct float64
	ttl         int64 // ns
	now         func() int64
	log         *slog.Logger
	onDrop      func(string)

	table    atomic.Pointer[[]*podSlot] // gateway pod index → slot
	charges  chargeTable
	sessions sessionTable

	// selection serializes a selection with its charge (LockSelection).
	selection sync.Mutex

	mu   sync.Mutex // guards byID and pods; slow path only
	byID map[int32]*pod
	pods []*pod // registration order, for stable metric output
}

// New returns an empty ledger. cfg must have passed Validate.
func New(cfg Config, env Env) *Ledger {
	l := &Ledger{
		requestCost: cfg.RequestCost,
		minMatchPct: cfg.MinMatchPct,
		ttl:         int64(cfg.TTLSeconds) * int64(time.Second),
		now:         env.Now,
		log:         env.Logger,
		onDrop:      env.OnDrop,
		byID:        map[int32]*pod{},
	}
	if l.now == nil {
		start := time.Now()
		l.now = func() int64 { return int64(time.Since(start)) }
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	l.charges = newChargeTable()
	l.sessions.init(int64(cfg.SessionTTLSeconds)*int64(time.Second), int64(cfg.MaxSessions))
	empty := []*podSlot{}
	l.table.Store(&empty)
	return l
}

// Now returns the ledger clock (monotonic nanoseconds), the time base of
// Charge and Decode. The gateway reads it once per selection and passes the
// reading to both, so a charge costs no clock read of its own.
func (l *Ledger) Now() int64 { return l.now() }

// SetPods tells the ledger the gateway's pods. Call it whenever the
// gateway publishes a new pool snapshot; it is the slow path (a lock and a
// map lookup per pod). Counters follow the id: a pod keeps its load for
// its life, a pod that left drains as its requests finish (releases reach
// the pod they charged), and a new id starts from zero, whatever its name
// and index. Ids must be non-negative, with distinct indexes; an id names
// one pod, under one name, for good.
func (l *Ledger) SetPods(pods []Member) {
	now := l.now()
	n := 0
	for _, m := range pods {
		n = max(n, int(m.ID&indexMask)+1)
	}
	tab := make([]*podSlot, n)
	l.mu.Lock()
	for _, p := range l.pods {
		p.live = false
	}
	for _, m := range pods {
		p := l.byID[m.ID]
		if p == nil {
			key := m.Key
			if key == "" {
				key = m.Name
			}
			p = &pod{slot: &podSlot{id: m.ID}, name: m.Name, key: key, zeroSince: now}
			label := `{pod="` + labelEscaper.Replace(m.Name) + `"}`
			for j, family := range seriesFamilies {
				p.series[j] = family.name + label
			}
			l.byID[m.ID] = p
			l.pods = append(l.pods, p)
		}
		p.live, p.load = true, m.Load
		tab[m.ID&indexMask] = p.slot
	}
	l.table.Store(&tab)
	l.mu.Unlock()
}

// charged is the slot Charge charges for id: the table's, else that of a
// pod that left and drains; nil for -1 or a pod the ledger forgot.
func (l *Ledger) charged(tab []*podSlot, id int32) *podSlot {
	if s := lookup(tab, id); s != nil || id < 0 {
		return s
	}
	return l.leaving(id)
}

// leaving is the slot of the pod with id that left, nil if the ledger
// forgot it. Only a decision racing a reload gets here.
func (l *Ledger) leaving(id int32) *podSlot {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.byID[id]; p != nil {
		return p.slot
	}
	return nil
}

// lookup is the slot of the pod with id in tab, nil for none (-1, or a pod
// that left).
func lookup(tab []*podSlot, id int32) *podSlot {
	if i := int(id & indexMask); id >= 0 && i < len(tab) {
		if s := tab[i]; s != nil && s.id == id {
			return s
		}
	}
	return nil
}

// LockSelection serializes selections: the gateway holds it from reading
// the ledger into its candidates until Charge returns, so concurrent
// selections see each other's charges (AIBrix: "in the same critical
// section as the selection"). Charges and releases themselves never take
// it.
func (l *Ledger) LockSelection() { l.selection.Lock() }

// UnlockSelection ends what LockSelection began.
func (l *Ledger) UnlockSelection() { l.selection.Unlock() }

// Ticket is a request's claim check on the ledger: Charge records where
// it keeps the request's charge, and PrefillDone and Finish go straight
// there. The place is the shard of the first pod charged and never changes,
// so requests on different pods never share a lock or a cache line. A copy
// releases the active part of the charge it was taken with only: a leg of
// an earlier attempt that ends after a re-charge (a retry) must not release
// the retry's.
type Ticket struct {
	// ID names the request; unique among the charges outstanding. Set it
	// before the first Charge.
	ID uint64
	// Lane is the caller's lane (an event loop) that charges and releases
	// the request, set before the first Charge: a pod's charges from
	// different lanes live in different shards, so cores serving their
	// own loops do not pass a shard's lock and lines between them.
	Lane uint8
	// home is the charge's shard + 1; 0 until the first Charge.
	home uint8
	// gen counts the Charges of the ticket, which mark their charge with it.
	gen uint32
}

// shard returns the ticket's shard; only for a charged ticket.
func (t Ticket) shard() int { return int(t.home) - 1 }

// Charge charges t's request to prefill pod prefill and decode pod decode
// (pod ids; -1 for none) at now, the Now reading the selection was
// made at, and returns the prefill charge in tokens:
// request_cost + new_tokens, where new_tokens is the first rule that
// applies of session delta, prefix match and whole prompt. The decode pod
// is charged the whole prompt, since it receives all of the prompt's KV.
// Charging a ticket that already holds a charge releases the old one first,
// so a retry on another pod moves the charge. A pod the last SetPods no
// longer names (a decision made on the gateway's previous snapshot while
// a reload removed the pod) is charged while it drains: the request goes
// to it.
func (l *Ledger) Charge(t *Ticket, prefill, decode int32, p *Prompt, now int64) int64 {
	tab := *l.table.Load()
	c := charge{at: now, prefill: l.charged(tab, prefill), decode: l.charged(tab, decode)}
	if t.home == 0 {
		t.home = uint8((uint32(max(prefill, decode, 0)&indexMask)+laneStride*uint32(t.Lane))%chargeShards) + 1
	}
	t.gen++
	c.seqs = max(p.Sequences, 1)
	if c.prefill != nil {
		c.active = l.requestCost + l.newTokens(p, now)
		c.kv = c.active
		s := c.prefill
		s.active.Add(c.active)
		s.kv.Add(c.kv)
	}
	if c.decode != nil {
		c.decodeTokens = p.Tokens
		c.routedMs = now / int64(time.Millisecond)
		c.decode.addDecode(c.decodeTokens, c.seqs, c.routedMs)
	}
	old, ok := l.charges.swap(*t, c)
	if ok {
		old.release()
	}
	// A pod counts a request once while it holds its charge: placed on
	// it again (a deferred request's re-picks) it is not charged anew.
	if c.prefill != nil && (!ok || old.prefill != c.prefill) {
		c.prefill.touch()
	}
	if c.decode != nil && (!ok || old.decode != c.decode) {
		c.decode.touch()
	}
	return c.active
}

// MoveDecode moves the decode part of t's charge to the pod decode at
// now (Now's clock), leaving its prefill part as it is: a decode leg that
// went to another pod while its prefill leg may still run, which releases
// its active part itself (PrefillDone). A ticket without a charge is
// ignored.
func (l *Ledger) MoveDecode(t Ticket, decode int32, now int64) {
	if t.home == 0 {
		return
	}
	l.charges.moveDecode(t, l.charged(*l.table.Load(), decode), now/int64(time.Millisecond))
}

// newTokens is AIBrix's new_tokens: the growth since the session's last
// shorter prompt, else the prompt less its (thresholded) prefix match, else
// the whole prompt.
func (l *Ledger) newTokens(p *Prompt, now int64) int64 {
	if d, ok := l.sessions.delta(p.Model, p.SessionKey, p.Tokens, now); ok {
		return d
	}
	if p.Matched && p.MatchPct > 0 && p.MatchPct >= l.minMatchPct {
		return int64(math.Round(float64(p.Tokens) * (1 - min(p.MatchPct, 100)/100)))
	}
	return p.Tokens
}

// PrefillDone releases the active part of t's prefill charge: the prefill
// call returned and the pod only holds the KV now. Idempotent; a ticket
// never charged, already finished, or charged again since t was copied, is
// ignored.
func (l *Ledger) PrefillDone(t Ticket) {
	if t.home == 0 {
		return
	}
	if s, n := l.charges.takeActive(t); n != 0 {
		s.active.Add(-n)
	}
}

// Finish releases everything left of t's charges: the request completed,
// or failed. Idempotent; a ticket never charged is ignored.
func (l *Ledger) Finish(t Ticket) {
	if t.home == 0 {
		return
	}
	if c, ok := l.charges.take(t); ok {
		c.release()
	}
}

// Prefill returns pod's prefill counters (tokens): the token_load score is
// active + kv_weight × kv. Both include the other replicas' charges when
// the ledger is shared.
//
// A pod the last SetPods no longer names (see Charge) reads as idle: no
// decision on the current snapshot reads it.
func (l *Ledger) Prefill(pod int32) (active, kv int64) {
	s := lookup(*l.table.Load(), pod)
	if s == nil {
		return 0, 0
	}
	active, kv = s.active.Load(), s.kv.Load()
	if r := s.remote.Load(); r != nil {
		active += r.active
		kv += r.kv
	}
	return active, kv
}

// Remote returns the other replicas' requests in flight on pod and the
// uncached prompt tokens they queued there, as of the shared ledger's last
// sync: what a replica adds to its pod's own counts so that replicas route
// as one. Zero when the ledger is not shared.
func (l *Ledger) Remote(pod int32) (inFlight, queued int64) {
	if s := lookup(*l.table.Load(), pod); s != nil {
		if r := s.remote.Load(); r != nil {
			return r.inFlight, r.queued
		}
	}
	return 0, 0
}

// Decode returns pod's decode load at now (Now's clock): tokens is the
// prompt tokens of its outstanding decode charges, ageSec is Σ seqs ×
// (now − routed_at) over them in seconds (Prompt.Sequences), the factor
// the output-growth term multiplies by the pod's generation rate per
// sequence. Both include the other replicas' charges when the ledger is
// shared.
func (l *Ledger) Decode(pod int32, now int64) (tokens, ageSec float64) {
	s := lookup(*l.table.Load(), pod)
	if s == nil {
		return 0, 0
	}
	nowMs := now / int64(time.Millisecond)
	t, ageMs := s.decode.Load(), s.decodeSeqs.Load()*nowMs-s.routedMs.Load()
	if r := s.remote.Load(); r != nil {
		t += r.tokens
		ageMs += r.ageMs + r.seqs*(nowMs-r.asOfMs)
	}
	return float64(t), float64(ageMs) / 1000
}

// RunJanitor sweeps once per JanitorInterval until ctx ends: it
// force-releases charges older than the TTL, forgets expired sessions and
// drops pods idle at zero for IdleDropAfter.
func (l *Ledger) RunJanitor(ctx context.Context) {
	t := time.NewTicker(JanitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.sweep()
		}
	}
}

// touch records a charge for the janitor and revives a dropped pod.
func (s *podSlot) touch() {
	s.ops.Add(1)
	if s.dropped.Load() {
		s.dropped.Store(false)
	}
}

// addDecode adds a decode charge of tokens and seqs sequences routed at
// routedMs to s; negative tokens and seqs take it off.
func (s *podSlot) addDecode(tokens, seqs, routedMs int64) {
	s.decode.Add(tokens)
	s.decodeSeqs.Add(seqs)
	s.routedMs.Add(seqs * routedMs)
}

// zero reports whether the slot holds no local charge.
func (s *podSlot) zero() bool {
	return s.active.Load() == 0 && s.kv.Load() == 0 && s.decode.Load() == 0 && s.decodeSeqs.Load() == 0
}

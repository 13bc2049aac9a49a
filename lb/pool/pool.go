// Package pool holds the fleet as the gateway sees it: pods, their health,
// their in-flight counts and their last scraped load.
//
// Membership and configuration change rarely compared with requests, so they
// are published as an immutable Snapshot behind an atomic pointer (readers
// never lock); what changes per request or per check lives in atomics on the
// Pod itself.
package pool

import (
	"crypto/tls"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/chat"
	"pdlb/engines/prompt"
	"pdlb/engines/protocols"
	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/route"
	"pdlb/ledger"
	"pdlb/radix"
)

// Pod is one inference pod as one snapshot sees it. Its fields are
// immutable; its state lives in a podState that every later snapshot
// shares while the pod keeps its identity (see Build), so a reload keeps
// its health, ejection, counters, learned speed and connections.
type Pod struct {
	// ID is the pod's id, the same in every snapshot for the pod's life
	// and never another pod's, so what is keyed by it (the ledger's
	// counters) follows the pod: its low ledger.IndexBits bits are a slot
	// (dense: a pod that left frees its slot), the bits above tell apart
	// the pods that held that slot one after another.
	ID     int32
	Config config.Pod
	Engine engines.Kind
	// PrefixID is the pod's id in its model's prefix index and Slot its
	// slot there (radix.Slot(PrefixID)), the index of its depth in a
	// Match: the same for the pod's life, as long as the model keeps its
	// index.
	PrefixID, Slot int32
	// Role is the pod's part in prefill/decode disaggregation; Roleset
	// indexes its model's Rolesets (-1 for a combined pod).
	Role    route.PDRole
	Roleset int32
	// auth is the Authorization value of the pod's API key ("Bearer "
	// and the key, config.PodKey), nil when it has none; read anew by
	// each snapshot, so a reload rotates it.
	auth []byte
	*podState
}

// Auth is the Authorization value every request to the pod carries, nil
// when the pod has no API key: the client's then goes as it sent it.
func (p *Pod) Auth() []byte { return p.auth }

// Authorize gives req, one of the gateway's own requests to the pod, the
// pod's API key when it has one.
func (p *Pod) Authorize(req *fasthttp.Request) {
	if p.auth != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, p.auth)
	}
}

// podLoad is the part of a pod's state that a routing decision reads for
// every pod of the model (availability and load), together at the head of
// podState: 80 bytes, where they were spread over the podState, the Pod
// (weight), the Scraped and the speed learner.
type podLoad struct {
	inFlight atomic.Int64
	// queued is the uncached prompt tokens of requests sent to the pod
	// whose first token has not come back yet: its prefill queue.
	queued atomic.Int64
	// ejectedUntil is when an ejection ends, on the clock of the now the
	// callers pass (the gateway's: its ledger's monotonic nanoseconds); at
	// or before now means not ejected.
	ejectedUntil atomic.Int64
	// flags are the pod's availability bits (flagHealthy and the rest),
	// one word so Available reads them with one load.
	flags atomic.Uint32
	// Speed learns the pod's prefill speed on uncached tokens. Held here,
	// not behind a pointer, so a pick reads it without another cache miss
	// per pod.
	Speed admit.PrefillSpeed
	// weight is Config.Weight (float64 bits), which a reload may change.
	weight atomic.Uint64
	// The last scrape's running and waiting counts (int32 each, waiting in
	// the high half: one word, so one scrape's pair) and KV usage (float64
	// bits), copied here so a pick reads them without loading the Scraped.
	// While a scrape is being published a reader may see the new counts
	// with the previous usage: two scrapes one interval apart, which the
	// policies weigh no differently from a scrape one interval old.
	counts, kvUsage atomic.Uint64
	scraped         atomic.Pointer[Scraped]
}

// PodLoad is a pod's load with its ID and Slot, what a pick reads of each
// pod: a loop over a slice of them (Model.CombinedLoads) reaches every
// pod's load without loading its Pod.
type PodLoad struct {
	*podLoad
	ID, Slot int32
}

// Load returns the pod's PodLoad.
func (p *Pod) Load() PodLoad { return PodLoad{&p.podLoad, p.ID, p.Slot} }

// podState is what a pod keeps across snapshots: atomics any goroutine may
// read, and the objects that outlive one configuration.
type podState struct {
	podLoad
	// Client is the keep-alive connection pool to the pod; Dial opens
	// one of its connections (with TLS for an https pod).
	Client *fasthttp.HostClient
	Dial   func(addr string) (net.Conn, error)

	fails      atomic.Int32
	checkFails atomic.Int32 // failed health checks in a row
	// answered says a request got the pod's answer since the last health
	// check (Checker.check).
	answered atomic.Bool
	// DownAt is when (mono.Now) health checks last found the pod dead,
	// 0 never: the transports give up its attempts sent before then
	// that have no byte of an answer yet (frontend.Upstream.Down on the
	// event loops, Down on goroutines).
	DownAt         atomic.Int64
	down           downHooks
	ejections      atomic.Int64
	kept           atomic.Int64
	upstreamErrors atomic.Int64
	pd             pdState
	lora           podLoRA
	// PrefillInfo is the pod's answer to its engine's PrefillInfoPath, its
	// process's: a pod that changes identity gets a podState of its own.
	PrefillInfo protocols.PrefillInfo
	// moreSeqs is the sequences of the requests in flight beyond one
	// each (Acquire): kept apart from inFlight, which the policies and
	// the half-open probe read as requests.
	moreSeqs atomic.Int64
}

// UpstreamErrors counts the pod's failed exchanges.
func (p *Pod) UpstreamErrors() int64 { return p.upstreamErrors.Load() }

// QueuedPrefill is the uncached prompt tokens the pod has yet to prefill,
// as far as the gateway knows (tokens).
func (p *Pod) QueuedPrefill() int64 { return p.queued.Load() }

// AddQueuedPrefill adds n (negative: removes) uncached tokens to the pod's
// prefill queue.
func (p *Pod) AddQueuedPrefill(n int64) { p.queued.Add(n) }

// Scraped is a pod's load as read from its /metrics.
type Scraped struct {
	engines.Load
	// TokensPerSec is the pod's generation throughput: the engine's gauge
	// when it has one, else derived from two scrapes of its token counter.
	TokensPerSec float64
	At           time.Time
}

// The bits of podLoad.flags.
const (
	// flagHealthy: the last active check passed.
	flagHealthy uint32 = 1 << iota
	// flagHalfOpen: set from an ejection until a request succeeds again.
	flagHalfOpen
	// flagLeaving: set for good by Leave.
	flagLeaving
)

func (l *podLoad) has(f uint32) bool { return l.flags.Load()&f != 0 }

// set sets f, or clears it, and reports whether it was set before.
func (l *podLoad) set(f uint32, on bool) bool {
	if on {
		return l.flags.Or(f)&f != 0
	}
	return l.flags.And(^f)&f != 0
}

// Available reports whether the pod may receive traffic at now: its last
// active check passed, it is not ejected, and it is not leaving.
//
// Passive ejection is a circuit breaker: closed while requests succeed, open
// for the ejection time after threshold consecutive failures, then
// half-open: one request at a time probes the pod until one succeeds
// (closed again) or fails (open again at once).
func (l *podLoad) Available(now int64) bool { return l.available(now, false) }

// AvailableBeside is Available for a request answered beside the engine's
// work when beside (a tokenization), as AppendCombined picks it.
func (l *podLoad) AvailableBeside(now int64, beside bool) bool { return l.available(now, beside) }

// available is Available for a request answered beside the engine's work
// (beside: a tokenization), which is no probe: a half-open pod's probe in
// flight does not keep it off.
func (l *podLoad) available(now int64, beside bool) bool {
	f := l.flags.Load()
	if f&flagHealthy == 0 || f&flagLeaving != 0 || l.ejectedUntil.Load() > now {
		return false
	}
	return beside || f&flagHalfOpen == 0 || l.inFlight.Load() == 0
}

// Circuit states, as the pdlb_pod_circuit_state gauge reports them.
const (
	CircuitClosed   = 0
	CircuitOpen     = 1
	CircuitHalfOpen = 2
)

// Circuit returns the pod's breaker state at now.
func (p *Pod) Circuit(now int64) int {
	switch {
	case p.ejectedUntil.Load() > now:
		return CircuitOpen
	case p.has(flagHalfOpen):
		return CircuitHalfOpen
	}
	return CircuitClosed
}

// Healthy reports the result of the pod's last active check.
func (l *podLoad) Healthy() bool { return l.has(flagHealthy) }

// Refused takes the pod out as a health check refused would (nothing
// listens at its address: it died or is draining) until a check passes
// again; it reports whether the pod was healthy.
func (p *Pod) Refused() bool { return p.set(flagHealthy, false) }

// Leave keeps the pod out of every pick from now on, by requests that
// still hold a snapshot naming it too. A reload calls it for each pod
// that left the fleet (its state is never another snapshot's again),
// which the new snapshot alone would leave to requests that started
// before it.
func (p *Pod) Leave() { p.set(flagLeaving, true) }

// Left reports whether the pod left the fleet (Leave): unlike its health
// or breaker, no later check or success brings it back.
func (l *podLoad) Left() bool { return l.has(flagLeaving) }

// Ejected reports whether passive ejection keeps the pod out at now.
func (p *Pod) Ejected(now int64) bool { return p.ejectedUntil.Load() > now }

// Ejections counts how often the pod was ejected.
func (p *Pod) Ejections() int64 { return p.ejections.Load() }

// EjectionsKept counts how often the pod was due for ejection but kept in
// (KeepIn).
func (p *Pod) EjectionsKept() int64 { return p.kept.Load() }

// InFlight is the number of requests the gateway has sent to the pod and
// not yet seen finish.
func (p *Pod) InFlight() int64 { return p.inFlight.Load() }

// Sequences is the sequences of the requests in flight on the pod: an
// engine runs each of a request's n choices of each prompt as one
// (vLLM's child requests), and counts them so in its running gauge.
func (p *Pod) Sequences() int64 { return p.inFlight.Load() + p.moreSeqs.Load() }

// Acquire counts a request of seqs sequences against the pod; pair it
// with Release(seqs).
func (p *Pod) Acquire(seqs int) {
	p.inFlight.Add(1)
	p.addSeqs(seqs, 1)
}

// AcquireProbe is Acquire for a request picked while the pod was
// available: false, counting nothing, when the pod is half-open and a
// request counts on it already. A half-open pod takes one probe, and the
// pick's look (available) and this count are two steps, which two picks
// on two event loops can pass together.
func (p *Pod) AcquireProbe(seqs int) bool {
	if p.has(flagHalfOpen) {
		if !p.inFlight.CompareAndSwap(0, 1) {
			return false
		}
	} else {
		p.inFlight.Add(1)
	}
	p.addSeqs(seqs, 1)
	return true
}

// Release ends a request of seqs sequences counted by Acquire.
func (p *Pod) Release(seqs int) {
	p.inFlight.Add(-1)
	p.addSeqs(seqs, -1)
}

// addSeqs adds (sign 1) or takes off (sign -1) a request's seqs beyond
// its one: a request of one sequence touches no second counter.
func (p *Pod) addSeqs(seqs int, sign int64) {
	if seqs > 1 {
		p.moreSeqs.Add(sign * int64(seqs-1))
	}
}

// Scraped returns the last scrape, nil before the first.
func (p *Pod) Scraped() *Scraped { return p.scraped.Load() }

// Match is a request's prefix match on a model as candidates report it:
// Depth[slot] is how many of the prompt's blocks the pod in slot holds (nil
// when the model's policy reads no matches), each BlockSize tokens; the
// cached tokens are capped at PromptTokens.
type Match struct {
	Depth                   []int32
	BlockSize, PromptTokens int
}

// AppendCombined appends to cands a candidate for each combined pod of m
// that is available at now (for a request answered beside the engine's
// work, with beside) and whose ID is not in skip, filled as Fill does,
// and returns the extended slice. The loop lives here, over
// m.CombinedLoads, so it reads no Pod and calls nothing per pod: a fill
// called per pod, with the slice header reloaded from memory each time,
// cost a fifth of a pick over 64 pods.
func (m *Model) AppendCombined(cands []route.Candidate, now int64, skip []int32, match *Match, beside bool) []route.Candidate {
	for i := range m.CombinedLoads {
		l := &m.CombinedLoads[i]
		if !l.available(now, beside) || slices.Contains(skip, l.ID) {
			continue
		}
		cands = append(cands, route.Candidate{})
		c := &cands[len(cands)-1]
		l.fillLoad(c, match)
		l.fillScrape(c)
	}
	return cands
}

// Fill fills c with what the pod itself says: its ID, in-flight count,
// weight, prefill queue and speed, prefix match, and its last scrape
// (before the first, HasMetrics and the scraped fields stay as they were).
// Fields it does not know stay as they were (zero in a fresh Candidate).
func (l *PodLoad) Fill(c *route.Candidate, match *Match) {
	l.fillLoad(c, match)
	l.fillScrape(c)
}

// fillLoad and fillScrape are Fill's two halves, each small enough for the
// compiler to inline into AppendCombined's loop (Fill as one is not).
func (l *PodLoad) fillLoad(c *route.Candidate, match *Match) {
	c.Pod = l.ID
	c.InFlight = int(l.inFlight.Load())
	c.Weight = math.Float64frombits(l.weight.Load())
	c.QueuedPrefillTokens = float64(l.queued.Load())
	c.PrefillTokensPerSec = l.Speed.TokensPerSec()
	if match.Depth != nil {
		c.CachedTokens = min(int(match.Depth[l.Slot])*match.BlockSize, match.PromptTokens)
	}
}

func (l *podLoad) fillScrape(c *route.Candidate) {
	if l.scraped.Load() != nil {
		counts := l.counts.Load()
		c.HasMetrics = true
		c.Running, c.Waiting = int(int32(counts)), int(int32(counts>>32))
		c.KVUsage = math.Float64frombits(l.kvUsage.Load())
	}
}

// setScraped publishes a scrape: its counts for Fill, then the Scraped
// itself, so a reader that sees the Scraped sees its counts.
func (p *Pod) setScraped(s *Scraped) {
	p.counts.Store(uint64(uint32(int32(s.Running))) | uint64(uint32(int32(s.Waiting)))<<32)
	p.kvUsage.Store(math.Float64bits(s.KVUsage))
	p.scraped.Store(s)
}

// ReportSuccess records a request or check the pod answered properly.
func (p *Pod) ReportSuccess() {
	// Stores only when the value changes: every loop reports to the same
	// pod, and a store would move the cache line at each request.
	if p.fails.Load() != 0 {
		p.fails.Store(0)
	}
	if p.has(flagHalfOpen) {
		p.set(flagHalfOpen, false)
	}
	if !p.answered.Load() {
		p.answered.Store(true)
	}
}

// ReportFailure records a failed request and reports whether the pod is
// due for ejection: threshold consecutive failures, or one while it is
// half-open (its first request after an ejection).
func (p *Pod) ReportFailure(threshold int) bool {
	p.upstreamErrors.Add(1)
	return int(p.fails.Add(1)) >= threshold || p.has(flagHalfOpen)
}

// Eject keeps the pod out of every choice until now+d; then it is
// half-open, taking one request at a time until one succeeds.
func (p *Pod) Eject(now int64, d time.Duration) {
	p.fails.Store(0)
	p.set(flagHalfOpen, true)
	p.ejectedUntil.Store(now + int64(d))
	p.ejections.Add(1)
}

// KeepIn records that the pod, due for ejection, stays in (its model has
// as many pods ejected as it may): it is due again after as many failures.
func (p *Pod) KeepIn() {
	p.fails.Store(0)
	p.kept.Add(1)
}

// MayEject reports whether one more of m's pods may be ejected at now with
// at most maxPercent of them ejected at once; one always may be.
func (m *Model) MayEject(now int64, maxPercent int) bool {
	n := 0
	for _, p := range m.Pods {
		if p.Ejected(now) {
			n++
		}
	}
	return n == 0 || (n+1)*100 <= maxPercent*len(m.Pods)
}

// Model is one model's pods, routing policy and prefix index.
type Model struct {
	Name string
	// Index numbers the model for per-model tables; a model keeps its
	// number across snapshots, even those it is absent from, and new
	// models get new numbers.
	Index int
	// Pods are every pod of the model, in configuration order, and Slots
	// is one past their highest Slot: the length of a Match's depths.
	Pods  []*Pod
	Slots int
	// Combined are the pods that run whole requests, and CombinedLoads
	// their loads, in the same order.
	Combined      []*Pod
	CombinedLoads []PodLoad
	// Prefill and Decode are the model's prefill and decode pods, and
	// Rolesets their roleset names by dense index.
	Prefill, Decode []*Pod
	Rolesets        []string
	// Profiles resolve a request's routing strategy and PD cascade.
	Profiles *route.ModelProfiles
	Policy   route.Policy
	// UsesCache says the policy reads prefix matches: requests are then
	// looked up in Prefix.
	UsesCache bool
	// KVEvents says some pod of the model publishes its KV events
	// (kv_events) into Prefix, which then knows what that pod holds
	// whatever policy sent the prompts there.
	KVEvents bool
	// Prefix is the model's prefix index: which pod holds which blocks,
	// from the gateway's own routing and the pods' KV events. prefixIDs
	// hands out its pod ids, capacity is each pod's capacity in it
	// (blocks) and width its slots.
	Prefix          *radix.Tree
	prefixIDs       ids
	capacity, width int
	// BlockSize is the tokens per block key, Seed the chain's seed.
	BlockSize int
	Seed      uint64
	// Prompt renders and tokenizes the model's prompts as its engine does
	// (its tokenizer and chat template); nil: the stand-in tokenizer,
	// whose keys match the gateway's own picks but no engine's KV events.
	// promptKey names its settings, so a reload keeps a loaded one.
	Prompt    *prompt.Model
	promptKey string
	// LoRA are the model's adapter settings (lora.go), and loads orders
	// the loads of adapters on its pods.
	LoRA  config.LoRA
	loads *loadGate
	// Engine is the engine the model's prompts are keyed as: a prompt has
	// one set of keys, made as that engine makes its ids (it decides
	// whether truncate_prompt_tokens cuts them, and whether a bad value
	// of it is refused). Where the model's pods run several engines (a
	// migration), it is the one of theirs that cuts the fewest prompts,
	// whatever the pods' order: its keys count no fewer tokens than any
	// pod computes, and where one is SGLang's, which ignores the field,
	// the gateway refuses no value of it.
	Engine engines.Kind
}

// cutForms counts the prompt forms (text, token ids) engine k cuts to
// truncate_prompt_tokens.
func cutForms(k engines.Kind) int {
	n := 0
	for _, ids := range [...]bool{false, true} {
		if k.TruncatesPrompt(ids) {
			n++
		}
	}
	return n
}

// Snapshot is an immutable view of the fleet. Never modify one after it is
// published; build a new one instead.
type Snapshot struct {
	Pods   []*Pod
	Models []*Model
	byName map[string]*Model
	names  names // adapters and aliases (lora.go)
	// podIDs hands out the pods' ids.
	podIDs ids
	// modelIndex numbers every model any snapshot had, so a model that
	// leaves (its last pod gone) and comes back takes its number again:
	// the per-model tables (metrics) keyed by it hold its series still.
	modelIndex map[string]int
	// commit changes the state s shares with the snapshot it replaces
	// (kept pods' weights, departed pods' index slots): run by Commit, once
	// nothing else can fail the reload.
	commit []func()
}

// Commit applies what s changes in the state it shares with the snapshot
// it replaces; call it once, when s is about to be published, so a reload
// that fails after Build leaves the previous snapshot as it was.
func (s *Snapshot) Commit() {
	for _, f := range s.commit {
		f()
	}
	s.commit = nil
}

// Model returns the model called name, or nil. The []byte→string conversion
// in the map index does not allocate.
func (s *Snapshot) Model(name []byte) *Model { return s.byName[string(name)] }

// Pool publishes the current Snapshot.
type Pool struct{ snap atomic.Pointer[Snapshot] }

// Load returns the current snapshot.
func (p *Pool) Load() *Snapshot { return p.snap.Load() }

// DialFunc opens a connection to a pod within timeout, with TLS by tc
// (nil: plain), its handshake within timeout too; the gateway supplies one
// that lets it manage stream deadlines.
type DialFunc func(addr string, timeout time.Duration, tc *tls.Config) (net.Conn, error)

// Build makes the snapshot of a validated configuration, dialing pods with
// dial. prev, if not nil, is the snapshot it replaces.
//
// A pod keeps its identity, and with it its state (health, ejection,
// counters, learned speed, connections), its ID and its place in its
// model's prefix index, for as long as a reload names it with the same
// identity (UID, name and address) and model; any other change to its
// configuration applies to the pod it is. A pod that leaves (or changes
// identity or model) frees its ID and its prefix slot, and its blocks
// leave the index; the next pod to take either gets another id for it, so
// a charge or index write still on its way for the pod that left never
// reaches it. A model keeps its number, and its prefix index while its
// block size, tokenizer and pods' cache capacity stay and its pods fit.
// New pods start healthy (the first check corrects that within one
// interval) so a fresh gateway serves at once.
func Build(cfg *config.Config, dial DialFunc, prev *Snapshot) (*Snapshot, error) {
	s := &Snapshot{byName: map[string]*Model{}, podIDs: ids{bits: ledger.IndexBits}, modelIndex: map[string]int{}}
	// The pods of prev by identity; those a pod of cfg takes over stay.
	old := map[identity]*Pod{}
	// Loaded tokenizers by settings, so models sharing one (and a reload
	// keeping one) load it once.
	prompts := prompt.Loaded{}
	if prev != nil {
		s.podIDs = prev.podIDs.clone()
		maps.Copy(s.modelIndex, prev.modelIndex)
		for _, p := range prev.Pods {
			old[identityOf(p.Config)] = p
		}
		for _, m := range prev.Models {
			if m.Prompt != nil {
				prompts[m.promptKey] = m.Prompt
			}
		}
	}
	pcs := make([]config.Pod, len(cfg.Pods))
	stays := map[*Pod]bool{}
	var upTLS *tls.Config
	for i := range cfg.Pods {
		// The snapshot holds pods with their defaults filled, whoever
		// built the configuration.
		pcs[i] = cfg.Pods[i]
		pcs[i].Provision()
		if o := old[identityOf(pcs[i])]; o != nil && o.Config.Model == pcs[i].Model {
			stays[o] = true
		}
	}
	if prev != nil {
		for _, p := range prev.Pods {
			if !stays[p] {
				s.podIDs.free(p.ID)
			}
		}
	}
	// The pods of s that are pods of prev.
	continued := map[*Pod]bool{}
	connectTimeout := cfg.Upstream.ConnectTimeout
	for i, pc := range pcs {
		kind, err := engines.ParseKind(pc.Engine)
		if err != nil {
			return nil, err
		}
		pod := &Pod{Config: pc, Engine: kind}
		key, err := cfg.PodKeyOf(i)
		if err != nil {
			return nil, err
		}
		if key != "" {
			pod.auth = append([]byte("Bearer "), key...)
		}
		if o := old[identityOf(pc)]; stays[o] {
			continued[pod] = true
			pod.ID, pod.PrefixID, pod.podState = o.ID, o.PrefixID, o.podState
			if w := math.Float64bits(pc.Weight); pod.weight.Load() != w {
				s.commit = append(s.commit, func() { pod.weight.Store(w) })
			}
		} else {
			if pod.ID, err = s.podIDs.take(); err != nil {
				return nil, err
			}
			pod.podState = new(podState)
			pod.Speed.Init(pc.PrefillTokensPerSec, admit.DefaultSpeedAlpha)
			pod.weight.Store(math.Float64bits(pc.Weight))
			var tc *tls.Config
			if pc.TLS {
				if upTLS == nil {
					if upTLS, err = upstreamTLS(cfg.Upstream.TLS); err != nil {
						return nil, err
					}
				}
				tc = podTLS(upTLS, pc.Address)
			}
			pod.Dial = func(addr string) (net.Conn, error) { return dial(addr, connectTimeout, tc) }
			pod.Client = newClient(cfg, pc.Address, pod.Dial)
			pod.pd = newPDState()
			pod.set(flagHealthy, true)
		}
		s.Pods = append(s.Pods, pod)
		m := s.byName[pc.Model]
		if m == nil {
			mc := cfg.ModelFor(pc.Model)
			pol, err := route.New(mc.Policy, cfg.RouteOptions())
			if err != nil {
				return nil, err
			}
			profiles, err := cfg.Profiles(pc.Model)
			if err != nil {
				return nil, err
			}
			m = &Model{Name: pc.Model, Policy: pol, UsesCache: route.UsesCache(mc.Policy),
				BlockSize: mc.BlockSize, Seed: radix.Seed(pc.Model), Profiles: profiles, Engine: kind, loads: new(loadGate)}
			if pm := prev.model(pc.Model); pm != nil {
				// A pick on the previous snapshot may be loading an
				// adapter on the pods this one keeps.
				m.loads = pm.loads
			}
			if m.Prompt, m.promptKey, err = loadPrompt(mc, prompts); err != nil {
				return nil, cfg.PromptError(pc.Model, err)
			}
			i, ok := s.modelIndex[pc.Model]
			if !ok {
				i = len(s.modelIndex)
				s.modelIndex[pc.Model] = i
			}
			m.Index = i
			s.byName[pc.Model] = m
			s.Models = append(s.Models, m)
		}
		m.Pods = append(m.Pods, pod)
		if cutForms(kind) < cutForms(m.Engine) {
			m.Engine = kind
		}
		if pc.Role == config.RoleCombined {
			m.Combined = append(m.Combined, pod)
		}
		m.addPD(pod)
		m.KVEvents = m.KVEvents || pc.KVEvents != ""
	}
	// Pods that left a kept index leave it on Commit.
	for _, m := range s.Models {
		// The PD cascade's prefill scores read prefix matches.
		m.UsesCache = m.UsesCache || len(m.Prefill) > 0
		v, err := m.placeInIndex(prev.model(m.Name), stays, continued)
		if err != nil {
			return nil, err
		}
		s.commit = append(s.commit, v...)
		for _, p := range m.Pods {
			m.Slots = max(m.Slots, int(p.Slot)+1)
		}
		for _, p := range m.Combined {
			m.CombinedLoads = append(m.CombinedLoads, p.Load())
		}
	}
	s.buildNames(cfg)
	return s, nil
}

// identity is what tells one pod from another across reloads: the
// Kubernetes UID where discovery knows it (a pod recreated under its name,
// maybe at its address, is another pod), its name and its address with its
// scheme (a pod moved to https:// needs connections dialed anew).
type identity struct {
	uid, name, address string
	tls                bool
}

func identityOf(c config.Pod) identity { return identity{c.UID, c.Name, c.Address, c.TLS} }

// placeInIndex gives m a prefix index and its pods their ids there. The
// index of pm, m's model in the previous snapshot, stays when it fits:
// the pods that stay keep their ids, new pods take the slots free, and
// the returned calls vacate the slots of pm's pods that left. Otherwise m
// gets an index of its own, empty. stays are the pods of the previous
// snapshot that stay, continued the pods of m's that are them.
func (m *Model) placeInIndex(pm *Model, stays, continued map[*Pod]bool) (vacate []func(), err error) {
	// One capacity for the whole tree: the smallest any pod declares, so
	// no pod is assumed to hold more than it can.
	for _, p := range m.Pods {
		if c := p.Config.CacheBlocks; c > 0 && (m.capacity == 0 || c < m.capacity) {
			m.capacity = c
		}
	}
	// A new tokenizer gives new keys: the old index names none of them.
	if pm != nil && pm.BlockSize == m.BlockSize && pm.promptKey == m.promptKey && pm.capacity == m.capacity {
		m.Prefix, m.prefixIDs, m.width = pm.Prefix, pm.prefixIDs.clone(), pm.width
		for _, p := range pm.Pods {
			if !stays[p] {
				id, next := p.PrefixID, m.prefixIDs.free(p.PrefixID)
				vacate = append(vacate, func() { m.Prefix.Vacate(id, next) })
			}
		}
		if m.takePrefixIDs(continued) {
			return vacate, nil
		}
	}
	// Bitsets hold 64 pods a word: a wider index costs a reader nothing
	// until its pods need another word.
	m.width = max(64, (len(m.Pods)+63)/64*64)
	if m.Prefix, err = radix.New(radix.Options{MaxPods: m.width, PodCapacity: m.capacity}); err != nil {
		return nil, fmt.Errorf("model %q: %w", m.Name, err)
	}
	m.prefixIDs = ids{bits: radix.SlotBits}
	m.takePrefixIDs(nil)
	return nil, nil
}

// takePrefixIDs gives each pod of m that is not continued an id in m's
// index, and every pod its Slot; false if they do not fit its width.
func (m *Model) takePrefixIDs(continued map[*Pod]bool) bool {
	for _, p := range m.Pods {
		if !continued[p] {
			id, err := m.prefixIDs.take()
			if err != nil || int(radix.Slot(id)) >= m.width {
				return false
			}
			p.PrefixID = id
		}
		p.Slot = radix.Slot(p.PrefixID)
	}
	return true
}

// loadPrompt loads the tokenizer and chat template mc names, or takes the
// one already loaded with the same settings; key names the settings.
func loadPrompt(mc config.Model, loaded prompt.Loaded) (m *prompt.Model, key string, err error) {
	if mc.Tokenizer == "" {
		return nil, "", nil
	}
	inline, _ := chat.ParseInlineSystem(mc.MessagesInlineSystem) // validated by config
	c := prompt.Config{Tokenizer: mc.Tokenizer, ChatTemplate: mc.ChatTemplate, ChatTemplateKwargs: mc.ChatTemplateKwargs, InlineSystem: inline}
	m, err = loaded.Load(c)
	return m, c.Key(), err
}

// newClient is a pod's keep-alive pool. It reads a response's body whole
// unless the caller sets Response.StreamBody: a stream, or a PD decode leg
// whose watchdog times each read of the body. A streamed body costs the
// client a few allocations per request (its stream and the closures that
// hand the connection back), which a whole body does not: measured under
// bench/proxy's load, 11 GCs in 6 s with every body streamed, 2 without.
func newClient(cfg *config.Config, addr string, dial fasthttp.DialFunc) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:                          addr,
		Name:                          "pdlb",
		MaxConns:                      cfg.Upstream.MaxConnsPerPod,
		MaxResponseBodySize:           cfg.Upstream.MaxResponseBytes,
		MaxIdleConnDuration:           cfg.Upstream.KeepaliveTimeout,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		NoDefaultUserAgentHeader:      true,
		// A request is retried by the gateway on another pod, not by the
		// client on the same one.
		MaxIdemponentCallAttempts: 1,
		// The head of an answer must fit, as on the event loop.
		ReadBufferSize: cfg.MaxHeaderBytes,
		// The error of an answer that does not parse, which reaches the
		// client, does not quote it.
		SecureErrorLogMessage: true,
		Dial:                  dial,
	}
}

// model is Model for a snapshot that may be nil.
func (s *Snapshot) model(name string) *Model {
	if s == nil {
		return nil
	}
	return s.byName[name]
}

// Publish makes s the current snapshot.
func (p *Pool) Publish(s *Snapshot) { p.snap.Store(s) }

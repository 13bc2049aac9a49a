package gateway

import (
	"math/rand/v2"
	"time"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/ledger"
)

// Headers that carry a request's session key (AIBrix's name is an alias)
// and its priority class.
const (
	headerSession       = "x-session-key"
	headerSessionAIBrix = config.HeaderAIBrixSessionKey
	headerPriority      = "x-priority"
)

// usesCache says x reads and feeds m's prefix index: m's policy or cascade
// does, or the policy a header or profile chose for x alone does.
func (x *completion) usesCache(m *pool.Model) bool {
	return m.UsesCache || x.policyCache
}

// looksUp says x's prompt is to be looked up in m's prefix index: its
// policy reads the matches, or admission predicts its prefill on a model
// whose pods publish KV events, which tell how much of it the chosen pod
// holds whatever policy chose the pod.
func (g *Gateway) looksUp(m *pool.Model, x *completion) bool {
	return x.usesCache(m) || (m.KVEvents && g.admit != nil)
}

// lookup finds how much of the prompt each pod of m holds, once per
// request (retries reuse it) and where looksUp says so: block keys, then
// one walk of the index. x.looked then says the candidates, the charge
// and admission's prediction count the match (matchOf, promptOf).
func (g *Gateway) lookup(m *pool.Model, x *completion) {
	if x.looked || !g.looksUp(m, x) {
		return
	}
	x.looked = true
	x.keys, x.chains = appendKeys(x.keys[:0], x.chains[:0], m, x)
	x.depth = slots(x.depth, m.Slots)
	if len(x.chains) > 0 {
		x.chainDepth = slots(x.chainDepth, m.Slots)
	}
	m.Prefix.MatchChains(x.keys, x.chains, x.depth, x.chainDepth)
}

// slots returns d resized to n, its buffer reused where it fits.
func slots(d []int32, n int) []int32 {
	if cap(d) < n {
		return make([]int32, n)
	}
	return d[:n]
}

// pick chooses an available combined pod of m that x has not tried yet, or
// nil if none is left, and charges it to the ledger. For a policy that
// reads the ledger's counters (route.ReadsLedger) the charge is taken under
// the ledger's selection lock, in the same critical section as the ledger
// reads and the scoring, so concurrent picks see each other's charges; any
// other policy's picks take no lock and read no counters, so they never
// wait for each other.
//
// The pods' own state (health, in-flight count, queue, speed, scrape) is
// read before the lock: the gateway changes it after the pick, outside the
// lock, so holding the lock would not make it more current, and the
// shorter critical section is what lets concurrent picks use every core.
//
// The pick of a pod that must load x's adapter begins the load
// (loadAdapter), or picks again if another pick began one since it looked.
func (g *Gateway) pick(m *pool.Model, x *completion, session string) *pool.Pod {
	for {
		if pod, raced := g.pickOnce(m, x, session); !raced {
			return pod
		}
	}
}

// pickOnce is one try of pick: raced says another pick began an adapter
// load this one did not see, and nothing was charged.
func (g *Gateway) pickOnce(m *pool.Model, x *completion, session string) (pod *pool.Pod, raced bool) {
	g.lookup(m, x)
	// One clock reading serves the breakers and the charge: the gateway's
	// clock is its ledger's (time.Now, wall and monotonic, cost twice as
	// much as this monotonic reading).
	now := g.ledger.Now()
	x.routeReq = route.Request{PromptTokens: x.req.PromptTokens(), Keys: x.keys, BlockSize: m.BlockSize, Rand: rand.Uint64()}
	match := matchOf(m, x)
	beside := !x.reachesEngine()
	x.cands = m.AppendCombined(x.cands[:0], now, x.tried, &match, beside)
	x.panicked = false
	if len(x.cands) == 0 && !x.seeking {
		// No pod available (panic.go): a retry goes back to a tried pod
		// available again, else the breakers yield.
		if x.attempts > 0 {
			x.cands = appendBack(m, x.cands, now, x.back, &match, beside)
		}
		if len(x.cands) == 0 && g.mayPanic(x) {
			x.cands = appendPanic(m, x.cands, x, &match)
			x.panicked = len(x.cands) > 0
		}
	}
	if g.shared {
		for i := range x.cands {
			g.addRemote(&x.cands[i])
		}
	}
	// After the other replicas' load is in: a conversation's pod is
	// weighed with it.
	if x.home.pod != "" {
		x.cands = keepHome(m, x.cands, x.home.pod, false) // responses.go
	} else if x.prefer.pod != "" {
		x.cands = keepHome(m, x.cands, x.prefer.pod, true)
	}
	var seen uint64
	if x.adapter != nil {
		seen = m.LoadsBegun()
		x.cands = m.FillAdapter(x.cands, x.adapter)
	}
	policy := m.Policy
	if x.policy != nil {
		policy = x.policy
	}
	if route.ReadsLedger(policy) {
		g.ledger.LockSelection()
		defer g.ledger.UnlockSelection()
		for i := range x.cands {
			g.fillCharges(&x.cands[i])
		}
	}
	if cap(x.scratch) < len(x.cands) {
		x.scratch = make([]float64, len(x.cands))
	}
	i := policy.Pick(&x.routeReq, x.cands, x.scratch[:len(x.cands)])
	if i < 0 {
		return nil, false
	}
	x.chosen = x.cands[i]
	// Candidate i came from m.CombinedLoads[j] for some j ≥ i
	// (AppendCombined skips pods, never repeats them): usually j == i.
	j := i
	for m.CombinedLoads[j].ID != x.chosen.Pod {
		j++
	}
	if !g.loadAdapter(m, x, m.Combined[j], m.Combined[j], seen) {
		return nil, true
	}
	prompt := promptOf(m, x, session)
	g.ledger.Charge(&x.ticket, x.chosen.Pod, -1, &prompt, now)
	if x.panicked {
		g.metrics.model(m).panics.Inc()
	}
	return m.Combined[j], false
}

// promptOf is x's prompt as the ledger charges it, matched against the
// chosen candidate's prefix.
func promptOf(m *pool.Model, x *completion, session string) ledger.Prompt {
	prompt := ledger.Prompt{Tokens: int64(x.routeReq.PromptTokens), Sequences: int64(x.sequences()), Model: m.Name, SessionKey: session}
	if x.looked && x.routeReq.PromptTokens > 0 {
		prompt.Matched = true
		prompt.MatchPct = 100 * float64(x.chosen.CachedTokens) / float64(x.routeReq.PromptTokens)
	}
	return prompt
}

// candidate fills *c with pod p of m as the policies see it for x: what
// the pod says (pool.PodLoad.Fill), the other replicas' load on it
// (addRemote), then fillCharges. The caller holds the
// ledger's selection lock.
func (g *Gateway) candidate(c *route.Candidate, m *pool.Model, x *completion, p *pool.Pod) {
	l, match := p.Load(), matchOf(m, x)
	l.Fill(c, &match)
	g.addRemote(c)
	g.fillCharges(c)
}

// matchOf is x's prefix match on m as the candidates report it: none
// unless x was looked up. A policy that reads no prefixes (route.UsesCache
// false) reads no CachedTokens either, so its pick is the same with it.
func matchOf(m *pool.Model, x *completion) pool.Match {
	if !x.looked {
		return pool.Match{}
	}
	return pool.Match{Depth: x.depth, BlockSize: m.BlockSize, PromptTokens: x.routeReq.PromptTokens}
}

// fillCharges fills c's prefill ledger counters. The caller holds the
// ledger's selection lock, so they include every earlier pick's charge.
func (g *Gateway) fillCharges(c *route.Candidate) {
	active, kv := g.ledger.Prefill(c.Pod)
	c.ActiveTokens, c.KVTokens = float64(active), float64(kv)
}

func tried(ids []int32, id int32) bool {
	for _, t := range ids {
		if t == id {
			return true
		}
	}
	return false
}

// place commits x to pod: its uncached tokens join the pod's prefill queue,
// the index learns that the pod will hold the prompt, and the pod counts
// the request in flight. With probe, x was picked as available: false,
// committing nothing, when the pod is half-open and another request took
// its one probe since (pool.Pod.AcquireProbe).
func (g *Gateway) place(m *pool.Model, x *completion, pod *pool.Pod, probe bool) bool {
	if x.reachesEngine() {
		if !probe {
			pod.Acquire(x.sequences())
		} else if !pod.AcquireProbe(x.sequences()) {
			return false
		}
		if x.adapter != nil {
			pod.UseAdapter(x.adapter, &m.LoRA)
		}
	}
	x.uncached = int64(max(x.routeReq.PromptTokens-x.chosen.CachedTokens, 0))
	x.idleStart = pod.QueuedPrefill() == 0
	pod.AddQueuedPrefill(x.uncached)
	if x.usesCache(m) {
		m.Prefix.InsertChains(pod.PrefixID, x.keys, x.chains)
	}
	if stats := g.metrics.model(m); stats != x.countedOn {
		// The planner reads these counters as a model's demand: a retry
		// places the same prompt again and is not counted, a fallback
		// model's placement is demand on that model and is.
		x.countedOn = stats
		stats.promptTokens.Add(x.routeReq.PromptTokens)
		stats.cachedTokens.Add(x.chosen.CachedTokens)
	}
	return true
}

// unplace undoes place for a pod that refused the request.
func (g *Gateway) unplace(x *completion, pod *pool.Pod) {
	pod.AddQueuedPrefill(-x.uncached)
	if x.reachesEngine() {
		pod.Release(x.sequences())
	}
	x.uncached = 0
}

// reachesEngine reports whether x reaches its pod's engine. A
// tokenization does not, nor a request about a stored response: the API
// server answers them beside the engine's work, so they count in flight
// on no pod (place), take no GPU slot for an adapter, are not the one
// probe a half-open pod takes nor kept off by it, and their outcome is no
// evidence of the pod's health (respond, callFailed).
func (x *completion) reachesEngine() bool {
	return x.req.Kind != openai.KindTokenizer && x.req.Kind != openai.KindStored
}

// prefillDone runs once per request when its first token is out (or the
// whole response, for a non-streaming one): the prompt has left the pod's
// prefill queue, and the ledger releases the active part of the charge. A
// stream that found the queue empty also times the pod's prefill speed by
// at, its first token's arrival (unused otherwise).
func (g *Gateway) prefillDone(x *completion, pod *pool.Pod, at time.Time) {
	if x.firstSeen {
		return
	}
	x.firstSeen = true
	pod.AddQueuedPrefill(-x.uncached)
	g.ledger.PrefillDone(x.ticket)
	if x.idleStart && x.req.Stream {
		pod.Speed.Observe(int(x.uncached), at.Sub(x.start).Seconds())
	}
}

// predict is the TTFT of x on prefill pod pre, from its queue now (queued
// uncached tokens / speed + this prompt's uncached tokens / speed), and the
// TPOT on decode pod dec, from its learned step-time line
// at its batch and KV usage with this request's sequences added (at most
// plan.decode_max_batch of them run at once; the rest wait). The queue is the
// fleet's: the other replicas' prompts queued on pre (addRemote) delay x
// as much as this replica's.
func (g *Gateway) predict(x *completion, pre, dec *pool.Pod) (ttft, tpot float64) {
	batch, kv := g.decodeBatch(dec)
	_, remote := g.ledger.Remote(pre.ID)
	return admit.Predict(admit.Path{QueuedTokens: float64(pre.QueuedPrefill() + remote), UncachedTokens: float64(max(x.routeReq.PromptTokens-x.chosen.CachedTokens, 0)),
		PrefillTokensPerSec: pre.Speed.TokensPerSec(), Batch: batch, Sequences: min(x.sequences(), g.cfg.Plan.DecodeMaxBatch),
		KVUsage: kv, Line: dec.DecodeLine()})
}

// sequences is how many sequences x runs on its decode pod: n for each
// prompt of a completion batch, as the engine fans a request out.
func (x *completion) sequences() int { return x.req.Choices * x.req.Batch() }

// decodeBatch is the pod's decode batch as best known: the engine's
// running count when scraped, at least the fleet's in-flight count (the
// gateway's own sequences and, shared, the other replicas' requests);
// and its KV usage. The engines' running gauges count sequences (vLLM's
// scheduler holds each of n child requests), as the own count does.
func (g *Gateway) decodeBatch(p *pool.Pod) (batch int, kvUsage float64) {
	remote, _ := g.ledger.Remote(p.ID)
	batch = int(p.Sequences() + remote)
	if s := p.Scraped(); s != nil {
		batch = max(batch, int(s.Running))
		kvUsage = s.KVUsage
	}
	return batch, kvUsage
}

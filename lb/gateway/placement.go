package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/engines/tokenize"
	"pdlb/lb/admit"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/ledger"
	"pdlb/radix"
)

// Headers that carry a request's session key (seed 001's name is an alias)
// and its priority class.
const (
	headerSession       = "x-session-key"
	headerSessionAIBrix = "x-aibrix-session-key"
	headerPriority      = "x-priority"
)

// lookup finds how much of the prompt each pod of m holds, once per
// request (retries reuse it): block keys, then one walk of the index.
func (g *Gateway) lookup(m *pool.Model, x *exchange) {
	if x.looked || !m.UsesCache {
		return
	}
	x.looked = true
	if x.req.TokenIDs {
		x.keys = radix.AppendBlockKeys(x.keys[:0], m.Seed, x.req.PromptIDs, m.BlockSize)
	} else {
		x.keys = tokenize.AppendBlockKeys(x.keys[:0], m.Seed, x.req.Prompt, m.BlockSize)
	}
	if cap(x.depth) < len(m.Pods) {
		x.depth = make([]int32, len(m.Pods))
	}
	x.depth = x.depth[:len(m.Pods)]
	m.Prefix.Match(x.keys, x.depth)
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
func (g *Gateway) pick(m *pool.Model, x *exchange, session string) *pool.Pod {
	g.lookup(m, x)
	// One clock reading serves the breakers and the charge: the gateway's
	// clock is its ledger's (time.Now, wall and monotonic, cost twice as
	// much as this monotonic reading).
	now := g.ledger.Now()
	x.rreq = route.Request{PromptTokens: x.req.PromptTokens(), Keys: x.keys, BlockSize: m.BlockSize, Rand: rand.Uint64()}
	match := matchOf(m, x)
	x.cands = m.AppendCombined(x.cands[:0], now, x.tried, &match)
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
	i := policy.Pick(&x.rreq, x.cands, x.scratch[:len(x.cands)])
	if i < 0 {
		return nil
	}
	x.chosen = x.cands[i]
	prompt := promptOf(m, x, session)
	g.ledger.Charge(&x.ticket, x.chosen.Pod, -1, &prompt, now)
	// Candidate i came from m.CombinedLoads[j] for some j ≥ i
	// (AppendCombined skips pods, never repeats them): usually j == i.
	for j := i; ; j++ {
		if m.CombinedLoads[j].ID == x.chosen.Pod {
			return m.Combined[j]
		}
	}
}

// promptOf is x's prompt as the ledger charges it, matched against the
// chosen candidate's prefix.
func promptOf(m *pool.Model, x *exchange, session string) ledger.Prompt {
	prompt := ledger.Prompt{Tokens: int64(x.rreq.PromptTokens), Model: m.Name, SessionKey: session}
	if m.UsesCache && x.rreq.PromptTokens > 0 {
		prompt.Matched = true
		prompt.MatchPct = 100 * float64(x.chosen.CachedTokens) / float64(x.rreq.PromptTokens)
	}
	return prompt
}

// candidate fills *c with pod p of m as the policies see it for x: what
// the pod says (pool.PodLoad.Fill), then fillCharges. The caller holds the
// ledger's selection lock.
func (g *Gateway) candidate(c *route.Candidate, m *pool.Model, x *exchange, p *pool.Pod) {
	l, match := p.Load(), matchOf(m, x)
	l.Fill(c, &match)
	g.fillCharges(c)
}

// matchOf is x's prefix match on m as the candidates report it.
func matchOf(m *pool.Model, x *exchange) pool.Match {
	if !m.UsesCache {
		return pool.Match{}
	}
	return pool.Match{Depth: x.depth, BlockSize: m.BlockSize, PromptTokens: x.rreq.PromptTokens}
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
// the request in flight.
func (g *Gateway) place(m *pool.Model, x *exchange, pod *pool.Pod) {
	x.uncached = int64(max(x.rreq.PromptTokens-x.chosen.CachedTokens, 0))
	x.idleStart = pod.QueuedPrefill() == 0
	pod.AddQueuedPrefill(x.uncached)
	pod.Acquire()
	if m.UsesCache && len(x.keys) > 0 {
		m.Prefix.Insert(pod.Slot, x.keys)
	}
	mm := g.metrics.model(m)
	mm.promptTokens.Add(x.rreq.PromptTokens)
	mm.cachedTokens.Add(x.chosen.CachedTokens)
}

// unplace undoes place for a pod that refused the request.
func (g *Gateway) unplace(x *exchange, pod *pool.Pod) {
	pod.AddQueuedPrefill(-x.uncached)
	pod.Release()
	x.uncached = 0
}

// prefillDone runs once per request when its first token is out (or the
// whole response, for a non-streaming one): the prompt has left the pod's
// prefill queue, and the ledger releases the active part of the charge. A
// request that found the queue empty also times the pod's prefill speed.
func (g *Gateway) prefillDone(x *exchange, pod *pool.Pod, at time.Time) {
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

// deferPoll is how often a deferred request looks whether it is at the head
// of the queue and its prediction has cleared. The queue is bounded, so the
// polling is too.
const deferPoll = 5 * time.Millisecond

// admission decides whether x, placed by the router, may go upstream: its
// predicted TTFT and TPOT within its class's targets, or else reject (429
// at once) or wait in the bounded deferral queue until a prediction clears
// or its wait runs out. predict returns the predictions for the current
// placement from the pods' live queues; replace, if set, places the request
// anew while it waits (a combined pod may be picked again; a PD pair keeps
// its pods, whose queues drain).
func (g *Gateway) admission(x *exchange, predict func() (ttft, tpot float64), replace func()) *failure {
	since := g.clock()
	ttft, tpot := predict()
	if wait, f := g.admitNow(x, since, ttft, tpot); !wait {
		return f
	}
	return g.awaitAdmission(x, admitWait{since, ttft, tpot}, predict, replace)
}

// admitNow asks the admission controller about x once, with the
// predictions ttft and tpot made at since: wait reports that x was deferred
// (queued: awaitAdmission waits for it), else f is nil to admit x or the
// rejection to answer.
func (g *Gateway) admitNow(x *exchange, since, ttft, tpot float64) (wait bool, f *failure) {
	v := g.admit.Decide(x.class, x.ticket.ID, since, ttft, tpot)
	switch v.Action {
	case admit.Admit:
		return false, nil
	case admit.Reject:
		return false, g.reject(x, ttft, tpot, v.RetryAfter)
	}
	return true, nil
}

// admitWait is a deferral: when it began, and the predictions it was
// deferred on.
type admitWait struct{ since, ttft, tpot float64 }

// awaitAdmission waits for a deferred x until a prediction clears or its
// class's max wait runs out.
func (g *Gateway) awaitAdmission(x *exchange, w admitWait, predict func() (ttft, tpot float64), replace func()) *failure {
	since, ttft, tpot := w.since, w.ttft, w.tpot
	maxWait := g.admit.Config().Classes[x.class].MaxWait
	for {
		time.Sleep(deferPoll)
		if x.clientLeft() {
			// Its slot goes to a request someone still waits for.
			g.admit.Withdraw(x.ticket.ID)
			return errClientLeft
		}
		now := g.clock()
		if now-since > maxWait {
			// One expired entry leaves the queue per expired waiter, so
			// the queue and the waiters stay in step.
			g.admit.Expired(now)
			return g.reject(x, ttft, tpot, 1)
		}
		if d, ok := g.admit.Head(); !ok || d.ID != x.ticket.ID {
			continue
		}
		if replace != nil {
			replace()
		}
		ttft, tpot = predict()
		if g.admit.Retry(x.ticket.ID, now, ttft, tpot) {
			return nil
		}
	}
}

// predict is the TTFT of x on prefill pod pre, from its queue now (seed
// 000: queued uncached tokens / speed + this prompt's uncached tokens /
// speed), and the TPOT on decode pod dec, from its learned step-time line
// at its batch and KV usage with this request added.
func predict(x *exchange, pre, dec *pool.Pod) (ttft, tpot float64) {
	uncached := max(x.rreq.PromptTokens-x.chosen.CachedTokens, 0)
	ttft = admit.TTFT(float64(pre.QueuedPrefill()), float64(uncached), pre.Speed.TokensPerSec(), 0)
	batch, kv := decodeBatch(dec)
	return ttft, dec.DecodeLine().TPOT(batch, kv)
}

// decodeBatch is the pod's decode batch as best known: the engine's
// running count when scraped, at least the gateway's own in-flight count;
// and its KV usage.
func decodeBatch(p *pool.Pod) (batch int, kvUsage float64) {
	batch = int(p.InFlight())
	if s := p.Scraped(); s != nil {
		batch = max(batch, int(s.Running))
		kvUsage = s.KVUsage
	}
	return batch, kvUsage
}

// reject is the 429 of a request admission sheds, saying which prediction
// missed its class's target.
func (g *Gateway) reject(x *exchange, ttft, tpot float64, retryAfter int) *failure {
	c := g.admit.Config().Classes[x.class]
	why := "predicted time to first token " + strconv.FormatFloat(ttft, 'f', 2, 64) +
		"s exceeds the " + strconv.FormatFloat(c.TTFTSLO, 'f', -1, 64) + "s target of class " + x.class.String()
	if ttft <= c.TTFTSLO && c.TPOTSLO > 0 && tpot > c.TPOTSLO {
		why = "predicted time per output token " + strconv.FormatFloat(tpot*1000, 'f', 1, 64) +
			" ms exceeds the " + strconv.FormatFloat(c.TPOTSLO*1000, 'f', -1, 64) + " ms target of class " + x.class.String()
	}
	return &failure{e: openai.Overloaded(why), retryAfter: retryAfter}
}

// clock is the admission controller's time: seconds since the gateway
// started.
func (g *Gateway) clock() float64 { return time.Since(g.epoch).Seconds() }

// classOf reads the priority class of a request; an unknown one is a 400
// naming the header.
func classOf(v []byte) (admit.Class, *openai.Error) {
	if len(v) == 0 {
		return admit.Interactive, nil
	}
	c, err := admit.ParseClass(string(v))
	if err != nil {
		return 0, &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: headerPriority,
			Code: openai.CodeInvalidValue, Message: "header " + headerPriority + ": " + err.Error()}
	}
	return c, nil
}

// startSharedLedger shares the decode ledger through Redis until ctx ends.
// Redis never sits on the request path: a background loop exchanges the
// replicas' charges.
func (g *Gateway) startSharedLedger(ctx context.Context) {
	// The shared ledger logs Redis going and coming back once each; the
	// client's own line per failed dial would repeat every sync.
	redis.SetLogger(redisLog{g.log})
	rdb := redis.NewClient(&redis.Options{
		Addr:         g.cfg.Redis.Address,
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
		MaxRetries:   -1,
	})
	sh := ledger.NewShared(g.ledger, rdb, ledger.SharedOptions{
		ReplicaID: g.cfg.Redis.ReplicaID,
		Interval:  time.Duration(g.cfg.TokenLoad.SharedSyncIntervalMs) * time.Millisecond,
		Expiry:    time.Duration(g.cfg.TokenLoad.SharedExpiryMs) * time.Millisecond,
		Logger:    g.log,
	})
	g.background(func() {
		sh.Run(ctx)
		_ = rdb.Close()
	})
}

// redisLog hands go-redis's messages to the gateway's log at debug level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

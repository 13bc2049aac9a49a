package gateway

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/lb/plan"
)

// planCountsExpiry is how long the fleet's counters outlive the last
// replica that added to them: long enough for every replica to restart.
const planCountsExpiry = time.Hour

// planShareScript is one exchange: it renews this replica's membership of
// the planning replicas and takes or renews the plan lease, which names
// the one replica whose actuators run (SET NX PX, as a Redis lock, renewed
// by its holder only), then brings the fleet's counters up to this
// replica's cumulative counts and returns the totals. TIME is Redis's, so
// every replica's membership ages on one clock.
//
// The replica sends its counts whole, not what they grew by: a reply lost
// after the script ran (a reset, a read timeout) leaves the replica unsure
// whether they went in, and an increment sent again would count them
// twice. The script keeps, for this run of the replica, how far each count
// has been added, and adds only what lies beyond; where it keeps nothing
// (a new run, or one out of Redis past the counters' expiry) it starts
// from the counts the replica knows were added, those of its last reply.
//
//	KEYS[1]    the lease (string: the holder's id)
//	KEYS[2]    the planning replicas (sorted set, score = expiry ms)
//	KEYS[3]    how far this run's counts were added (hash: "field key" → count)
//	KEYS[3+i]  model i's counters (hash: requests finished prompt cached)
//	ARGV[1] replica id, ARGV[2] lease and membership ms, ARGV[3] counters'
//	expiry ms, then eight counts a model, in the order of KEYS: its four
//	counts now, then the four its last reply acknowledged
//
// It returns {holder, replicas, counts...}: one {requests, finished,
// prompt, cached} array a model. Every key carries the {prefix} hash tag,
// so a cluster keeps them in one slot.
var planShareScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, ttl = ARGV[1], tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, id)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local holder = redis.call('GET', KEYS[1])
if not holder or holder == id then
  redis.call('SET', KEYS[1], id, 'PX', ttl)
  holder = id
end
local out = {holder, redis.call('ZCARD', KEYS[2])}
local fields = {'requests', 'finished', 'prompt', 'cached'}
for i = 4, #KEYS do
  for j, field in ipairs(fields) do
    local a = 3 + (i - 4) * 8 + j
    local added = field .. ' ' .. KEYS[i]
    local n = tonumber(ARGV[a])
    local base = tonumber(redis.call('HGET', KEYS[3], added) or ARGV[a + 4])
    if n > base then
      redis.call('HINCRBY', KEYS[i], field, n - base)
      redis.call('HSET', KEYS[3], added, ARGV[a])
    end
  end
  redis.call('PEXPIRE', KEYS[i], ARGV[3])
  out[#out + 1] = redis.call('HMGET', KEYS[i], unpack(fields))
end
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return out
`)

// planReleaseScript is a clean stop: it gives up the plan lease if this
// replica holds it, so another takes it at its next exchange rather than
// when it expires, leaves the planning replicas and drops what this run
// added. KEYS and ARGV[1] are planShareScript's.
var planReleaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
`)

// planHoldScript renews the plan lease for a full term if this replica
// holds it, and returns its holder (nil: none). KEYS[1] and ARGV[1] are
// planShareScript's, ARGV[2] the term in ms.
var planHoldScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return holder
`)

// planReleaseTimeout bounds the release on a clean stop: a Redis out of
// reach lets the lease expire instead.
const planReleaseTimeout = time.Second

// planShare shares the planning loop with the other gateway replicas that
// share a Redis and plan.
//
// Counts: a replica counts the requests it routes, while the pods'
// counters (the output) count every replica's; a planner reading its own
// counts beside them would see each request N times as long and 1/N of
// the prompts, and split the fleet for that. So each replica brings one
// set of counters a model in Redis up to its own counts (each counted
// once, whatever replies are lost) and reads the totals back, every
// token_load.shared_sync_interval_ms, and its planner reads the fleet's
// counts: the others' as of the last exchange, its own as of now.
//
// Acting: every replica plans and shows its plan, but only the holder of
// the plan lease runs the actuators, so the webhook hears one split per
// decision and switch_roles never has two replicas move the same pods.
// The holder renews the lease every exchange, and its actuators before
// each step they cannot take back (Hold), and gives it up when it ends
// cleanly; when it stops otherwise (it crashed, or lost Redis), another
// takes the lease once it expires (token_load.shared_expiry_ms).
type planShare struct {
	rdb redis.UniversalClient
	id  string
	// keys are the lease's, the replicas' and this run's added counts',
	// keyPre the counters' prefix.
	keys     []string
	keyPre   string
	interval time.Duration
	// stale is the age past which the last exchange no longer tells the
	// fleet's counts, nor that this replica holds the lease
	// (token_load.shared_expiry_ms, when the shared ledger forgets a
	// replica too).
	stale time.Duration
	// switchRoles is plan.switch_roles, which holds, and warns, when
	// several replicas plan.
	switchRoles bool
	log         *slog.Logger
	// down says the last exchange failed (read by the metrics too),
	// warned that several replicas plan with switch_roles; only the
	// exchanges, one at a time, write them.
	down   atomic.Bool
	warned bool

	// mu guards the last exchange: run writes it, the planning loop reads.
	mu sync.Mutex
	// pushed is by model what this replica has added to the counters (a
	// model a reload removed keeps its entry: its counts go on if it comes
	// back) as of the last reply, fleet the totals then; at is when that
	// exchange was sent, holder the lease's holder it found, replicas the
	// planning replicas.
	pushed, fleet map[string]plan.Counts
	at            time.Time
	holder        string
	replicas      int64
}

func newPlanShare(g *Gateway) *planShare {
	pre := "{" + g.cfg.Redis.KeyPrefix + "}:plan:"
	return &planShare{
		rdb:         g.redis,
		pushed:      map[string]plan.Counts{},
		id:          g.replica,
		keys:        []string{pre + "lease", pre + "replicas", pre + "added:" + g.replica + ":" + rand.Text()},
		keyPre:      pre + "counts:",
		interval:    time.Duration(g.cfg.TokenLoad.SharedSyncIntervalMs) * time.Millisecond,
		stale:       time.Duration(g.cfg.TokenLoad.SharedExpiryMs) * time.Millisecond,
		switchRoles: g.cfg.Plan.SwitchRoles,
		log:         g.log,
	}
}

// up reports whether the last exchange worked (true before the first).
func (s *planShare) up() bool { return !s.down.Load() }

// run exchanges own's counts every interval, the first exchange being
// the caller's, until ctx ends, then releases the lease.
func (s *planShare) run(ctx context.Context, own func() map[string]plan.Counts) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.release(context.WithoutCancel(ctx))
			return
		case <-t.C:
			s.exchange(ctx, own())
		}
	}
}

// release gives up the lease if this replica holds it and leaves the
// planning replicas, within planReleaseTimeout.
func (s *planShare) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, planReleaseTimeout)
	defer cancel()
	if err := planReleaseScript.Run(ctx, s.rdb, s.keys, s.id).Err(); err != nil && !errors.Is(err, redis.Nil) {
		s.log.Warn("plan: could not release the plan lease; another replica acts once it expires", slog.Any("err", err))
	}
}

// Hold renews the plan lease for a full term (plan.Lease), one round trip
// to Redis: the last exchange may be up to a term old, and the lease lapsed
// since.
func (s *planShare) Hold(ctx context.Context) error {
	holder, err := planHoldScript.Run(ctx, s.rdb, s.keys[:1], s.id, s.stale.Milliseconds()).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("%w: it expired", plan.ErrLeaseLost)
	case err != nil:
		return fmt.Errorf("%w: Redis does not say: %v", plan.ErrLeaseLost, err)
	case holder != s.id:
		return fmt.Errorf("%w: replica %q holds it", plan.ErrLeaseLost, holder)
	}
	return nil
}

// exchange brings the fleet's counters up to own, this replica's
// cumulative counts by model, keeps the totals and renews the lease; a
// failure is logged once until an exchange works again.
func (s *planShare) exchange(ctx context.Context, own map[string]plan.Counts) {
	models := sortedKeys(own)
	keys := slices.Clone(s.keys)
	args := []any{s.id, s.stale.Milliseconds(), planCountsExpiry.Milliseconds()}
	s.mu.Lock()
	for _, m := range models {
		keys = append(keys, s.keyPre+m)
		for _, c := range []plan.Counts{own[m], s.pushed[m]} {
			args = append(args, int64(c.Requests), int64(c.Finished), int64(c.PromptTokens), int64(c.CachedTokens))
		}
	}
	s.mu.Unlock()
	sent := time.Now()
	res, err := planShareScript.Run(ctx, s.rdb, keys, args...).Slice()
	var (
		holder   string
		replicas int64
		fleet    map[string]plan.Counts
	)
	if err == nil {
		holder, replicas, fleet, err = parsePlanShare(models, res)
	}
	if err != nil {
		if ctx.Err() == nil && !s.down.Swap(true) {
			s.log.Warn("plan: Redis unreachable, the planner holds and acts on nothing until it reads the other replicas' counts again", slog.Any("err", err))
		}
		return
	}
	if s.down.Swap(false) {
		s.log.Info("plan: Redis reachable again, the planner reads the other replicas' counts")
	}
	if s.switchRoles && replicas > 1 && !s.warned {
		s.warned = true
		s.log.Warn("plan: switch_roles holds while several replicas plan: it would re-role pods in the acting replica's pool only, and the others would route to them in their old roles (use the webhook with discovery)",
			slog.Int64("replicas", replicas))
	}
	s.mu.Lock()
	maps.Copy(s.pushed, own)
	s.fleet, s.at, s.holder, s.replicas = fleet, sent, holder, replicas
	s.mu.Unlock()
}

var errPlanReply = errors.New("plan: malformed reply of the plan's exchange with Redis")

// parsePlanShare reads planShareScript's reply for models.
func parsePlanShare(models []string, res []any) (holder string, replicas int64, fleet map[string]plan.Counts, err error) {
	if len(res) != 2+len(models) {
		return "", 0, nil, errPlanReply
	}
	holder, ok1 := res[0].(string)
	replicas, ok2 := res[1].(int64)
	if !ok1 || !ok2 {
		return "", 0, nil, errPlanReply
	}
	fleet = make(map[string]plan.Counts, len(models))
	for i, m := range models {
		vals, ok := res[2+i].([]any)
		if !ok || len(vals) != 4 {
			return "", 0, nil, errPlanReply
		}
		var n [4]float64
		for j, v := range vals {
			// A field no replica has added to yet is nil.
			if v == nil {
				continue
			}
			str, _ := v.(string)
			x, err := strconv.ParseInt(str, 10, 64)
			if err != nil {
				return "", 0, nil, errPlanReply
			}
			n[j] = float64(x)
		}
		fleet[m] = plan.Counts{Requests: n[0], Finished: n[1], PromptTokens: n[2], CachedTokens: n[3]}
	}
	return holder, replicas, fleet, nil
}

// counts returns model's counts over every replica, given own, this
// replica's now; an error says why they are not known.
func (s *planShare) counts(model string, own plan.Counts) (plan.Counts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.staleLocked(); err != nil {
		return plan.Counts{}, err
	}
	fleet, ok := s.fleet[model]
	if !ok {
		return plan.Counts{}, errors.New("the model was not exchanged yet")
	}
	return fleet.Add(own.Sub(s.pushed[model])), nil
}

// lease says whether this replica holds the plan lease as of the last
// exchange, and which replica does ("" when that exchange is too old to
// tell), and how many replicas plan.
func (s *planShare) lease() (holds bool, holder string, replicas int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.staleLocked() != nil {
		return false, "", 0
	}
	return s.holder == s.id, s.holder, s.replicas
}

// staleLocked says why the last exchange no longer counts, nil when it
// does; mu is held.
func (s *planShare) staleLocked() error {
	switch age := time.Since(s.at); {
	case s.at.IsZero():
		return errors.New("no exchange with Redis yet")
	case age > s.stale:
		return fmt.Errorf("no exchange with Redis for %.1fs", age.Seconds())
	}
	return nil
}

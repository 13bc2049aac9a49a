package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/lb/plan"
)

// planCountsExpiry is how long the fleet's counters outlive the last
// replica that added to them: long enough for every replica to restart.
const planCountsExpiry = time.Hour

// planCountsScript adds this replica's counts since its last exchange to
// the fleet's counters and returns the totals, one round trip for every
// model.
//
//	KEYS[i]  model i's counters (hash: requests finished prompt cached)
//	ARGV[1]  expiry ms, then four increments a model, in the order of KEYS
//
// It returns one {requests, finished, prompt, cached} array a model. Every
// key carries the {prefix} hash tag, so a cluster keeps them in one slot.
var planCountsScript = redis.NewScript(`
local fields = {'requests', 'finished', 'prompt', 'cached'}
local out = {}
for i, key in ipairs(KEYS) do
  for j, field in ipairs(fields) do
    local n = tonumber(ARGV[1 + (i - 1) * 4 + j])
    if n ~= 0 then redis.call('HINCRBY', key, field, n) end
  end
  redis.call('PEXPIRE', key, ARGV[1])
  out[i] = redis.call('HMGET', key, unpack(fields))
end
return out
`)

// planShare adds the planners' counts up over the gateway replicas that
// share a Redis. A replica counts the requests it routes, while the pods'
// counters (the output) count every replica's: a planner reading its own
// counts beside them would see each request N times as long and 1/N of
// the prompts, and split the fleet for that. So each replica adds what it
// counted since its last exchange to one set of counters a model in
// Redis and reads the totals back, every token_load.shared_sync_interval_ms,
// and its planner reads the fleet's counts: the others' as of the last
// exchange, its own as of now.
type planShare struct {
	rdb      redis.UniversalClient
	keyPre   string
	interval time.Duration
	// stale is the age past which the last exchange's totals are no
	// longer the fleet's (token_load.shared_expiry_ms, when the shared
	// ledger forgets a replica too).
	stale time.Duration
	log   *slog.Logger
	// down says the last exchange failed; only run's goroutine touches it.
	down bool

	// mu guards the last exchange: run writes it, the planning loop reads.
	mu sync.Mutex
	// pushed is by model what this replica has added to the counters (a
	// model a reload removed keeps its entry: its counts go on if it comes
	// back), fleet the totals after the last exchange; at is when that
	// exchange was sent.
	pushed, fleet map[string]plan.Counts
	at            time.Time
}

func newPlanShare(g *Gateway) *planShare {
	return &planShare{
		rdb:      g.redis,
		pushed:   map[string]plan.Counts{},
		keyPre:   "{" + g.cfg.Redis.KeyPrefix + "}:plan:counts:",
		interval: time.Duration(g.cfg.TokenLoad.SharedSyncIntervalMs) * time.Millisecond,
		stale:    time.Duration(g.cfg.TokenLoad.SharedExpiryMs) * time.Millisecond,
		log:      g.log,
	}
}

// run exchanges own's counts every interval until ctx ends.
func (s *planShare) run(ctx context.Context, own func() map[string]plan.Counts) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.exchange(ctx, own())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// exchange adds own, this replica's cumulative counts by model, to the
// fleet's counters and keeps the totals; a failure is logged once until
// an exchange works again.
func (s *planShare) exchange(ctx context.Context, own map[string]plan.Counts) {
	models := sortedKeys(own)
	keys := make([]string, len(models))
	args := []any{planCountsExpiry.Milliseconds()}
	s.mu.Lock()
	for i, m := range models {
		keys[i] = s.keyPre + m
		d := own[m].Sub(s.pushed[m])
		args = append(args, int64(d.Requests), int64(d.Finished), int64(d.PromptTokens), int64(d.CachedTokens))
	}
	s.mu.Unlock()
	sent := time.Now()
	res, err := planCountsScript.Run(ctx, s.rdb, keys, args...).Slice()
	var fleet map[string]plan.Counts
	if err == nil {
		fleet, err = parseFleetCounts(models, res)
	}
	if err != nil {
		if ctx.Err() == nil && !s.down {
			s.down = true
			s.log.Warn("plan: Redis unreachable, the planner holds until it reads the other replicas' counts again", slog.Any("err", err))
		}
		return
	}
	if s.down {
		s.down = false
		s.log.Info("plan: Redis reachable again, the planner reads the other replicas' counts")
	}
	s.mu.Lock()
	maps.Copy(s.pushed, own)
	s.fleet, s.at = fleet, sent
	s.mu.Unlock()
}

var errPlanReply = errors.New("plan: malformed reply of the fleet's counters")

// parseFleetCounts reads planCountsScript's reply for models.
func parseFleetCounts(models []string, res []any) (map[string]plan.Counts, error) {
	if len(res) != len(models) {
		return nil, errPlanReply
	}
	out := make(map[string]plan.Counts, len(models))
	for i, m := range models {
		vals, ok := res[i].([]any)
		if !ok || len(vals) != 4 {
			return nil, errPlanReply
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
				return nil, errPlanReply
			}
			n[j] = float64(x)
		}
		out[m] = plan.Counts{Requests: n[0], Finished: n[1], PromptTokens: n[2], CachedTokens: n[3]}
	}
	return out, nil
}

// counts returns model's counts over every replica, given own, this
// replica's now; an error says why they are not known.
func (s *planShare) counts(model string, own plan.Counts) (plan.Counts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fleet, ok := s.fleet[model]
	switch age := time.Since(s.at); {
	case s.at.IsZero():
		return plan.Counts{}, errors.New("no exchange with Redis yet")
	case age > s.stale:
		return plan.Counts{}, fmt.Errorf("no exchange with Redis for %.1fs", age.Seconds())
	case !ok:
		return plan.Counts{}, errors.New("the model was not exchanged yet")
	}
	return fleet.Add(own.Sub(s.pushed[model])), nil
}

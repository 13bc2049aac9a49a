package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/lb/limits"
	"pdlb/lb/route"
	"pdlb/ledger"
	"pdlb/promtext"
)

// startSharedLedger shares the ledger through Redis until ctx ends. Redis
// never sits on the request path: a background loop exchanges the
// replicas' charges and pod counts.
func (g *Gateway) startSharedLedger(ctx context.Context) {
	g.shared = true
	sh := ledger.NewShared(g.ledger, g.redis, ledger.SharedOptions{
		ReplicaID: g.replica,
		KeyPrefix: g.cfg.Redis.KeyPrefix,
		Interval:  time.Duration(g.cfg.TokenLoad.SharedSyncIntervalMs) * time.Millisecond,
		Expiry:    time.Duration(g.cfg.TokenLoad.SharedExpiryMs) * time.Millisecond,
		Logger:    g.log,
	})
	g.exchanges = append(g.exchanges, exchange{"ledger", sh.Up})
	g.background(func() { sh.Run(ctx) })
}

// shareKeyLimits shares the api_keys' rate-limit buckets with the other
// replicas through Redis until ctx ends, every shared_sync_interval_ms as
// the ledger: a key gets its limits across the replicas, not at each.
func (g *Gateway) shareKeyLimits(ctx context.Context) {
	s := limits.NewSync(g.keys.Load, g.redis, g.cfg.Redis.KeyPrefix,
		time.Duration(g.cfg.TokenLoad.SharedSyncIntervalMs)*time.Millisecond, g.log)
	g.exchanges = append(g.exchanges, exchange{"api_keys", s.Up})
	g.background(func() { s.Run(ctx) })
}

// exchange is a loop that exchanges with the other replicas through Redis:
// its name (the loop label) and whether its last exchange worked.
type exchange struct {
	loop string
	up   func() bool
}

// writeExchanges writes pdlb_redis_exchange_up, nothing without Redis.
func (g *Gateway) writeExchanges(w io.Writer) {
	if len(g.exchanges) == 0 {
		return
	}
	fmt.Fprint(w, "# HELP pdlb_redis_exchange_up 1 while this replica's last exchange with the others through Redis worked, 0 once one failed, by loop: ledger (the shared token ledger), api_keys (the keys' rate limits), plan (the planner's counts).\n# TYPE pdlb_redis_exchange_up gauge\n")
	for _, e := range g.exchanges {
		up := 0
		if e.up() {
			up = 1
		}
		fmt.Fprintf(w, "pdlb_redis_exchange_up{loop=%s} %d\n", promtext.Label(e.loop), up)
	}
}

// newRedis is the client of redis.address that the loops exchanging with
// the other replicas every tick share (the shared ledger, the api_keys'
// rate limits, the planner's counts).
func newRedis(addr string, log *slog.Logger) *redis.Client {
	// The loops log Redis going and coming back once each; the client's
	// own line per failed dial would repeat every tick.
	redis.SetLogger(redisLog{log})
	return redis.NewClient(sharedRedisOptions(addr))
}

// sharedRedisOptions are the client options ledger.NewShared asks for: a
// failed sync is tried again on the next tick, so the client neither
// retries a command nor redials (go-redis dials 5 times when left at 0).
func sharedRedisOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:          addr,
		DialTimeout:   200 * time.Millisecond,
		ReadTimeout:   200 * time.Millisecond,
		WriteTimeout:  200 * time.Millisecond,
		MaxRetries:    -1,
		DialerRetries: 1,
	}
}

// addRemote adds the other replicas' requests in flight and queued prefill
// tokens on c's pod to its own counts, so that every prefill policy (and
// the PD cascade's imbalance and overload checks) sees the fleet's load as
// one replica would.
func (g *Gateway) addRemote(c *route.Candidate) {
	n, q := g.ledger.Remote(c.Pod)
	c.InFlight += int(n)
	c.QueuedPrefillTokens += float64(q)
}

// redisLog hands go-redis's messages to the gateway's log at debug level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

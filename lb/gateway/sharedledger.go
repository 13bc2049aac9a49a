package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/ledger"
)

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

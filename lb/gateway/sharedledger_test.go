package gateway

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestSharedRedisDialsOnce checks that a sync with Redis down costs one
// dial, as ledger.NewShared asks, not go-redis's default five with
// backoffs between them.
func TestSharedRedisDialsOnce(t *testing.T) {
	o := sharedRedisOptions("127.0.0.1:1")
	var dials atomic.Int32
	o.Dialer = func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("connection refused")
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err == nil {
		t.Fatal("ping succeeded without Redis")
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("one failed command dialed %d times, want 1", n)
	}
}

package limits

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/internal/redistest"
	"pdlb/internal/testlog"
)

// TestSyncSharesBuckets: two replicas with the same key share its buckets
// through a real Redis: the requests and tokens one takes count at the
// other after an exchange each, its own are not counted twice, and what a
// replica takes while Redis is down reaches the other once Redis is back.
func TestSyncSharesBuckets(t *testing.T) {
	srv := redistest.Start(t, 0)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	cfg := APIKey{Name: "k", SHA256: HashKey("sk-k"), RequestsPerMinute: 10, TokensPerMinute: 1000}
	var logged testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	replica := func() (*Key, *Sync) {
		ks := newTestKeys(t, cfg)
		k, _ := ks.Lookup([]byte("Bearer sk-k"), nil)
		return k, NewSync(func() *Keys { return ks }, rdb, "t", time.Hour, log)
	}
	a, sa := replica()
	b, sb := replica()
	for i := range 10 {
		if d := a.Admit(time.Now(), 10); !d.OK() {
			t.Fatalf("request %d on a: %v", i, d.Limit)
		}
	}
	sa.Exchange(ctx)
	sb.Exchange(ctx)
	d := b.Admit(time.Now(), 10)
	if d.Limit != RequestsPerMinute {
		t.Fatalf("b after a took the key's 10 requests: %v, want %v", d.Limit, RequestsPerMinute)
	}
	// 1,000 tokens a minute refill one every 60 ms: a few at most while
	// the test runs.
	if d.tokensLeft < 895 || d.tokensLeft > 905 {
		t.Fatalf("b's tokens left after a's 100: %d, want 900", d.tokensLeft)
	}
	sa.Exchange(ctx)
	if d := a.Admit(time.Now(), 10); d.Limit != RequestsPerMinute || d.tokensLeft < 895 || d.tokensLeft > 905 {
		t.Fatalf("a after exchanging its own units again: %v, %d tokens left; want %v, 900", d.Limit, d.tokensLeft, RequestsPerMinute)
	}

	port := srv.Port
	srv.Stop()
	b.Done(time.Now(), 500) // a completion charged while Redis is down
	sb.Exchange(ctx)
	srv = redistest.Start(t, port) // back, empty
	sb.Exchange(ctx)
	sa.Exchange(ctx)
	if d := a.Admit(time.Now(), 10); d.tokensLeft > 505 {
		t.Fatalf("a's tokens left once b's 500 taken during the outage are shared: %d, want 500 at most", d.tokensLeft)
	}
	l := logged.String()
	if strings.Count(l, "rate limits not shared") != 1 || strings.Count(l, "rate limits shared again") != 1 {
		t.Fatalf("want the outage and the recovery logged once each:\n%s", l)
	}
}

// TestSyncReadsBusyKeysOnly: an exchange touches in Redis only the buckets
// some replica took from lately: 200 keys nobody uses write nothing, and
// the one a uses is the one b reads.
func TestSyncReadsBusyKeysOnly(t *testing.T) {
	srv := redistest.Start(t, 0)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	cfg := make([]APIKey, 200)
	for i := range cfg {
		name := fmt.Sprint("sk-", i)
		cfg[i] = APIKey{Name: name, SHA256: HashKey(name), RequestsPerMinute: 60}
	}
	log := slog.New(slog.DiscardHandler)
	a, b := newTestKeys(t, cfg...), newTestKeys(t, cfg...)
	sa := NewSync(func() *Keys { return a }, rdb, "t", time.Hour, log)
	sb := NewSync(func() *Keys { return b }, rdb, "t", time.Hour, log)
	sa.Exchange(ctx)
	sb.Exchange(ctx)
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("200 idle keys exchanged: %d keys in Redis, want none", n)
	}
	// The commands the scripts ran count in Redis's commandstats.
	if stats := rdb.Info(ctx, "commandstats").Val(); strings.Contains(stats, "cmdstat_get:") {
		t.Fatalf("200 idle keys exchanged: buckets read:\n%s", stats)
	}
	ka, _ := a.Lookup([]byte("Bearer sk-7"), nil)
	for range 60 {
		ka.Admit(time.Now(), 0)
	}
	sa.Exchange(ctx)
	if n := rdb.DBSize(ctx).Val(); n != 3 {
		t.Fatalf("one key used: %d keys in Redis, want its bucket, the set of busy ones and a's exchange number", n)
	}
	sb.Exchange(ctx)
	if kb, _ := b.Lookup([]byte("Bearer sk-7"), nil); kb.Admit(time.Now(), 0).Limit != RequestsPerMinute {
		t.Fatal("b admits the key a spent")
	}
	if kb, _ := b.Lookup([]byte("Bearer sk-8"), nil); !kb.Admit(time.Now(), 0).OK() {
		t.Fatal("b refuses a key nobody used")
	}
}

// TestSyncLostReplyCountsOnce: an exchange Redis made whose reply did not
// come back (a read timeout, a reset) is sent again, and its units count
// once at the other replicas, not twice.
func TestSyncLostReplyCountsOnce(t *testing.T) {
	srv := redistest.Start(t, 0)
	client := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	ra, rb := client(), client()
	lose := &loseReplies{}
	ra.AddHook(lose)
	ctx := context.Background()
	cfg := APIKey{Name: "k", SHA256: HashKey("sk-k"), TokensPerMinute: 1000}
	log := slog.New(slog.DiscardHandler)
	replica := func(rdb *redis.Client) (*Key, *Sync) {
		ks := newTestKeys(t, cfg)
		k, _ := ks.Lookup([]byte("Bearer sk-k"), nil)
		return k, NewSync(func() *Keys { return ks }, rdb, "t", time.Hour, log)
	}
	a, sa := replica(ra)
	b, sb := replica(rb)
	a.Admit(time.Now(), 100)
	lose.on.Store(true)
	sa.Exchange(ctx)
	lose.on.Store(false)
	if sa.Up() || lose.lost.Load() != 1 {
		t.Fatalf("the exchange whose reply was lost: up %v, %d replies lost; want down, 1", sa.Up(), lose.lost.Load())
	}
	sa.Exchange(ctx)
	sb.Exchange(ctx)
	// 1,000 tokens a minute refill one every 60 ms: a few at most while
	// the test runs.
	if d := b.Admit(time.Now(), 10); d.tokensLeft < 885 || d.tokensLeft > 895 {
		t.Fatalf("b's tokens left after a's 100 (their exchange's reply lost once) and its own 10: %d, want 890", d.tokensLeft)
	}
	if !sa.Up() {
		t.Fatal("a is not up again after an exchange that worked")
	}
}

// loseReplies is a go-redis hook that, while on, lets a command run in
// Redis and fails it as a lost reply does.
type loseReplies struct {
	on   atomic.Bool
	lost atomic.Int32
}

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// Only a script's reply is lost; a Redis error (the NOSCRIPT
		// that has the script sent whole) is a reply.
		if err := next(ctx, cmd); err != nil || cmd.Err() != nil || !h.on.Load() || !strings.HasPrefix(cmd.Name(), "eval") {
			return err
		}
		h.lost.Add(1)
		cmd.SetErr(os.ErrDeadlineExceeded)
		return cmd.Err()
	}
}

func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/internal/redistest"
	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
)

// replica is one gateway's ledger sharing its decode charges.
type replica struct {
	*Ledger
	logs   *testlog.Buffer
	cancel context.CancelFunc
	done   chan struct{}
}

func newReplica(t *testing.T, addr, id string, pods []string) *replica {
	t.Helper()
	logs := new(testlog.Buffer)
	log := slog.New(slog.NewTextHandler(logs, nil))
	l := New(DefaultConfig(), Env{Logger: log})
	l.SetPods(members(pods...))
	rdb := redis.NewClient(&redis.Options{
		Addr:            addr,
		DialTimeout:     100 * time.Millisecond,
		ReadTimeout:     200 * time.Millisecond,
		WriteTimeout:    200 * time.Millisecond,
		MaxRetries:      -1,
		DialerRetries:   1,
		PoolSize:        2,
		DisableIdentity: true,
	})
	t.Cleanup(func() { rdb.Close() })
	sh := NewShared(l, rdb, SharedOptions{ReplicaID: id, KeyPrefix: t.Name(), Interval: 10 * time.Millisecond, Expiry: 500 * time.Millisecond, Logger: log})
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{Ledger: l, logs: logs, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		sh.Run(ctx)
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	r.cancel()
	<-r.done
}

// decodeTokens is r's decode view of its pod index i.
func (r *replica) decodeTokens(i int32) float64 {
	tok, _ := r.Decode(i, r.Now())
	return tok
}

func TestSharedDecodeLedgerThroughRedis(t *testing.T) {
	srv := redistest.Start(t, 0)
	// The replicas index the pods differently: sharing goes by name.
	a := newReplica(t, srv.Addr(), "a", []string{"p0", "p1"})
	b := newReplica(t, srv.Addr(), "b", []string{"p1", "p0"})
	const aP0, aP1, bP1, bP0 = 0, 1, 0, 1
	tk := tickets{}

	a.Charge(tk.of(1), -1, aP0, &Prompt{Tokens: 1000}, a.Now())
	b.Charge(tk.of(2), -1, bP1, &Prompt{Tokens: 300}, b.Now())
	testwait.For(t, "each replica to see the other's decode charge", func() bool {
		return b.decodeTokens(bP0) == 1000 && a.decodeTokens(aP1) == 300 &&
			a.decodeTokens(aP0) == 1000 && b.decodeTokens(bP1) == 300
	})
	// The remote charge ages like a local one: Σ (now − routed_at) grows.
	time.Sleep(50 * time.Millisecond)
	if _, age := b.Decode(bP0, b.Now()); age < 0.04 || age > 5 {
		t.Fatalf("remote age %v s, want about the 50+ ms since a charged", age)
	}

	// Redis goes away: nothing is lost, each replica keeps scoring its own
	// charges and keeps charging.
	srv.Stop()
	testwait.For(t, "both replicas to fall back to their own charges", func() bool {
		return b.decodeTokens(bP0) == 0 && a.decodeTokens(aP1) == 0
	})
	a.Charge(tk.of(3), -1, aP0, &Prompt{Tokens: 500}, a.Now())
	if got := a.decodeTokens(aP0); got != 1500 {
		t.Fatalf("a's local decode tokens %v while Redis is down, want 1500", got)
	}
	time.Sleep(50 * time.Millisecond) // several failed syncs
	for name, r := range map[string]*replica{"a": a, "b": b} {
		if n := strings.Count(r.logs.String(), "unreachable"); n != 1 {
			t.Fatalf("replica %s logged unreachable %d times, want once", name, n)
		}
	}

	// Redis comes back, empty: the replicas republish and share again.
	redistest.Start(t, srv.Port)
	testwait.For(t, "sharing to resume after Redis restarted", func() bool {
		return b.decodeTokens(bP0) == 1500 && a.decodeTokens(aP1) == 300
	})
	for name, r := range map[string]*replica{"a": a, "b": b} {
		if n := strings.Count(r.logs.String(), "reachable again"); n != 1 {
			t.Fatalf("replica %s logged the recovery %d times, want once", name, n)
		}
	}

	// Releases propagate; a replica that stops withdraws its charges.
	a.Finish(*tk.of(1))
	testwait.For(t, "b to see a's release", func() bool { return b.decodeTokens(bP0) == 500 })
	a.stop()
	testwait.For(t, "b to drop a's charges once a stopped", func() bool { return b.decodeTokens(bP0) == 0 })
	if got := b.decodeTokens(bP1); got != 300 {
		t.Fatalf("b's own decode tokens %v, want 300", got)
	}
}

func TestParseRemote(t *testing.T) {
	// Two replicas' hashes for pod x; the second published 100 ms before the
	// reply, so its 2 requests are 200 ms older now.
	res := []any{int64(10_000),
		[]any{"@at", "10000", "x", "100 1 50", "y", "7 1 0"},
		[]any{"x", "200 2 300", "@at", "9900"},
	}
	got, err := parseRemote(res, 42)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]remoteLoad{
		"x": {tokens: 300, reqs: 3, ageMs: 50 + 300 + 2*100, asOfMs: 42},
		"y": {tokens: 7, reqs: 1, ageMs: 0, asOfMs: 42},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range [][]any{{}, {"x"}, {int64(1), []any{"x"}}, {int64(1), []any{"x", "1 2"}}, {int64(1), []any{"@at", "z"}}} {
		if _, err := parseRemote(bad, 0); err == nil {
			t.Fatalf("parsed malformed reply %v", bad)
		}
	}
}

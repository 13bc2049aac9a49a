package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
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

func newReplica(t *testing.T, addr, id string, pods []Member) *replica {
	t.Helper()
	logs := new(testlog.Buffer)
	log := slog.New(slog.NewTextHandler(logs, nil))
	l := New(DefaultConfig(), Env{Logger: log})
	l.SetPods(pods)
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
	a := newReplica(t, srv.Addr(), "a", members("p0", "p1"))
	b := newReplica(t, srv.Addr(), "b", members("p1", "p0"))
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

// fakeLoad is a pod's own counts, as the gateway's pool.Pod keeps them.
type fakeLoad struct{ inFlight, queued atomic.Int64 }

func (f *fakeLoad) InFlight() int64      { return f.inFlight.Load() }
func (f *fakeLoad) QueuedPrefill() int64 { return f.queued.Load() }

// TestSharedPrefillLoadThroughRedis: a replica's view of a pod's prefill
// load (charges, requests in flight, queued tokens) includes the other
// replicas', matched by the pod's key, so replicas route as one.
func TestSharedPrefillLoadThroughRedis(t *testing.T) {
	srv := redistest.Start(t, 0)
	var podA, podB fakeLoad
	// b knows pod "p" under a newer UID as well (recreated under its name):
	// the old pod's load is not the new one's.
	a := newReplica(t, srv.Addr(), "a", []Member{{ID: 0, Name: "p", Key: "uid-1", Load: &podA}})
	b := newReplica(t, srv.Addr(), "b", []Member{{ID: 0, Name: "p", Key: "uid-2"}, {ID: 1, Name: "p", Key: "uid-1", Load: &podB}})
	const bNew, bOld = 0, 1
	podA.inFlight.Store(3)
	podA.queued.Store(900)
	podB.inFlight.Store(1)
	tk := tickets{}
	a.Charge(tk.of(1), 0, -1, &Prompt{Tokens: 1000}, a.Now())
	view := func(r *replica, pod int32) string {
		active, kv := r.Prefill(pod)
		n, q := r.Remote(pod)
		return fmt.Sprintf("active %d kv %d remote in flight %d queued %d", active, kv, n, q)
	}
	cost := DefaultConfig().RequestCost + 1000
	want := fmt.Sprintf("active %d kv %d remote in flight 3 queued 900", cost, cost)
	testwait.For(t, "b to see a's prefill load on the pod", func() bool { return view(b, bOld) == want })
	if got := view(b, bNew); got != "active 0 kv 0 remote in flight 0 queued 0" {
		t.Fatalf("b's view of the pod recreated under the name: %s, want none of a's load", got)
	}
	testwait.For(t, "a to see b's request in flight", func() bool {
		return view(a, 0) == fmt.Sprintf("active %d kv %d remote in flight 1 queued 0", cost, cost)
	})
	a.PrefillDone(*tk.of(1))
	podA.inFlight.Store(0)
	podA.queued.Store(0)
	want = fmt.Sprintf("active 0 kv %d remote in flight 0 queued 0", cost)
	testwait.For(t, "b to see a's prefill finish", func() bool { return view(b, bOld) == want })
}

func TestParseRemote(t *testing.T) {
	// Two replicas' hashes for pod x; the second published 100 ms before the
	// reply, so its 2 requests are 200 ms older now. The second is of an
	// older release: decode charges only. The third is of a later one,
	// whose eighth field is not read.
	res := []any{int64(10_000),
		[]any{"@at", "10000", "x", "100 1 50 10 20 3 40", "y", "7 1 0 0 0 0 0"},
		[]any{"x", "200 2 300", "@at", "9900"},
		[]any{"@at", "10000", "y", "1 0 0 0 0 0 0 99"},
	}
	got, err := parseRemote(res, 42)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]remoteLoad{
		"x": {tokens: 300, seqs: 3, ageMs: 50 + 300 + 2*100, asOfMs: 42, active: 10, kv: 20, inFlight: 3, queued: 40},
		"y": {tokens: 8, seqs: 1, ageMs: 0, asOfMs: 42},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range [][]any{{}, {"x"}, {int64(1), []any{"x"}}, {int64(1), []any{"x", "1 2"}}, {int64(1), []any{"x", "1 2 3 4"}}, {int64(1), []any{"x", "1 2 z"}}, {int64(1), []any{"@at", "z"}}} {
		if _, err := parseRemote(bad, 0); err == nil {
			t.Fatalf("parsed malformed reply %v", bad)
		}
	}
}

// FuzzParseRemote: any one-replica reply parses or is refused, without a
// panic; a parsed pod's load is the fields it was sent.
func FuzzParseRemote(f *testing.F) {
	f.Add("10000", "x", "100 1 50 10 20 3 40")
	f.Add("9900", "y", "200 2 300")
	f.Add("z", "x", "1 2")
	f.Fuzz(func(t *testing.T, at, key, value string) {
		got, err := parseRemote([]any{int64(10_000), []any{"@at", at, key, value}}, 0)
		if err != nil || key == "@at" {
			return
		}
		r, ok := got[key]
		if !ok {
			t.Fatalf("parsed %q without pod %q: %v", value, key, got)
		}
		if want, _ := strconv.ParseInt(strings.Fields(value)[0], 10, 64); r.tokens != want {
			t.Fatalf("pod %q tokens %d from %q", key, r.tokens, value)
		}
	})
}

package ledger

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testLedger is a ledger on a fake clock with pods a, b, c at 0, 1, 2.
type testLedger struct {
	*Ledger
	clock   *atomic.Int64
	logs    *bytes.Buffer
	dropped []string
}

func newTestLedger(t *testing.T, cfg Config) *testLedger {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	tl := &testLedger{clock: new(atomic.Int64), logs: new(bytes.Buffer)}
	tl.clock.Store(int64(time.Hour)) // any origin; not zero, to catch "0 means unset" bugs
	tl.Ledger = New(cfg, Env{
		Now:    tl.clock.Load,
		Logger: slog.New(slog.NewTextHandler(tl.logs, nil)),
		OnDrop: func(name string) { tl.dropped = append(tl.dropped, name) },
	})
	tl.SetPods(members("a", "b", "c"))
	return tl
}

// members are pods named names with ids 0, 1, ...
func members(names ...string) []Member {
	m := make([]Member, len(names))
	for i, n := range names {
		m[i] = Member{ID: int32(i), Name: n}
	}
	return m
}

// tickets keeps one Ticket per request id, as the gateway keeps one per
// request, for tests that name their requests by number.
type tickets map[uint64]*Ticket

func (ts tickets) of(id uint64) *Ticket {
	t := ts[id]
	if t == nil {
		t = &Ticket{ID: id}
		ts[id] = t
	}
	return t
}

func (tl *testLedger) advance(d time.Duration) { tl.clock.Add(int64(d)) }

func (tl *testLedger) prefill(t *testing.T, pod int32, wantActive, wantKV int64) {
	t.Helper()
	if a, kv := tl.Prefill(pod); a != wantActive || kv != wantKV {
		t.Fatalf("pod %d: active, kv = %d, %d; want %d, %d", pod, a, kv, wantActive, wantKV)
	}
}

// decode checks pod's decode view at the fake clock's now.
func (tl *testLedger) decode(t *testing.T, pod int32, wantTokens, wantAgeSec float64) {
	t.Helper()
	if tok, age := tl.Decode(pod, tl.Now()); tok != wantTokens || age != wantAgeSec {
		t.Fatalf("pod %d: decode %v tokens, age %v s; want %v, %v", pod, tok, age, wantTokens, wantAgeSec)
	}
}

func TestNewTokensRules(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinMatchPct = 30
	tl := newTestLedger(t, cfg)
	tk := tickets{}
	id := uint64(0)
	// f charges p to pod a and checks the prefill charge (request_cost +
	// new_tokens); the charge is finished at once so charges never pile up.
	f := func(p Prompt, wantNew int64) {
		t.Helper()
		id++
		if got := tl.Charge(tk.of(id), 0, -1, &p, tl.Now()); got != DefaultRequestCost+wantNew {
			t.Fatalf("%+v: charge %d, want %d + %d", p, got, DefaultRequestCost, wantNew)
		}
		tl.prefill(t, 0, DefaultRequestCost+wantNew, DefaultRequestCost+wantNew)
		tl.Finish(*tk.of(id))
	}
	// Whole prompt: no session, no lookup.
	f(Prompt{Tokens: 1000}, 1000)
	// Prefix match: prompt × (1 − match%), thresholded by min_match_pct.
	f(Prompt{Tokens: 1000, Matched: true, MatchPct: 75}, 250)
	f(Prompt{Tokens: 1000, Matched: true, MatchPct: 30}, 700)
	f(Prompt{Tokens: 1000, Matched: true, MatchPct: 29.9}, 1000)
	f(Prompt{Tokens: 1000, Matched: true, MatchPct: 100}, 0)
	f(Prompt{Tokens: 1000, Matched: false, MatchPct: 75}, 1000)
	// Session delta: the first turn is charged whole (or by its match), later
	// longer turns by their growth, even when the prefix match says more.
	f(Prompt{Tokens: 1000, Model: "m", SessionKey: "s1"}, 1000)
	f(Prompt{Tokens: 1500, Model: "m", SessionKey: "s1", Matched: true, MatchPct: 50}, 500)
	f(Prompt{Tokens: 1600, Model: "m", SessionKey: "s1"}, 100)
	// Same key, other model: a session of its own.
	f(Prompt{Tokens: 1700, Model: "m2", SessionKey: "s1"}, 1700)
	// A prompt no longer than the last one falls through to rules 2 and 3,
	// and becomes the new reference.
	f(Prompt{Tokens: 1600, Model: "m", SessionKey: "s1", Matched: true, MatchPct: 50}, 800)
	f(Prompt{Tokens: 1200, Model: "m", SessionKey: "s1"}, 1200)
	f(Prompt{Tokens: 1300, Model: "m", SessionKey: "s1"}, 100)
	// Past the session TTL the old size no longer counts.
	tl.advance(DefaultSessionTTLSeconds*time.Second + time.Nanosecond)
	f(Prompt{Tokens: 2000, Model: "m", SessionKey: "s1"}, 2000)
	f(Prompt{Tokens: 2100, Model: "m", SessionKey: "s1"}, 100)
}

func TestSessionTTLZeroTurnsRuleOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SessionTTLSeconds = 0
	tl := newTestLedger(t, cfg)
	tk := tickets{}
	for i, tokens := range []int64{1000, 1500} {
		p := Prompt{Tokens: tokens, Model: "m", SessionKey: "s"}
		if got := tl.Charge(tk.of(uint64(i)), 0, -1, &p, tl.Now()); got != DefaultRequestCost+tokens {
			t.Fatalf("turn %d: charge %d, want whole prompt", i, got)
		}
	}
	if n := tl.sessions.len(); n != 0 {
		t.Fatalf("%d sessions stored with the rule off", n)
	}
}

func TestSessionKeyLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxSessions = 2
	tl := newTestLedger(t, cfg)
	tk := tickets{}
	id := uint64(0)
	// f charges two turns of key (100 then 150 tokens) and checks the second.
	f := func(key string, wantNew int64) {
		t.Helper()
		for _, tokens := range []int64{100, 150} {
			id++
			p := Prompt{Tokens: tokens, Model: "m", SessionKey: key}
			got := tl.Charge(tk.of(id), 0, -1, &p, tl.Now()) - DefaultRequestCost
			tl.Finish(*tk.of(id))
			if tokens == 150 && got != wantNew {
				t.Fatalf("key %.10q… (%d bytes): second turn charged %d new, want %d", key, len(key), got, wantNew)
			}
		}
	}
	f(strings.Repeat("k", MaxSessionKeySize+1), 150) // too long: ignored, not stored
	if n := tl.sessions.len(); n != 0 {
		t.Fatalf("over-long key stored (%d sessions)", n)
	}
	f(strings.Repeat("k", MaxSessionKeySize), 50) // at the limit: kept
	f("second", 50)
	f("third", 150) // table full: charged without a delta
	if n := tl.sessions.len(); n != 2 {
		t.Fatalf("%d sessions, want the cap 2", n)
	}
	// The janitor forgets idle sessions; then new keys fit again.
	tl.advance(DefaultSessionTTLSeconds*time.Second + time.Second)
	tl.sweep()
	if n := tl.sessions.len(); n != 0 {
		t.Fatalf("%d sessions after expiry, want 0", n)
	}
	f("third", 50)
}

func TestLifecycleAndIdempotentRelease(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	p := Prompt{Tokens: 500}
	c := tl.Charge(tk.of(7), 1, -1, &p, tl.Now())
	tl.prefill(t, 1, c, c)
	tl.PrefillDone(*tk.of(7))
	tl.prefill(t, 1, 0, c)
	tl.PrefillDone(*tk.of(7)) // idempotent
	tl.prefill(t, 1, 0, c)
	tl.Finish(*tk.of(7))
	tl.prefill(t, 1, 0, 0)
	tl.Finish(*tk.of(7)) // idempotent
	tl.PrefillDone(*tk.of(7))
	tl.Finish(*tk.of(99)) // unknown
	tl.prefill(t, 1, 0, 0)

	// A prefill that fails: Finish without PrefillDone releases both parts.
	tl.Charge(tk.of(8), 1, -1, &p, tl.Now())
	tl.Finish(*tk.of(8))
	tl.prefill(t, 1, 0, 0)

	// Charging an id again (a retry on another pod) moves the charge.
	tl.Charge(tk.of(9), 0, -1, &p, tl.Now())
	tl.Charge(tk.of(9), 2, -1, &p, tl.Now())
	tl.prefill(t, 0, 0, 0)
	tl.prefill(t, 2, c, c)
	tl.Finish(*tk.of(9))
	tl.prefill(t, 2, 0, 0)

	// A copy taken before a retry's charge (a concurrent prefill leg of
	// the earlier attempt) releases nothing of the retry's when it ends.
	tl.Charge(tk.of(10), 0, -1, &p, tl.Now())
	leg := *tk.of(10)
	tl.Charge(tk.of(10), 2, -1, &p, tl.Now())
	tl.PrefillDone(leg)
	tl.prefill(t, 2, c, c)
	tl.PrefillDone(*tk.of(10))
	tl.prefill(t, 2, 0, c)
	tl.Finish(*tk.of(10))
	tl.prefill(t, 2, 0, 0)
}

// TestMoveDecode: a decode leg that moves to another pod moves its decode
// charge, routed anew; the prefill part stays as it was, for the prefill
// leg to release.
func TestMoveDecode(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	p := Prompt{Tokens: 3000}
	c := tl.Charge(tk.of(1), 0, 1, &p, tl.Now())
	tl.advance(2 * time.Second)
	tl.MoveDecode(*tk.of(1), 2, tl.Now())
	tl.prefill(t, 0, c, c)
	for pod, want := range []float64{0, 0, 3000} {
		if tok, age := tl.Decode(int32(pod), tl.Now()); tok != want || age != 0 {
			t.Fatalf("after the move, pod %d: decode %v tokens, age %v s; want %v, 0", pod, tok, age, want)
		}
	}
	tl.PrefillDone(*tk.of(1))
	tl.prefill(t, 0, 0, c)
	tl.Finish(*tk.of(1))
	tl.prefill(t, 0, 0, 0)
	if tok, _ := tl.Decode(2, tl.Now()); tok != 0 {
		t.Fatalf("after the finish: pod c holds %v decode tokens", tok)
	}
	tl.MoveDecode(*tk.of(1), 1, tl.Now()) // finished: nothing to move
	if tok, _ := tl.Decode(1, tl.Now()); tok != 0 {
		t.Fatalf("a finished ticket's move charged pod b %v decode tokens", tok)
	}
}

func TestDecodeChargeAndGrowthAge(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	p := Prompt{Tokens: 3000, Matched: true, MatchPct: 90}
	// Prefill on a, decode on b: b gets the whole prompt, no request cost.
	c := tl.Charge(tk.of(1), 0, 1, &p, tl.Now())
	tl.prefill(t, 0, c, c)
	tl.decode(t, 1, 3000, 0)
	tl.advance(2 * time.Second)
	p.Tokens = 1000
	tl.Charge(tk.of(2), -1, 1, &p, tl.Now()) // decode only
	tl.prefill(t, 1, 0, 0)
	tl.decode(t, 1, 4000, 2)
	tl.advance(500 * time.Millisecond)
	tl.decode(t, 1, 4000, 2.5+0.5)
	tl.PrefillDone(*tk.of(1)) // the decode part stays until the request finishes
	tl.decode(t, 1, 4000, 3)
	tl.Finish(*tk.of(1))
	tl.prefill(t, 0, 0, 0)
	tl.decode(t, 1, 1000, 0.5)
	tl.Finish(*tk.of(2))
	tl.decode(t, 1, 0, 0)
}

// TestDecodeGrowthPerSequence: a request's output grows in each of its
// sequences (n for each prompt), so its age counts once per sequence,
// where it was routed and where it moves; its release takes all of them.
func TestDecodeGrowthPerSequence(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	tl.Charge(tk.of(1), 0, 1, &Prompt{Tokens: 100, Sequences: 4}, tl.Now())
	tl.Charge(tk.of(2), 0, 1, &Prompt{Tokens: 50}, tl.Now()) // 0: one sequence
	tl.advance(2 * time.Second)
	tl.decode(t, 1, 150, 4*2+2)
	tl.MoveDecode(*tk.of(1), 2, tl.Now())
	tl.decode(t, 1, 50, 2)
	tl.advance(time.Second)
	tl.decode(t, 2, 100, 4*1)
	tl.Finish(*tk.of(1))
	tl.Finish(*tk.of(2))
	tl.decode(t, 1, 0, 0)
	tl.decode(t, 2, 0, 0)
}

func TestTTLForceRelease(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	p := Prompt{Tokens: 100}
	c := tl.Charge(tk.of(1), 0, 1, &p, tl.Now())
	tl.advance(time.Duration(DefaultTTLSeconds) * time.Second)
	tl.Charge(tk.of(2), 0, -1, &p, tl.Now())
	tl.sweep() // charge 1 is exactly TTL old: not yet
	tl.prefill(t, 0, 2*c, 2*c)
	if tl.logs.Len() != 0 {
		t.Fatalf("warning before the TTL passed: %s", tl.logs)
	}
	tl.advance(time.Nanosecond)
	tl.sweep()
	tl.prefill(t, 0, c, c)
	if tok, _ := tl.Decode(1, tl.Now()); tok != 0 {
		t.Fatalf("decode tokens %v after force release", tok)
	}
	log := tl.logs.String()
	for _, want := range []string{"level=WARN", "force-released", "request_id=1", "prefill_pod=a", "decode_pod=b"} {
		if !strings.Contains(log, want) {
			t.Fatalf("log %q lacks %q", log, want)
		}
	}
	// The late release of the forced charge changes nothing.
	tl.PrefillDone(*tk.of(1))
	tl.Finish(*tk.of(1))
	tl.prefill(t, 0, c, c)
	tl.Finish(*tk.of(2))
	tl.prefill(t, 0, 0, 0)
}

func TestJanitorDropsIdlePods(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	series := func() string {
		var b bytes.Buffer
		tl.WritePrometheus(&b)
		return b.String()
	}
	p := Prompt{Tokens: 100}
	tl.Charge(tk.of(1), 0, -1, &p, tl.Now()) // a busy
	tl.advance(30 * time.Second)
	tl.Charge(tk.of(2), 1, -1, &p, tl.Now()) // b touched
	tl.Finish(*tk.of(2))
	tl.sweep() // b: at zero from now; c: at zero since SetPods, 30 s ago
	tl.advance(30 * time.Second)
	tl.sweep() // c idle a whole minute
	if got := strings.Join(tl.dropped, ","); got != "c" {
		t.Fatalf("dropped %q, want c", got)
	}
	if s := series(); strings.Contains(s, `pod="c"`) || !strings.Contains(s, `pod="b"`) {
		t.Fatalf("series after dropping c:\n%s", s)
	}
	tl.advance(30 * time.Second)
	tl.sweep() // b idle a minute since the sweep that saw it at zero
	tl.advance(time.Hour - 90*time.Second)
	tl.sweep() // a still holds its charge
	if got := strings.Join(tl.dropped, ","); got != "c,b" {
		t.Fatalf("dropped %q, want c,b", got)
	}
	// The next charge re-creates the pod from zero.
	tl.Charge(tk.of(3), 2, -1, &p, tl.Now())
	if s := series(); !strings.Contains(s, `pd_token_load_active_tokens{pod="c"} 3600`) {
		t.Fatalf("c not back after a charge:\n%s", s)
	}
	// A pod the gateway no longer has is forgotten once idle; its index is
	// taken by another pod, which starts from its own counters.
	tl.Finish(*tk.of(1))
	tl.Finish(*tk.of(3))
	tl.SetPods([]Member{{ID: 1 << IndexBits, Name: "d"}, {ID: 1, Name: "b"}, {ID: 2, Name: "c"}})
	tl.prefill(t, 1<<IndexBits, 0, 0)
	tl.advance(time.Minute)
	tl.sweep()
	tl.advance(time.Minute)
	tl.sweep()
	tl.mu.Lock()
	_, hasA := tl.byID[0]
	tl.mu.Unlock()
	if hasA {
		t.Fatal("pod a still registered after leaving the pool and idling")
	}
}

// TestCountersFollowIDs reloads the pods: a and c keep their ids, b
// leaves and a new pod named b takes its index under another id. Each id
// keeps its own counters: the new b starts from zero, a charge naming the
// old b's id charges the old b, and the series sum the two b's while the
// old one drains.
func TestCountersFollowIDs(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	tk := tickets{}
	p := Prompt{Tokens: 100}
	c := tl.Charge(tk.of(1), 0, 2, &p, tl.Now())
	tl.Charge(tk.of(2), 1, -1, &p, tl.Now())
	newB := int32(1 + 1<<IndexBits)
	tl.SetPods([]Member{{ID: 2, Name: "c"}, {ID: 0, Name: "a"}, {ID: newB, Name: "b"}})
	tl.prefill(t, 0, c, c)
	tl.prefill(t, newB, 0, 0)
	if tok, _ := tl.Decode(2, tl.Now()); tok != 100 {
		t.Fatalf("c's decode tokens %v after the reload, want 100", tok)
	}
	if a, _ := tl.Prefill(1); a != 0 {
		t.Fatalf("the old b's id reads %d active tokens, want none", a)
	}
	tl.Charge(tk.of(3), 1, -1, &p, tl.Now()) // decided before the reload
	tl.prefill(t, newB, 0, 0)
	tl.Charge(tk.of(4), newB, -1, &p, tl.Now())
	var buf strings.Builder
	tl.WritePrometheus(&buf)
	if want := fmt.Sprintf(`pd_token_load_active_tokens{pod="b"} %d`, 3*c); !strings.Contains(buf.String(), want) {
		t.Fatalf("series want %s (both b's):\n%s", want, buf.String())
	}
	for id := range uint64(5) {
		tl.Finish(*tk.of(id))
	}
	for _, id := range []int32{0, 2, newB} {
		tl.prefill(t, id, 0, 0)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if old := tl.byID[1]; old == nil || !old.slot.zero() {
		t.Fatal("the old b is not registered at zero after its charges drained")
	}
}

// TestConcurrentChargesEndAtZero charges and releases from many goroutines
// on shared pods, with duplicate releases, retries and janitor sweeps racing
// them; every counter must end exactly at zero. Run it with -race.
func TestConcurrentChargesEndAtZero(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	const goroutines, perG = 16, 2000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				tl.sweep()
				var b bytes.Buffer
				tl.WritePrometheus(&b)
			}
		}
	}()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				tk := Ticket{ID: uint64(g*perG + i)}
				p := Prompt{Tokens: int64(1 + i%5000), Model: "m", SessionKey: []string{"", "x", "y"}[i%3], Matched: i%2 == 0, MatchPct: float64(i % 100)}
				tl.Charge(&tk, int32(i%3), int32((i+1)%3), &p, tl.Now())
				if i%7 == 0 {
					tl.Charge(&tk, int32((i+2)%3), -1, &p, tl.Now()) // retry elsewhere
				}
				tl.PrefillDone(tk)
				tl.PrefillDone(tk)
				tl.Finish(tk)
				tl.Finish(tk)
			}
		}()
	}
	wg.Wait()
	close(stop)
	for pod := range int32(3) {
		tl.prefill(t, pod, 0, 0)
		s := (*tl.table.Load())[pod]
		if s.decode.Load() != 0 || s.decodeSeqs.Load() != 0 || s.routedMs.Load() != 0 {
			t.Fatalf("pod %d decode counters %d %d %d, want 0", pod, s.decode.Load(), s.decodeSeqs.Load(), s.routedMs.Load())
		}
	}
}

func TestChargeReleaseAllocs(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	p := Prompt{Tokens: 2000, Matched: true, MatchPct: 40}
	id := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		id++
		tk := Ticket{ID: id}
		now := tl.Now()
		tl.Charge(&tk, int32(id%3), int32((id+1)%3), &p, now)
		tl.PrefillDone(tk)
		tl.Decode(0, now)
		tl.Finish(tk)
	})
	if allocs != 0 {
		t.Fatalf("charge + release: %v allocs/op, want 0", allocs)
	}
}

// TestSelectionsSeeEachOthersCharges runs concurrent least-loaded picks
// under LockSelection: each must see the charges of those before it, so
// equal requests spread exactly evenly.
func TestSelectionsSeeEachOthersCharges(t *testing.T) {
	tl := newTestLedger(t, DefaultConfig())
	const perPod = 20
	var wg sync.WaitGroup
	for g := range 3 * perPod {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl.LockSelection()
			defer tl.UnlockSelection()
			best, bestLoad := int32(0), int64(-1)
			for pod := range int32(3) {
				if a, _ := tl.Prefill(pod); bestLoad < 0 || a < bestLoad {
					best, bestLoad = pod, a
				}
			}
			tl.Charge(&Ticket{ID: uint64(g)}, best, -1, &Prompt{Tokens: 1000}, tl.Now())
		}()
	}
	wg.Wait()
	for pod := range int32(3) {
		tl.prefill(t, pod, perPod*(DefaultRequestCost+1000), perPod*(DefaultRequestCost+1000))
	}
}

// A decision made on the gateway's previous snapshot may name a pod a
// reload just removed: the pod is charged, as the request goes to it, and
// drains, though it reads as idle; a pod the ledger forgot is not charged.
func TestPodsBeyondTheLastSetPods(t *testing.T) {
	l := New(DefaultConfig(), Env{})
	tk := tickets{}
	l.SetPods(members("a", "b", "c", "d"))
	l.SetPods(members("a", "b", "c"))
	if a, kv := l.Prefill(3); a != 0 || kv != 0 {
		t.Fatalf("Prefill(3) = %d, %d", a, kv)
	}
	if tok, _ := l.Decode(3, 0); tok != 0 {
		t.Fatalf("Decode(3) = %v", tok)
	}
	l.Charge(tk.of(1), 3, 3, &Prompt{Tokens: 100}, 0)
	l.Charge(tk.of(2), 0, 3, &Prompt{Tokens: 100}, 0)
	l.Charge(tk.of(3), 9, -1, &Prompt{Tokens: 100}, 0)
	if a, _ := l.Prefill(0); a == 0 {
		t.Fatal("the pod still present was not charged")
	}
	l.mu.Lock()
	d := l.byID[3].slot
	l.mu.Unlock()
	if d.active.Load() == 0 || d.decodeSeqs.Load() != 2 {
		t.Fatalf("the pod that left holds %d active tokens and %d decode sequences, want its charges", d.active.Load(), d.decodeSeqs.Load())
	}
	for id := range uint64(4) {
		l.Finish(*tk.of(id))
	}
	if a, kv := l.Prefill(0); a != 0 || kv != 0 || !d.zero() {
		t.Fatalf("charges left after Finish: %d, %d, and the pod that left at zero: %v", a, kv, d.zero())
	}
}

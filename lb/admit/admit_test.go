package admit

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestTTFT(t *testing.T) {
	f := func(queued, uncached, speed, transfer, want float64) {
		t.Helper()
		if got := TTFT(queued, uncached, speed, transfer); math.Abs(got-want) > 1e-12 {
			t.Fatalf("TTFT(%v, %v, %v, %v) = %v, want %v", queued, uncached, speed, transfer, got, want)
		}
	}
	f(0, 2000, 20000, 0, 0.1)
	f(40000, 2000, 20000, 0, 2.1)
	f(40000, 2000, 0, 0.25, 2.35) // unknown speed: the default
	f(0, 0, 10000, 0, 0)
}

func TestPredict(t *testing.T) {
	// A line of 10 ms a step plus 1 ms a sequence: a step at batch 4 is 14 ms.
	line := NewDecodeLine(0.010, 0.001, 64, DefaultDecodeForget)
	f := func(p Path, wantTTFT, wantTPOT float64) {
		t.Helper()
		ttft, tpot := Predict(p)
		if math.Abs(ttft-wantTTFT) > 1e-9 || math.Abs(tpot-wantTPOT) > 1e-9 {
			t.Fatalf("Predict(%+v) = %v, %v, want %v, %v", p, ttft, tpot, wantTTFT, wantTPOT)
		}
	}
	// One pod: the prefill alone (the gateway's combined path).
	f(Path{QueuedTokens: 40000, UncachedTokens: 2000, PrefillTokensPerSec: 20000, Batch: 3, Line: line}, 2.1, 0.014)
	// A pair: the transfer and the slot wait add to the prefill.
	f(Path{UncachedTokens: 2000, PrefillTokensPerSec: 20000, TransferSec: 0.05, SlotWaitSec: 0.5, Batch: 3, Line: line}, 0.65, 0.014)
	// The decode pod's first step is the client's first token.
	f(Path{UncachedTokens: 2000, PrefillTokensPerSec: 20000, TransferSec: 0.05, FirstTokenOnDecode: true, Batch: 3, Line: line}, 0.164, 0.014)
	// A full KV cache: the request would queue.
	ttft, tpot := Predict(Path{FirstTokenOnDecode: true, KVUsage: 1, Line: line})
	if !math.IsInf(ttft, 1) || !math.IsInf(tpot, 1) {
		t.Fatalf("full KV: %v, %v, want +Inf, +Inf", ttft, tpot)
	}
}

func TestSlotWait(t *testing.T) {
	f := func(ahead int, remaining []int, queued int, want float64) {
		t.Helper()
		// A full batch of 4 steps in 0.1 s.
		if got := SlotWait(ahead, remaining, 0.1, 4, queued); math.Abs(got-want) > 1e-9 {
			t.Fatalf("SlotWait(%d, %v, queued %d) = %v, want %v", ahead, remaining, queued, got, want)
		}
	}
	f(-1, []int{5, 9}, 0, 0)           // a free slot
	f(0, []int{5, 9, 20, 30}, 10, 0.5) // the first slot to free
	f(2, []int{5, 9, 20, 30}, 10, 2)
	f(4, []int{5, 9, 20, 30}, 40, 4) // past the batch: the last slot, then the queue at 4 tokens a step
	f(3, nil, 8, 0.2)                // nothing running yet: the queue alone
}

func TestPrefillSpeedConverges(t *testing.T) {
	s := NewPrefillSpeed(DefaultPrefillTokensPerSec, DefaultSpeedAlpha)
	if s.TokensPerSec() != DefaultPrefillTokensPerSec {
		t.Fatalf("starts at %v", s.TokensPerSec())
	}
	s.Observe(0, 1)     // a full cache hit: no information
	s.Observe(1000, 0)  // no time: no information
	s.Observe(1000, -1) // nonsense: ignored
	if s.TokensPerSec() != DefaultPrefillTokensPerSec {
		t.Fatalf("moved on empty observations to %v", s.TokensPerSec())
	}
	// The pod is in fact half as fast as configured, with ±10% jitter.
	for i := 0; i < 60; i++ {
		n := 500 + 37*i
		jitter := 1 + 0.1*float64(i%3-1)
		s.Observe(n, float64(n)/10000*jitter)
	}
	if got := s.TokensPerSec(); math.Abs(got-10000) > 600 {
		t.Fatalf("learned %v tokens/s, want about 10000", got)
	}
}

func TestDecodeLineConverges(t *testing.T) {
	d := NewDecodeLine(DefaultDecodeBaseSec, DefaultDecodePerSeqSec, DefaultDecodeMaxBatch, DefaultDecodeForget)
	base, per := d.Line()
	if math.Abs(base-DefaultDecodeBaseSec) > 1e-12 || math.Abs(per-DefaultDecodePerSeqSec) > 1e-12 {
		t.Fatalf("prior line %v + %v·b", base, per)
	}
	// The real pod: 20 ms + 0.5 ms per sequence.
	for i := 0; i < 400; i++ {
		b := 1 + (i*7)%48
		d.Observe(b, 0.020+0.0005*float64(b))
	}
	base, per = d.Line()
	if math.Abs(base-0.020) > 0.001 || math.Abs(per-0.0005) > 0.00003 {
		t.Fatalf("learned %v + %v·b, want 0.020 + 0.0005·b", base, per)
	}
	if got := d.TPOT(9, 0.5); math.Abs(got-0.025) > 0.001 {
		t.Fatalf("TPOT at batch 9 = %v, want about 0.025 (step at batch 10)", got)
	}
	if got := d.TPOT(9, 1); !math.IsInf(got, 1) {
		t.Fatalf("TPOT with full KV = %v, want +Inf", got)
	}
	// Observations at one batch size only fix the level, keeping the slope.
	for i := 0; i < 2000; i++ {
		d.Observe(16, 0.040)
	}
	base, per = d.Line()
	if math.IsNaN(base) || math.IsNaN(per) || math.Abs(base+16*per-0.040) > 0.001 {
		t.Fatalf("after one batch size: %v + %v·b, want 0.040 at 16", base, per)
	}
}

func TestConfigValidate(t *testing.T) {
	f := func(mut func(*Config), want string) {
		t.Helper()
		c := DefaultConfig()
		mut(&c)
		err := c.Validate()
		if want == "" {
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want it to mention %q", err, want)
		}
	}
	f(func(*Config) {}, "")
	f(func(c *Config) { c.Classes[Batch].TTFTSLO = 0 }, "classes.batch.ttft_slo = 0")
	f(func(c *Config) { c.Classes[Interactive].TPOTSLO = -1 }, "classes.interactive.tpot_slo = -1")
	f(func(c *Config) { c.Classes[Batch].MaxWait = math.NaN() }, "classes.batch.max_wait = NaN")
	f(func(c *Config) { c.DeferQueue = -3 }, "defer_queue = -3")
}

func TestParseClass(t *testing.T) {
	f := func(name string, want Class, ok bool) {
		t.Helper()
		got, err := ParseClass(name)
		if (err == nil) != ok || (ok && got != want) {
			t.Fatalf("ParseClass(%q) = %v, %v", name, got, err)
		}
	}
	f("", Interactive, true)
	f("interactive", Interactive, true)
	f("batch", Batch, true)
	f("gold", 0, false)
}

func TestDecide(t *testing.T) {
	c, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	f := func(class Class, ttft, tpot float64, want Verdict) {
		t.Helper()
		if got := c.Decide(class, "", 1, 0, ttft, tpot); got != want {
			t.Fatalf("Decide(%v, ttft %v, tpot %v) = %+v, want %+v", class, ttft, tpot, got, want)
		}
	}
	f(Interactive, 1.9, 0.05, Verdict{Action: Admit})
	f(Interactive, 2.0, 0.1, Verdict{Action: Admit}) // at the target is within it
	f(Interactive, 2.1, 0.05, Verdict{Action: Reject, RetryAfter: 1})
	f(Interactive, 7.5, 0.05, Verdict{Action: Reject, RetryAfter: 6})
	f(Interactive, 0.5, 0.2, Verdict{Action: Reject, RetryAfter: 1}) // TPOT miss
	f(Interactive, math.Inf(1), 0, Verdict{Action: Reject, RetryAfter: 3600})
	f(Batch, 30, 5, Verdict{Action: Admit}) // no TPOT target
	f(Batch, 90, 0, Verdict{Action: Defer})

	s := c.Stats(Interactive)
	if s.Admitted != 2 || s.Rejected != 4 || s.Deferred != 0 {
		t.Fatalf("interactive stats %+v", s)
	}
	s = c.Stats(Batch)
	if s.Admitted != 1 || s.Deferred != 1 || s.Waiting != 1 || s.Rejected != 0 {
		t.Fatalf("batch stats %+v", s)
	}
	c.Observe(Interactive, 1.5, 0.05)
	c.Observe(Interactive, 2.5, 0.05)
	if a := c.Stats(Interactive).Attainment(); math.Abs(a-1.0/6) > 1e-12 {
		t.Fatalf("attainment %v, want 1/6 (1 met of 2 observed + 4 rejected)", a)
	}
}

func TestDeferralQueue(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DeferQueue = 3
	cfg.Classes[Batch].MaxWait = 10
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Four batch requests that would miss now: three wait, the fourth finds
	// the queue full and is rejected.
	for id := uint64(1); id <= 4; id++ {
		want := Defer
		if id == 4 {
			want = Reject
		}
		if v := c.Decide(Batch, "", id, float64(id), 100, 0); v.Action != want {
			t.Fatalf("request %d: %v, want %v", id, v.Action, want)
		}
	}
	if d, ok := c.Head(); !ok || d.ID != 1 || d.Since != 1 {
		t.Fatalf("head %+v %v", d, ok)
	}
	// Only the head may be retried; a prediction that still misses keeps it.
	if c.Retry(2, 5, 1, 0) {
		t.Fatal("retried a request that is not the head")
	}
	if c.Retry(1, 5, 58, 0) { // waited 4 s + 58 s > 60 s
		t.Fatal("admitted a request whose prediction misses")
	}
	if !c.Retry(1, 5, 50, 0) {
		t.Fatal("prediction cleared but the head stayed")
	}
	// Request 2 arrived at 2 and may wait 10 s: at 12 it is still in time,
	// past 12 it expires, then request 3 past 13.
	if _, ok := c.Expired(12); ok {
		t.Fatal("expired a request still within its wait")
	}
	if d, ok := c.Expired(12.5); !ok || d.ID != 2 {
		t.Fatalf("expired %+v %v, want request 2", d, ok)
	}
	if _, ok := c.Expired(12.5); ok {
		t.Fatal("expired request 3 early")
	}
	if d, ok := c.Expired(14); !ok || d.ID != 3 {
		t.Fatalf("expired %+v %v, want request 3", d, ok)
	}
	if _, ok := c.Head(); ok {
		t.Fatal("queue not empty")
	}
	s := c.Stats(Batch)
	if s.Admitted != 1 || s.Rejected != 3 || s.Deferred != 3 || s.Waiting != 0 {
		t.Fatalf("batch stats %+v", s)
	}
	// The ring wraps: fill and drain it again in order.
	for id := uint64(10); id < 13; id++ {
		c.Decide(Batch, "", id, 20, 100, 0)
	}
	for id := uint64(10); id < 13; id++ {
		if d, _ := c.Head(); d.ID != id || !c.Retry(id, 21, 1, 0) {
			t.Fatalf("drain out of order at %d (head %d)", id, d.ID)
		}
	}
}

func TestExpiredKeepsOrderAcrossClasses(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Classes[Interactive].MaxWait = 1 // interactive may wait a little here
	cfg.Classes[Batch].MaxWait = 100
	c, _ := New(cfg)
	c.Decide(Batch, "", 1, 0, 1000, 0)
	c.Decide(Interactive, "", 2, 0, 1000, 0)
	c.Decide(Batch, "", 3, 0, 1000, 0)
	if d, ok := c.Expired(2); !ok || d.ID != 2 {
		t.Fatalf("expired %+v %v, want the interactive request 2", d, ok)
	}
	for _, id := range []uint64{1, 3} {
		if d, _ := c.Head(); d.ID != id || !c.Retry(id, 3, 1, 0) {
			t.Fatalf("head %d, want %d", d.ID, id)
		}
	}
}

// TestWithdraw: a waiter takes its own entry out of the queue (its client
// left, or its wait ran out; not the oldest expired one), and the others
// keep their order; a withdrawn request counts neither admitted nor
// rejected.
func TestWithdraw(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Classes[Batch].MaxWait = 100
	c, _ := New(cfg)
	for id := uint64(1); id <= 3; id++ {
		c.Decide(Batch, "", id, 0, 1000, 0)
	}
	if !c.Withdraw(2) || c.Withdraw(2) || c.Withdraw(9) {
		t.Fatal("Withdraw found what is not queued, or missed what is")
	}
	for _, id := range []uint64{1, 3} {
		if d, _ := c.Head(); d.ID != id || !c.Retry(id, 1, 1, 0) {
			t.Fatalf("head %d, want %d", d.ID, id)
		}
	}
	if s := c.Stats(Batch); s.Admitted != 2 || s.Rejected != 0 || s.Waiting != 0 {
		t.Fatalf("batch stats %+v, want 2 admitted, none rejected", s)
	}
}

// TestLanes: the oldest request of each lane may be retried whatever
// waits in the other lanes; within a lane, only its oldest, and whichever
// way it leaves (admitted, withdrawn, expired) the next takes its turn.
func TestLanes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Classes[Batch].MaxWait = 10
	c, _ := New(cfg)
	for id, lane := range []string{"hot", "hot", "cold", "hot", "cold", "cold"} {
		c.Decide(Batch, lane, uint64(id+1), float64(id), 1000, 0)
	}
	f := func(firsts ...uint64) {
		t.Helper()
		for id := uint64(1); id <= 6; id++ {
			if want := slices.Contains(firsts, id); c.First(id) != want {
				t.Fatalf("First(%d) = %v, want the oldest of each lane, %v", id, !want, firsts)
			}
		}
	}
	f(1, 3)
	if c.Retry(5, 6, 1, 0) || !c.Retry(3, 6, 1, 0) {
		t.Fatal("cold's oldest request did not pass hot's, or its second one did")
	}
	f(1, 5)
	if !c.Withdraw(1) {
		t.Fatal("Withdraw missed hot's oldest request")
	}
	f(2, 5)
	// Request 2 arrived at 1 and expires past 11; request 4 past 13.
	if d, ok := c.Expired(12); !ok || d.ID != 2 {
		t.Fatalf("expired %+v %v, want request 2", d, ok)
	}
	f(4, 5)
	for _, id := range []uint64{4, 5, 6} {
		if !c.Retry(id, 12, 1, 0) {
			t.Fatalf("request %d not admitted", id)
		}
	}
	if _, ok := c.Head(); ok || c.First(6) {
		t.Fatal("queue not empty")
	}
	if s := c.Stats(Batch); s.Admitted != 4 || s.Rejected != 1 || s.Waiting != 0 {
		t.Fatalf("batch stats %+v", s)
	}
}

// TestJudge: Judge rejects as Decide does but leaves the rejection for
// Rejected to count, once it stands.
func TestJudge(t *testing.T) {
	c, _ := New(DefaultConfig())
	if v := c.Judge(Interactive, "", 1, 0, 7.5, 0.05); v != (Verdict{Action: Reject, RetryAfter: 6}) {
		t.Fatalf("Judge = %+v, want a rejection after 6 s", v)
	}
	if s := c.Stats(Interactive); s.Rejected != 0 {
		t.Fatalf("%d rejected before Rejected, want 0", s.Rejected)
	}
	c.Rejected(Interactive)
	if s := c.Stats(Interactive); s.Rejected != 1 || s.Admitted != 0 {
		t.Fatalf("interactive stats %+v, want 1 rejected", s)
	}
}

func TestDecideAllocs(t *testing.T) {
	c, _ := New(DefaultConfig())
	id := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		id++
		c.Decide(Interactive, "", id, 0, 1.5, 0.05)
		c.Decide(Batch, "", id, 0, 100, 0)
		if d, ok := c.Head(); ok {
			c.Retry(d.ID, 1, 1, 0)
		}
		c.Observe(Interactive, 1, 0.01)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decision", allocs)
	}
}

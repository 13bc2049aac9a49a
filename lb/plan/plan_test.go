package plan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The global-scheduling study's three phases and capacities (P_cap 20,000,
// D_cap 3,000).
var chat, summaries, agents = SeedPhases()[0].Demand, SeedPhases()[1].Demand, SeedPhases()[2].Demand

// TestSeedTable checks Needed and Load against the global-scheduling study's
// printed table.
func TestSeedTable(t *testing.T) {
	static := Ratio{12, 12}
	f := func(d Demand, want Ratio, wantP, wantD string) {
		t.Helper()
		if got := d.Needed(); got != want {
			t.Fatalf("%+v: needed %v, want %v", d, got, want)
		}
		p, q := d.Load(static)
		if got := pct(p); got != wantP {
			t.Fatalf("%+v: prefill load %s, want %s", d, got, wantP)
		}
		if got := pct(q); got != wantD {
			t.Fatalf("%+v: decode load %s, want %s", d, got, wantD)
		}
	}
	f(chat, Ratio{4, 17}, "33%", "139%")
	f(summaries, Ratio{20, 3}, "160%", "25%")
	f(agents, Ratio{2, 17}, "12%", "139%")
}

// pct formats as the global-scheduling study's Python does ({x:.0%}).
func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }

func TestParseRatio(t *testing.T) {
	f := func(in string, want Ratio, ok bool) {
		t.Helper()
		got, err := ParseRatio(in)
		if (err == nil) != ok || got != want {
			t.Fatalf("ParseRatio(%q) = %v, %v; want %v, ok %v", in, got, err, want, ok)
		}
		if ok && strings.ToUpper(in) != got.String() {
			t.Fatalf("%v prints as %q, parsed from %q", got, got.String(), in)
		}
	}
	f("12P12D", Ratio{12, 12}, true)
	f("4p17d", Ratio{4, 17}, true)
	f("0P3D", Ratio{0, 3}, true)
	f("12P", Ratio{}, false)
	f("P12D", Ratio{}, false)
	f("-1P3D", Ratio{}, false)
	f("3D4P", Ratio{}, false)
	f("", Ratio{}, false)
}

func TestSplit(t *testing.T) {
	f := func(total int, p, d float64, want Ratio) {
		t.Helper()
		if got := Split(total, p, d); got != want {
			t.Fatalf("Split(%d, %v, %v) = %v, want %v", total, p, d, got, want)
		}
	}
	// The global-scheduling study's phases in 24 instances: the spare ones
	// follow the needs.
	np, nd := chat.Needs()
	f(24, np, nd, Ratio{5, 19}) // 4P17D + 3 spare: 24 × 4/20.7 = 4.6
	np, nd = summaries.Needs()
	f(24, np, nd, Ratio{21, 3}) // 20P3D + 1 spare: 24 × 19.2/22.2 = 20.8
	np, nd = agents.Needs()
	f(24, np, nd, Ratio{2, 22})
	// Ceilings that fit are kept even where rounding would shave one:
	// 10 × 1.1/9 = 1.2 rounds to 1P, but 2P8D fits.
	f(10, 1.1, 7.9, Ratio{2, 8})
	f(10, 7.9, 1.1, Ratio{8, 2})
	// Too small a pool: in proportion to the needs.
	f(24, 30, 10, Ratio{18, 6})
	f(10, 40, 60, Ratio{4, 6})
	// Never below one a role.
	f(24, 0, 50, Ratio{1, 23})
	f(24, 50, 0, Ratio{23, 1})
	f(2, 100, 1, Ratio{1, 1})
	// No load: even.
	f(24, 0, 0, Ratio{12, 12})
	f(5, 0, 0, Ratio{2, 3})
}

func TestDecodeCapacity(t *testing.T) {
	f := func(base, perSeq float64, maxBatch int, slo, want float64) {
		t.Helper()
		if got := DecodeCapacity(base, perSeq, maxBatch, slo); math.Abs(got-want) > 1e-6*want+1e-9 {
			t.Fatalf("DecodeCapacity(%v, %v, %d, %v) = %v, want %v", base, perSeq, maxBatch, slo, got, want)
		}
	}
	// engines/sim's defaults: 64 sequences step in 22.8 ms, under 100 ms.
	f(0.010, 0.0002, 64, 0.1, 64/0.0228)
	f(0.010, 0.0002, 64, 0, 64/0.0228)
	// A 20 ms target caps the batch at 50.
	f(0.010, 0.0002, 64, 0.020, 50/0.020)
	// Even one sequence misses it.
	f(0.010, 0.0002, 64, 0.005, 0)
	// A flat line: the whole batch, or nothing.
	f(0.010, 0, 8, 0.02, 800)
	f(0.030, 0, 8, 0.02, 0)
	// A learned line can be flat up to rounding: a slope so small that the
	// batch the target allows overflows an int is the whole batch too.
	f(0.010, 1e-300, 8, 0.02, 800)
	f(0.010, 1e-21, 8, 0.02, 800)
}

func TestValidate(t *testing.T) {
	f := func(mut func(*Config), want string) {
		t.Helper()
		c := DefaultConfig(24)
		mut(&c)
		err := c.Validate()
		if want == "" {
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate = %v, want an error containing %q", err, want)
		}
		if _, err := New(c, time.Now); err == nil {
			t.Fatalf("New accepted %+v", c)
		}
	}
	f(func(*Config) {}, "")
	f(func(c *Config) { c.Total = 1 }, "total = 1")
	f(func(c *Config) { c.WindowSec = 0 }, "window_sec = 0")
	f(func(c *Config) { c.DrainSec = -1 }, "drain_sec = -1")
	f(func(c *Config) { c.WarmupSec = math.NaN() }, "warmup_sec = NaN")
	f(func(c *Config) { c.MinDwellSec = -5 }, "min_dwell_sec = -5")
	f(func(c *Config) { c.Hysteresis = -0.1 }, "hysteresis = -0.1")

	d := func(mut func(*Demand), want string) {
		t.Helper()
		w := chat
		mut(&w)
		err := w.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Demand.Validate = %v, want an error containing %q", err, want)
		}
	}
	d(func(w *Demand) { w.Rate = -1 }, "rate = -1")
	d(func(w *Demand) { w.PromptTokens = math.Inf(1) }, "isl = +Inf")
	d(func(w *Demand) { w.OutputTokens = math.NaN() }, "osl = NaN")
	d(func(w *Demand) { w.HitRate = 1.5 }, "hit = 1.5")
	d(func(w *Demand) { w.PrefillCap = 0 }, "prefill_cap = 0")
	d(func(w *Demand) { w.DecodeCap = -3 }, "decode_cap = -3")
}

// clock is a settable virtual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) advance(sec float64) { c.t = c.t.Add(time.Duration(sec * float64(time.Second))) }
func newPlanner(t *testing.T, cfg Config) (*Planner, *clock) {
	t.Helper()
	c := &clock{t: time.Unix(1000, 0)}
	p, err := New(cfg, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

func TestPlanFollowsPhases(t *testing.T) {
	p, c := newPlanner(t, DefaultConfig(24))
	if d := p.Plan(); d.Switch || !strings.Contains(d.Reason, "no window") {
		t.Fatalf("before any window: %+v", d)
	}
	cur := Ratio{12, 12}
	step := func(dem Demand, wantSwitch bool, want Ratio, reason string) {
		t.Helper()
		if err := p.Observe(Window{Demand: dem, Current: cur}); err != nil {
			t.Fatal(err)
		}
		d := p.Plan()
		if d.Switch != wantSwitch || d.Target != want || !strings.Contains(d.Reason, reason) {
			t.Fatalf("at %v with %v: %+v; want switch %v to %v, reason containing %q", c.t.Unix(), cur, d, wantSwitch, want, reason)
		}
		if d.Switch {
			cur = d.Target
		}
		c.advance(DefaultWindowSec)
	}
	// Chat on 12P12D: decode is 39% short, so it moves.
	step(chat, true, Ratio{5, 19}, "switch 12P12D → 5P19D")
	// Then holds: the target is where it is.
	step(chat, false, Ratio{5, 19}, "it is the target")
	step(chat, false, Ratio{5, 19}, "it is the target")
	// Summaries arrive: prefill is short, and the dwell (180 s) is over.
	step(summaries, true, Ratio{21, 3}, "prefill short 14.2")
	// Agents arrive 60 s later: the dwell holds it back for two windows.
	step(agents, false, Ratio{2, 22}, "dwell, last switch 60s ago")
	step(agents, false, Ratio{2, 22}, "dwell, last switch 120s ago")
	step(agents, true, Ratio{2, 22}, "decode short 13.7")
}

func TestPlanHoldsWhenCovered(t *testing.T) {
	p, _ := newPlanner(t, DefaultConfig(24))
	// 8P16D covers chat at 80 req/s (3.2P 13.3D) but is not its target.
	light := chat
	light.Rate = 80 // needs 3.2P 13.3D
	_ = p.Observe(Window{Demand: light, Current: Ratio{8, 16}})
	d := p.Plan()
	if d.Switch || d.Target == d.Current || !strings.Contains(d.Reason, "covers the load") {
		t.Fatalf("%+v", d)
	}
}

func TestPlanCostTooHigh(t *testing.T) {
	cfg := DefaultConfig(24)
	// Moving takes longer than a window: nothing can pay.
	cfg.DrainSec, cfg.WarmupSec = 30, 40
	p, _ := newPlanner(t, cfg)
	_ = p.Observe(Window{Demand: chat, Current: Ratio{12, 12}})
	if d := p.Plan(); d.Switch || !strings.Contains(d.Reason, "does not beat cost") || d.Gain != d.Cost {
		t.Fatalf("%+v", d)
	}
	// A small shortage whose gain is within the hysteresis holds too:
	// 5P19D against needs of 5.3P 17D falls 5.7% short; moving one
	// instance gains 3.4 s of load over 60 s, costs 2.3 s in the 40 s of
	// the move, and the difference is below the hysteresis's 3 s.
	p, _ = newPlanner(t, DefaultConfig(24))
	_ = p.Observe(Window{Demand: Demand{Rate: 1, PromptTokens: 5.3, OutputTokens: 17, PrefillCap: 1, DecodeCap: 1}, Current: Ratio{5, 19}})
	if d := p.Plan(); d.Switch || d.Target != (Ratio{6, 18}) || !strings.Contains(d.Reason, "hysteresis") {
		t.Fatalf("%+v", d)
	}
}

// TestPlanNoFlapping feeds noisy windows of one load whose needs sit on a
// rounding boundary, in an overloaded pool where every split has a
// deficit: after the first move the planner must stay put.
func TestPlanNoFlapping(t *testing.T) {
	cfg := DefaultConfig(24)
	cfg.MinDwellSec = 0 // only hysteresis and cost stand against flapping
	elsewhere, switches := noisyRun(t, cfg)
	t.Logf("target differed from the pool in %d of 500 windows; %d switches", elsewhere, switches)
	if elsewhere < 100 || switches > 0 {
		t.Fatalf("target moved %d times, %d switches; want many moves and no switch", elsewhere, switches)
	}
	// Without hysteresis and with free moves, the same windows flap.
	cfg.Hysteresis, cfg.DrainSec, cfg.WarmupSec = 0, 0, 0
	if _, switches := noisyRun(t, cfg); switches < 50 {
		t.Fatalf("%d switches without hysteresis; the test no longer exercises it", switches)
	}
}

func noisyRun(t *testing.T, cfg Config) (elsewhere, switches int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	p, c := newPlanner(t, cfg)
	cur := Ratio{12, 12}
	for range 500 {
		noise := 1 + 0.2*(rng.Float64()-0.5)
		// 13.5P 13.5D ± 10% in opposite directions: overloaded, and the
		// targets wander from 11P13D to 13P11D.
		dem := Demand{Rate: 13.5 * noise, PromptTokens: 1, OutputTokens: 1 / noise / noise, PrefillCap: 1, DecodeCap: 1}
		if err := p.Observe(Window{Demand: dem, Current: cur}); err != nil {
			t.Fatal(err)
		}
		d := p.Plan()
		if d.Target != cur {
			elsewhere++
		}
		if d.Switch {
			switches++
			cur = d.Target
		}
		c.advance(cfg.WindowSec)
	}
	return elsewhere, switches
}

func TestObserveRejects(t *testing.T) {
	p, _ := newPlanner(t, DefaultConfig(24))
	if err := p.Observe(Window{Demand: chat, Current: Ratio{-1, 25}}); err == nil {
		t.Fatal("negative count accepted")
	}
	bad := chat
	bad.DecodeCap = 0
	if err := p.Observe(Window{Demand: bad, Current: Ratio{12, 12}}); err == nil || !strings.Contains(err.Error(), "decode_cap = 0") {
		t.Fatalf("zero decode capacity: %v", err)
	}
	if d := p.Plan(); !strings.Contains(d.Reason, "no window") {
		t.Fatalf("a rejected window was kept: %+v", d)
	}
	if _, err := New(DefaultConfig(24), nil); err == nil {
		t.Fatal("New without a clock")
	}
}

package plan

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of Config. The window is a minute, the granularity the
// global-scheduling study says planners adjust at; drain and warm-up are what
// a role switch costs (finishing or migrating in-flight requests, then
// loading weights and capturing CUDA graphs) and together stay under a
// window, or no switch could ever pay within one; the dwell of three windows
// lets a switch settle and be measured before the next.
const (
	DefaultWindowSec   = 60
	DefaultDrainSec    = 10
	DefaultWarmupSec   = 30
	DefaultMinDwellSec = 180
	DefaultHysteresis  = 0.05
)

// Config is the planner's configuration. Times are in seconds.
type Config struct {
	// Total is the number of instances in the pool, every one of them
	// serving one role (no default: the fleet's size).
	Total int `yaml:"total"`
	// WindowSec is how often the planner observes and decides, and the
	// horizon over which a switch must pay for itself (default 60).
	WindowSec float64 `yaml:"window_sec"`
	// DrainSec is the capacity a switched instance loses while it finishes
	// or hands off its in-flight requests and takes no new ones (default 10).
	DrainSec float64 `yaml:"drain_sec"`
	// WarmupSec is the capacity it then loses loading and warming its new
	// role (default 30).
	WarmupSec float64 `yaml:"warmup_sec"`
	// MinDwellSec is the least time between two switches (default 180): the
	// previous switch must finish and its effect be measured.
	MinDwellSec float64 `yaml:"min_dwell_sec"`
	// Hysteresis is by what fraction of a window's load a switch's gain
	// must beat its cost (default 0.05): needs that wobble around a rounding
	// boundary by less never move instances.
	Hysteresis float64 `yaml:"hysteresis"`
}

// DefaultConfig returns every default for a pool of total instances.
func DefaultConfig(total int) Config {
	return Config{
		Total:       total,
		WindowSec:   DefaultWindowSec,
		DrainSec:    DefaultDrainSec,
		WarmupSec:   DefaultWarmupSec,
		MinDwellSec: DefaultMinDwellSec,
		Hysteresis:  DefaultHysteresis,
	}
}

var errConfig = errors.New("plan: invalid config")

// Validate rejects values the planner cannot run with, naming the field and
// quoting the value; it never corrects them.
func (c Config) Validate() error {
	if c.Total < 2 {
		return fmt.Errorf("%w: total = %d must be at least 2 (one instance a role)", errConfig, c.Total)
	}
	if !(c.WindowSec > 0) {
		return fmt.Errorf("%w: window_sec = %v must be positive", errConfig, c.WindowSec)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"drain_sec", c.DrainSec}, {"warmup_sec", c.WarmupSec}, {"min_dwell_sec", c.MinDwellSec}, {"hysteresis", c.Hysteresis}} {
		if !(f.v >= 0) {
			return fmt.Errorf("%w: %s = %v must not be negative", errConfig, f.name, f.v)
		}
	}
	return nil
}

// Window is one window's observation: the load's shape and the instances'
// measured speeds, and the pool's roles as the window closes.
type Window struct {
	Demand
	// Current is the pool's split now, counting an instance that is
	// switching by the role it is switching to.
	Current Ratio
}

// Decision is the planner's verdict on the last window.
type Decision struct {
	// Needed is the global-scheduling study's needed xPyD for the window (the
	// ceilings).
	Needed Ratio
	// NeedPrefill and NeedDecode are the needs in instances, unrounded.
	NeedPrefill, NeedDecode float64
	// Current is the pool's split the window reported; Target is the split
	// of Total the planner would run (Split).
	Current, Target Ratio
	// Switch says to move the pool from Current to Target now; Moves is how
	// many instances take a new role.
	Switch bool
	Moves  int
	// Gain is the load Target serves over the next window that Current
	// would not; Cost is the load lost while the moved instances drain and
	// warm up. Both are in seconds of the whole load (a shortfall of 0.25
	// for 60 s is 15 s) and 0 when Target is Current.
	Gain, Cost float64
	// Reason says, for a person, why the planner switches or holds.
	Reason string
}

// Planner turns windows into decisions. It is not safe for concurrent use:
// one goroutine (the gateway's planning loop, or a simulation) owns it.
// Time comes only from the clock it was given, so a simulation in virtual
// time replays exactly.
type Planner struct {
	cfg        Config
	now        func() time.Time
	last       Window
	observed   bool
	lastSwitch time.Time
	switched   bool
}

// New returns a planner for cfg reading time from now.
func New(cfg Config, now func() time.Time) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		return nil, fmt.Errorf("%w: no clock", errConfig)
	}
	return &Planner{cfg: cfg, now: now}, nil
}

// Config returns the planner's configuration.
func (p *Planner) Config() Config { return p.cfg }

// Observe records a window; the next Plan decides on it. An invalid window
// is rejected and the previous one kept.
func (p *Planner) Observe(w Window) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if w.Current.Prefill < 0 || w.Current.Decode < 0 {
		return fmt.Errorf("%w: current = %v has a negative count", errDemand, w.Current)
	}
	p.last, p.observed = w, true
	return nil
}

// Plan decides on the last observed window. A switch happens when, in
// order: the target differs from the current split; the last switch began
// at least MinDwellSec ago; and over the next window the gain beats the
// cost by more than Hysteresis of the window's load:
//
//	τ    = min(DrainSec + WarmupSec, WindowSec)
//	mid  = (min(Pc, Pt), min(Dc, Dt))        the pool while instances move
//	gain = (Shortfall(current) − Shortfall(target)) × WindowSec
//	cost = (Shortfall(mid) − Shortfall(target)) × τ
//	switch iff gain − cost > Hysteresis × WindowSec
//
// The cost counts only capacity the load needed: an instance taken from a
// role with room to spare costs nothing while it moves. A pool that covers
// its load (shortfall 0) never switches, however far its split is from the
// target, which is what keeps a ratio from chasing noise. When Plan
// decides to switch it starts the dwell: the caller is expected to apply
// the target.
func (p *Planner) Plan() Decision {
	if !p.observed {
		return Decision{Reason: "hold: no window observed yet"}
	}
	w, cfg := p.last, p.cfg
	np, nd := w.Needs()
	d := Decision{
		Needed: w.Needed(), NeedPrefill: np, NeedDecode: nd,
		Current: w.Current, Target: Split(cfg.Total, np, nd),
	}
	needs := fmt.Sprintf("needs %.1fP %.1fD", np, nd)
	if d.Target == d.Current {
		d.Reason = fmt.Sprintf("hold %v: it is the target (%s)", d.Current, needs)
		return d
	}
	d.Moves = max(0, d.Target.Prefill-d.Current.Prefill) + max(0, d.Target.Decode-d.Current.Decode)
	mid := Ratio{min(d.Current.Prefill, d.Target.Prefill), min(d.Current.Decode, d.Target.Decode)}
	tau := min(cfg.DrainSec+cfg.WarmupSec, cfg.WindowSec)
	shortCur, shortTarget := Shortfall(d.Current, np, nd), Shortfall(d.Target, np, nd)
	d.Gain = (shortCur - shortTarget) * cfg.WindowSec
	d.Cost = (Shortfall(mid, np, nd) - shortTarget) * tau
	margin := cfg.Hysteresis * cfg.WindowSec
	now := p.now()
	switch {
	case p.switched && now.Sub(p.lastSwitch).Seconds() < cfg.MinDwellSec:
		d.Reason = fmt.Sprintf("hold %v (target %v, %s): dwell, last switch %.0fs ago, minimum %.0fs",
			d.Current, d.Target, needs, now.Sub(p.lastSwitch).Seconds(), cfg.MinDwellSec)
	case shortCur == 0:
		d.Reason = fmt.Sprintf("hold %v (target %v, %s): current split covers the load", d.Current, d.Target, needs)
	case d.Gain-d.Cost <= margin:
		d.Reason = fmt.Sprintf("hold %v (target %v, %s): gain %.1fs of load over the next %.0fs does not beat cost %.1fs + hysteresis %.1fs",
			d.Current, d.Target, needs, d.Gain, cfg.WindowSec, d.Cost, margin)
	default:
		d.Switch = true
		p.lastSwitch, p.switched = now, true
		d.Reason = fmt.Sprintf("switch %v → %v (%s; %s): moving %d instances gains %.1fs of load over the next %.0fs at a cost of %.1fs",
			d.Current, d.Target, needs, shortage(d.Current, np, nd), d.Moves, d.Gain, cfg.WindowSec, d.Cost)
	}
	return d
}

// shortage names the roles r leaves short, for a Decision's reason.
func shortage(r Ratio, np, nd float64) string {
	switch {
	case np > float64(r.Prefill) && nd > float64(r.Decode):
		return fmt.Sprintf("prefill short %.1f, decode short %.1f", np-float64(r.Prefill), nd-float64(r.Decode))
	case np > float64(r.Prefill):
		return fmt.Sprintf("prefill short %.1f", np-float64(r.Prefill))
	default:
		return fmt.Sprintf("decode short %.1f", nd-float64(r.Decode))
	}
}

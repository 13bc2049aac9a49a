package cluster

import (
	"errors"
	"fmt"
	"io"

	"pdlb/engines/sim"
	"pdlb/lb/admit"
	"pdlb/lb/plan"
	"pdlb/lb/route"
)

// The three-phase scenario's defaults: the global-scheduling study's day
// compressed into 120 s a phase on its 24 instances, and a planner whose
// window, drain, warm-up and dwell are compressed with it (a 20 s window
// where a live planner has 60 s).
const (
	DefaultPhaseSec       = 120
	DefaultPhasePods      = 24
	DefaultPhaseWindowSec = 20
	DefaultPhaseDrainSec  = 10
	DefaultPhaseWarmupSec = 5
	DefaultPhaseMinDwell  = 40
)

// PhasesConfig is the three-phase scenario: one phased workload played
// against a static split and against the planner driving role switches,
// both on the same fleet, cascade and admission (requests predicted to miss
// their SLOs are rejected at once, so a backlog never outlives its phase).
type PhasesConfig struct {
	Phases   []plan.Phase
	PhaseSec float64
	Pods     int
	// Static is the split the static arm keeps and the planned arm starts
	// from (default half and half).
	Static plan.Ratio
	// Planner configures the planned arm; its Total is Pods.
	Planner plan.Config
	// Physics is every pod's timing model; Admission the SLOs (defaults:
	// TTFT 2 s, TPOT 0.1 s).
	Physics   sim.Physics
	Admission admit.Config
	// PD is the cascade's knobs (default: the gateway's).
	PD   route.PDOptions
	Seed uint64
}

// DefaultPhasesConfig returns the global-scheduling study's three phases on
// its 24 instances, static 12P12D.
func DefaultPhasesConfig() PhasesConfig {
	pc := plan.DefaultConfig(DefaultPhasePods)
	pc.WindowSec, pc.DrainSec, pc.WarmupSec = DefaultPhaseWindowSec, DefaultPhaseDrainSec, DefaultPhaseWarmupSec
	pc.MinDwellSec = DefaultPhaseMinDwell
	adm := admit.DefaultConfig()
	// Every request is interactive; the PD simulator does not defer.
	adm.Classes[admit.Batch].MaxWait = 0
	return PhasesConfig{
		Phases:    plan.SeedPhases(),
		PhaseSec:  DefaultPhaseSec,
		Pods:      DefaultPhasePods,
		Static:    plan.Ratio{Prefill: DefaultPhasePods / 2, Decode: DefaultPhasePods - DefaultPhasePods/2},
		Planner:   pc,
		Physics:   sim.DefaultPhysics(),
		Admission: adm,
		PD:        route.DefaultPDOptions(),
	}
}

// PhaseRow is one phase's outcome in both arms.
type PhaseRow struct {
	Phase           string
	Static, Planned PDPeriod
}

// PhasesResult is the scenario's outcome: a row per phase and the planned
// arm's decisions.
type PhasesResult struct {
	Static    plan.Ratio
	Rows      []PhaseRow
	Decisions []PDDecision
}

var errPhasesConfig = errors.New("cluster: invalid phases config")

// RunPhases plays the scenario in both arms.
func RunPhases(cfg PhasesConfig) (PhasesResult, error) {
	if len(cfg.Phases) == 0 || !(cfg.PhaseSec > 0) {
		return PhasesResult{}, fmt.Errorf("%w: %d phases of %v s", errPhasesConfig, len(cfg.Phases), cfg.PhaseSec)
	}
	w := PhasedWorkload{Phases: cfg.Phases, PhaseSec: cfg.PhaseSec, Prefixes: DefaultPhasePrefixes, BlockSize: cfg.Physics.BlockSize, Seed: cfg.Seed}
	pd := PDConfig{
		Pods: cfg.Pods, Initial: cfg.Static, Physics: cfg.Physics,
		PD: cfg.PD, Admission: cfg.Admission, Reject: true,
		ReportSec: cfg.PhaseSec, Seed: cfg.Seed,
	}
	static, err := RunPD(pd, w.Start())
	if err != nil {
		return PhasesResult{}, err
	}
	pc := cfg.Planner
	pd.Planner = &pc
	planned, err := RunPD(pd, w.Start())
	if err != nil {
		return PhasesResult{}, err
	}
	res := PhasesResult{Static: cfg.Static, Decisions: planned.Decisions}
	for i, ph := range cfg.Phases {
		row := PhaseRow{Phase: ph.Name}
		// Requests finish after the last arrival, but every arrival falls
		// in a phase: later periods are empty.
		if i < len(static.Periods) {
			row.Static = static.Periods[i]
		}
		if i < len(planned.Periods) {
			row.Planned = planned.Periods[i]
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// WriteTable prints the per-phase comparison, for bench/RESULTS.md, and
// the reasons of the plans that switched.
func (r PhasesResult) WriteTable(w io.Writer) error {
	cols := fmt.Sprintf("%6s  %6s  %8s  %8s", "attain", "reject", "TTFT p99", "TPOT p99")
	arm := func(p PDPeriod) string {
		return fmt.Sprintf("%5.1f%%  %5.1f%%  %7.2fs  %6.0fms", 100*p.Attainment, 100*p.Rejected, p.TTFTP99, 1000*p.TPOTP99)
	}
	fmt.Fprintf(w, "%-24s  %-*s  %s\n", "", len(cols), "static "+r.Static.String(), "planner")
	fmt.Fprintf(w, "%-24s  %s  %s  %5s  %5s\n", "phase", cols, cols, "waves", "moved")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "%-24s  %s  %s  %5d  %5d\n", row.Phase, arm(row.Static), arm(row.Planned), row.Planned.Waves, row.Planned.Switched)
	}
	fmt.Fprintln(w, "\nplanner switches:")
	for _, d := range r.Decisions {
		if d.Switch {
			fmt.Fprintf(w, "  t=%4.0fs %s\n", d.At, d.Reason)
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"pdlb/bench/cluster"
	"pdlb/lb/plan"
)

// planRow is one phase of `pdlb plan --json`. Loads are utilisations under
// the static ratio (1 = fully busy, above 1 = overloaded).
type planRow struct {
	Phase             string  `json:"phase"`
	Prefill           int     `json:"prefill"`
	Decode            int     `json:"decode"`
	StaticPrefillLoad float64 `json:"static_prefill_load"`
	StaticDecodeLoad  float64 `json:"static_decode_load"`
}

// cmdPlan prints, for each phase, the xPyD it needs and the load a static
// ratio would carry (the global-scheduling study's planner table).
func cmdPlan(args []string, stdout io.Writer) error {
	fs := newFlagSet("plan", "--phases FILE|seed --total N [--static xPyD] [--json]",
		`For each phase of load, prints the instances it needs (the
global-scheduling study's formula: P = ceil(rate × isl × (1 − hit) / P_cap),
D = ceil(rate × osl / D_cap)), whether they fit in --total, the split of
--total the planner would run (lb/plan.Split: in proportion to the needs, at
least the needs where they fit, at least one a role), and the prefill and
decode load (utilisation; above 100% is overloaded) under the static ratio.

--phases seed is the global-scheduling study's day: chat (100 req/s, isl
2000, osl 500, hit 0.6), long-document summaries (30, 16000, 300, 0.2) and
coding agents (25, 6000, 2000, 0.8). A phases FILE is a YAML or JSON list of
objects with fields name, rate (requests/s), isl and osl (mean prompt and
output tokens), hit (prefix cache hit rate, 0..1) and optionally prefill_cap
and decode_cap (tokens/s a phase's instances reach, overriding the flags):

  - {name: chat, rate: 100, isl: 2000, osl: 500, hit: 0.6}
  - {name: summaries, rate: 30, isl: 16000, osl: 300, hit: 0.2}

With --simulate it also plays the phases in sequence (--phase-sec each) on
bench/cluster's virtual-time fleet of --total pods (engines/sim physics:
prefill and decode capacities are measured there, not taken from the flags),
static against the planner (lb/plan) driving role switches, with admission
on (TTFT SLO 2 s, TPOT 0.1 s), and prints each phase's SLO attainment in
both arms and the planner's switches.

Example (prints the study's planner table): pdlb plan --phases seed --total 24 --static 12P12D`, stdout)
	phasesArg := fs.String("phases", "", "phases file (YAML or JSON), or seed for the global-scheduling study's three phases (required)")
	total := fs.Int("total", 0, "instances in the pool (required, at least 2)")
	staticArg := fs.String("static", "", "the static ratio to compare against, xPyD (default half and half)")
	prefillCap := fs.Float64("prefill-cap", plan.SeedPrefillCap, "prompt tokens/s one prefill instance computes (P_cap)")
	decodeCap := fs.Float64("decode-cap", plan.SeedDecodeCap, "tokens/s one decode instance outputs under the TPOT target (D_cap)")
	asJSON := fs.Bool("json", false, `print a JSON list of {"phase", "prefill", "decode", "static_prefill_load", "static_decode_load"}`)
	simulate := fs.Bool("simulate", false, "also play the phases on a simulated fleet, static against the planner")
	phaseSec := fs.Float64("phase-sec", cluster.DefaultPhaseSec, "virtual seconds each phase lasts (--simulate)")
	seed := fs.Uint64("seed", 0, "seed of the simulated workload and routers (--simulate; default 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("%w: unexpected argument %q", errSimUsage, fs.Arg(0)))
	}
	if *total < 2 {
		return fs.usageError(fmt.Errorf("%w: --total %d must be at least 2", errSimUsage, *total))
	}
	if *simulate && !(*phaseSec > 0) {
		return fs.usageError(fmt.Errorf("%w: --phase-sec %v must be positive", errSimUsage, *phaseSec))
	}
	static := plan.Ratio{Prefill: *total / 2, Decode: *total - *total/2}
	if *staticArg != "" {
		var err error
		if static, err = plan.ParseRatio(*staticArg); err != nil {
			return fs.usageError(fmt.Errorf("--static %q: %w", *staticArg, err))
		}
		if static.Total() != *total {
			return fs.usageError(fmt.Errorf("%w: --static %v places %d instances, --total is %d", errSimUsage, static, static.Total(), *total))
		}
	}
	phases, err := readPhases(*phasesArg)
	if errors.Is(err, errSimUsage) {
		return fs.usageError(err)
	}
	if err != nil {
		return err
	}

	rows := make([]planRow, len(phases))
	for i := range phases {
		d := &phases[i].Demand
		if d.PrefillCap == 0 {
			d.PrefillCap = *prefillCap
		}
		if d.DecodeCap == 0 {
			d.DecodeCap = *decodeCap
		}
		if err := d.Validate(); err != nil {
			return fmt.Errorf("phase %q: %w", phases[i].Name, err)
		}
		need := d.Needed()
		lp, ld := d.Load(static)
		rows[i] = planRow{phases[i].Name, need.Prefill, need.Decode, lp, ld}
	}
	if *asJSON {
		if *simulate {
			return fs.usageError(fmt.Errorf("%w: --simulate prints a table, not JSON", errSimUsage))
		}
		return json.NewEncoder(stdout).Encode(rows)
	}
	fmt.Fprintf(stdout, "%d instances, static %v:\n", *total, static)
	fmt.Fprintf(stdout, "%-26s %-7s %-5s %-7s %-17s %s\n", "phase", "needs", "fits", "split", "static prefill", "static decode")
	for i, r := range rows {
		need := plan.Ratio{Prefill: r.Prefill, Decode: r.Decode}
		fits := "yes"
		if need.Total() > *total {
			fits = "no"
		}
		np, nd := phases[i].Needs()
		fmt.Fprintf(stdout, "%-26s %-7v %-5s %-7v %-17s %s\n", r.Phase, need, fits,
			plan.Split(*total, np, nd), loadText(r.StaticPrefillLoad), loadText(r.StaticDecodeLoad))
	}
	if !*simulate {
		return nil
	}
	cfg := cluster.DefaultPhasesConfig()
	cfg.Phases, cfg.PhaseSec, cfg.Seed = phases, *phaseSec, *seed
	cfg.Pods, cfg.Static, cfg.Planner.Total = *total, static, *total
	res, err := cluster.RunPhases(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nsimulated, %.0f s a phase:\n", *phaseSec)
	return res.WriteTable(stdout)
}

// loadText prints a utilisation as the global-scheduling study does: a
// whole percentage, marked when over 100%.
func loadText(x float64) string {
	s := fmt.Sprintf("%.0f%%", 100*x)
	if x > 1 {
		s += " (overloaded)"
	}
	return s
}

// readPhases reads --phases: the global-scheduling study's, or a file's.
// Its phases come without capacities, so that --prefill-cap and
// --decode-cap (whose defaults are the study's) apply to them.
func readPhases(arg string) ([]plan.Phase, error) {
	switch arg {
	case "":
		return nil, fmt.Errorf("%w: --phases FILE or --phases seed is required", errSimUsage)
	case "seed":
		phases := plan.SeedPhases()
		for i := range phases {
			phases[i].PrefillCap, phases[i].DecodeCap = 0, 0
		}
		return phases, nil
	}
	f, err := os.Open(arg)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return plan.ReadPhases(f)
}

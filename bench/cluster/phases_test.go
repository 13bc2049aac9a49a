package cluster

import (
	"math"
	"os"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/lb/admit"
	"pdlb/lb/plan"
	"pdlb/lb/route"
)

// TestPhasesTable plays the global-scheduling study's day (chat,
// long-document summaries, coding agents; 120 s each) on 24 instances, static
// 12P12D against the planner, and prints the per-phase table for
// bench/RESULTS.md:
//
//	go test ./bench/cluster -run TestPhasesTable -v
func TestPhasesTable(t *testing.T) {
	res, err := RunPhases(DefaultPhasesConfig())
	if err != nil {
		t.Fatal(err)
	}
	checkPhases(t, res)
	if testing.Verbose() {
		res.WriteTable(os.Stdout)
	}
}

// TestPhasesPlannerBeatsStatic is the acceptance check on a shorter day
// (60 s phases, a planner with a 10 s window): in every phase the planner's
// SLO attainment beats static 12P12D's, it switches at most twice per
// phase change and at least once, and the run is deterministic.
func TestPhasesPlannerBeatsStatic(t *testing.T) {
	cfg := DefaultPhasesConfig()
	cfg.PhaseSec = 60
	cfg.Planner.WindowSec, cfg.Planner.DrainSec, cfg.Planner.WarmupSec, cfg.Planner.MinDwellSec = 10, 4, 3, 20
	cfg.Seed = 3
	res, err := RunPhases(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	res.WriteTable(&b)
	t.Log("\n" + b.String())
	checkPhases(t, res)
	again, err := RunPhases(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range res.Rows {
		if res.Rows[i] != again.Rows[i] {
			t.Fatalf("phase %d differs between two runs:\n%+v\n%+v", i, res.Rows[i], again.Rows[i])
		}
	}
}

// checkPhases asserts the scenario's acceptance: the planner beats the
// static split in every phase, reacts to every phase, never flaps.
func checkPhases(t *testing.T, res PhasesResult) {
	t.Helper()
	for _, row := range res.Rows {
		s, p := row.Static, row.Planned
		if s.Requests == 0 || s.Requests != p.Requests {
			t.Fatalf("%s: %d requests static, %d planned", row.Phase, s.Requests, p.Requests)
		}
		if p.Attainment <= s.Attainment {
			t.Errorf("%s: planner attainment %.1f%% does not beat static's %.1f%%", row.Phase, 100*p.Attainment, 100*s.Attainment)
		}
		if s.Waves != 0 || p.Waves < 1 || p.Waves > 2 {
			t.Errorf("%s: %d static waves, %d planner waves; want 0, and 1 or 2", row.Phase, s.Waves, p.Waves)
		}
	}
}

func trace(t *testing.T, lines string) Workload {
	t.Helper()
	tr, err := ReadTrace(strings.NewReader(lines), sim.DefaultBlockSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	return tr.Start()
}

func pdConfig(t *testing.T) PDConfig {
	t.Helper()
	adm := admit.DefaultConfig()
	adm.Classes[admit.Batch].MaxWait = 0
	return PDConfig{Pods: 2, Initial: plan.Ratio{Prefill: 1, Decode: 1}, Physics: sim.DefaultPhysics(), PD: route.DefaultPDOptions(), Admission: adm}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestPDOneRequest follows one request through the pair: prefill, KV
// transfer, and decode steps of a batch of one.
func TestPDOneRequest(t *testing.T) {
	cfg := pdConfig(t)
	res, err := RunPD(cfg, trace(t, `{"t": 1, "prompt_tokens": 640, "output_tokens": 10}`))
	if err != nil {
		t.Fatal(err)
	}
	ph := cfg.Physics
	p := res.Periods[0]
	wantTTFT := ph.PrefillSec(640) + ph.TransferSec(640) + ph.DecodeStepSec(1)
	if p.Requests != 1 || p.Attainment != 1 || !near(p.TTFTP50, wantTTFT) || !near(p.TPOTP99, ph.DecodeStepSec(1)) {
		t.Fatalf("%+v; want TTFT %v, TPOT %v", p, wantTTFT, ph.DecodeStepSec(1))
	}
}

// TestPDBatchLimit queues decode: with a batch of one, four requests that
// arrive together decode one after another, and the last one's first token
// waits for the three before it.
func TestPDBatchLimit(t *testing.T) {
	cfg := pdConfig(t)
	cfg.Physics.MaxBatch = 1
	const line = `{"t": 0, "prompt_tokens": 64, "output_tokens": 5}` + "\n"
	res, err := RunPD(cfg, trace(t, strings.Repeat(line, 4)))
	if err != nil {
		t.Fatal(err)
	}
	ph := cfg.Physics
	step := ph.DecodeStepSec(1)
	// The first KV reaches the decode pod after one prefill and a transfer;
	// the others arrive while it decodes, so decode runs back to back.
	last := ph.PrefillSec(64) + ph.TransferSec(64) + 3*5*step + step
	p := res.Periods[0]
	if !near(p.TTFTP99, last) || !near(p.TPOTP99, step) {
		t.Fatalf("%+v; want last TTFT %v, TPOT %v", p, last, step)
	}
}

func TestPDConfigValidate(t *testing.T) {
	f := func(mut func(*PDConfig), want string) {
		t.Helper()
		cfg := pdConfig(t)
		mut(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate = %v, want an error containing %q", err, want)
		}
	}
	f(func(c *PDConfig) { c.Pods = 1 }, "pods = 1")
	f(func(c *PDConfig) { c.Initial = plan.Ratio{Prefill: 2} }, "initial = 2P0D")
	f(func(c *PDConfig) { c.PD.LocalPrefillMaxTokens = 64 }, "pd.local_prefill_max_tokens = 64")
	f(func(c *PDConfig) { c.PD.DecodeScorePolicy = "fastest" }, `decode_score_policy = "fastest"`)
	f(func(c *PDConfig) { c.ReportSec = -1 }, "report_sec = -1")
	f(func(c *PDConfig) { c.Admission.Classes[admit.Batch].MaxWait = 30 }, "classes.batch.max_wait = 30")
	f(func(c *PDConfig) { pc := plan.DefaultConfig(3); c.Planner = &pc }, "planner total = 3, pods = 2")
	f(func(c *PDConfig) { c.Physics.MaxBatch = 0 }, "max_batch = 0")
}

func TestPhasedWorkload(t *testing.T) {
	w := PhasedWorkload{Phases: plan.SeedPhases(), PhaseSec: 20, Prefixes: 4, BlockSize: 64, Seed: 9}
	run := w.Start()
	var a Arrival
	type sums struct{ n, prompt, output float64 }
	got := make([]sums, len(w.Phases))
	last := 0.0
	for run.Next(&a) {
		if a.Time < last {
			t.Fatalf("arrival at %v before %v", a.Time, last)
		}
		last = a.Time
		i := w.PhaseOf(a.Time)
		ph := w.Phases[i]
		shared := int(math.Round(ph.HitRate * ph.PromptTokens / 64))
		if len(a.Keys) != a.PromptTokens/64 || len(a.Keys) < shared || a.OutputTokens < 1 {
			t.Fatalf("phase %d: %d keys for %d tokens, %d shared", i, len(a.Keys), a.PromptTokens, shared)
		}
		s := &got[i]
		s.n++
		s.prompt += float64(a.PromptTokens)
		s.output += float64(a.OutputTokens)
	}
	for i, ph := range w.Phases {
		s := got[i]
		// Poisson counts within 4σ; means within 5% (uniform lengths).
		if want := ph.Rate * w.PhaseSec; math.Abs(s.n-want) > 4*math.Sqrt(want) {
			t.Errorf("%s: %v arrivals, want about %v", ph.Name, s.n, want)
		}
		if m := s.prompt / s.n; math.Abs(m/ph.PromptTokens-1) > 0.05 {
			t.Errorf("%s: mean prompt %v, want about %v", ph.Name, m, ph.PromptTokens)
		}
		if m := s.output / s.n; math.Abs(m/ph.OutputTokens-1) > 0.05 {
			t.Errorf("%s: mean output %v, want about %v", ph.Name, m, ph.OutputTokens)
		}
	}
}

package cluster

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pdlb/lb/admit"
	"pdlb/lb/route"
)

// studyRow is one row of the global-scheduling study's printed table, in percent.
type studyRow struct {
	rate               float64
	policy             string
	reject             bool
	hit, attain, rejct float64
	attainBand         float64
}

// studyTable is the table the global-scheduling study's Python printed
// (workload seed 0), the reference bench/cluster must reproduce. Its
// least-queue row is our least_queue: the study's "最少排队" is min over
// instances of busy, the time its queued prefill work runs out.
var studyTable = []studyRow{
	{40, "random", false, 53.5, 99.5, 0, 4},
	{40, "least_queue", false, 53.3, 100.0, 0, 4},
	{40, "cache_only", false, 90.9, 100.0, 0, 4},
	{40, "min_ttft", false, 84.4, 100.0, 0, 4},
	{40, "min_ttft", true, 84.4, 100.0, 0.0, 4},
	{70, "random", false, 38.9, 44.0, 0, 4},
	{70, "least_queue", false, 39.1, 47.1, 0, 4},
	{70, "cache_only", false, 81.7, 85.3, 0, 8},
	{70, "min_ttft", false, 75.8, 86.4, 0, 4},
	{70, "min_ttft", true, 78.6, 97.9, 2.1, 4},
}

// simulate runs the global-scheduling study's chat at rate for 120 s with the
// named policy. Faithful runs (the study's min_ttft rows) break ties for
// the first pod and know the pods' speed, as the study's Python does; see
// Config.FirstTie.
func simulate(t testing.TB, policy string, rate float64, reject, faithful bool, seed uint64) Result {
	t.Helper()
	p, err := route.New(policy, route.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(p)
	cfg.Reject, cfg.Seed = reject, seed
	cfg.FirstTie, cfg.KnownSpeed = faithful, faithful
	res, err := Run(cfg, NewSeedChat(rate, 120, cfg.Physics.BlockSize, seed).Start())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func seeds(t *testing.T) []uint64 {
	if testing.Short() {
		return []uint64{0}
	}
	return []uint64{0, 1, 2, 3}
}

func pct(x float64) string { return fmt.Sprintf("%5.1f", 100*x) }

// TestSeedTable reproduces the global-scheduling study's table: the mean over
// workload seeds of each row's hit rate and attainment must lie within ±4
// points of the study's (±8 for cache_only's attainment at 70 req/s, where
// hotspots make it swing), and its rejection within ±1 point. Run with -v for
// the table.
func TestSeedTable(t *testing.T) {
	ss := seeds(t)
	var b strings.Builder
	fmt.Fprintf(&b, "\nrate  policy              seed: hit%%  attain%%  reject%%   per seed (hit/attain/reject)\n")
	for _, row := range studyTable {
		// The seed breaks min_ttft's ties for the first instance; that
		// piles new sessions onto pod 0 and costs it about 5 points of hit
		// rate at 40 req/s against the gateway's random tie-break.
		faithful := row.policy == "min_ttft"
		var hit, att, rej float64
		var per []string
		for _, s := range ss {
			res := simulate(t, row.policy, row.rate, row.reject, faithful, s)
			hit += res.HitRate / float64(len(ss))
			att += res.Attainment / float64(len(ss))
			rej += res.Rejected / float64(len(ss))
			per = append(per, pct(res.HitRate)+"/"+pct(res.Attainment)+"/"+pct(res.Rejected))
		}
		name := row.policy
		if row.reject {
			name += "+reject"
		}
		fmt.Fprintf(&b, "%4.0f  %-15s %5.1f/%5.1f/%4.1f  %s/%s/%s  %s\n", row.rate, name,
			row.hit, row.attain, row.rejct, pct(hit), pct(att), pct(rej), strings.Join(per, "  "))
		if math.Abs(100*hit-row.hit) > 4 || math.Abs(100*att-row.attain) > row.attainBand || math.Abs(100*rej-row.rejct) > 1 {
			t.Errorf("%v req/s %s: hit %.1f%%, attainment %.1f%%, rejected %.1f%%; study: %.1f%%, %.1f%%, %.1f%%",
				row.rate, name, 100*hit, 100*att, 100*rej, row.hit, row.attain, row.rejct)
		}
	}
	t.Log(b.String())
}

// TestBeatTheStudy checks that the default policy with admission beats the
// global-scheduling study's best (min_ttft with rejection): at 70 req/s it
// reaches 99% of requests within the SLO with at most 1% rejected, for every
// workload seed, and at 40, 85 and 100 req/s it is never below min_ttft with
// rejection on the same workload.
func TestBeatTheStudy(t *testing.T) {
	ss := seeds(t)
	var b strings.Builder
	fmt.Fprintf(&b, "\nrate  seed  %s+reject hit/attain/reject   min_ttft+reject hit/attain/reject\n", route.DefaultPolicy)
	for _, rate := range []float64{40, 70, 85, 100} {
		if testing.Short() && rate != 70 {
			continue
		}
		for _, s := range ss {
			ours := simulate(t, route.DefaultPolicy, rate, true, false, s)
			base := simulate(t, "min_ttft", rate, true, false, s)
			fmt.Fprintf(&b, "%4.0f  %4d  %s/%s/%s          %s/%s/%s\n", rate, s,
				pct(ours.HitRate), pct(ours.Attainment), pct(ours.Rejected),
				pct(base.HitRate), pct(base.Attainment), pct(base.Rejected))
			if rate == 70 && (ours.Attainment < 0.99 || ours.Rejected > 0.01) {
				t.Errorf("70 req/s seed %d: attainment %.2f%%, rejected %.2f%%; want ≥ 99%% and ≤ 1%%", s, 100*ours.Attainment, 100*ours.Rejected)
			}
			if ours.Attainment < base.Attainment {
				t.Errorf("%v req/s seed %d: attainment %.2f%% below min_ttft+reject's %.2f%%", rate, s, 100*ours.Attainment, 100*base.Attainment)
			}
		}
	}
	t.Log(b.String())
}

func TestDeterministic(t *testing.T) {
	f := func(policy string, reject bool) {
		t.Helper()
		a := simulate(t, policy, 70, reject, false, 7)
		b := simulate(t, policy, 70, reject, false, 7)
		if a != b {
			t.Fatalf("%s: same seed, different results:\n%+v\n%+v", policy, a, b)
		}
		if c := simulate(t, policy, 70, reject, false, 8); c == a {
			t.Fatalf("%s: seeds 7 and 8 gave identical results %+v", policy, a)
		}
	}
	f("random", false)
	f(route.DefaultPolicy, true)
}

func TestSeedChatWorkload(t *testing.T) {
	w := NewSeedChat(50, 10, 64, 1)
	run := w.Start()
	var a Arrival
	n, last := 0, 0.0
	for run.Next(&a) {
		n++
		if a.Time < last {
			t.Fatalf("arrival %d at %v before %v", n, a.Time, last)
		}
		last = a.Time
		turns := (a.PromptTokens - DefaultChatSystemTokens) / DefaultChatTurnTokens
		if a.PromptTokens != DefaultChatSystemTokens+turns*DefaultChatTurnTokens || turns < 1 {
			t.Fatalf("prompt of %d tokens is not 2048 + 300k", a.PromptTokens)
		}
		if len(a.Keys) != a.PromptTokens/64 {
			t.Fatalf("%d keys for %d tokens", len(a.Keys), a.PromptTokens)
		}
	}
	// Poisson at 50/s for 10 s: 500 ± 3σ (σ ≈ 22).
	if n < 430 || n > 570 {
		t.Fatalf("%d arrivals, want about 500", n)
	}
}

// TestDeferral runs batch requests through the deferral queue: with batch
// requests allowed to wait, an overloaded fleet admits most of them later
// instead of rejecting them.
func TestDeferral(t *testing.T) {
	p, _ := route.New(route.DefaultPolicy, route.DefaultOptions())
	cfg := DefaultConfig(p)
	cfg.Reject = true
	// At 100 req/s the fleet is overloaded (about 11% of interactive
	// requests are rejected); batch requests may wait up to 20 s for a
	// first token within 20 s.
	cfg.Admission.Classes[admit.Batch] = admit.ClassConfig{TTFTSLO: 20, MaxWait: 20}
	base := NewSeedChat(100, 120, 64, 3)
	inter, err := Run(cfg, base.Start())
	if err != nil {
		t.Fatal(err)
	}
	batch, err := Run(cfg, classed{base.Start(), admit.Batch})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("interactive: %+v\nbatch:       %+v", inter, batch)
	if inter.Rejected == 0 || inter.Deferred != 0 {
		t.Fatalf("interactive run: %+v, want rejections and no deferral", inter)
	}
	if batch.Deferred == 0 || batch.Rejected >= inter.Rejected {
		t.Fatalf("batch run %+v against interactive %+v: want deferrals and fewer rejections", batch, inter)
	}
}

// classed gives every arrival of a workload one class.
type classed struct {
	Workload
	class admit.Class
}

func (c classed) Next(a *Arrival) bool {
	ok := c.Workload.Next(a)
	a.Class = c.class
	return ok
}

func TestTrace(t *testing.T) {
	const text = "<|system|>\nYou are a careful assistant who answers briefly and to the point, always.\n"
	trace := `{"t": 0.5, "session": "a", "prompt_tokens": 200, "output_tokens": 10}

{"t": 0.1, "prompt": "` + strings.ReplaceAll(text, "\n", `\n`) + `", "priority": "batch"}
{"t": 0.9, "session": "a", "prompt_tokens": 300}
{"t": 1.2, "session": "b", "prompt_tokens": 300}
{"t": 1.3, "prompt_tokens": 64}
`
	tr, err := ReadTrace(strings.NewReader(trace), 16, 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []Arrival
	run := tr.Start()
	for a := (Arrival{}); run.Next(&a); {
		got = append(got, a)
	}
	if len(got) != 5 || tr.Len() != 5 {
		t.Fatalf("%d arrivals", len(got))
	}
	// Sorted by time: the text prompt first.
	if got[0].Time != 0.1 || got[0].Class != admit.Batch || got[0].PromptTokens != (len(text)+3)/4 || len(got[0].Keys) != got[0].PromptTokens/16 {
		t.Fatalf("text line %+v", got[0])
	}
	// Session a's second turn extends its first: 12 shared blocks.
	a1, a2 := got[1], got[2]
	if a1.OutputTokens != 10 || len(a1.Keys) != 12 || len(a2.Keys) != 18 || !slices.Equal(a1.Keys, a2.Keys[:12]) {
		t.Fatalf("session a: %d and %d keys, shared prefix %v", len(a1.Keys), len(a2.Keys), slices.Equal(a1.Keys, a2.Keys[:12]))
	}
	// Another session and a sessionless prompt share nothing with it.
	if got[3].Keys[0] == a2.Keys[0] || got[4].Keys[0] == a2.Keys[0] || got[4].PromptTokens != 64 {
		t.Fatalf("unrelated prompts share a first block")
	}
	// A replay runs.
	p, _ := route.New(route.DefaultPolicy, route.DefaultOptions())
	res, err := Run(DefaultConfig(p), tr.Start())
	if err != nil || res.Requests != 5 {
		t.Fatalf("replay: %+v, %v", res, err)
	}

	bad := func(line, want string) {
		t.Helper()
		_, err := ReadTrace(strings.NewReader(line), 16, 1)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("ReadTrace(%s): %v, want an error mentioning %q", line, err, want)
		}
	}
	bad(`{"t": 1}`, `exactly one of "prompt" and "prompt_tokens"`)
	bad(`{"t": 1, "prompt": "x", "prompt_tokens": 3}`, `exactly one`)
	bad(`{"prompt": "x"}`, `"t" must be`)
	bad(`{"t": 1, "prompt_tokens": -3}`, `"prompt_tokens" = -3`)
	bad(`{"t": 1, "prompt": "x", "priority": "gold"}`, `unknown priority class "gold"`)
	bad("{\"t\": 1, \"prompt\": \"x\"}\n{nope", "line 2")
}

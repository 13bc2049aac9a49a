package load

import (
	"context"
	"testing"
	"time"
)

// TestRunOverTargets sends round robin over a gateway and a closed port:
// each gets half the requests, and the report counts them apart.
func TestRunOverTargets(t *testing.T) {
	target, _ := testFleet(t, "m", 1)
	closed := closedTarget(t)

	cfg := Config{Target: target, Targets: []string{closed + "/"}, Body: BodyOptions{Model: "m", Stream: true},
		Arrival: Closed, Concurrency: 2, Requests: 8, Timeout: 5 * time.Second}
	rep, err := Run(context.Background(), cfg, mustWorkload(t, WorkloadSpec{Name: WorkloadSeedChat, OutputTokens: 2}))
	if err != nil {
		t.Fatal(err)
	}
	want := []TargetReport{{Target: target, Requests: 4, OK: 4}, {Target: closed, Requests: 4, Errors: 4}}
	if len(rep.Targets) != 2 || rep.Targets[0] != want[0] || rep.Targets[1] != want[1] {
		t.Fatalf("targets %+v, want %+v", rep.Targets, want)
	}
	if rep.OK != 4 || rep.Errors["connect"] != 4 {
		t.Fatalf("ok %d errors %v, want 4 and connect:4", rep.OK, rep.Errors)
	}
}

func TestSamePod(t *testing.T) {
	f := func(results []Result, want float64, ok bool) {
		t.Helper()
		got := samePod(results)
		if (got != nil) != ok || ok && *got != want {
			t.Fatalf("samePod(%+v) = %v, want %v (ok %v)", results, deref(got), want, ok)
		}
	}
	r := func(session string, start float64, pod string) Result {
		return Result{Session: session, Start: start, Pod: pod}
	}
	f(nil, 0, false)
	f([]Result{r("a", 0, "p0"), r("b", 1, "p1")}, 0, false)
	// Ended out of order: turns are compared in the order they were due.
	f([]Result{r("a", 2, "p0"), r("a", 0, "p0"), r("a", 1, "p0")}, 1, true)
	f([]Result{r("a", 0, "p0"), r("a", 1, "p1"), r("b", 0, "p2"), r("b", 1, "p2")}, 0.5, true)
	// A turn without a pod (an error) is skipped.
	f([]Result{r("a", 0, "p0"), r("a", 1, ""), r("a", 2, "p0")}, 1, true)
}

package gateway

import (
	"testing"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/pool"
)

// TestPlanOutputAcrossRoles: a pod the planner moved to prefill and back
// adds to the model's output only what it generated as a decode pod. The
// first tokens it generated as a prefill pod are the decode pods' output
// already; credited when it came back, they landed in one window as a
// burst of decode demand.
func TestPlanOutputAcrossRoles(t *testing.T) {
	st := &modelPlan{generated: map[string]float64{}}
	read := func(role string, tokens float64) {
		t.Helper()
		st.countOutput("pod", role, &pool.Scraped{Load: engines.Load{GeneratedTokens: tokens}}, 60)
	}
	read(config.RoleDecode, 1000)
	read(config.RoleDecode, 1500) // +500 as a decode pod
	read(config.RolePrefill, 1600)
	read(config.RolePrefill, 9600) // 8000 first tokens as a prefill pod
	read(config.RoleDecode, 9700)  // +100 as a decode pod again
	if st.output != 600 {
		t.Fatalf("output %v tokens, want 600 (500 + 100 generated as a decode pod)", st.output)
	}
}

// TestPlanOutputAfterRestart: a pod whose token counter went backwards
// restarted, and what it generated since counts, as Prometheus's rate
// counts a reset, rather than being lost with the window.
func TestPlanOutputAfterRestart(t *testing.T) {
	st := &modelPlan{generated: map[string]float64{}}
	for _, tokens := range []float64{1000, 1500, 200, 300} {
		st.countOutput("pod", config.RoleDecode, &pool.Scraped{Load: engines.Load{GeneratedTokens: tokens}}, 60)
	}
	if st.output != 800 {
		t.Fatalf("output %v tokens, want 800 (500, then 200 since the restart, then 100)", st.output)
	}
}

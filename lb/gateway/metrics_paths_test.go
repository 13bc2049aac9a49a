package gateway

import (
	"fmt"
	"strings"
	"testing"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/fail"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// pdStagesGateway is a gateway over two prefill pods and one decode pod of
// model m, one roleset, with neither health checks nor sockets; adm, if
// set, is every class's admission.
func pdStagesGateway(t *testing.T, adm *admit.ClassConfig) (*Gateway, *pool.Model) {
	t.Helper()
	cfg := config.Default()
	cfg.Upstream.Retries = 2
	cfg.Models = []config.Model{{Name: "m"}}
	pod := func(name, role string, port int) config.Pod {
		return config.Pod{Name: name, Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", port), Role: role, Roleset: "a"}
	}
	cfg.Pods = []config.Pod{pod("p0", "prefill", 10000), pod("p1", "prefill", 10001), pod("d0", "decode", 10002)}
	cfg.Provision()
	return testGateway(t, cfg, upstream.Dialer(nil), adm)
}

// startPD is startCompletion with m's prefill/decode cascade resolved.
func startPD(t *testing.T, g *Gateway, m *pool.Model, via transport, class admit.Class) *completion {
	t.Helper()
	x, _ := startCompletion(t, g, m, via, class)
	res, err := strategyFor(x, m)
	if err != nil || res.PD == nil {
		t.Fatalf("no PD cascade for m: %v", err)
	}
	x.cascade = res.PD
	return x
}

// pdDecisions is what g's PD series counted for m: the requests routed
// (summed over kinds) and the decisions timed (pdlb_pd_decision_seconds
// counts each decision: a request decided anew took two).
func pdDecisions(t *testing.T, g *Gateway) (routed, timed float64) {
	t.Helper()
	var b strings.Builder
	g.metrics.set.WritePrometheus(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		var v float64
		switch {
		case strings.HasPrefix(line, `pdlb_pd_routed_total{model="m",`):
			fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v)
			routed += v
		case strings.HasPrefix(line, `pdlb_pd_decision_seconds_count{model="m"}`):
			fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v)
			timed += v
		}
	}
	return routed, timed
}

// TestPDProbeTakenRoutedOnce: a PD request whose half-open prefill pod
// another request took as its probe since its decision is decided anew
// (pd.ProbeTaken) without any attempt made: pdlb_pd_routed_total, which
// counts requests (and the planner's arrivals with it), counted it twice;
// pdlb_pd_decision_seconds times both decisions.
func TestPDProbeTakenRoutedOnce(t *testing.T) {
	g, m := pdStagesGateway(t, nil)
	for _, p := range m.Prefill {
		p.Eject(g.ledger.Now(), 0) // half-open, idle
	}
	x := startPD(t, g, m, &scripted{blocks: true}, admit.Interactive)
	if !g.pickStage(x) || !g.admitStage(x) || x.stage != stageAttempt {
		t.Fatalf("stage %d", x.stage)
	}
	taken := x.pd.Pre
	if !taken.AcquireProbe(1) { // another request's
		t.Fatal("probe")
	}
	if !g.attemptStage(x) || x.stage != stagePick || x.attempts != 0 {
		t.Fatalf("after the probe was taken: stage %d, %d attempts", x.stage, x.attempts)
	}
	if !g.pickStage(x) || x.pd.Pre == taken {
		t.Fatalf("decided anew on %v", x.pd.Pre)
	}
	if routed, timed := pdDecisions(t, g); routed != 1 || timed != 2 {
		t.Errorf("one request decided twice: pdlb_pd_routed_total %v, pdlb_pd_decision_seconds_count %v; want 1 and 2", routed, timed)
	}
	g.fail(x.ctx, x, m, fail.ClientLeft)
	taken.Release(1)
}

// TestPDDeferredRoutedOnce: a PD request admission deferred is decided
// again on the worker its wait moves it to: pdlb_pd_routed_total counted
// every deferred PD request twice (and the planner two arrivals).
func TestPDDeferredRoutedOnce(t *testing.T) {
	g, m := pdStagesGateway(t, &admit.ClassConfig{TTFTSLO: 1e-9, MaxWait: 0.02})
	x := startPD(t, g, m, &scripted{blocks: true}, admit.Batch)
	ctx := x.ctx
	g.advance(x) // deferred, picked again, waits past its max wait: 429
	if ctx.Response.StatusCode() != 429 || g.admit.Stats(admit.Batch).Deferred != 1 {
		t.Fatalf("status %d, %d deferred; want 429 after a deferral", ctx.Response.StatusCode(), g.admit.Stats(admit.Batch).Deferred)
	}
	if routed, timed := pdDecisions(t, g); routed != 1 || timed != 2 {
		t.Errorf("one deferred request decided twice: pdlb_pd_routed_total %v, pdlb_pd_decision_seconds_count %v; want 1 and 2", routed, timed)
	}
}

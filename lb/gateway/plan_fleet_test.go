package gateway

import (
	"context"
	"slices"
	"testing"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/plan"
	"pdlb/lb/pool"
)

// TestHeldPodsStayOutOfReloads: a pod the planner released to switch its
// role stays out of the fleet through a reload or a discovery update that
// lists it (it came back routable mid-switch, and the planner's Assign
// then added a second copy, which validation refused). Assign brings back
// the version the last update had; one an update dropped stays gone.
// Reloading the running configuration keeps it held.
func TestHeldPodsStayOutOfReloads(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = []config.Pod{
		{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
		{Name: "dec", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
		{Name: "dec2", Model: "m", Address: "127.0.0.1:10003", Role: config.RoleDecode, Roleset: "a"},
	}
	g := started(t, cfg)
	f := &planFleet{g: g, loop: &planLoop{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pod := func(name string) *pool.Pod {
		i := slices.IndexFunc(g.pool.Load().Pods, func(p *pool.Pod) bool { return p.Config.Name == name })
		if i < 0 {
			return nil
		}
		return g.pool.Load().Pods[i]
	}

	if err := f.Release(ctx, "m", []string{"dec2"}); err != nil {
		t.Fatal(err)
	}
	if err := g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if pod("dec2") != nil {
		t.Fatal("a reload put the released pod back in the fleet mid-switch")
	}
	// What SIGHUP without a config file applies: the running configuration.
	if err := g.Reload(g.Config()); err != nil {
		t.Fatal(err)
	}
	if pod("dec2") != nil || len(g.held) != 1 {
		t.Fatalf("reloading the running configuration: dec2 routable %v, %d pods held, want none and 1", pod("dec2") != nil, len(g.held))
	}
	moved := slices.Clone(cfg.Pods)
	moved[2].Address = "127.0.0.1:10004"
	if err := g.SetPods(moved); err != nil {
		t.Fatal(err)
	}
	if pod("dec2") != nil {
		t.Fatal("a discovery update put the released pod back in the fleet mid-switch")
	}
	if err := f.Assign("m", []plan.Change{{Name: "dec2", Role: config.RolePrefill, Roleset: "a", Switch: true}}); err != nil {
		t.Fatal(err)
	}
	if p := pod("dec2"); p == nil || p.Config.Role != config.RolePrefill || p.Config.Address != "127.0.0.1:10004" {
		t.Fatalf("after Assign: %+v, want dec2 as a prefill pod at discovery's address", p)
	}

	if err := f.Release(ctx, "m", []string{"dec2"}); err != nil {
		t.Fatal(err)
	}
	if err := g.SetPods(cfg.Pods[:2]); err != nil {
		t.Fatal(err)
	}
	if err := f.Assign("m", nil); err != nil {
		t.Fatal(err)
	}
	if p := pod("dec2"); p != nil || len(g.pool.Load().Pods) != 2 {
		t.Fatalf("a pod discovery dropped while it was held came back: %d pods", len(g.pool.Load().Pods))
	}
}

// TestAssignReturnsOnlyItsModelsPods: two models' switches run at once
// (a wave each); the one that ends first brings back its own pods only,
// not the other's, still changing role.
func TestAssignReturnsOnlyItsModelsPods(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "a", Policy: "least_request"}, {Name: "b", Policy: "least_request"}}
	cfg.Pods = []config.Pod{
		{Name: "a-pre", Model: "a", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "x"},
		{Name: "a-dec", Model: "a", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "x"},
		{Name: "a-dec2", Model: "a", Address: "127.0.0.1:10003", Role: config.RoleDecode, Roleset: "x"},
		{Name: "b-pre", Model: "b", Address: "127.0.0.1:10011", Role: config.RolePrefill, Roleset: "y"},
		{Name: "b-dec", Model: "b", Address: "127.0.0.1:10012", Role: config.RoleDecode, Roleset: "y"},
		{Name: "b-dec2", Model: "b", Address: "127.0.0.1:10013", Role: config.RoleDecode, Roleset: "y"},
	}
	g := started(t, cfg)
	f := &planFleet{g: g, loop: &planLoop{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	routable := func(name string) bool {
		return slices.ContainsFunc(g.pool.Load().Pods, func(p *pool.Pod) bool { return p.Config.Name == name })
	}

	if err := f.Release(ctx, "a", []string{"a-dec2"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx, "b", []string{"b-dec2"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Assign("a", []plan.Change{{Name: "a-dec2", Role: config.RolePrefill, Roleset: "x", Switch: true}}); err != nil {
		t.Fatal(err)
	}
	if !routable("a-dec2") {
		t.Fatal("model a's Assign did not bring back its own pod")
	}
	if routable("b-dec2") {
		t.Fatal("model a's Assign brought back model b's pod mid-switch, in the role it is leaving")
	}
	if err := f.Assign("b", []plan.Change{{Name: "b-dec2", Role: config.RolePrefill, Roleset: "y", Switch: true}}); err != nil {
		t.Fatal(err)
	}
	if !routable("b-dec2") || len(g.held) != 0 {
		t.Fatalf("after both Assigns: b-dec2 routable %v, %d pods held, want true and 0", routable("b-dec2"), len(g.held))
	}
}

// TestInstancesCarryPodKeys: the planner's role switches go to a pod's
// admin endpoint with the pod's API key, its model's for a pod of none.
func TestInstancesCarryPodKeys(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request", PodKey: config.PodKey{APIKey: "sk-model"}}}
	cfg.Pods = []config.Pod{
		{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a", PodKey: config.PodKey{APIKey: "sk-pre"}},
		{Name: "dec", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
	}
	f := &planFleet{g: started(t, cfg), loop: &planLoop{}}
	var got []string
	for _, in := range f.Instances("m") {
		got = append(got, in.Name+" "+in.Auth)
	}
	if want := []string{"pre Bearer sk-pre", "dec Bearer sk-model"}; !slices.Equal(got, want) {
		t.Errorf("instances %q, want %q", got, want)
	}
}

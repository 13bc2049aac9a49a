package gateway

import (
	"testing"
	"time"

	"pdlb/lb/config"
)

// TestReloadLeavesDepartedPods: a reload takes the pods that left the
// fleet (gone, or moved to another address: another pod) out of every
// pick, so that a request still holding the snapshot before it (a pick
// racing the reload, a PD decode leg moved) does not go to a pod whose
// health is no longer checked and that may be shutting down. A pod that
// stays, its weight changed, stays in.
func TestReloadLeavesDepartedPods(t *testing.T) {
	cfg := config.Default()
	cfg.Health.Interval = time.Hour
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = []config.Pod{
		{Name: "stays", Model: "m", Address: "127.0.0.1:10001"},
		{Name: "goes", Model: "m", Address: "127.0.0.1:10002"},
		{Name: "moves", Model: "m", Address: "127.0.0.1:10003"},
	}
	g := started(t, cfg)
	before := g.pool.Load()
	next := cfg
	next.Pods = []config.Pod{{Name: "stays", Model: "m", Address: "127.0.0.1:10001", Weight: 2}, {Name: "moves", Model: "m", Address: "127.0.0.1:10004"}}
	if err := g.Reload(next); err != nil {
		t.Fatal(err)
	}
	now := g.ledger.Now()
	for _, p := range before.Pods {
		if got, want := p.Available(now), p.Config.Name == "stays"; got != want {
			t.Errorf("the pod %s at %s of the snapshot before the reload: available %v, want %v", p.Config.Name, p.Config.Address, got, want)
		}
	}
	for _, p := range g.pool.Load().Pods {
		if !p.Available(now) {
			t.Errorf("the pod %s at %s of the reloaded fleet is not available", p.Config.Name, p.Config.Address)
		}
	}
}

package gateway

import (
	"testing"

	"pdlb/lb/config"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
)

func TestBucketRolesets(t *testing.T) {
	cfg := config.Default()
	// Never dialed; an address each, as each pod is an engine of its own.
	pod := func(name, role, roleset string, lo, hi int) config.Pod {
		return config.Pod{Name: name, Model: "m", Address: name + ":1", Role: role, Roleset: roleset, BucketMin: lo, BucketMax: hi}
	}
	cfg.Pods = []config.Pod{
		pod("p0", "prefill", "short", 0, 2048), pod("d0", "decode", "short", 0, 4096),
		pod("p1", "prefill", "long", 2048, 0), pod("d1", "decode", "long", 1024, 0), pod("d2", "decode", "long", 1024, 0),
		pod("p2", "prefill", "lonely", 0, 0),
		pod("c0", "combined", "", 0, 0),
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	snap, err := pool.Build(&cfg, upstream.Dialer(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := snap.Models[0]
	got := bucketRolesets(nil, m, 0)
	want := map[string]route.BucketRoleset{
		"short":  {Min: 0, Max: 2048, Replicas: 1},
		"long":   {Min: 2048, Max: 0, Replicas: 1},
		"lonely": {Min: 0, Max: 0, Replicas: 0},
	}
	if len(got) != len(m.Rolesets) {
		t.Fatalf("%d sets for %d rolesets", len(got), len(m.Rolesets))
	}
	for i, name := range m.Rolesets {
		if got[i] != want[name] {
			t.Fatalf("roleset %s: %+v, want %+v", name, got[i], want[name])
		}
	}
}

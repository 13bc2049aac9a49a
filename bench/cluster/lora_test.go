package cluster

import (
	"math"
	"testing"

	"pdlb/engines/sim"
	"pdlb/lb/route"
)

// TestCompareLoRA: on the acceptance workload (50 adapters, 8 pods, 4
// slots each, Zipf popularity, 45 requests/s), LoRA-aware placement swaps adapters at
// most a fifth as often as least_request and has at most half its p99
// TTFT.
func TestCompareLoRA(t *testing.T) {
	cfg := DefaultConfig(nil)
	cfg.MaxLoras = DefaultLoRAMaxLoras
	w := NewLoRAChat(45, 60, sim.DefaultBlockSize, 1)
	rows, err := CompareLoRA(cfg, w, route.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		t.Logf("%-34s swaps/request %.3f  TTFT p50 %.3f s  p99 %.3f s  hit %.1f%%", r.Name, r.SwapsPerRequest, r.TTFTP50, r.TTFTP99, 100*r.HitRate)
	}
	aware, lr := rows[0], rows[1]
	if aware.SwapsPerRequest > lr.SwapsPerRequest/5 || aware.TTFTP99 > lr.TTFTP99/2 {
		t.Errorf("LoRA-aware: %.3f swaps/request, p99 %.3f s; least_request: %.3f, %.3f s", aware.SwapsPerRequest, aware.TTFTP99, lr.SwapsPerRequest, lr.TTFTP99)
	}
	// No placement beats the floor: every policy's requests wait for a
	// load at least as often, and its p99 is at least one load.
	f := w.Floor(cfg)
	for _, r := range rows {
		if r.LoadWaited < f.MissShare || r.TTFTP99 < f.TTFTP99 {
			t.Errorf("%s: %.3f waited for a load, p99 %.3f s; below the floor %.3f, %.3f s", r.Name, r.LoadWaited, r.TTFTP99, f.MissShare, f.TTFTP99)
		}
	}
}

// TestLoRAFloor: the default workload's 50 adapters (Zipf 1.1) on 8 pods
// of 4 slots leave the 18 least popular outside any placement's slots,
// 7.95% of the requests; more than 1%, so the p99 floor is one load plus
// the prefill of 256 new tokens.
func TestLoRAFloor(t *testing.T) {
	cfg := DefaultConfig(nil)
	cfg.MaxLoras = DefaultLoRAMaxLoras
	f := func(pods int, share, p99 float64) {
		t.Helper()
		cfg.Pods = pods
		got := NewLoRAChat(30, 60, sim.DefaultBlockSize, 0).Floor(cfg)
		if math.Abs(got.MissShare-share) > 5e-5 || math.Abs(got.TTFTP99-p99) > 1e-9 {
			t.Errorf("%d pods: floor %+v, want miss share %.4f, p99 %.4f s", pods, got, share, p99)
		}
	}
	f(8, 0.0795, cfg.Physics.AdapterLoadSec+256/cfg.Physics.PrefillTokensPerSec)
	f(13, 0, 0)
	f(12, 0.0071, 0) // the two least popular: under 1%
}

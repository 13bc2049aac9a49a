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
// 7.95% of the requests, whose p99 floor is one load plus the prefill of
// 256 new tokens; in a short run, the 50 cold first requests are over 1%
// too, and the floor is one load plus the whole 768-token prompt's
// prefill. With 13 pods, all 50 fit.
func TestLoRAFloor(t *testing.T) {
	cfg := DefaultConfig(nil)
	cfg.MaxLoras = DefaultLoRAMaxLoras
	load, tokenSec := cfg.Physics.AdapterLoadSec, 1/cfg.Physics.PrefillTokensPerSec
	f := func(pods int, rate, duration, miss, cold, p99 float64) {
		t.Helper()
		cfg.Pods = pods
		got := NewLoRAChat(rate, duration, sim.DefaultBlockSize, 0).Floor(cfg)
		if math.Abs(got.MissShare-miss) > 5e-5 || math.Abs(got.ColdShare-cold) > 5e-5 || math.Abs(got.TTFTP99-p99) > 1e-9 {
			t.Errorf("%d pods, %g req/s for %g s: floor %+v, want miss %.4f, cold %.4f, p99 %.4f s", pods, rate, duration, got, miss, cold, p99)
		}
	}
	f(8, 30, 120, 0.0795, 50.0/3689, load+768*tokenSec)
	f(8, 45, 600, 0.0795, 0.0019, load+256*tokenSec)
	f(13, 45, 600, 0, 0.0019, 0)
}

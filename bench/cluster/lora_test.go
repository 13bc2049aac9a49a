package cluster

import (
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
}

package cluster

import (
	"testing"

	"pdlb/lb/route"
)

// BenchmarkSeedChat70 is one `pdlb sim --workload seed-chat --rate 70
// --duration 120 --policy default --reject` run: 8,400 requests, workload
// generation included. Target: well under 1 s.
func BenchmarkSeedChat70(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		res := simulate(b, route.DefaultPolicy, 70, true, false, 0)
		b.ReportMetric(float64(res.Requests), "requests")
	}
}

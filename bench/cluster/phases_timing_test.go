package cluster

import "testing"

// BenchmarkPhases is one `go test -run TestPhasesTable` scenario: the
// global-scheduling study's three 120 s phases on 24 pods (about 18,800
// requests and 13 million output tokens offered), static and planned arms.
// Target: well under 1 s.
func BenchmarkPhases(b *testing.B) {
	b.ReportAllocs()
	cfg := DefaultPhasesConfig()
	for b.Loop() {
		res, err := RunPhases(cfg)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, row := range res.Rows {
			n += row.Static.Requests
		}
		b.ReportMetric(float64(n), "requests/arm")
	}
}

package gateway

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/config"
	"pdlb/lb/pool"
)

// TestAdapterRequestSeries: a model's configured adapters have their
// series from the start; others get one on their first request, up to
// maxAdapterSeries, and the requests of the rest count as "other".
func TestAdapterRequestSeries(t *testing.T) {
	set := metrics.NewSet()
	r := newAdapterRequests(set, &pool.Model{Name: "m", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "sql"}}}})
	series := func() string {
		var b bytes.Buffer
		set.WritePrometheus(&b)
		return b.String()
	}
	if s := series(); !strings.Contains(s, `pdlb_adapter_requests_total{model="m",adapter="sql"} 0`) {
		t.Fatalf("no series for a configured adapter:\n%s", s)
	}
	for i := range maxAdapterSeries + 6 {
		r.counter(fmt.Sprint("a", i)).Inc()
	}
	r.counter("sql").Inc()
	s := series()
	if n := strings.Count(s, "pdlb_adapter_requests_total{"); n != maxAdapterSeries+1 {
		t.Errorf("%d series, want %d and other", n, maxAdapterSeries)
	}
	for _, want := range []string{`adapter="sql"} 1`, `adapter="a0"} 1`, `adapter="a62"} 1`, `adapter="other"} 7`} {
		if !strings.Contains(s, want) {
			t.Errorf("series lack %s:\n%s", want, s)
		}
	}
}

package ledger

import (
	"fmt"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// Gauge families, seed 001's names; each series carries pod="<name>".
const (
	MetricActiveTokens = "pd_token_load_active_tokens"
	MetricKVTokens     = "pd_token_load_kv_tokens"
	MetricDecodeTokens = "pd_token_load_decode_tokens"
)

var seriesFamilies = [3]string{MetricActiveTokens, MetricKVTokens, MetricDecodeTokens}

// labelEscaper escapes a Prometheus label value.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// RegisterMetrics makes set's WritePrometheus include the ledger's gauges.
// They are written from the counters at scrape time, so nothing is created
// per request, and a pod the janitor dropped has no series.
func (l *Ledger) RegisterMetrics(set *metrics.Set) { set.RegisterMetricsWriter(l.WritePrometheus) }

// WritePrometheus writes the per-pod gauges of the pods not dropped, in
// Prometheus text format: this replica's own charges (the decode gauge does
// not include other replicas').
func (l *Ledger) WritePrometheus(w io.Writer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for j, family := range seriesFamilies {
		header := false
		for _, p := range l.pods {
			s := p.slot
			if s.dropped.Load() {
				continue
			}
			if !header {
				metrics.WriteMetadataIfNeeded(w, family, "gauge")
				header = true
			}
			fmt.Fprintf(w, "%s %d\n", p.series[j], s.gauges()[j])
		}
	}
}

// gauges returns the slot's published counters in seriesFamilies order.
func (s *podSlot) gauges() [3]int64 {
	return [3]int64{s.active.Load(), s.kv.Load(), s.decode.Load()}
}

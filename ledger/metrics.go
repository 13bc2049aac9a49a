package ledger

import (
	"fmt"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// Metric families; each series carries pod="<name>". The gauges have
// AIBrix's names; the counter is the charges taken on the pod (each
// side of a prefill/decode charge counts), one per attempt sent to it.
const (
	MetricActiveTokens = "pd_token_load_active_tokens"
	MetricKVTokens     = "pd_token_load_kv_tokens"
	MetricDecodeTokens = "pd_token_load_decode_tokens"
	MetricCharges      = "pdlb_ledger_charges_total"
)

var seriesFamilies = [4]struct{ name, typ string }{
	{MetricActiveTokens, "gauge"}, {MetricKVTokens, "gauge"}, {MetricDecodeTokens, "gauge"}, {MetricCharges, "counter"},
}

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
	sums := l.sumBy(podName, func(p *pod) (counters, bool) {
		c := p.slot.series()
		c[3] += int64(p.carried)
		return c, !p.slot.dropped.Load()
	})
	l.mu.Unlock()
	for j, family := range seriesFamilies {
		if len(sums) > 0 {
			metrics.WriteMetadataIfNeeded(w, family.name, family.typ)
		}
		for _, n := range sums {
			fmt.Fprintf(w, "%s %d\n", n.pod.series[j], n.v[j])
		}
	}
}

// counters are the per-pod values sumBy adds up: the series in
// seriesFamilies order, or what the shared ledger publishes.
type counters [7]int64

// nameSum is counters summed over the pods of one name or key.
type nameSum struct {
	pod *pod // the first registered
	v   counters
}

func podName(p *pod) string { return p.name }

func podKey(p *pod) string { return p.key }

// sumBy sums f's counters over the registered pods it keeps, per key (the
// pod's name or its Member.Key), in registration order: a pod re-added
// under its name (a new id) while its previous self drains is one pod to
// whoever reads names or keys (a series, the other replicas). Called with
// mu held.
func (l *Ledger) sumBy(key func(*pod) string, f func(*pod) (counters, bool)) []nameSum {
	var sums []nameSum
	at := map[string]int{}
	for _, p := range l.pods {
		v, ok := f(p)
		if !ok {
			continue
		}
		i, seen := at[key(p)]
		if !seen {
			i = len(sums)
			at[key(p)] = i
			sums = append(sums, nameSum{pod: p})
		}
		for j := range v {
			sums[i].v[j] += v[j]
		}
	}
	return sums
}

// series returns the slot's published counters in seriesFamilies order.
func (s *podSlot) series() counters {
	return counters{s.active.Load(), s.kv.Load(), s.decode.Load(), int64(s.ops.Load())}
}

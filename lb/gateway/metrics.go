package gateway

import (
	"fmt"
	"io"
	"strconv"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/pool"
	"pdlb/ledger"
	"pdlb/promtext"
)

// statusCodes are the statuses the gateway answers with. Counters exist for
// each model × status at start-up, so the hot path indexes a table instead of
// building a metric name per request.
var statusCodes = []int{200, 400, 404, 405, 413, 429, 499, 500, 502, 503, 504}

// statusIndex maps a status to its column; other upstream statuses share the
// last column ("other").
func statusIndex(code int) int {
	for i, c := range statusCodes {
		if c == code {
			return i
		}
	}
	return len(statusCodes)
}

// Latency buckets in seconds: fine below 100 ms where TPOT lives, coarse up
// to the minutes a long prefill can queue.
var (
	ttftBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}
	tpotBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1}
	e2eBuckets  = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// modelMetrics are one model's series.
type modelMetrics struct {
	requests []*metrics.Counter // by statusIndex
	ttft     *metrics.PrometheusHistogram
	tpot     *metrics.PrometheusHistogram
	e2e      *metrics.PrometheusHistogram
	// promptTokens and cachedTokens add up the prompts placed and the part
	// of them the chosen pod was predicted to hold: their ratio is the
	// prefix hit rate the router achieved.
	promptTokens *metrics.Counter
	cachedTokens *metrics.Counter
}

// podMetrics are one pod's series.
type podMetrics struct {
	upstreamErrors *metrics.Counter
}

// gatewayMetrics holds every series of the gateway, created once.
type gatewayMetrics struct {
	set     *metrics.Set
	models  []modelMetrics // by pool.Model.Index
	unknown []*metrics.Counter
	pods    []podMetrics // by pool.Pod.ID
}

func newMetrics(s *pool.Snapshot, inFlight *atomic.Int64) *gatewayMetrics {
	m := &gatewayMetrics{set: metrics.NewSet()}
	requests := func(model string) []*metrics.Counter {
		out := make([]*metrics.Counter, len(statusCodes)+1)
		for i := range out {
			code := "other"
			if i < len(statusCodes) {
				code = strconv.Itoa(statusCodes[i])
			}
			out[i] = m.set.NewCounter(fmt.Sprintf(`pdlb_requests_total{model=%q,code=%q}`, model, code))
		}
		return out
	}
	for _, md := range s.Models {
		m.models = append(m.models, modelMetrics{
			requests:     requests(md.Name),
			ttft:         m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_time_to_first_token_seconds{model=%q}`, md.Name), ttftBuckets),
			tpot:         m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_time_per_output_token_seconds{model=%q}`, md.Name), tpotBuckets),
			e2e:          m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_request_duration_seconds{model=%q}`, md.Name), e2eBuckets),
			promptTokens: m.set.NewCounter(fmt.Sprintf(`pdlb_prompt_tokens_total{model=%q}`, md.Name)),
			cachedTokens: m.set.NewCounter(fmt.Sprintf(`pdlb_prefix_cached_tokens_total{model=%q}`, md.Name)),
		})
	}
	// Requests naming no known model are counted under one label, so a
	// client cannot create series by inventing model names.
	m.unknown = requests("")
	for _, p := range s.Pods {
		p := p
		m.pods = append(m.pods, podMetrics{
			upstreamErrors: m.set.NewCounter(fmt.Sprintf(`pdlb_upstream_errors_total{pod=%q}`, p.Config.Name)),
		})
		m.set.NewGauge(fmt.Sprintf(`pdlb_pod_healthy{pod=%q,model=%q}`, p.Config.Name, p.Config.Model), func() float64 {
			if p.Healthy() {
				return 1
			}
			return 0
		})
		m.set.NewGauge(fmt.Sprintf(`pdlb_pod_in_flight{pod=%q}`, p.Config.Name), func() float64 { return float64(p.InFlight()) })
		m.set.NewGauge(fmt.Sprintf(`pdlb_pod_ejections_total{pod=%q}`, p.Config.Name), func() float64 { return float64(p.Ejections()) })
	}
	m.set.NewGauge("pdlb_requests_in_flight", func() float64 { return float64(inFlight.Load()) })
	return m
}

// countRequest counts one finished request of model md (nil: unknown model).
func (m *gatewayMetrics) countRequest(md *pool.Model, code int) {
	if md == nil {
		m.unknown[statusIndex(code)].Inc()
		return
	}
	m.models[md.Index].requests[statusIndex(code)].Inc()
}

// metricsDoc documents every family of the admin /metrics page, so it
// passes `promtool check metrics` (tests/promtool_test.go runs it on a live
// gateway). A series added without an entry here shows up there with an
// empty HELP; writers that print their own HELP text need no entry.
var metricsDoc = promtext.Merge(promtext.ProcessDoc, promtext.Doc{
	"pdlb_requests_total":                {Help: "Requests answered, by model and HTTP status (model is empty for unknown models)."},
	"pdlb_requests_in_flight":            {Help: "Requests the gateway is serving now."},
	"pdlb_time_to_first_token_seconds":   {Help: "Time from a streaming request's arrival to its first token event, in seconds."},
	"pdlb_time_per_output_token_seconds": {Help: "Time per output token after the first of a streaming request, in seconds."},
	"pdlb_request_duration_seconds":      {Help: "Time from a request's arrival to the end of its answer, in seconds."},
	"pdlb_prompt_tokens_total":           {Help: "Prompt tokens of the requests placed on a pod."},
	"pdlb_prefix_cached_tokens_total":    {Help: "Prompt tokens the chosen pod was predicted to hold in its prefix cache."},
	"pdlb_upstream_errors_total":         {Help: "Failed exchanges with a pod (refused, reset, timed out)."},
	"pdlb_pod_healthy":                   {Help: "1 while the pod passes its health checks, else 0."},
	"pdlb_pod_in_flight":                 {Help: "Requests the gateway has in flight on the pod."},
	// The count comes from a callback, which the library can only
	// register as a gauge; it never decreases.
	"pdlb_pod_ejections_total": {Help: "Times the pod was ejected after consecutive failures.", Type: "counter"},

	// The token ledger's gauges: this replica's own charges, in tokens.
	ledger.MetricActiveTokens: {Help: "Prompt tokens charged to the pod for prefill and not yet prefilled (token ledger)."},
	ledger.MetricKVTokens:     {Help: "Prompt tokens charged to the pod whose KV is still resident (token ledger)."},
	ledger.MetricDecodeTokens: {Help: "Prompt tokens held by the pod's outstanding decode requests (token ledger)."},
})

// writePrometheus writes the admin /metrics page: the gateway's series and
// the process's, each family with its help text.
func (m *gatewayMetrics) writePrometheus(w io.Writer) error {
	return promtext.Write(w, metricsDoc, m.set.WritePrometheus, metrics.WriteProcessMetrics)
}

package gateway

import (
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/pool"
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
			requests: requests(md.Name),
			ttft:     m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_time_to_first_token_seconds{model=%q}`, md.Name), ttftBuckets),
			tpot:     m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_time_per_output_token_seconds{model=%q}`, md.Name), tpotBuckets),
			e2e:      m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_request_duration_seconds{model=%q}`, md.Name), e2eBuckets),
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
		m.set.NewGauge(fmt.Sprintf(`pdlb_pod_ejections{pod=%q}`, p.Config.Name), func() float64 { return float64(p.Ejections()) })
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

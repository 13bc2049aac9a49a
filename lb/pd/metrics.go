package pd

import (
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/route"
	"pdlb/promtext"
)

// pdSteps names the cascade's steps by the bit of route.PDFired they set.
var pdSteps = []string{"no_pair", "overflow", "prefill_imbalance", "decode_count",
	"decode_throughput", "decode_drain", "bucket_band", "local_prefill"}

// pdKinds names route.PDKind values.
var pdKinds = []string{"pair", "local", "combined"}

// Decision times are microseconds.
var pdDecisionBuckets = []float64{1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 5e-4, 1e-3, 1e-2}

// Metrics are one model's PD series, created with its other series.
type Metrics struct {
	decision *metrics.PrometheusHistogram
	// Prefill is the prefill leg's time, request to answer (legs without
	// one are not timed); KVTransfer the KV handoff of a sequential pair's
	// stream, from the prefill leg's answer to the decode stream's first
	// token (Call.FirstToken).
	Prefill    *metrics.PrometheusHistogram
	KVTransfer *metrics.PrometheusHistogram
	Kinds      []*metrics.Counter // by route.PDKind
	fired      []*metrics.Counter // by bit of route.PDFired
	// Watchdog is AIBrix's gateway_request_model_fail_total series.
	Watchdog *metrics.Counter
}

// NewMetrics creates model's PD series in set; the legs' times use
// legBuckets (seconds).
func NewMetrics(set *metrics.Set, model string, legBuckets []float64) *Metrics {
	m := &Metrics{
		decision:   set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_pd_decision_seconds{model=%s}`, promtext.Label(model)), pdDecisionBuckets),
		Prefill:    set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_pd_prefill_seconds{model=%s}`, promtext.Label(model)), legBuckets),
		KVTransfer: set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_pd_kv_transfer_seconds{model=%s}`, promtext.Label(model)), legBuckets),
		Watchdog:   set.NewCounter(fmt.Sprintf(`gateway_request_model_fail_total{model=%s,status="pd_decode_watchdog",status_code="504"}`, promtext.Label(model))),
	}
	for _, k := range pdKinds {
		m.Kinds = append(m.Kinds, set.NewCounter(fmt.Sprintf(`pdlb_pd_routed_total{model=%s,kind=%q}`, promtext.Label(model), k)))
	}
	for _, s := range pdSteps {
		m.fired = append(m.fired, set.NewCounter(fmt.Sprintf(`pdlb_pd_cascade_fired_total{model=%s,step=%q}`, promtext.Label(model), s)))
	}
	return m
}

// Decided counts one decision that took took: its time and the steps of
// the cascade that fired in it. A request decided anew counts each
// decision here, and itself once in Kinds (Call.Routed).
func (m *Metrics) Decided(d route.PDDecision, took time.Duration) {
	m.decision.Update(took.Seconds())
	for b, f := 0, d.Fired; f != 0; b, f = b+1, f>>1 {
		if f&1 != 0 {
			m.fired[b].Inc()
		}
	}
}

// MetricsDoc documents the PD series for the admin /metrics page.
var MetricsDoc = promtext.Doc{
	"pdlb_pd_decision_seconds":         {Help: "Time the prefill/decode cascade took to decide, in seconds."},
	"pdlb_pd_prefill_seconds":          {Help: "Time from sending a prefill leg to its pod's answer, in seconds; a leg without one (refused, reset, timed out, cut) is not timed."},
	"pdlb_pd_kv_transfer_seconds":      {Help: "KV handoff as the gateway sees it: time from a prefill leg's answer to the decode stream's first token (the decode pod's queue, its KV pull and its first step), in seconds; streams of sequential protocols (vLLM, TensorRT-LLM context_first) only: a decode pod sends a stream's headers before its KV pull, and a whole answer after its whole decode."},
	"pdlb_pd_routed_total":             {Help: "Requests the PD cascade routed, by the kind of their first decision: pair (prefill and decode pods), local (decode pod prefills itself), combined; a request decided anew (a retry, a half-open probe taken, an admission deferral) counts once."},
	"pdlb_pd_cascade_fired_total":      {Help: "Decisions in which a step of the PD cascade fired, by step."},
	"gateway_request_model_fail_total": {Help: "Requests the decode watchdog failed (AIBrix's series; status_code is 504 even when the client saw a cut stream)."},
}

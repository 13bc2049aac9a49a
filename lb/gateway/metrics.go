package gateway

import (
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/accesslog"
	"pdlb/lb/admit"
	"pdlb/lb/limits"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/ledger"
	"pdlb/promtext"
	"pdlb/radix"
)

// statusCodes are the statuses the gateway answers with (401 a refused API
// key, 408 and 431 a client's request cut short). Counters exist for each
// model × status at start-up, so the hot path indexes a table instead of
// building a metric name per request.
var statusCodes = []int{200, 400, 401, 404, 405, 408, 413, 429, 431, 499, 500, 502, 503, 504}

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
	shedBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1}
	e2eBuckets  = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// modelMetrics are one model's series.
type modelMetrics struct {
	requests []*metrics.Counter // by statusIndex
	ttft     *metrics.PrometheusHistogram
	tpot     *metrics.PrometheusHistogram
	e2e      *metrics.PrometheusHistogram
	// promptTokens and cachedTokens add up the prompts placed, each
	// request's once (place), and the part of them the chosen pod was
	// predicted to hold: their ratio is the prefix hit rate the router
	// achieved.
	promptTokens *metrics.Counter
	cachedTokens *metrics.Counter
	// tokenized counts requests by how their prompt became token ids
	// (tokenMode): exactly as the engine, the stand-in, or not at all
	// (routed without the KV-event index).
	tokenized [numTokenModes]*metrics.Counter
	// offLoop counts the requests read or tokenized on a worker, not the
	// event loop they came on (stageParse, tokenizeHere).
	offLoop *metrics.Counter
	// rankPins counts the requests sent to a data-parallel rank the
	// gateway named (rankFor), a PD pair's legs each, an SGLang pair by
	// its bootstrap room (PrefillRank).
	rankPins *metrics.Counter
	// completionTokens adds up the output of the answers relayed, from
	// their usage (a stream's events where it carries none).
	completionTokens *metrics.Counter
	// generated counts the completions, Responses and Messages answered
	// 200: the planner's finished requests, whose output it averages (the
	// other APIs' answers have none).
	generated atomic.Int64
	// uncascaded counts the Responses and Messages requests that arrived
	// and took no prefill/decode cascade: the planner's besides those the
	// cascade decided (pd.Kinds).
	uncascaded atomic.Int64
	// fallbacks counts requests for another model moved to this one
	// (models.go); panics the picks that found no pod available (panic.go).
	fallbacks, panics *metrics.Counter
	// adapterLoads counts the LoRA adapters the gateway loaded on pods;
	// adapters the requests by adapter.
	adapterLoads *metrics.Counter
	adapters     *adapterRequests
	// pd are the prefill/decode exchange's series.
	pd *pd.Metrics
}

// gatewayMetrics holds every series of the gateway. Per-model series are
// created when a model first appears and kept for the process's life, so a
// reload never resets a counter; per-pod series are written at scrape time
// from the current snapshot, so pods that leave take their series along.
type gatewayMetrics struct {
	set *metrics.Set
	// models is indexed by pool.Model.Index; it only grows, by copy, so the
	// request path reads it without a lock.
	models  atomic.Pointer[[]*modelMetrics]
	unknown []*metrics.Counter
	// shed times the requests answered 429, from arrival to the answer:
	// how fast the gateway refuses what it cannot serve in time.
	shed *metrics.PrometheusHistogram
	// retry counts retries and holds the retry budget's count (retry.go).
	retry *retryMetrics
	// reloadFailed is whether the last operator's reload failed;
	// reloadedAt, when one last succeeded (unix seconds; the start first).
	// certFailed is whether the last reload of a changed certificate
	// file failed (cleared by its next, or by a reload that applied,
	// which reads every certificate file anew).
	reloadFailed, certFailed atomic.Bool
	reloadedAt               atomic.Int64
}

func newMetrics(inFlight *atomic.Int64) *gatewayMetrics {
	m := &gatewayMetrics{set: metrics.NewSet()}
	// Requests naming no known model are counted under one label, so a
	// client cannot create series by inventing model names.
	m.unknown = m.requests("")
	m.set.NewGauge("pdlb_requests_in_flight", func() float64 { return float64(inFlight.Load()) })
	m.shed = m.set.NewPrometheusHistogramExt("pdlb_shed_duration_seconds", shedBuckets)
	m.retry = newRetryMetrics(m.set)
	m.models.Store(&[]*modelMetrics{})
	m.reloadedAt.Store(time.Now().Unix())
	m.set.NewGauge("pdlb_config_last_reload_successful", func() float64 {
		if m.reloadFailed.Load() || m.certFailed.Load() {
			return 0
		}
		return 1
	})
	m.set.NewGauge("pdlb_config_last_reload_success_timestamp_seconds", func() float64 { return float64(m.reloadedAt.Load()) })
	return m
}

// NoteReload records how an operator's reload (SIGHUP, a change to the
// config file) ended, nil when it applied, for the
// pdlb_config_last_reload_* gauges an alert watches.
func (g *Gateway) NoteReload(err error) {
	g.metrics.reloadFailed.Store(err != nil)
	if err == nil {
		g.metrics.certFailed.Store(false)
		g.metrics.reloadedAt.Store(time.Now().Unix())
	}
}

// NoteCertReload records how the reload of a changed certificate file
// ended: a failure shows on pdlb_config_last_reload_successful until the
// next one, or a reload, succeeds; neither moves the configuration's
// timestamp, nor does a success hide a failed reload's 0.
func (g *Gateway) NoteCertReload(err error) {
	g.metrics.certFailed.Store(err != nil)
}

func (m *gatewayMetrics) requests(model string) []*metrics.Counter {
	out := make([]*metrics.Counter, len(statusCodes)+1)
	for i := range out {
		code := "other"
		if i < len(statusCodes) {
			code = strconv.Itoa(statusCodes[i])
		}
		out[i] = m.set.NewCounter(fmt.Sprintf(`pdlb_requests_total{model=%s,code=%q}`, promtext.Label(model), code))
	}
	return out
}

// addModels creates the series of the models of s that have none yet. It
// runs when a snapshot is built, never on the request path, and only one
// at a time (the gateway's reload lock).
func (m *gatewayMetrics) addModels(s *pool.Snapshot) {
	cur := *m.models.Load()
	next := cur
	for _, md := range s.Models {
		for len(next) <= md.Index {
			next = append(next, nil)
		}
		if next[md.Index] != nil {
			continue
		}
		if len(cur) > 0 && &next[0] == &cur[0] {
			next = append([]*modelMetrics(nil), next...) // never write a published slice
		}
		next[md.Index] = &modelMetrics{
			requests:         m.requests(md.Name),
			ttft:             m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_time_to_first_token_seconds{model=%s}`, promtext.Label(md.Name)), ttftBuckets),
			tpot:             m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_time_per_output_token_seconds{model=%s}`, promtext.Label(md.Name)), tpotBuckets),
			e2e:              m.set.NewPrometheusHistogramExt(fmt.Sprintf(`pdlb_request_duration_seconds{model=%s}`, promtext.Label(md.Name)), e2eBuckets),
			promptTokens:     m.set.NewCounter(fmt.Sprintf(`pdlb_prompt_tokens_total{model=%s}`, promtext.Label(md.Name))),
			cachedTokens:     m.set.NewCounter(fmt.Sprintf(`pdlb_prefix_cached_tokens_total{model=%s}`, promtext.Label(md.Name))),
			completionTokens: m.set.NewCounter(fmt.Sprintf(`pdlb_completion_tokens_total{model=%s}`, promtext.Label(md.Name))),
			fallbacks:        m.set.NewCounter(fmt.Sprintf(`pdlb_fallback_requests_total{model=%s}`, promtext.Label(md.Name))),
			panics:           m.set.NewCounter(fmt.Sprintf(`pdlb_panic_picks_total{model=%s}`, promtext.Label(md.Name))),
			offLoop:          m.set.NewCounter(fmt.Sprintf(`pdlb_prompt_tokenized_off_loop_total{model=%s}`, promtext.Label(md.Name))),
			rankPins:         m.set.NewCounter(fmt.Sprintf(`pdlb_data_parallel_rank_pins_total{model=%s}`, promtext.Label(md.Name))),
			adapterLoads:     m.set.NewCounter(fmt.Sprintf(`pdlb_adapter_loads_total{model=%s}`, promtext.Label(md.Name))),
			adapters:         newAdapterRequests(m.set, md),
			pd:               pd.NewMetrics(m.set, md.Name, ttftBuckets),
		}
		for i, name := range tokenModeNames {
			next[md.Index].tokenized[i] = m.set.NewCounter(fmt.Sprintf(`pdlb_prompt_tokenized_total{model=%s,mode=%q}`, promtext.Label(md.Name), name))
		}
	}
	m.models.Store(&next)
}

// model returns md's series.
func (m *gatewayMetrics) model(md *pool.Model) *modelMetrics { return (*m.models.Load())[md.Index] }

// countRequest counts one finished request of model md (nil: unknown model).
func (m *gatewayMetrics) countRequest(md *pool.Model, code int) {
	if md == nil {
		m.unknown[statusIndex(code)].Inc()
		return
	}
	m.model(md).requests[statusIndex(code)].Inc()
}

// writePods writes the per-pod series of the current snapshot at now (the
// ledger's clock, as the pods' breakers take it). Their help texts come
// from metricsDoc.
func writePods(w io.Writer, s *pool.Snapshot, now int64) {
	family := func(name, typ string, value func(p *pool.Pod) int64) {
		fmt.Fprintf(w, "# HELP %s\n# TYPE %s %s\n", name, name, typ)
		for _, p := range s.Pods {
			fmt.Fprintf(w, "%s{pod=%s} %d\n", name, promtext.Label(p.Config.Name), value(p))
		}
	}
	family("pdlb_upstream_errors_total", "counter", (*pool.Pod).UpstreamErrors)
	family("pdlb_pod_healthy", "gauge", func(p *pool.Pod) int64 {
		if p.Healthy() {
			return 1
		}
		return 0
	})
	family("pdlb_pod_in_flight", "gauge", (*pool.Pod).InFlight)
	family("pdlb_pod_ejections_total", "counter", (*pool.Pod).Ejections)
	family("pdlb_pod_ejections_kept_total", "counter", (*pool.Pod).EjectionsKept)
	family("pdlb_pod_circuit_state", "gauge", func(p *pool.Pod) int64 { return int64(p.Circuit(now)) })
}

// metricsDoc documents every family of the admin /metrics page, so it
// passes `promtool check metrics` (tests/promtool_test.go runs it on a live
// gateway). A series added without an entry here shows up there with an
// empty HELP; writers that print their own HELP text need no entry.
var metricsDoc = promtext.Merge(promtext.ProcessDoc, pd.MetricsDoc, limits.MetricsDoc, accesslog.MetricsDoc, retryMetricsDoc, adapterMetricsDoc, promtext.Doc{
	"pdlb_requests_total":                               {Help: "Requests answered, by model and HTTP status (model is empty where none applies: an unknown model, a request refused before its model was resolved (an API key refused, a body that does not parse, whatever model it names), a path not served); the health checks, CORS preflights and the /v1/models list are not counted, a refusal of the list is."},
	"pdlb_requests_in_flight":                           {Help: "Requests the gateway is serving now."},
	"pdlb_stored_responses":                             {Help: "Stored Responses API responses whose pod the gateway remembers (those of the last max_stored_responses made or found)."},
	"pdlb_responses_conversations":                      {Help: "Responses API conversations (prompt_cache_key) whose last pod the gateway remembers (max_stored_responses bounds them)."},
	"pdlb_config_last_reload_successful":                {Help: "1 if the last reload (SIGHUP, a change to the config file) applied and the last change to a certificate file loaded, 0 if either failed and what was running stayed."},
	"pdlb_config_last_reload_success_timestamp_seconds": {Help: "When the configuration was last applied (the start, or the last reload that succeeded), in Unix seconds."},
	"pdlb_time_to_first_token_seconds":                  {Help: "Time from a streaming request's arrival to its first token event, in seconds."},
	"pdlb_time_per_output_token_seconds":                {Help: "Time per output token after the first of a streaming request, in seconds."},
	"pdlb_request_duration_seconds":                     {Help: "Time from the arrival of a completion, Responses or Messages request to the end of its answer, the gateway's own errors too (no pod available, retries spent, shed), in seconds (the engines' other APIs, such as embeddings, are not in it)."},
	"pdlb_shed_duration_seconds":                        {Help: "Time from a request's arrival to its 429 answer (shed or rejected by admission, or over its API key's request or token rate), in seconds."},
	"pdlb_prompt_tokens_total":                          {Help: "Prompt tokens of the requests placed on the model's pods, each request's once (a retry's is not counted again; a fallback model counts the requests moved to it)."},
	"pdlb_prefix_cached_tokens_total":                   {Help: "Prompt tokens the pod chosen at a request's placement on the model was predicted to hold in its prefix cache (counted as pdlb_prompt_tokens_total counts the prompt)."},
	"pdlb_prompt_tokenized_total":                       {Help: "Requests by how their prompt's block keys were made: exact (the engine's tokenizer and template, or the client's token ids), stand_in (no tokenizer configured), unindexed (routed without the KV-event index)."},
	"pdlb_prompt_tokenized_off_loop_total":              {Help: "Requests whose prompt was read or tokenized on a worker rather than the event loop they came on, on the gnet front end: a body over 64 KiB; over 16 KiB, on a model with a tokenizer, for the chat template's Jinja engine or with over 16 KiB of text new to the tokenizer."},
	"pdlb_completion_tokens_total":                      {Help: "Output tokens of the answers relayed, by model (from its usage, which the gateway asks a stream's engine for where the client did not; a stream without any counted from its events)."},
	"pdlb_data_parallel_rank_pins_total":                {Help: "Requests sent to the data-parallel rank of their pod holding strictly the longest prefix of their prompt (X-Data-Parallel-Rank, or an SGLang pair's bootstrap room), rather than left to the engine's balancer; a prefill/decode pair's legs count each."},
	"pdlb_fallback_requests_total":                      {Help: "Requests for another model that this model served, as the other's fallback (it had no available pod, shed the request, or its pod answered 503)."},
	"pdlb_panic_picks_total":                            {Help: "Picks that found none of the model's pods available and took one anyway (panic routing): a first attempt's, a pod whose health checks pass whatever its breaker (ejected, or half-open with its probe out); a retry's, any pod it had not tried."},
	"pdlb_adapter_loads_total":                          {Help: "LoRA adapters the gateway loaded on the model's pods through the engine's API."},
	"pdlb_upstream_errors_total":                        {Help: "Failed exchanges with a pod (refused, reset, timed out)."},
	"pdlb_pod_healthy":                                  {Help: "1 while the pod passes its health checks, else 0."},
	"pdlb_pod_in_flight":                                {Help: "Requests the gateway has in flight on the pod."},
	"pdlb_pod_ejections_total":                          {Help: "Times the pod was ejected after consecutive failures.", Type: "counter"},
	"pdlb_pod_ejections_kept_total":                     {Help: "Times the pod was due for ejection but kept in: health.max_ejected_percent of its model's pods were ejected already.", Type: "counter"},
	"pdlb_pod_circuit_state":                            {Help: "The pod's circuit breaker: 0 closed, 1 open (ejected), 2 half-open (one probe request at a time)."},

	// The token ledger's gauges: this replica's own charges, in tokens.
	ledger.MetricActiveTokens: {Help: "Prompt tokens charged to the pod for prefill and not yet prefilled (token ledger)."},
	ledger.MetricKVTokens:     {Help: "Prompt tokens charged to the pod whose KV is still resident (token ledger)."},
	ledger.MetricDecodeTokens: {Help: "Prompt tokens held by the pod's outstanding decode requests (token ledger)."},
	ledger.MetricCharges:      {Help: "Charges the token ledger took on the pod: one per request placed on it (each side of a prefill/decode pair), a request placed on it again while it holds its charge (a deferred request's re-picks) not counted again, summed over the pods that held its name.", Type: "counter"},
})

// writePrometheus writes the admin /metrics page: the gateway's series and
// the process's, each family with its help text. The process's open and
// maximum descriptors come apart from the rest (the library leaves them out
// of WriteProcessMetrics for the cost of counting /proc/self/fd, one
// directory read per scrape); the open-files alert docs/tuning.md advises
// divides the two.
func (m *gatewayMetrics) writePrometheus(w io.Writer) error {
	return promtext.Write(w, metricsDoc, m.set.WritePrometheus, metrics.WriteProcessMetrics, metrics.WriteFDMetrics)
}

// writeDynamicMetrics writes, at scrape time, the series whose label sets
// come from state rather than configuration: the prefix index, the KV-event
// feeds and admission.
func (g *Gateway) writeDynamicMetrics(w io.Writer) {
	snap := g.pool.Load()
	writePods(w, snap, g.ledger.Now())
	g.writeExchanges(w)
	fmt.Fprint(w, "# HELP pdlb_prefix_index_blocks Blocks the prefix index believes a pod holds.\n# TYPE pdlb_prefix_index_blocks gauge\n")
	stats := make([]radix.Stats, len(snap.Models))
	for i, m := range snap.Models {
		stats[i] = m.Prefix.Stats()
		for _, p := range m.Pods {
			fmt.Fprintf(w, "pdlb_prefix_index_blocks{model=%s,pod=%s} %d\n", promtext.Label(m.Name), promtext.Label(p.Config.Name), stats[i].PodBlocks[p.Slot])
		}
	}
	fmt.Fprint(w, "# HELP pdlb_prefix_index_bytes Memory the prefix index's arenas hold.\n# TYPE pdlb_prefix_index_bytes gauge\n")
	for i, m := range snap.Models {
		fmt.Fprintf(w, "pdlb_prefix_index_bytes{model=%s} %d\n", promtext.Label(m.Name), stats[i].Bytes)
	}
	g.mu.Lock()
	feeds := g.kv.feeds
	g.mu.Unlock()
	if len(feeds) > 0 {
		// Each feed's counters are summed once, so a scrape's families
		// agree with each other.
		counts := make([]feedCounts, len(feeds))
		for i, f := range feeds {
			counts[i] = f.counts()
		}
		for _, fam := range feedFamilies {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", fam.name, fam.help, fam.name, fam.kind)
			for i, f := range feeds {
				fmt.Fprintf(w, "%s{pod=%s} %d\n", fam.name, promtext.Label(f.pod.Config.Name), fam.value(counts[i]))
			}
		}
	}
	if g.admit != nil {
		fmt.Fprint(w, "# HELP pdlb_admission_requests_total Admission decisions by priority class: each request's last, admitted or rejected (one rejected on its model counts by its fallback model's decision), and the deferrals on the way.\n# TYPE pdlb_admission_requests_total counter\n")
		for c := admit.Class(0); c < admit.NumClasses; c++ {
			st := g.admit.Stats(c)
			fmt.Fprintf(w, "pdlb_admission_requests_total{class=%q,decision=\"admitted\"} %d\n", c, st.Admitted)
			fmt.Fprintf(w, "pdlb_admission_requests_total{class=%q,decision=\"rejected\"} %d\n", c, st.Rejected)
			fmt.Fprintf(w, "pdlb_admission_requests_total{class=%q,decision=\"deferred\"} %d\n", c, st.Deferred)
		}
		fmt.Fprint(w, "# HELP pdlb_admission_waiting Requests waiting in the deferral queue.\n# TYPE pdlb_admission_waiting gauge\n")
		for c := admit.Class(0); c < admit.NumClasses; c++ {
			fmt.Fprintf(w, "pdlb_admission_waiting{class=%q} %d\n", c, g.admit.Stats(c).Waiting)
		}
		fmt.Fprint(w, "# HELP pdlb_slo_attainment_ratio Fraction of decided requests of a class that met its targets (rejected ones count as misses).\n# TYPE pdlb_slo_attainment_ratio gauge\n")
		for c := admit.Class(0); c < admit.NumClasses; c++ {
			fmt.Fprintf(w, "pdlb_slo_attainment_ratio{class=%q} %g\n", c, g.admit.Stats(c).Attainment())
		}
	}
}

// feedFamilies are the metric families of the KV-event feeds, a value of
// feedCounts each.
var feedFamilies = []struct {
	name, help, kind string
	value            func(feedCounts) uint64
}{
	{"pdlb_kv_events_total", "KV events received from a pod.", "counter", func(c feedCounts) uint64 { return c.events }},
	{"pdlb_kv_event_gaps_total", "Sequence gaps seen in a pod's KV events.", "counter", func(c feedCounts) uint64 { return c.gaps }},
	{"pdlb_kv_event_replayed_batches_total", "KV-event batches recovered through a pod's replay socket.", "counter", func(c feedCounts) uint64 { return c.replayed }},
	{"pdlb_kv_feed_connected_ranks", "Ranks of a pod (1 without data-parallel ranks) whose KV-event feed holds a connection its publisher greeted; fewer while the publisher is down or its port never speaks ZeroMQ.", "gauge", func(c feedCounts) uint64 { return c.connected }},
}

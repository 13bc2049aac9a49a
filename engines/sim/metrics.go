package sim

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/engines"
	"pdlb/promtext"
)

// Histogram bounds of the engines imitated, in seconds.
var (
	// vLLM v1, vllm/v1/metrics/loggers.py.
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	vllmITLBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	vllmE2EBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// SGLang, python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector).
	sglangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	sglangITLBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035,
		0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000}
	sglangE2EBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200,
		400, 600, 1200, 1800, 2400}
	// vLLM's NIXL connector, vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py
	// (NixlPromMetrics); SGLang's decode side uses them too for the sim's
	// own series, having none of its own in Prometheus.
	kvTransferBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}
)

// finish reasons, as vLLM names them in finish_reason and in
// request_success_total's finished_reason label.
const (
	finishNone uint8 = iota
	finishStop
	finishLength
	finishAbort
	numFinish
)

var finishNames = [numFinish]string{"", "stop", "length", "abort"}

// podMetrics is one pod's counters: atomics that Stats and the trtllm JSON
// read, and, for vllm and sglang, the Prometheus series of a metrics.Set of
// the pod's own (many pods share a process, so never the global set). The
// scheduler goroutine writes it; scrapes read it concurrently.
type podMetrics struct {
	// Gauges, published by the scheduler after each wake-up: the pod's,
	// and each data-parallel rank's share.
	running, waiting, prefilling, usedBlocks, pinnedBlocks atomic.Int64
	ranks                                                  []rankMetrics
	// Counters, in tokens or requests: the pod's, the sums of its ranks'.
	promptTokens  atomic.Int64
	tokens        tokenCounts
	finished      [numFinish]atomic.Int64
	steps         atomic.Int64
	lastStepNanos atomic.Int64 // simulated
	// KV transfers: pulls done and failed on a decode pod, holds that
	// expired unpicked on a prefill pod.
	kvPulls, kvPullFailures, kvExpired atomic.Int64
	// adapterLoads counts LoRA adapters brought into a slot.
	adapterLoads atomic.Int64

	set         *metrics.Set // nil for trtllm, whose /metrics is JSON
	cacheBlocks int          // a rank's
	blockSize   int
	now         func() float64 // simulated seconds since start
}

// labelValue escapes a Prometheus label value. Config.Validate keeps quotes
// and newlines out of model names, so only backslashes could need it.
func labelValue(s string) string { return strings.ReplaceAll(s, `\`, `\\`) }

// rankMetrics are one data-parallel rank's gauges and token counts, and
// the Prometheus series its requests are recorded to.
type rankMetrics struct {
	running, waiting, usedBlocks atomic.Int64
	tokens                       tokenCounts
	series                       *promSeries
}

// promSeries are the Prometheus counters and histograms of requests: each
// rank's own on vLLM, whose PrometheusStatLogger labels every series with
// the engine index; one for the pod on SGLang, whose tokenizer manager
// counts them; on TensorRT-LLM none (nil fields record nothing).
type promSeries struct {
	promptC, genC, queryC, hitC *metrics.Counter
	successC                    [numFinish]*metrics.Counter
	ttft, itl, e2e              *metrics.PrometheusHistogram
	kvXfer                      *metrics.PrometheusHistogram
	kvFailedC, kvExpiredC       *metrics.Counter
}

// tokenCounts are the tokens generated, and the prompt tokens queried in
// the prefix cache and found there, of a pod or a rank.
type tokenCounts struct {
	generated, queried, hit atomic.Int64
	// gen_throughput is measured between reads (simulated seconds).
	thrMu           sync.Mutex
	thrAt, thrValue float64
	thrTokens       int64
}

// rankLoad is what one rank's gauges are set to: requests running and
// waiting, and KV blocks in use.
type rankLoad struct{ running, waiting, usedBlocks int }

func newPodMetrics(cfg Config, now func() float64) *podMetrics {
	m := &podMetrics{cacheBlocks: cfg.Physics.CacheBlocks, blockSize: cfg.Physics.BlockSize, now: now,
		ranks: make([]rankMetrics, cfg.DataParallelSize)}
	model := labelValue(cfg.Model)
	switch cfg.Engine {
	case engines.VLLM:
		// vLLM labels every series with the served model and the engine
		// (data-parallel rank) index.
		s := metrics.NewSet()
		for i := range m.ranks {
			g, l := &m.ranks[i], fmt.Sprintf(`{model_name=%q,engine="%d"}`, model, i)
			s.NewGauge("vllm:num_requests_running"+l, func() float64 { return float64(g.running.Load()) })
			s.NewGauge("vllm:num_requests_waiting"+l, func() float64 { return float64(g.waiting.Load()) })
			s.NewGauge("vllm:kv_cache_usage_perc"+l, func() float64 { return m.rankKVUsage(g) })
			ps := &promSeries{
				queryC:     s.NewCounter("vllm:prefix_cache_queries_total" + l),
				hitC:       s.NewCounter("vllm:prefix_cache_hits_total" + l),
				promptC:    s.NewCounter("vllm:prompt_tokens_total" + l),
				genC:       s.NewCounter("vllm:generation_tokens_total" + l),
				ttft:       s.NewPrometheusHistogramExt("vllm:time_to_first_token_seconds"+l, vllmTTFTBuckets),
				itl:        s.NewPrometheusHistogramExt("vllm:inter_token_latency_seconds"+l, vllmITLBuckets),
				e2e:        s.NewPrometheusHistogramExt("vllm:e2e_request_latency_seconds"+l, vllmE2EBuckets),
				kvXfer:     s.NewPrometheusHistogramExt("vllm:nixl_xfer_time_seconds"+l, kvTransferBuckets),
				kvFailedC:  s.NewCounter("vllm:nixl_num_failed_transfers_total" + l),
				kvExpiredC: s.NewCounter("vllm:nixl_num_kv_expired_reqs_total" + l),
			}
			for r := finishStop; r < numFinish; r++ {
				ps.successC[r] = s.NewCounter(fmt.Sprintf(`vllm:request_success_total{model_name=%q,engine="%d",finished_reason=%q}`, model, i, finishNames[r]))
			}
			g.series = ps
		}
		m.set = s
	case engines.SGLang:
		// The scheduler of each rank (dp_size > 1) labels its gauges
		// with its tp_rank and dp_rank too (SchedulerMetricsCollector);
		// the tokenizer manager's counters and histograms are the pod's.
		l := fmt.Sprintf(`{model_name=%q}`, model)
		s := metrics.NewSet()
		ps := &promSeries{
			promptC: s.NewCounter("sglang:prompt_tokens_total" + l),
			genC:    s.NewCounter("sglang:generation_tokens_total" + l),
			hitC:    s.NewCounter("sglang:cached_tokens_total" + l),
			ttft:    s.NewPrometheusHistogramExt("sglang:time_to_first_token_seconds"+l, sglangTTFTBuckets),
			itl:     s.NewPrometheusHistogramExt("sglang:inter_token_latency_seconds"+l, sglangITLBuckets),
			e2e:     s.NewPrometheusHistogramExt("sglang:e2e_request_latency_seconds"+l, sglangE2EBuckets),
			kvXfer:  s.NewPrometheusHistogramExt("pdlb_sim_kv_transfer_seconds"+l, kvTransferBuckets),
		}
		ps.successC[finishStop] = s.NewCounter("sglang:num_requests_total" + l)
		ps.successC[finishLength] = ps.successC[finishStop]
		ps.successC[finishAbort] = s.NewCounter("sglang:num_aborted_requests_total" + l)
		for i := range m.ranks {
			g, rl := &m.ranks[i], l
			if len(m.ranks) > 1 {
				rl = fmt.Sprintf(`{model_name=%q,tp_rank="0",dp_rank="%d"}`, model, i)
			}
			s.NewGauge("sglang:num_running_reqs"+rl, func() float64 { return float64(g.running.Load()) })
			s.NewGauge("sglang:num_queue_reqs"+rl, func() float64 { return float64(g.waiting.Load()) })
			s.NewGauge("sglang:num_used_tokens"+rl, func() float64 { return float64(g.usedBlocks.Load()) * float64(m.blockSize) })
			s.NewGauge("sglang:token_usage"+rl, func() float64 { return m.rankKVUsage(g) })
			s.NewGauge("sglang:gen_throughput"+rl, func() float64 { return g.tokens.throughput(m.now()) })
			s.NewGauge("sglang:cache_hit_rate"+rl, g.tokens.hitRate)
			g.series = ps
		}
		m.set = s
	default:
		for i := range m.ranks {
			m.ranks[i].series = &promSeries{}
		}
	}
	return m
}

// setLoads sets the gauges of the ranks, loads[i] rank i's, and the
// pod's, their sums.
func (m *podMetrics) setLoads(loads []rankLoad) {
	var pod rankLoad
	for i, l := range loads {
		g := &m.ranks[i]
		g.running.Store(int64(l.running))
		g.waiting.Store(int64(l.waiting))
		g.usedBlocks.Store(int64(l.usedBlocks))
		pod.running += l.running
		pod.waiting += l.waiting
		pod.usedBlocks += l.usedBlocks
	}
	m.running.Store(int64(pod.running))
	m.waiting.Store(int64(pod.waiting))
	m.usedBlocks.Store(int64(pod.usedBlocks))
}

// kvUsage is the fraction of the pod's KV blocks in use: of all its ranks'
// caches, the mean of theirs.
func (m *podMetrics) kvUsage() float64 {
	return float64(m.usedBlocks.Load()) / float64(m.podBlocks())
}

// rankKVUsage is the fraction of rank g's KV cache in use.
func (m *podMetrics) rankKVUsage(g *rankMetrics) float64 {
	return float64(g.usedBlocks.Load()) / float64(m.cacheBlocks)
}

// podBlocks is the KV capacity of all the pod's ranks, in blocks.
func (m *podMetrics) podBlocks() int { return m.cacheBlocks * len(m.ranks) }

// hitRate is hit tokens over queried prompt tokens since start (SGLang
// reports it per logging interval; cumulative is steadier for a scraper).
func (c *tokenCounts) hitRate() float64 {
	q := c.queried.Load()
	if q == 0 {
		return 0
	}
	return float64(c.hit.Load()) / float64(q)
}

// throughput is generated tokens per simulated second since the previous
// read at least one simulated second before now.
func (c *tokenCounts) throughput(now float64) float64 {
	c.thrMu.Lock()
	defer c.thrMu.Unlock()
	gen := c.generated.Load()
	if dt := now - c.thrAt; dt >= 1 {
		c.thrValue = float64(gen-c.thrTokens) / dt
		c.thrAt, c.thrTokens = now, gen
	}
	return c.thrValue
}

// add counts tokens generated, queried and hit.
func (c *tokenCounts) add(generated, queried, hit int) {
	c.generated.Add(int64(generated))
	c.queried.Add(int64(queried))
	c.hit.Add(int64(hit))
}

func addCounter(c *metrics.Counter, n int) {
	if c != nil {
		c.Add(n)
	}
}

func observe(h *metrics.PrometheusHistogram, v float64) {
	if h != nil {
		h.Update(v)
	}
}

// The recorders below count an event of a request served by rank.

// prefillStarted counts one prefix-cache lookup: prompt tokens queried and
// the leading ones found cached, as vLLM counts at scheduling.
func (m *podMetrics) prefillStarted(rank, prompt, cached int) {
	m.tokens.add(0, prompt, cached)
	m.ranks[rank].tokens.add(0, prompt, cached)
	s := m.ranks[rank].series
	addCounter(s.queryC, prompt)
	addCounter(s.hitC, cached)
}

// firstToken records a finished prefill: the prompt processed and its first
// output token, ttft simulated seconds after arrival.
func (m *podMetrics) firstToken(rank, prompt int, ttft float64) {
	m.promptTokens.Add(int64(prompt))
	m.tokens.add(1, 0, 0)
	m.ranks[rank].tokens.add(1, 0, 0)
	s := m.ranks[rank].series
	addCounter(s.promptC, prompt)
	addCounter(s.genC, 1)
	observe(s.ttft, ttft)
}

// decodeStep records one of rank's decode steps, of batch sequences, that
// took stepSec.
func (m *podMetrics) decodeStep(rank, batch int, stepSec float64) {
	m.steps.Add(1)
	m.lastStepNanos.Store(int64(stepSec * 1e9))
	m.tokens.generated.Add(int64(batch))
	m.ranks[rank].tokens.generated.Add(int64(batch))
	addCounter(m.ranks[rank].series.genC, batch)
}

// token records one decoded token itl simulated seconds after the
// previous.
func (m *podMetrics) token(rank int, itl float64) { observe(m.ranks[rank].series.itl, itl) }

// finish records a request leaving the pod after e2e simulated seconds.
func (m *podMetrics) finish(rank int, reason uint8, e2e float64) {
	m.finished[reason].Add(1)
	s := m.ranks[rank].series
	addCounter(s.successC[reason], 1)
	if reason != finishAbort {
		observe(s.e2e, e2e)
	}
}

// kvPulled records a decode pod's KV pull that took sec simulated seconds,
// or failed.
func (m *podMetrics) kvPulled(rank int, sec float64, ok bool) {
	s := m.ranks[rank].series
	if !ok {
		m.kvPullFailures.Add(1)
		addCounter(s.kvFailedC, 1)
		return
	}
	m.kvPulls.Add(1)
	observe(s.kvXfer, sec)
}

// kvHoldExpired records a prefill pod's KV that nobody picked up in time.
func (m *podMetrics) kvHoldExpired(rank int) {
	m.kvExpired.Add(1)
	addCounter(m.ranks[rank].series.kvExpiredC, 1)
}

// writePrometheus writes the text exposition with HELP and TYPE lines, as
// the engines' prometheus_client does; w gets nothing for trtllm.
func (m *podMetrics) writePrometheus(w io.Writer) {
	if m.set != nil {
		_ = promtext.Write(w, engineDoc, m.set.WritePrometheus)
	}
}

// engineDoc holds the help texts of the vllm and sglang series, after the
// engines' own descriptions. Their colon-prefixed names stay as the engines
// write them, although promtool's lint objects to colons in names.
var engineDoc = promtext.Doc{
	"vllm:num_requests_running":        {Help: "Number of requests in model execution batches."},
	"vllm:num_requests_waiting":        {Help: "Number of requests waiting to be processed."},
	"vllm:kv_cache_usage_perc":         {Help: "KV-cache usage. 1 means 100 percent usage."},
	"vllm:prefix_cache_queries_total":  {Help: "Prefix cache queries, in terms of number of queried tokens."},
	"vllm:prefix_cache_hits_total":     {Help: "Prefix cache hits, in terms of number of cached tokens."},
	"vllm:prompt_tokens_total":         {Help: "Number of prefill tokens processed."},
	"vllm:generation_tokens_total":     {Help: "Number of generation tokens processed."},
	"vllm:request_success_total":       {Help: "Count of successfully processed requests."},
	"vllm:time_to_first_token_seconds": {Help: "Histogram of time to first token in seconds."},
	"vllm:inter_token_latency_seconds": {Help: "Histogram of inter-token latency in seconds."},
	"vllm:e2e_request_latency_seconds": {Help: "Histogram of end to end request latency in seconds."},
	// vLLM's prometheus_client writes a counter named x as x_total.
	"vllm:nixl_xfer_time_seconds":          {Help: "Histogram of transfer duration for NIXL KV Cache transfers."},
	"vllm:nixl_num_failed_transfers_total": {Help: "Number of failed NIXL KV Cache transfers."},
	"vllm:nixl_num_kv_expired_reqs_total":  {Help: "Number of requests that had their KV expire."},
	"pdlb_sim_kv_transfer_seconds":         {Help: "Time a decode pod took to pull a request's KV from its prefill pod, in simulated seconds."},
	"sglang:num_running_reqs":              {Help: "The number of running requests."},
	"sglang:num_queue_reqs":                {Help: "The number of requests in the waiting queue."},
	"sglang:num_used_tokens":               {Help: "The number of used tokens."},
	"sglang:token_usage":                   {Help: "The token usage."},
	"sglang:gen_throughput":                {Help: "The generation throughput (token/s)."},
	"sglang:cache_hit_rate":                {Help: "The prefix cache hit rate."},
	"sglang:prompt_tokens_total":           {Help: "Number of prefill tokens processed."},
	"sglang:generation_tokens_total":       {Help: "Number of generation tokens processed."},
	"sglang:cached_tokens_total":           {Help: "Number of cached prompt tokens."},
	"sglang:num_requests_total":            {Help: "Number of requests processed."},
	"sglang:num_aborted_requests_total":    {Help: "Number of requests aborted."},
	"sglang:time_to_first_token_seconds":   {Help: "Histogram of time to first token in seconds."},
	"sglang:inter_token_latency_seconds":   {Help: "Histogram of inter-token latency in seconds."},
	"sglang:e2e_request_latency_seconds":   {Help: "Histogram of end-to-end request latency in seconds."},
}

// trtllmStats is one entry of trtllm-serve's /metrics: a JSON list of
// iteration statistics (tensorrt_llm IterationStats, camelCase fields). The
// sim fills the fields a router reads; the GPU and CPU memory fields are 0.
type trtllmStats struct {
	Timestamp              string              `json:"timestamp"`
	Iter                   int64               `json:"iter"`
	IterLatencyMS          float64             `json:"iterLatencyMS"`
	NewActiveRequestsQueue float64             `json:"newActiveRequestsQueueLatencyMS"`
	NumActiveRequests      int64               `json:"numActiveRequests"`
	NumQueuedRequests      int64               `json:"numQueuedRequests"`
	NumCompletedRequests   int64               `json:"numCompletedRequests"`
	MaxNumActiveRequests   int                 `json:"maxNumActiveRequests"`
	GpuMemUsage            int64               `json:"gpuMemUsage"`
	CPUMemUsage            int64               `json:"cpuMemUsage"`
	PinnedMemUsage         int64               `json:"pinnedMemUsage"`
	KvCacheStats           trtllmKVCacheStats  `json:"kvCacheStats"`
	InflightBatchingStats  trtllmBatchingStats `json:"inflightBatchingStats"`
	MaxBatchSizeRuntime    int                 `json:"maxBatchSizeRuntime"`
	MaxNumTokensRuntime    int                 `json:"maxNumTokensRuntime"`
	NumNewActiveRequests   int64               `json:"numNewActiveRequests"`
	MaxBatchSizeStatic     int                 `json:"maxBatchSizeStatic"`
	MaxNumTokensStatic     int                 `json:"maxNumTokensStatic"`
}

type trtllmKVCacheStats struct {
	MaxNumBlocks   int     `json:"maxNumBlocks"`
	FreeNumBlocks  int64   `json:"freeNumBlocks"`
	UsedNumBlocks  int64   `json:"usedNumBlocks"`
	TokensPerBlock int     `json:"tokensPerBlock"`
	ReusedBlocks   int64   `json:"reusedBlocks"`
	MissedBlocks   int64   `json:"missedBlocks"`
	CacheHitRate   float64 `json:"cacheHitRate"`
}

type trtllmBatchingStats struct {
	NumScheduledRequests       int64   `json:"numScheduledRequests"`
	NumContextRequests         int64   `json:"numContextRequests"`
	NumGenRequests             int64   `json:"numGenRequests"`
	NumPausedRequests          int64   `json:"numPausedRequests"`
	NumCtxTokens               int64   `json:"numCtxTokens"`
	AvgNumDecodedTokensPerIter float64 `json:"avgNumDecodedTokensPerIter"`
	MicroBatchID               int     `json:"microBatchId"`
}

// trtllm returns the pod's state as trtllm-serve's /metrics entry.
func (m *podMetrics) trtllm(maxBatch int, timestamp string) trtllmStats {
	running, prefilling, used := m.running.Load(), m.prefilling.Load(), m.usedBlocks.Load()
	queried, hit := m.tokens.queried.Load(), m.tokens.hit.Load()
	s := trtllmStats{
		Timestamp:            timestamp,
		Iter:                 m.steps.Load(),
		IterLatencyMS:        float64(m.lastStepNanos.Load()) / 1e6,
		NumActiveRequests:    running,
		NumQueuedRequests:    m.waiting.Load(),
		MaxNumActiveRequests: maxBatch,
		MaxBatchSizeRuntime:  maxBatch,
		MaxBatchSizeStatic:   maxBatch,
		KvCacheStats: trtllmKVCacheStats{
			MaxNumBlocks:   m.podBlocks(),
			FreeNumBlocks:  int64(m.podBlocks()) - used,
			UsedNumBlocks:  used,
			TokensPerBlock: m.blockSize,
			ReusedBlocks:   hit / int64(m.blockSize),
			MissedBlocks:   (queried - hit) / int64(m.blockSize),
			CacheHitRate:   m.tokens.hitRate(),
		},
		InflightBatchingStats: trtllmBatchingStats{
			NumScheduledRequests:       running,
			NumContextRequests:         prefilling,
			NumGenRequests:             running - prefilling,
			AvgNumDecodedTokensPerIter: 1,
		},
	}
	for r := finishStop; r < numFinish; r++ {
		s.NumCompletedRequests += m.finished[r].Load()
	}
	return s
}

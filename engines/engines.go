// Package engines holds what differs between inference engines: names,
// metric names, request shaping. The gateway asks this package, so no
// engine-specific field or metric name appears in lb/.
package engines

import (
	"bytes"
	"fmt"
	"strconv"
)

// Kind names an engine as pods declare it (the values of AIBrix's
// model.aibrix.ai/engine label).
type Kind string

// The engines pdlb speaks to.
const (
	VLLM   Kind = "vllm"
	SGLang Kind = "sglang"
	TRTLLM Kind = "trtllm"
)

// Kinds lists every engine, in the order error messages name them.
var Kinds = []Kind{VLLM, SGLang, TRTLLM}

// ParseKind validates an engine name; the empty string means vLLM, AIBrix's
// default.
func ParseKind(s string) (Kind, error) {
	if s == "" {
		return VLLM, nil
	}
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("unknown engine %q (known: vllm, sglang, trtllm)", s)
}

// TruncatesPrompt says whether engine k cuts a prompt to a request's
// truncate_prompt_tokens; ids says the client sent the prompt as token
// ids. vLLM cuts any prompt; TensorRT-LLM only the text it tokenizes
// itself (HF truncation on its tokenizer's left side); SGLang has no
// such field and ignores it.
func (k Kind) TruncatesPrompt(ids bool) bool {
	switch k {
	case VLLM, "":
		return true
	case TRTLLM:
		return !ids
	}
	return false
}

// ReadsTruncation says whether engine k reads truncate_prompt_tokens and
// truncation_side, and so refuses values of them it cannot take. SGLang
// has neither field, and its protocol ignores fields it does not know.
func (k Kind) ReadsTruncation() bool { return k != SGLang }

// RefusesChatAsVLLM says whether engine k refuses a chat request before
// rendering exactly where vLLM does (engines/chat's RequestError). SGLang
// and TensorRT-LLM validate messages, parts and tools by their own types
// and take some of what vLLM refuses, so only their pods may answer.
func (k Kind) RefusesChatAsVLLM() bool { return k == VLLM || k == "" }

// ConvertsMessagesAsVLLM says whether engine k runs an Anthropic Messages
// request as the chat vLLM makes of it (engines/chat.AppendMessages).
// SGLang's conversion joins system blocks by "\n", keeps the billing
// header and drops thinking, among others: its ids are not those.
func (k Kind) ConvertsMessagesAsVLLM() bool { return k == VLLM || k == "" }

// RequiresModel says whether engine k refuses a request without "model"
// (absent, null or ""): TensorRT-LLM's protocol requires it, vLLM and
// SGLang serve such a request with the pod's model.
func (k Kind) RequiresModel() bool { return k == TRTLLM }

// IncludeUsageDefault is a stream's include_usage when stream_options is
// given without it: true on vLLM and TensorRT-LLM, false on SGLang (each
// engine's StreamOptions in its OpenAI protocol module).
func (k Kind) IncludeUsageDefault() bool { return k != SGLang }

// ContinuousUsageAlone says whether engine k streams usage in every chunk
// for stream_options.continuous_usage_stats even where include_usage is
// false: SGLang does; vLLM and TensorRT-LLM need both (their
// should_include_usage: include_usage and continuous_usage_stats).
func (k Kind) ContinuousUsageAlone() bool { return k == SGLang }

// DecodeServesPlain says whether a decode pod of engine k serves a request
// that carries none of the prefill/decode exchange's fields by prefilling
// it itself. vLLM's NixlConnector computes a request without
// kv_transfer_params locally, and a TensorRT-LLM generation server runs
// one without disaggregated_params whole (its own conditional
// disaggregation sends them so); SGLang's scheduler, in either
// disaggregation mode, refuses one without bootstrap_room with a 400.
func (k Kind) DecodeServesPlain() bool { return k != SGLang }

// ExchangesBatch says whether a prefill/decode exchange of engine k
// carries a completion batch (a prompt list of several prompts). SGLang's
// does: each prompt runs as a request of its own under its own bootstrap
// room, and its router sends bootstrap_host, bootstrap_port and
// bootstrap_room as lists of one per prompt. vLLM's prefill answer
// carries one prompt's kv_transfer_params, and trtllm-serve's
// disaggregated server refuses batches.
func (k Kind) ExchangesBatch() bool { return k == SGLang }

// ReadsMaxCompletionTokens says whether engine k holds a chat to the
// max_completion_tokens v it was sent (not null) rather than to its
// max_tokens: vLLM and TensorRT-LLM whatever v is; SGLang, which takes
// max_completion_tokens or max_tokens (Python's or), unless v is 0.
func (k Kind) ReadsMaxCompletionTokens(v int) bool { return v != 0 || k != SGLang }

// CompletionMaxTokens is the output budget of each sequence engine k
// gives a completion (not a chat) that leaves max_tokens out: 16 on vLLM
// and SGLang (their CompletionRequest's default, OpenAI's), -1 (unknown)
// on TensorRT-LLM, whose default of None lets the output run to the
// context's end. An explicit null gets the same on vLLM (its
// normalize_null_max_tokens) and TensorRT-LLM; SGLang refuses it.
func (k Kind) CompletionMaxTokens() int {
	if k == TRTLLM {
		return -1
	}
	return 16
}

// Load is what the gateway reads from a pod's /metrics scrape.
type Load struct {
	Running float64 // requests in the running batch
	Waiting float64 // requests queued in the engine
	KVUsage float64 // fraction of KV cache in use, 0..1
	// GeneratedTokens is the engine's cumulative generated-token counter;
	// the scraper turns two scrapes into a throughput. Negative if the
	// engine does not export one.
	GeneratedTokens float64
	// Throughput is the engine's own generation-throughput gauge (tokens/s),
	// negative if it has none (the scraper then derives one).
	Throughput float64
	// Ranks are Running and Waiting by data-parallel rank, where the
	// engine exports them apart (vLLM's engine label, SGLang's dp_rank);
	// nil otherwise.
	Ranks []RankLoad
}

// RankLoad is one data-parallel rank's requests.
type RankLoad struct{ Running, Waiting float64 }

// maxRankLabel bounds the rank labels Load.Ranks takes: a larger value is
// no rank of a real pod, and would only grow the slice.
const maxRankLabel = 1 << 10

// metricNames maps an engine's metric names to Load fields. breakdown
// names a label whose non-empty values mark series that split a total
// exported beside them (under the empty value), which must not be added
// to it. replica names a label whose values tell apart ranks that export
// one group's counts each, the same; groups names the labels that tell
// the groups apart. Only the lowest replica's series of a group is
// counted. rank names the label of a series' data-parallel rank.
type metricNames struct {
	running, waiting, kvUsage, kvUsageOld, generated, throughput string
	breakdown                                                    string
	replica                                                      string
	groups                                                       [2]string
	rank                                                         string
}

var names = map[Kind]metricNames{
	VLLM: {
		running:    "vllm:num_requests_running",
		waiting:    "vllm:num_requests_waiting",
		kvUsage:    "vllm:kv_cache_usage_perc",
		kvUsageOld: "vllm:gpu_cache_usage_perc", // before vLLM 0.10
		generated:  "vllm:generation_tokens_total",
		rank:       "engine",
	},
	SGLang: {
		running:    "sglang:num_running_reqs",
		waiting:    "sglang:num_queue_reqs",
		kvUsage:    "sglang:token_usage",
		generated:  "sglang:generation_tokens_total",
		throughput: "sglang:gen_throughput",
		// --enable-priority-scheduling: _log_gauge_queue_count sets the
		// total under priority="" and each priority's share under
		// priority="<n>".
		breakdown: "priority",
		// A scheduler exports its gauges when its attention-TP rank is 0,
		// or with --enable-metrics-for-all-schedulers always: then every
		// tensor-parallel rank of a data-parallel rank (and pipeline
		// stage) repeats that rank's counts under its own tp_rank. Under
		// DP attention a DP rank's first tp_rank is not 0.
		replica: "tp_rank",
		groups:  [2]string{"dp_rank", "pp_rank"},
		rank:    "dp_rank",
	},
}

// metricSlot is the Load field a series adds to.
type metricSlot int

const (
	slotNone metricSlot = iota
	slotRunning
	slotWaiting
	slotKVUsage
	slotKVUsageOld
	slotGenerated
	slotThroughput
)

// slot is the field the series of metric name adds to.
func (n *metricNames) slot(name []byte) metricSlot {
	switch string(name) {
	case n.running:
		return slotRunning
	case n.waiting:
		return slotWaiting
	case n.kvUsage:
		return slotKVUsage
	case n.kvUsageOld:
		return slotKVUsageOld
	case n.generated:
		return slotGenerated
	case n.throughput:
		return slotThroughput
	}
	return slotNone
}

// ParseMetrics reads a Prometheus text exposition from an engine of kind k.
// An engine serving several models or data-parallel ranks exports one
// series each (vLLM's engine label, SGLang's dp_rank): request counts and
// token counters are summed over them, while KV usage, each series the
// fraction of its own rank's equal-sized cache, is their mean. Series that
// repeat a rank's counts (SGLang's tensor-parallel ranks) count once. ok is
// false when the engine exports none of the load metrics, as trtllm-serve,
// whose /metrics is JSON iteration stats.
//
// This reads a few names out of a few kilobytes once a second per pod; a
// full exposition-format parser would cost more than it brings.
func ParseMetrics(k Kind, text []byte) (Load, bool) {
	n, known := names[k]
	if !known {
		return Load{}, false
	}
	sum := loadSum{l: Load{GeneratedTokens: -1, Throughput: -1}}
	var replicas []replicaSeries
	for len(text) > 0 {
		var line []byte
		line, text, _ = bytes.Cut(text, []byte{'\n'})
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := bytes.IndexAny(line, "{ ")
		if end <= 0 {
			continue
		}
		slot := n.slot(line[:end])
		sp := bytes.LastIndexByte(line, ' ')
		if slot == slotNone || sp < end {
			continue
		}
		v, err := strconv.ParseFloat(string(bytes.TrimSpace(line[sp+1:])), 64)
		if err != nil {
			continue
		}
		var labels []byte
		if line[end] == '{' {
			labels = line[end+1 : sp]
		}
		if n.breakdown != "" && len(labelValue(labels, n.breakdown)) > 0 {
			continue
		}
		if n.replica != "" {
			if rank, err := strconv.Atoi(string(labelValue(labels, n.replica))); err == nil {
				group := [2]string{string(labelValue(labels, n.groups[0])), string(labelValue(labels, n.groups[1]))}
				replicas = lowestReplica(replicas, replicaSeries{slot, group, rank, rankOf(labelValue(labels, n.rank)), v})
				continue
			}
		}
		sum.add(slot, v, rankOf(labelValue(labels, n.rank)))
	}
	for _, r := range replicas {
		sum.add(r.slot, r.v, r.dpRank)
	}
	return sum.load()
}

// rankOf is the data-parallel rank a label's value names, -1 for none.
func rankOf(v []byte) int {
	if r, err := strconv.Atoi(string(v)); err == nil && r >= 0 && r < maxRankLabel {
		return r
	}
	return -1
}

// replicaSeries is the series of one metric and group that ParseMetrics
// counts: the lowest replica's seen so far.
type replicaSeries struct {
	slot   metricSlot
	group  [2]string // the values of metricNames.groups
	rank   int
	dpRank int // rankOf its rank label
	v      float64
}

// lowestReplica keeps s in kept unless a series of its metric and group
// with a lower rank is there.
func lowestReplica(kept []replicaSeries, s replicaSeries) []replicaSeries {
	for i, k := range kept {
		if k.slot == s.slot && k.group == s.group {
			if s.rank < k.rank {
				kept[i] = s
			}
			return kept
		}
	}
	return append(kept, s)
}

// loadSum adds an exposition's counted series up into a Load.
type loadSum struct {
	l                     Load
	ok, seenGen, seenThr  bool
	kvSeries, kvOldSeries int
	kvOldSum              float64
}

// add counts series v of slot, of data-parallel rank (-1: none).
func (s *loadSum) add(slot metricSlot, v float64, rank int) {
	switch slot {
	case slotRunning:
		s.l.Running += v
		if r := s.rank(rank); r != nil {
			r.Running += v
		}
		s.ok = true
	case slotWaiting:
		s.l.Waiting += v
		if r := s.rank(rank); r != nil {
			r.Waiting += v
		}
		s.ok = true
	case slotKVUsage:
		s.l.KVUsage += v
		s.kvSeries++
		s.ok = true
	case slotKVUsageOld:
		s.kvOldSum += v
		s.kvOldSeries++
		s.ok = true
	case slotGenerated:
		if !s.seenGen {
			s.l.GeneratedTokens = 0
			s.seenGen = true
		}
		s.l.GeneratedTokens += v
	case slotThroughput:
		if !s.seenThr {
			s.l.Throughput = 0
			s.seenThr = true
		}
		s.l.Throughput += v
	}
}

// rank is the RankLoad of rank, grown to it; nil for -1.
func (s *loadSum) rank(rank int) *RankLoad {
	if rank < 0 {
		return nil
	}
	if rank >= len(s.l.Ranks) {
		s.l.Ranks = append(s.l.Ranks, make([]RankLoad, rank+1-len(s.l.Ranks))...)
	}
	return &s.l.Ranks[rank]
}

// load is the Load the series added up to, and whether any load metric
// was among them.
func (s *loadSum) load() (Load, bool) {
	l := s.l
	switch {
	case s.kvSeries > 0:
		l.KVUsage /= float64(s.kvSeries)
	case s.kvOldSeries > 0:
		l.KVUsage = s.kvOldSum / float64(s.kvOldSeries)
	}
	return l, s.ok
}

// labelValue returns the raw (still escaped) value of label name in
// labels, the text after a sample's '{'; nil when it has none.
func labelValue(labels []byte, name string) []byte {
	for {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return nil
		}
		key := bytes.TrimSpace(labels[:eq])
		rest := labels[eq+2:]
		i := 0
		for i < len(rest) && rest[i] != '"' {
			if rest[i] == '\\' {
				i++
			}
			i++
		}
		if i >= len(rest) {
			return nil
		}
		if string(key) == name {
			return rest[:i]
		}
		labels = bytes.TrimLeft(rest[i+1:], ", ")
	}
}

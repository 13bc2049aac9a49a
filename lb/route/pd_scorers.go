package route

import (
	"math"

	"pdlb/lb/admit"
)

// The scorers of the PD cascade that lb/route did not have: conductor
// (prefill and decode), load_balancing and least_request on decode pods.
// prefix_cache, least_request (prefill), token_load and hybrid_cache_load
// are the Scorers of cache.go, basic.go and token_load.go.

// DecodeView is what a decode scorer sees: the decode pods, and per pod
// the pending decodes (picked, headers not yet back) and the learned step
// line (nil: the default). The slices are parallel and caller-owned.
type DecodeView struct {
	Cands   []Candidate
	Pending []float64
	Lines   []*admit.DecodeLine
}

// DecodeScorer fills out[i] with the cost of decoding req on v.Cands[i],
// lower is better. Implementations allocate nothing and are safe for
// concurrent use. Pods without metrics are the cascade's business (the
// cold-start score), so a scorer may treat their zero fields as real.
type DecodeScorer interface {
	ScoreDecode(req *Request, v *DecodeView, out []float64)
}

// DecodeLoadBalancing is AIBrix's load_balancing decode score:
//
//	score = (w_run × norm_reqs + w_thru × (1 − norm_throughput)) / norm_free_gpu
//
// with reqs = running + pending, throughput the generation tokens/s and
// free_gpu = 1 − KV usage, each normalised by its maximum over the pods
// scored. Fewer requests, more throughput (a pod that still has headroom
// to batch) and more free KV all lower the score; a pod with no free KV
// scores +Inf.
type DecodeLoadBalancing struct{ WRunning, WThroughput float64 }

// ScoreDecode implements DecodeScorer.
func (p DecodeLoadBalancing) ScoreDecode(_ *Request, v *DecodeView, out []float64) {
	// The maxima are over pods with metrics: a cold pod's zero fields
	// would otherwise rescale everyone else's score.
	maxReqs, maxThr, maxFree := 0.0, 0.0, 0.0
	for i := range v.Cands {
		c := &v.Cands[i]
		if !c.HasMetrics {
			continue
		}
		maxReqs = max(maxReqs, float64(c.Running)+v.Pending[i])
		maxThr = max(maxThr, c.GenTokensPerSec)
		maxFree = max(maxFree, 1-c.KVUsage)
	}
	for i := range v.Cands {
		c := &v.Cands[i]
		reqs, thr := 0.0, 0.0
		if maxReqs > 0 {
			reqs = (float64(c.Running) + v.Pending[i]) / maxReqs
		}
		if maxThr > 0 {
			thr = c.GenTokensPerSec / maxThr
		}
		free := 1 - c.KVUsage
		if !(free > 0) || !(maxFree > 0) {
			out[i] = math.Inf(1)
			continue
		}
		out[i] = (p.WRunning*reqs + p.WThroughput*(1-thr)) / (free / maxFree)
	}
}

// DecodeLeastRequestScore is AIBrix's least_request decode score:
// running requests plus pending decodes.
type DecodeLeastRequestScore struct{}

// ScoreDecode implements DecodeScorer.
func (DecodeLeastRequestScore) ScoreDecode(_ *Request, v *DecodeView, out []float64) {
	for i := range v.Cands {
		out[i] = float64(v.Cands[i].Running) + v.Pending[i]
	}
}

// Conductor constants. The prefill estimate charges cached prefix tokens
// a small fraction of an uncached token (they are read, not computed) and
// grows the per-token cost of uncached tokens with the context they attend
// to; the decode estimate doubles the step time between 90% and 100% KV
// usage, where engines start to preempt.
const (
	// ConductorPrefixCost is the cost of a cached prompt token in units of
	// an uncached one.
	ConductorPrefixCost = 0.05
	// ConductorAttentionTokens is the context length (tokens) at which
	// attention doubles the cost of an uncached token.
	ConductorAttentionTokens = 32768
	// ConductorKVPressure is the KV usage above which the decode estimate
	// is penalised.
	ConductorKVPressure = 0.9
)

// defaultLine is the decode line of a pod that has no learned one.
var defaultLine = admit.NewDecodeLine(admit.DefaultDecodeBaseSec, admit.DefaultDecodePerSeqSec,
	admit.DefaultDecodeMaxBatch, admit.DefaultDecodeForget)

// PrefillConductorScore is AIBrix's conductor prefill score: the
// predicted time to first token (seconds) as lb/admit computes it, from
// the queue already charged to the pod, the cached prefix, and the
// uncached part with its attention cost:
//
//	TTFT = (queued + cached × ConductorPrefixCost
//	        + uncached × (1 + prompt / ConductorAttentionTokens)) / speed
//	       + AdapterSec
//
// AdapterSec, the request's LoRA adapter's load, as PredictedTTFT adds it.
type PrefillConductorScore struct{}

// Score implements Scorer.
func (PrefillConductorScore) Score(req *Request, cands []Candidate, out []float64) {
	attn := 1 + float64(req.PromptTokens)/ConductorAttentionTokens
	for i := range cands {
		c := &cands[i]
		hit := float64(min(c.CachedTokens, req.PromptTokens))
		work := hit*ConductorPrefixCost + float64(uncached(req, c))*attn
		out[i] = admit.TTFT(c.QueuedPrefillTokens, work, c.PrefillTokensPerSec, 0) + c.AdapterSec
	}
}

// DecodeConductorScore is AIBrix's conductor decode score: the predicted
// time between tokens (seconds) once the request joins the pod. The batch
// it joins is running + pending; the step time is the pod's learned line
// (lb/admit.DecodeLine) at that batch, or, when the scrape shows a slower
// pod than the line, the observed step (running / throughput) grown by the
// line's per-sequence cost for the requests still to join. Above
// ConductorKVPressure KV usage the estimate grows linearly, to double at
// a full cache, and a full cache is +Inf (the request would queue).
type DecodeConductorScore struct{}

// ScoreDecode implements DecodeScorer.
func (DecodeConductorScore) ScoreDecode(_ *Request, v *DecodeView, out []float64) {
	for i := range v.Cands {
		c := &v.Cands[i]
		line := v.Lines[i]
		if line == nil {
			line = defaultLine
		}
		batch := c.Running + int(v.Pending[i])
		tbt := line.TPOT(batch, c.KVUsage)
		if c.Running > 0 && c.GenTokensPerSec > 0 {
			_, perSeq := line.Line()
			observed := float64(c.Running)/c.GenTokensPerSec + perSeq*(v.Pending[i]+1)
			tbt = max(tbt, observed)
		}
		if c.KVUsage > ConductorKVPressure {
			tbt *= 1 + (c.KVUsage-ConductorKVPressure)/(1-ConductorKVPressure)
		}
		out[i] = tbt
	}
}

// decodeScorerOf adapts a Scorer that needs nothing beyond Candidate
// (token_load's decode ledger) to DecodeScorer.
type decodeScorerOf struct{ Scorer }

// ScoreDecode implements DecodeScorer.
func (d decodeScorerOf) ScoreDecode(req *Request, v *DecodeView, out []float64) {
	d.Score(req, v.Cands, out)
}

var (
	_ DecodeScorer = DecodeLoadBalancing{}
	_ DecodeScorer = DecodeLeastRequestScore{}
	_ DecodeScorer = DecodeConductorScore{}
	_ DecodeScorer = decodeScorerOf{}
	_ Scorer       = PrefillConductorScore{}
)

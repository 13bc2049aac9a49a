package route

import "pdlb/lb/admit"

// The global-scheduling study's routing policies (global scheduling chapter):
// cache only and minimum predicted TTFT. Its other two, random and "最少排队"
// (least queued work), are Random and LeastQueue.

// PredictedTTFT is the time to first token (seconds) req would see on c:
// the prefill work already queued on the pod plus req's uncached tokens at
// the pod's learned speed, plus transferSec for the KV handoff when the pod
// is a prefill pod of a disaggregated pair (0 on a combined pod), plus the
// time to bring the request's LoRA adapter into a slot (AdapterSec). The
// min_ttft family ranks pods by it and lb/admit decides on it, so routing
// and admission agree on what a pod can do.
func PredictedTTFT(req *Request, c *Candidate, transferSec float64) float64 {
	return admit.TTFT(c.QueuedPrefillTokens, float64(uncached(req, c)), c.PrefillTokensPerSec, transferSec) + c.AdapterSec
}

// AdapterCost is Candidate.AdapterSec of a pod for a request's LoRA
// adapter (seconds): 0 when the pod holds it in a slot (held); one load,
// loadSec, when one of its maxLoras slots is free (used are taken); two
// when all are: the load evicts an adapter whose next request pays one.
func AdapterCost(held bool, used, maxLoras int, loadSec float64) float64 {
	switch {
	case held:
		return 0
	case used < maxLoras:
		return loadSec
	}
	return 2 * loadSec
}

// queueSec is how long the work already queued on c takes (seconds).
func queueSec(c *Candidate) float64 {
	return admit.TTFT(c.QueuedPrefillTokens, 0, c.PrefillTokensPerSec, 0)
}

func uncached(req *Request, c *Candidate) int {
	return max(req.PromptTokens-c.CachedTokens, 0)
}

// LeastQueue scores a pod by how long its queued prefill work takes: the
// global-scheduling study's "最少排队" (min over instances of when their queue
// runs out). Unlike LeastRequest it weighs each request by its uncached
// tokens, which is what reproduces the study's table, where a request's cost
// is its prefill.
type LeastQueue struct{}

// Score implements Scorer.
func (LeastQueue) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		out[i] = queueSec(&cands[i])
	}
}

// CacheOnly scores a pod by its cached prefix, most first, breaking ties by
// the shortest queue: the global-scheduling study's "只看缓存", key (hit, -busy).
// It is the best policy under light load and makes hotspots under heavy load.
type CacheOnly struct{}

// Score implements Scorer. Cached tokens are whole numbers, so adding the
// queue time squashed into [0, 1) orders by cache first, then queue.
func (CacheOnly) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		q := queueSec(&cands[i])
		out[i] = -float64(cands[i].CachedTokens) + q/(1+q)
	}
}

// MinTTFT scores a pod by PredictedTTFT: the global-scheduling study's "预计
// TTFT 最小", which weighs cache hits and queueing on one scale.
type MinTTFT struct{}

// Score implements Scorer.
func (MinTTFT) Score(req *Request, cands []Candidate, out []float64) {
	for i := range cands {
		out[i] = PredictedTTFT(req, &cands[i], 0)
	}
}

var (
	_ Scorer = LeastQueue{}
	_ Scorer = CacheOnly{}
	_ Scorer = MinTTFT{}
)

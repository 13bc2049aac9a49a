package gateway

import (
	"slices"

	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// Panic routing. A first attempt whose model has no pod available goes to
// the pods whose active checks pass, whatever their breaker: ejected, or
// half-open with its one probe out. The breaker is the gateway's inference
// from requests that failed, and it lags a pod that recovered (the
// ejection time runs on, a probe holds the pod for a whole generation);
// it must not leave a model no pod, as Envoy's panic threshold routes
// across every host once too few are healthy. A pod the checks find down
// stays out: with none passing, "no healthy pod" is the fast and honest
// answer. A request with a fallback model left moves there instead, as
// its model's operator asked for a model without a pod.
//
// A retry whose model has no pod left that is untried and available
// (healthy by the active checks, not ejected, not a half-open pod busy
// with its probe) goes back to a pod it tried that took none of it and is
// available again (mayReturn): a check found it healthy since it failed,
// as Envoy's previous_hosts predicate gives up avoiding the hosts tried
// once none other is left. Failing that, it goes to the untried pods
// whatever their state, as Envoy routes across every host once too few
// are healthy: the checks and ejections lag a pod that restarted or
// recovered, and a retry that finds no pod fails a request another pod
// may answer. A PD request that finds no available pair (nor combined
// pod) decides once more among the same pods (panicPod). A pod that left
// the fleet is no lagging state but a reload's word: never a panic pick.
//
// health.panic_routing false turns both off, as Envoy's
// healthy_panic_threshold of 0 does: such a request is answered 503 (a
// retry: with the last attempt's answer), and an engine that fails every
// request while its checks pass gets none for its ejection time.

// mayPanic says whether x, which found no pod available, may take a
// panic pick: while health.panic_routing is on, on a retry, or on a first
// attempt with no fallback model left.
func (g *Gateway) mayPanic(x *completion) bool {
	return g.cfg.Health.PanicRouting && (x.attempts > 0 || len(x.fallbacks) == 0)
}

// panicPod says whether a pod (its checks passing: healthy; left the
// fleet: left) may take x's panic pick: never one that left; on a first
// attempt one whose checks pass, tried or not (a first attempt has tried
// a pod only when it lost the pod's half-open probe to another request,
// pickAgain, and may go beside that probe now); on a retry one it has not
// tried, whatever its state (panicRetry).
func panicPod(x *completion, id int32, healthy, left bool) bool {
	if x.attempts == 0 {
		return healthy && !left
	}
	return panicRetry(x, id, left)
}

// panicRetry says whether a pod may take the panic pick of x's retry, or
// of its decode leg's move to another pod (MoveDecode, which spends a
// retry): one x has not tried and that did not leave the fleet.
func panicRetry(x *completion, id int32, left bool) bool {
	return !left && !tried(x.tried, id)
}

// appendBack appends to cands a candidate for each combined pod of m in
// back that is available at now (to a request answered beside the
// engine's work when beside, as m.AppendCombined), filled as
// pool.PodLoad.Fill does.
func appendBack(m *pool.Model, cands []route.Candidate, now int64, back []int32, match *pool.Match, beside bool) []route.Candidate {
	return appendCombinedIf(m, cands, match, func(l *pool.PodLoad) bool {
		return l.AvailableBeside(now, beside) && slices.Contains(back, l.ID)
	})
}

// appendPanic appends to cands a candidate for each combined pod of m
// that may take x's panic pick (panicPod), filled as pool.PodLoad.Fill
// does.
func appendPanic(m *pool.Model, cands []route.Candidate, x *completion, match *pool.Match) []route.Candidate {
	return appendCombinedIf(m, cands, match, func(l *pool.PodLoad) bool { return panicPod(x, l.ID, l.Healthy(), l.Left()) })
}

// appendCombinedIf appends to cands a candidate for each combined pod of
// m that keep keeps.
func appendCombinedIf(m *pool.Model, cands []route.Candidate, match *pool.Match, keep func(*pool.PodLoad) bool) []route.Candidate {
	for i := range m.CombinedLoads {
		if l := &m.CombinedLoads[i]; keep(l) {
			cands = append(cands, route.Candidate{})
			l.Fill(&cands[len(cands)-1], match)
		}
	}
	return cands
}

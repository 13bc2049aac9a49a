package gateway

import (
	"slices"

	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// Panic routing for retries. A retry whose model has no pod left that is
// untried and available (healthy by the active checks, not ejected, not a
// half-open pod busy with its probe) goes to the untried pods whatever
// their state, as Envoy routes across every host once too few are
// healthy: the checks and ejections lag a pod that restarted or recovered,
// and a retry that finds no pod fails a request another pod may answer.
// A first attempt keeps to the available pods: until a pod failed the
// request, "no healthy pod" is the fast and honest answer. Combined pods
// only: a PD retry still decides among the available pods. A pod that left
// the fleet is no lagging state but a reload's word: never a panic pick.

// appendPanic appends to cands a candidate for each combined pod of m not
// in skip and still in the fleet, available or not, filled as
// pool.PodLoad.Fill does.
func appendPanic(m *pool.Model, cands []route.Candidate, skip []int32, match *pool.Match) []route.Candidate {
	for i := range m.CombinedLoads {
		l := &m.CombinedLoads[i]
		if !l.Left() && !slices.Contains(skip, l.ID) {
			cands = append(cands, route.Candidate{})
			l.Fill(&cands[len(cands)-1], match)
		}
	}
	return cands
}

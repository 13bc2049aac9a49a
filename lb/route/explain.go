package route

import (
	"math"
	"reflect"
	"sync"
)

// What an explanation of a decision needs from the policies: their names
// and, for a ScorePolicy, the scores behind a pick.

// PolicyName is the registry name of p, "" for a policy not built by New.
func PolicyName(p Policy) string {
	t := policyType(p)
	for i, rt := range registryTypes() {
		if rt == t {
			return registry[i].name
		}
	}
	return ""
}

// policyType tells policies apart: a ScorePolicy by its scorer.
func policyType(p Policy) reflect.Type {
	if sp, ok := p.(ScorePolicy); ok {
		return reflect.TypeOf(sp.Scorer)
	}
	return reflect.TypeOf(p)
}

// registryTypes are the registry's policies' types, in table order.
var registryTypes = sync.OnceValue(func() []reflect.Type {
	out := make([]reflect.Type, len(registry))
	for i, r := range registry {
		out[i] = policyType(r.build(DefaultOptions()))
	}
	return out
})

// Scores fills out[i] with the score p gives cands[i] for req, lower is
// better, when p is a ScorePolicy; else every out[i] is NaN: the policy
// picks without one score per pod (round robin, random, cache_aware's
// two modes, slo_cache's bound).
func Scores(p Policy, req *Request, cands []Candidate, out []float64) {
	if sp, ok := p.(ScorePolicy); ok {
		sp.Scorer.Score(req, cands, out)
		return
	}
	for i := range out {
		out[i] = math.NaN()
	}
}

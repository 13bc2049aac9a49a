package gateway

import (
	"context"
	"time"

	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// bucketRebuildInterval is how often adaptive bucket serving recomputes its
// cut points from the prompt lengths recorded since (AIBrix rebuilds
// them "every few seconds"; the planner halves its picture each time, so it
// follows the traffic).
const bucketRebuildInterval = 5 * time.Second

// rebuildBuckets runs until ctx ends, rebuilding the bucket plan of every
// PD router that has adaptive bucket serving on. It is the plans' one
// writer, as BucketPlanner.Rebuild requires.
func (g *Gateway) rebuildBuckets(ctx context.Context) {
	t := time.NewTicker(bucketRebuildInterval)
	defer t.Stop()
	var sets []route.BucketRoleset
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := g.ledger.Now()
		for _, m := range g.pool.Load().Models {
			if m.Profiles == nil {
				continue
			}
			sets = bucketRolesets(sets[:0], m, now)
			for _, r := range m.Profiles.Routers() {
				if pl := r.Planner(); pl != nil {
					pl.Rebuild(sets)
				}
			}
		}
	}
}

// bucketRolesets describes m's rolesets as the planner sees them: the
// prompt range both roles declare (the intersection of their buckets) and
// the complete pairs that can serve it now.
func bucketRolesets(dst []route.BucketRoleset, m *pool.Model, now int64) []route.BucketRoleset {
	for range m.Rolesets {
		dst = append(dst, route.BucketRoleset{})
	}
	prefill := make([]int, len(m.Rolesets))
	decode := make([]int, len(m.Rolesets))
	for _, p := range m.Pods {
		if p.Role != route.RolePrefill && p.Role != route.RoleDecode {
			continue
		}
		s := &dst[p.Roleset]
		s.Min = max(s.Min, p.Config.BucketMin)
		if hi := p.Config.BucketMax; hi > 0 && (s.Max == 0 || hi < s.Max) {
			s.Max = hi
		}
		if !p.Available(now) {
			continue
		}
		if p.Role == route.RolePrefill {
			prefill[p.Roleset]++
		} else {
			decode[p.Roleset]++
		}
	}
	for i := range dst {
		dst[i].Replicas = min(prefill[i], decode[i])
	}
	return dst
}

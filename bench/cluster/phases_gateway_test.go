package cluster

import (
	"fmt"
	"testing"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/plan"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// pdDecision is one decision of the simulator with the snapshot and the
// request it was made on, copied when it was made.
type pdDecision struct {
	req     route.Request
	cands   []route.PDCandidate
	pending []int
	d       route.PDDecision
}

// gatewayPD is the gateway's decision path for a fleet of prefill pods
// followed by decode pods, all of roleset "r": the pool snapshot built from
// the configuration, the cascade its model's profiles resolve to, and the
// gateway's candidate fill (pool.PodLoad.Fill) over that snapshot's pods.
type gatewayPD struct {
	snap    *pool.Snapshot
	router  *route.PDRouter
	cands   []route.PDCandidate
	scratch route.PDScratch
	depth   []int32
}

func newGatewayPD(t *testing.T, prefill, decode int) *gatewayPD {
	t.Helper()
	cfg := config.Default()
	for i := range prefill + decode {
		role := config.RolePrefill
		if i >= prefill {
			role = config.RoleDecode
		}
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", 10000+i), Role: role, Roleset: "r"})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	snap, err := pool.Build(&cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := snap.Models[0].Profiles.Resolve("", "")
	if err != nil || res.PD == nil {
		t.Fatalf("the model resolves to %+v, %v; want the pd cascade", res, err)
	}
	return &gatewayPD{snap: snap, router: res.PD}
}

// decide sets the gateway's pods to the state the simulator's snapshot
// shows and decides. What the gateway learns by HTTP (the scrape: running,
// waiting, KV usage, throughput, drain rate; the decode line) is copied; what it keeps
// itself (in flight, prefill queue and speed, prefix match, pending
// decodes) is set on its pool's pods and read back through its own fill.
func (g *gatewayPD) decide(t *testing.T, rec *pdDecision, bs int) route.PDDecision {
	t.Helper()
	m := g.snap.Models[0]
	g.depth = g.depth[:0]
	g.cands = g.cands[:0]
	var tickets []route.PendingTicket
	var undo []func()
	for i, pod := range m.Pods {
		sc := &rec.cands[i]
		for range sc.InFlight {
			pod.Acquire(1)
		}
		q := int64(sc.QueuedPrefillTokens)
		pod.AddQueuedPrefill(q)
		pod.Speed.Init(sc.PrefillTokensPerSec, admit.DefaultSpeedAlpha)
		for range rec.pending[i] {
			tickets = append(tickets, pod.Pending().Pick())
		}
		undo = append(undo, func() {
			for range sc.InFlight {
				pod.Release(1)
			}
			pod.AddQueuedPrefill(-q)
		})
		g.depth = append(g.depth, int32((sc.CachedTokens+bs-1)/bs))
	}
	match := pool.Match{Depth: g.depth, BlockSize: bs, PromptTokens: rec.req.PromptTokens}
	for i, pod := range m.Pods {
		sc := &rec.cands[i]
		c := route.PDCandidate{Role: pod.Role, Roleset: pod.Roleset, Down: sc.Down}
		l := pod.Load()
		l.Fill(&c.Candidate, &match)
		c.HasMetrics, c.Running, c.Waiting, c.KVUsage, c.GenTokensPerSec = sc.HasMetrics, sc.Running, sc.Waiting, sc.KVUsage, sc.GenTokensPerSec
		if pod.Role == route.RoleDecode {
			c.Pending, c.Line, c.DrainRate = pod.Pending(), sc.Line, sc.DrainRate
		}
		g.cands = append(g.cands, c)
	}
	req := rec.req
	d, err := g.router.Decide(&req, g.cands, &g.scratch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range tickets {
		tickets[i].Done()
	}
	for _, f := range undo {
		f()
	}
	return d
}

// TestPDDecisionsMatchTheGateway plays a chat and a long-document phase on
// 4P4D and gives every snapshot and request the simulator decided on to
// the gateway's decision path: every pick must be the same.
func TestPDDecisionsMatchTheGateway(t *testing.T) {
	cfg := pdConfig(t)
	cfg.Pods, cfg.Initial = 8, plan.Ratio{Prefill: 4, Decode: 4}
	cfg.Reject = true
	var recs []pdDecision
	cfg.observe = func(req *route.Request, cands []route.PDCandidate, d route.PDDecision) {
		rec := pdDecision{req: *req, cands: append([]route.PDCandidate(nil), cands...), d: d}
		for i := range cands {
			rec.pending = append(rec.pending, cands[i].Pending.Load())
			// The simulator's counters move on; the copy must not.
			rec.cands[i].Pending = nil
		}
		recs = append(recs, rec)
	}
	phases := DefaultPhasesConfig().Phases[:2]
	for i := range phases {
		phases[i].Rate /= 2 // 8 pods where the phases are sized for 24: loaded
	}
	w := PhasedWorkload{Phases: phases, PhaseSec: 20, Prefixes: DefaultPhasePrefixes, BlockSize: cfg.Physics.BlockSize, Seed: 5}
	if _, err := RunPD(cfg, w.Start()); err != nil {
		t.Fatal(err)
	}
	g := newGatewayPD(t, cfg.Initial.Prefill, cfg.Initial.Decode)
	used := map[int]bool{}
	var fired route.PDFired
	for n := range recs {
		rec := &recs[n]
		got := g.decide(t, rec, cfg.Physics.BlockSize)
		if got != rec.d {
			t.Fatalf("decision %d of %d: the gateway decides %+v, the simulator %+v, on %+v", n, len(recs), got, rec.d, rec.cands)
		}
		used[rec.d.Prefill], used[rec.d.Decode] = true, true
		fired |= rec.d.Fired
	}
	t.Logf("%d decisions, cascade steps fired: %b", len(recs), fired)
	// Not a vacuous agreement: many decisions, over every pod, some by a
	// fast path.
	if len(recs) < 500 || len(used) != cfg.Pods || fired == 0 {
		t.Fatalf("%d decisions over %d pods, fired %b; want at least 500 over all %d, some by a fast path", len(recs), len(used), fired, cfg.Pods)
	}
}

package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"pdlb/engines/sim"
	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/plan"
	"pdlb/lb/route"
)

// PDConfig describes one run of a disaggregated fleet: prefill pods as in
// Run, and decode pods that batch continuously, all of one roleset. Every
// request is routed when it arrives by the gateway's own cascade
// (route.PDRouter.Decide) over a snapshot the simulator fills as the gateway
// fills its pool's (decide); when its prefill ends its KV moves to the decode
// pod (Physics.TransferSec of the whole prompt), waits there for a batch
// slot, and is decoded one token a step, each step taking
// Physics.DecodeStepSec(batch) for the batch running, up to Physics.MaxBatch
// sequences; new sequences join at step boundaries. Its first token comes at
// the end of its first decode step (the client streams from the decode pod),
// and its TPOT is the time from first to last token over the tokens after the
// first.
//
// Decode pods' KV capacity is not modelled (as in the global-scheduling
// study's D_cap, the batch is bounded by MaxBatch only), nor is deferral:
// every request is admitted or rejected when it arrives.
type PDConfig struct {
	// Pods is the fleet's size; Initial splits it between the roles.
	Pods    int
	Initial plan.Ratio
	// Physics is every pod's timing model.
	Physics sim.Physics
	// PD is the cascade's knobs, as the gateway's pd section sets them.
	// The fleet has no combined pods and its pods no buckets, and local
	// prefill (LocalPrefillMaxTokens) is not modelled.
	PD route.PDOptions
	// Admission holds the SLOs attainment is measured by. With Reject,
	// requests predicted to miss them are rejected on arrival.
	Admission admit.Config
	Reject    bool
	// Planner, when set, drives role switches: every Planner.WindowSec the
	// run observes the window and applies the plan. A switched pod takes no
	// new requests, finishes those it has (drain), then spends
	// Planner.WarmupSec warming up (its prefix cache starts empty) before
	// it serves its new role. Nil keeps the initial split.
	Planner *plan.Config
	// ReportSec cuts the results into consecutive periods of this length by
	// arrival time (a phased workload's PhaseSec); 0 reports one period.
	ReportSec float64
	// Seed drives the cascade's random choices.
	Seed uint64

	// observe, when set, sees every decision (tests).
	observe func(req *route.Request, cands []route.PDCandidate, d route.PDDecision)
}

var errPDConfig = errors.New("cluster: invalid PD config")

// Validate rejects a configuration the simulator cannot run, naming the
// field.
func (c PDConfig) Validate() error {
	switch {
	case c.Pods < 2:
		return fmt.Errorf("%w: pods = %d must be at least 2", errPDConfig, c.Pods)
	case c.Initial.Prefill < 1 || c.Initial.Decode < 1 || c.Initial.Total() != c.Pods:
		return fmt.Errorf("%w: initial = %v must give both roles a pod and place all %d", errPDConfig, c.Initial, c.Pods)
	case c.PD.LocalPrefillMaxTokens != 0:
		return fmt.Errorf("%w: pd.local_prefill_max_tokens = %d: the PD simulator does not prefill on decode pods, set it to 0", errPDConfig, c.PD.LocalPrefillMaxTokens)
	case c.ReportSec < 0:
		return fmt.Errorf("%w: report_sec = %v must not be negative", errPDConfig, c.ReportSec)
	}
	for i, cc := range c.Admission.Classes {
		if cc.MaxWait != 0 {
			return fmt.Errorf("%w: classes.%s.max_wait = %v: the PD simulator does not defer, set it to 0", errPDConfig, admit.Class(i), cc.MaxWait)
		}
	}
	if c.Planner != nil {
		if err := c.Planner.Validate(); err != nil {
			return err
		}
		if c.Planner.Total != c.Pods {
			return fmt.Errorf("%w: planner total = %d, pods = %d", errPDConfig, c.Planner.Total, c.Pods)
		}
	}
	if err := c.Physics.Validate(); err != nil {
		return err
	}
	if err := c.PD.Validate(); err != nil {
		return err
	}
	return c.Admission.Validate()
}

// PDPeriod is one report period's outcome. Attainment counts a request as
// met when its TTFT and TPOT both meet its class's SLOs; rejected requests
// are misses. Percentiles are over requests that finished.
type PDPeriod struct {
	Requests   int     `json:"requests"`
	Attainment float64 `json:"attainment"`
	Rejected   float64 `json:"rejected"`
	HitRate    float64 `json:"hit_rate"`
	TTFTP50    float64 `json:"ttft_p50_s"`
	TTFTP99    float64 `json:"ttft_p99_s"`
	TPOTP99    float64 `json:"tpot_p99_s"`
	// Waves is how many plans switched roles in the period, Switched how
	// many pods they moved in all.
	Waves    int `json:"waves"`
	Switched int `json:"switched"`
}

// PDResult is a run's outcome: one entry per report period, and every
// plan's decision (empty without a planner).
type PDResult struct {
	Periods   []PDPeriod
	Decisions []PDDecision
}

// PDDecision is one plan, when it was made (seconds of virtual time).
type PDDecision struct {
	At float64
	plan.Decision
}

// The kinds of event, and the pod states.
const (
	evPrefillDone = iota // a prefill pod's head job ends
	evKVArrive           // a request's KV reaches its decode pod
	evStepEnd            // a decode pod's step ends
	evWarm               // a switched pod has warmed up
	evTick               // a planner window closes
	evScrape             // the gateway scrapes every pod's /metrics
)

type podState uint8

const (
	active   podState = iota
	draining          // takes nothing new; warms up once empty
	warming
)

type event struct {
	t    float64
	seq  uint64 // ties in t go in scheduling order, for determinism
	kind uint8
	pod  int32
	req  int32
}

// eventHeap is a binary min-heap of events by (t, seq), written out rather
// than through container/heap so that pushing an event does not box it.
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	return h[i].t < h[j].t || (h[i].t == h[j].t && h[i].seq < h[j].seq)
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	s := *h
	for i := len(s) - 1; i > 0; {
		up := (i - 1) / 2
		if !s.less(i, up) {
			break
		}
		s[i], s[up] = s[up], s[i]
		i = up
	}
}

func (h *eventHeap) pop() event {
	s := *h
	e := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		m := i
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < n && s.less(c, m) {
				m = c
			}
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return e
}

// pdRequest is one admitted request's progress.
type pdRequest struct {
	arrival, firstAt float64
	prompt, output   int
	done             int // tokens generated
	decodePod        int32
	period           int32
	class            admit.Class
	// pending is the request's pick of its decode pod's pending count,
	// held until its prefill ends, when the gateway sends the decode leg
	// and the pod answers its headers.
	pending route.PendingTicket
}

// pdPod is a pod of either role. The prefill side is Run's pod; the decode
// side is a continuous batch.
type pdPod struct {
	pod
	prefillReqs []int32 // the request of each job in pod.jobs
	// queuedPrefill is the uncached tokens of the jobs, the prefill queue
	// as the gateway counts it: a request's until its prefill ends.
	queuedPrefill int

	decode   bool // the role it serves, or is switching to
	state    podState
	running  []int32 // decoding now
	waiting  []int32 // KV arrived, waiting for a slot
	incoming int     // routed here, KV not arrived yet
	queued   int     // output tokens of incoming and waiting requests
	stepping bool
	line     *admit.DecodeLine
	// generated and finished count the output tokens and the requests
	// the pod has decoded, the counters its /metrics shows.
	generated, finished int
	// scraped is the pod as the gateway's last scrape saw it.
	scraped podScrape
	// pending counts the incoming requests still in prefill: the
	// gateway's pending-decode count.
	pending route.PendingDecode
}

// podScrape is a pod's /metrics as one scrape reads them: running and
// waiting sequences, and, from the counters' growth since the scrape
// before, output tokens per second and decode requests finished per
// second.
type podScrape struct {
	running, waiting           int
	generated, finished        int
	genTokensPerSec, drainRate float64
}

// scrapeSec is the gateway's default interval between scrapes
// (health.metrics_interval), in seconds.
var scrapeSec = config.DefaultMetricsInterval.Seconds()

// assigned is how many requests the pod has that it has not finished.
func (p *pdPod) assigned() int {
	if p.decode {
		return p.incoming + len(p.waiting) + len(p.running)
	}
	return len(p.jobs)
}

// periodStats accumulates one report period.
type periodStats struct {
	PDPeriod
	met, rejected, hit, prompt int
	ttfts, tpots               []float64
}

// windowStats accumulates one planner window.
type windowStats struct {
	requests                    int
	prompt, output, hit, placed float64
}

type pdRun struct {
	cfg     PDConfig
	now     float64
	events  eventHeap
	seq     uint64
	pods    []pdPod
	reqs    []pdRequest
	rng     *rand.Rand
	ctrl    *admit.Controller
	planner *plan.Planner
	router  *route.PDRouter

	cands     []route.PDCandidate // candidate i is pod i
	scratch   route.PDScratch
	remaining []int // slotWait's scratch

	periods  []periodStats
	win      windowStats
	lastHit  float64
	result   PDResult
	arriving bool
}

// RunPD simulates w on the disaggregated fleet cfg describes.
func RunPD(cfg PDConfig, w Workload) (PDResult, error) {
	if err := cfg.Validate(); err != nil {
		return PDResult{}, err
	}
	router, err := route.NewPDRouter(cfg.PD)
	if err != nil {
		return PDResult{}, err
	}
	r := &pdRun{
		cfg:    cfg,
		pods:   make([]pdPod, cfg.Pods),
		rng:    rand.New(rand.NewPCG(cfg.Seed, 0x9d)),
		router: router,
		cands:  make([]route.PDCandidate, cfg.Pods),
	}
	ph := cfg.Physics
	for i := range r.pods {
		r.pods[i] = pdPod{
			pod: pod{
				cache: sim.NewPrefixCache(ph.CacheBlocks),
				speed: admit.NewPrefillSpeed(ph.PrefillTokensPerSec, admit.DefaultSpeedAlpha),
			},
			decode: i >= cfg.Initial.Prefill,
			line:   admit.NewDecodeLine(ph.DecodeBaseSec, ph.DecodePerSeqSec, ph.MaxBatch, admit.DefaultDecodeForget),
		}
	}
	if cfg.Reject {
		ctrl, err := admit.New(cfg.Admission)
		if err != nil {
			return PDResult{}, err
		}
		r.ctrl = ctrl
	}
	if cfg.Planner != nil {
		// The planner reads virtual time; its zero is the Unix epoch.
		p, err := plan.New(*cfg.Planner, func() time.Time { return time.Unix(0, 0).Add(time.Duration(r.now * float64(time.Second))) })
		if err != nil {
			return PDResult{}, err
		}
		r.planner = p
		r.schedule(cfg.Planner.WindowSec, evTick, -1, -1)
	}

	var a Arrival
	r.arriving = w.Next(&a)
	r.scrape()
	for r.arriving || len(r.events) > 0 {
		if r.arriving && (len(r.events) == 0 || a.Time <= r.events[0].t) {
			r.now = a.Time
			r.arrive(&a)
			r.arriving = w.Next(&a)
			continue
		}
		e := r.events.pop()
		r.now = e.t
		switch e.kind {
		case evPrefillDone:
			r.prefillDone(int(e.pod))
		case evKVArrive:
			r.kvArrive(int(e.pod), e.req)
		case evStepEnd:
			r.stepEnd(int(e.pod))
		case evWarm:
			p := &r.pods[e.pod]
			p.state = active
			p.cache.Clear()
		case evTick:
			r.tick()
		case evScrape:
			r.scrape()
		}
	}
	return r.finish(), nil
}

func (r *pdRun) schedule(t float64, kind uint8, pod int, req int32) {
	r.seq++
	r.events.push(event{t: t, seq: r.seq, kind: kind, pod: int32(pod), req: req})
}

// period returns the index of the report period of time t, growing the
// table to hold it.
func (r *pdRun) period(t float64) int {
	i := 0
	if r.cfg.ReportSec > 0 {
		i = int(t / r.cfg.ReportSec)
	}
	for len(r.periods) <= i {
		r.periods = append(r.periods, periodStats{})
	}
	return i
}

// arrive routes a to a prefill and a decode pod, asks admission, and starts
// its prefill.
func (r *pdRun) arrive(a *Arrival) {
	period := r.period(a.Time)
	ps := &r.periods[period]
	ps.Requests++
	r.win.requests++
	r.win.prompt += float64(a.PromptTokens)
	r.win.output += float64(a.OutputTokens)

	ph := &r.cfg.Physics
	req := route.Request{PromptTokens: a.PromptTokens, Keys: a.Keys, BlockSize: ph.BlockSize, Rand: r.rng.Uint64()}
	d := r.decide(&req)
	pi, di := d.Prefill, d.Decode
	pp, dp := &r.pods[pi], &r.pods[di]
	pc := &r.cands[pi].Candidate

	if r.ctrl != nil {
		ttft, tpot := r.predict(&req, pc, dp)
		if r.ctrl.Decide(a.Class, "", uint64(len(r.reqs)+1), r.now, ttft, tpot).Action != admit.Admit {
			ps.rejected++
			return
		}
	}

	id := int32(len(r.reqs))
	r.reqs = append(r.reqs, pdRequest{
		arrival: a.Time, prompt: a.PromptTokens, output: a.OutputTokens,
		decodePod: int32(di), period: int32(period), class: a.Class,
		pending: dp.pending.Pick(),
	})
	hit := pc.CachedTokens
	ps.hit += hit
	ps.prompt += a.PromptTokens
	r.win.hit += float64(hit)
	r.win.placed += float64(a.PromptTokens)

	// The prefill FIFO, as Run's place.
	unc := a.PromptTokens - hit
	start := max(pp.busy, r.now)
	pp.busy = start + ph.PrefillSec(unc)
	pp.jobs = append(pp.jobs, job{start: start, finish: pp.busy, uncached: unc})
	pp.queuedPrefill += unc
	pp.prefillReqs = append(pp.prefillReqs, id)
	pp.cache.Store(a.Keys, nil, nil)
	r.schedule(pp.busy, evPrefillDone, pi, id)

	dp.incoming++
	dp.queued += a.OutputTokens
}

// scrape reads every pod's /metrics as the gateway's health checker does,
// once per scrapeSec while requests still arrive.
func (r *pdRun) scrape() {
	for i := range r.pods {
		p := &r.pods[i]
		s := podScrape{running: len(p.running), waiting: len(p.waiting), generated: p.generated, finished: p.finished}
		if !p.decode {
			s.running, s.waiting = min(len(p.jobs), 1), max(len(p.jobs)-1, 0)
		}
		s.genTokensPerSec = float64(s.generated-p.scraped.generated) / scrapeSec
		s.drainRate = float64(s.finished-p.scraped.finished) / scrapeSec
		p.scraped = s
	}
	if r.arriving {
		r.schedule(r.now+scrapeSec, evScrape, -1, -1)
	}
}

// decide fills r.cands with every pod as the gateway's pool would show it
// and runs the gateway's cascade over them: what the gateway counts itself
// (in flight, prefill queue, prefix match, pending decodes) as it stands,
// what it scrapes as of the last scrape.
func (r *pdRun) decide(req *route.Request) route.PDDecision {
	ph := &r.cfg.Physics
	for i := range r.pods {
		p := &r.pods[i]
		c := &r.cands[i]
		sc := &p.scraped
		*c = route.PDCandidate{
			Candidate: route.Candidate{Pod: int32(i), HasMetrics: true, Running: sc.running, Waiting: sc.waiting, GenTokensPerSec: sc.genTokensPerSec},
			Down:      p.state != active,
		}
		if p.decode {
			c.Role, c.Pending, c.Line, c.DrainRate = route.RoleDecode, &p.pending, p.line, sc.drainRate
			// In flight from the decode leg's start, which the gateway
			// sends once the prefill answered: the KV is on its way.
			c.InFlight = p.incoming - p.pending.Load() + len(p.waiting) + len(p.running)
			continue
		}
		c.Role = route.RolePrefill
		c.CachedTokens = min(p.cache.Match(req.Keys)*ph.BlockSize, req.PromptTokens)
		c.InFlight = len(p.jobs)
		c.QueuedPrefillTokens = float64(p.queuedPrefill)
		c.PrefillTokensPerSec = p.speed.TokensPerSec()
	}
	d, err := r.router.Decide(req, r.cands, &r.scratch)
	if err != nil || d.Kind != route.PDPair {
		panic(fmt.Sprintf("BUG: cluster: the cascade did not pick a pair (%v, kind %d); switches keep a pod in each role", err, d.Kind))
	}
	if r.cfg.observe != nil {
		r.cfg.observe(req, r.cands, d)
	}
	return d
}

// predict is the request's predicted TTFT and TPOT on the pair, by
// admission's own formula (admit.Predict): the prefill pod's queue and the
// prompt's uncached part, the KV transfer, the wait for a decode slot
// (slotWait), and the decode pod's first step, which streams the first
// token; TPOT is a step at the batch the request joins.
func (r *pdRun) predict(req *route.Request, pc *route.Candidate, dp *pdPod) (ttft, tpot float64) {
	ph := &r.cfg.Physics
	return admit.Predict(admit.Path{
		QueuedTokens: pc.QueuedPrefillTokens, UncachedTokens: float64(max(req.PromptTokens-pc.CachedTokens, 0)),
		PrefillTokensPerSec: pc.PrefillTokensPerSec, TransferSec: ph.TransferSec(req.PromptTokens),
		SlotWaitSec: r.slotWait(dp), FirstTokenOnDecode: true,
		Batch: min(dp.assigned(), ph.MaxBatch-1), Line: dp.line,
	})
}

// slotWait is admit.SlotWait for a request routed to decode pod p now: the
// requests routed or waiting there beyond its free slots are ahead of it.
func (r *pdRun) slotWait(p *pdPod) float64 {
	ph := &r.cfg.Physics
	ahead := p.incoming + len(p.waiting) - (ph.MaxBatch - len(p.running))
	if ahead < 0 {
		return 0
	}
	r.remaining = r.remaining[:0]
	for _, id := range p.running {
		r.remaining = append(r.remaining, r.reqs[id].output-r.reqs[id].done)
	}
	slices.Sort(r.remaining)
	return admit.SlotWait(ahead, r.remaining, ph.DecodeStepSec(ph.MaxBatch), ph.MaxBatch, p.queued)
}

func (r *pdRun) prefillDone(i int) {
	p := &r.pods[i]
	j, id := p.jobs[0], p.prefillReqs[0]
	p.jobs, p.prefillReqs = p.jobs[1:], p.prefillReqs[1:]
	p.queuedPrefill -= j.uncached
	p.speed.Observe(j.uncached, j.finish-j.start)
	q := &r.reqs[id]
	q.pending.Done()
	r.schedule(r.now+r.cfg.Physics.TransferSec(q.prompt), evKVArrive, int(q.decodePod), id)
	r.drained(i)
}

func (r *pdRun) kvArrive(i int, id int32) {
	p := &r.pods[i]
	p.incoming--
	p.waiting = append(p.waiting, id)
	if !p.stepping {
		r.startStep(i)
	}
}

// startStep fills the batch from the waiting queue and schedules the step.
func (r *pdRun) startStep(i int) {
	p := &r.pods[i]
	n := min(len(p.waiting), r.cfg.Physics.MaxBatch-len(p.running))
	for _, id := range p.waiting[:n] {
		p.queued -= r.reqs[id].output
	}
	p.running = append(p.running, p.waiting[:n]...)
	p.waiting = p.waiting[n:]
	if len(p.running) == 0 {
		p.stepping = false
		return
	}
	p.stepping = true
	r.schedule(r.now+r.cfg.Physics.DecodeStepSec(len(p.running)), evStepEnd, i, -1)
}

// stepEnd gives every running sequence its next token and retires the
// finished ones.
func (r *pdRun) stepEnd(i int) {
	p := &r.pods[i]
	ph := &r.cfg.Physics
	p.line.Observe(len(p.running), ph.DecodeStepSec(len(p.running)))
	p.generated += len(p.running)
	keep := p.running[:0]
	for _, id := range p.running {
		q := &r.reqs[id]
		q.done++
		if q.done == 1 {
			q.firstAt = r.now
		}
		if q.done < q.output {
			keep = append(keep, id)
			continue
		}
		p.finished++
		r.complete(q)
	}
	p.running = keep
	r.startStep(i)
	r.drained(i)
}

// complete records a finished request's outcome.
func (r *pdRun) complete(q *pdRequest) {
	ps := &r.periods[q.period]
	ttft, tpot := q.firstAt-q.arrival, 0.0
	if q.output > 1 {
		tpot = (r.now - q.firstAt) / float64(q.output-1)
	}
	ps.ttfts = append(ps.ttfts, ttft)
	ps.tpots = append(ps.tpots, tpot)
	slo := r.cfg.Admission.Classes[q.class]
	if ttft <= slo.TTFTSLO && (slo.TPOTSLO == 0 || tpot <= slo.TPOTSLO) {
		ps.met++
	}
}

// drained starts a draining pod's warm-up once it has nothing left.
func (r *pdRun) drained(i int) {
	p := &r.pods[i]
	if p.state != draining || len(p.jobs) > 0 || p.incoming > 0 || len(p.waiting) > 0 || len(p.running) > 0 {
		return
	}
	p.state = warming
	r.schedule(r.now+r.cfg.Planner.WarmupSec, evWarm, i, -1)
}

// tick closes a planner window: it observes the window, plans, and starts
// the switches the plan asks for.
func (r *pdRun) tick() {
	cfg := r.cfg.Planner
	w := r.win
	r.win = windowStats{}
	if r.arriving {
		r.schedule(r.now+cfg.WindowSec, evTick, -1, -1)
	}
	if w.requests == 0 {
		return
	}
	hit := r.lastHit
	if w.placed > 0 {
		hit = w.hit / w.placed
	}
	r.lastHit = hit

	// Capacities as the gateway would measure them: the prefill pods'
	// learned speeds and the decode pods' learned step lines, averaged
	// over the pods serving each role now.
	var pcap, base, perSeq float64
	var cur plan.Ratio
	for i := range r.pods {
		p := &r.pods[i]
		if p.decode {
			cur.Decode++
		} else {
			cur.Prefill++
		}
		if p.state != active {
			continue
		}
		if p.decode {
			b, s := p.line.Line()
			base, perSeq = base+b, perSeq+s
		} else {
			pcap += p.speed.TokensPerSec()
		}
	}
	np, nd := r.activeCounts()
	ph := &r.cfg.Physics
	win := plan.Window{
		Demand: plan.Demand{
			Rate:         float64(w.requests) / cfg.WindowSec,
			PromptTokens: w.prompt / float64(w.requests),
			OutputTokens: w.output / float64(w.requests),
			HitRate:      hit,
			PrefillCap:   pcap / float64(np),
			DecodeCap:    plan.DecodeCapacity(base/float64(nd), perSeq/float64(nd), ph.MaxBatch, r.cfg.Admission.Classes[admit.Interactive].TPOTSLO),
		},
		Current: cur,
	}
	if err := r.planner.Observe(win); err != nil {
		panic("BUG: cluster: the simulator measured an invalid window: " + err.Error())
	}
	d := r.planner.Plan()
	r.result.Decisions = append(r.result.Decisions, PDDecision{At: r.now, Decision: d})
	if !d.Switch {
		return
	}
	ps := &r.periods[r.period(r.now)]
	ps.Waves++
	toDecode := d.Target.Decode - cur.Decode
	fromDecode := toDecode < 0
	for range abs(toDecode) {
		// Switch the active pod of the giving role with the least work,
		// keeping at least one active pod in the role.
		best, left := -1, 0
		for i := range r.pods {
			p := &r.pods[i]
			if p.state != active || p.decode != fromDecode {
				continue
			}
			left++
			if best < 0 || p.assigned() < r.pods[best].assigned() {
				best = i
			}
		}
		if left <= 1 {
			break
		}
		p := &r.pods[best]
		p.decode, p.state = !fromDecode, draining
		ps.Switched++
		r.drained(best)
	}
}

// activeCounts is the number of active prefill and decode pods.
func (r *pdRun) activeCounts() (prefill, decode int) {
	for i := range r.pods {
		if r.pods[i].state == active {
			if r.pods[i].decode {
				decode++
			} else {
				prefill++
			}
		}
	}
	return prefill, decode
}

func abs(x int) int { return max(x, -x) }

func (r *pdRun) finish() PDResult {
	res := r.result
	for _, ps := range r.periods {
		p := ps.PDPeriod
		if p.Requests > 0 {
			p.Attainment = float64(ps.met) / float64(p.Requests)
			p.Rejected = float64(ps.rejected) / float64(p.Requests)
		}
		if ps.prompt > 0 {
			p.HitRate = float64(ps.hit) / float64(ps.prompt)
		}
		p.TTFTP50, p.TTFTP99 = percentile(ps.ttfts, 0.5), percentile(ps.ttfts, 0.99)
		p.TPOTP99 = percentile(ps.tpots, 0.99)
		res.Periods = append(res.Periods, p)
	}
	return res
}

// percentile is sorted[int(n × q)], as Result's percentiles; it sorts s. 0
// for no samples.
func percentile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[min(int(float64(len(s))*q), len(s)-1)]
}

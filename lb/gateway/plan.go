package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/plan"
	"pdlb/lb/pool"
	"pdlb/promtext"
)

// The planning loop (config plan.enabled): once a window it reads, for every
// model with at least two prefill or decode pods, the gateway's own
// counters (the PD cascade's routing decisions, made as requests arrive;
// requests answered 200; prompt and prefix-cached tokens placed), added
// up over the replicas sharing its Redis (plan_shared.go), and the tokens
// its pods generated (their scraped counters), turns them into
// the window's demand (plan.Observer), adds the pods' learned speeds
// (prefill: Pod.Speed; decode: plan.DecodeCapacity of the pod's learned
// DecodeLine under plan.tpot_slo) and asks the model's plan.Planner. When
// it decides to switch, the actuators run in the background, the webhook
// first, then switch_roles; the model holds until they return, counting
// the pods being moved in their new roles.

// planHistory bounds the switch waves /admin/plan keeps per model.
const planHistory = 16

// planLoop is the planning loop's state. The loop's goroutine writes it;
// /admin/plan, /metrics and the actuators read or add to it under mu.
type planLoop struct {
	g         *Gateway
	cfg       config.Plan
	actuators []namedActuator
	// client carries the actuators' calls.
	client *http.Client
	fleet  *planFleet
	// share adds the counts up over the replicas; nil without Redis,
	// where this replica is the only one.
	share *planShare

	mu     sync.Mutex
	models map[string]*modelPlan
}

type namedActuator struct {
	name string
	plan.Actuator
}

// switchRolesActuator names switch_roles' actuator.
const switchRolesActuator = "switch_roles"

// modelPlan is one model's planner and what /admin/plan shows of it.
type modelPlan struct {
	planner  *plan.Planner
	total    int
	observer plan.Observer
	// output adds up the tokens the model's decode and combined pods
	// generated, from each pod's last counter (by pod name, so a pod
	// re-roled by a switch keeps counting from where it was).
	output    float64
	generated map[string]float64
	lastTick  time.Time
	// blind says the reason is that the last tick could not read the
	// other replicas' counts.
	blind bool

	view planView
	// wave is the switch running, nil when none.
	wave *planWave
}

// planView is a model in GET /admin/plan. Its Target is "none" while the
// planner has no split to propose (the model lacks pods of a role).
type planView struct {
	Model string `json:"model"`
	// Window is the last window's observation, with Current the split the
	// pool ran.
	ObservedAt time.Time    `json:"observed_at,omitzero"`
	Window     *plan.Demand `json:"window,omitempty"`
	Current    string       `json:"current"`
	Needed     string       `json:"needed"`
	NeedP      float64      `json:"need_prefill"`
	NeedD      float64      `json:"need_decode"`
	Target     string       `json:"target"`
	Reason     string       `json:"reason"`
	Switching  bool         `json:"switching"`
	// Switches counts the instances moved, Waves the decisions that moved
	// them, Failures the waves an actuator failed.
	Switches  int64      `json:"switches"`
	Waves     int        `json:"waves"`
	Failures  int        `json:"failures"`
	LastError string     `json:"last_error,omitempty"`
	History   []planWave `json:"history"`

	current, target plan.Ratio
	needP, needD    float64
}

// planWave is one switch: the decision and what the actuators did.
type planWave struct {
	At     time.Time `json:"at"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Moves  int       `json:"moves"`
	Reason string    `json:"reason"`
	// Released are the pods switch_roles took out of routing, InFlight the
	// requests they had then (which finished before the pods switched),
	// DrainSec how long those took.
	Released []string `json:"released,omitempty"`
	InFlight int64    `json:"in_flight_at_release"`
	DrainSec float64  `json:"drain_sec"`
	TookSec  float64  `json:"took_sec"`
	Error    string   `json:"error,omitempty"`
}

// startPlan starts the planning loop when the configuration enables it. The
// first tick runs here, so every planned model has its series at once.
func (g *Gateway) startPlan(ctx context.Context) {
	cfg := g.cfg.Plan
	if !cfg.Enabled {
		return
	}
	// Actuator calls are rare (a switch wave), and a client that keeps no
	// idle connections leaves nothing behind when the gateway closes.
	l := &planLoop{g: g, cfg: cfg, models: map[string]*modelPlan{},
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	l.fleet = &planFleet{g: g, loop: l}
	var lease plan.Lease
	if g.cfg.Redis.Address != "" {
		l.share = newPlanShare(g)
		lease = l.share
		g.exchanges = append(g.exchanges, exchange{"plan", l.share.up})
		// The first tick's reading is every model's baseline: without the
		// fleet's counts it would set none, and the first window would
		// end a window later. A Redis out of reach costs the start one
		// dial timeout.
		l.share.exchange(ctx, g.planCountsByModel())
		g.background(func() { l.share.run(ctx, g.planCountsByModel) })
	}
	if cfg.Webhook.URL != "" {
		l.actuators = append(l.actuators, namedActuator{"webhook",
			&plan.Webhook{URL: cfg.Webhook.URL, Timeout: cfg.Webhook.Timeout, Retries: cfg.Webhook.Retries, Client: l.client, Lease: lease}})
	}
	if cfg.SwitchRoles {
		l.actuators = append(l.actuators, namedActuator{switchRolesActuator,
			&plan.RoleSwitcher{Fleet: l.fleet, WarmupSec: cfg.WarmupSec, Timeout: cfg.SwitchTimeout, Client: l.client, Lease: lease}})
	}
	g.plan = l
	l.tick(ctx, time.Now())
	g.metrics.set.RegisterMetricsWriter(l.writeMetrics)
	g.background(func() {
		t := time.NewTicker(time.Duration(cfg.WindowSec * float64(time.Second)))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				l.tick(ctx, now)
			}
		}
	})
}

// tick observes the window that ends at now for every planned model and
// acts on the planners' decisions.
func (l *planLoop) tick(ctx context.Context, now time.Time) {
	snap := l.g.pool.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	planned := make(map[string]bool, len(snap.Models))
	for _, m := range snap.Models {
		st := l.models[m.Name]
		current := plan.Ratio{Prefill: len(m.Prefill), Decode: len(m.Decode)}
		total := current.Total()
		if st != nil && st.wave != nil {
			// The pods being moved are out of the snapshot; they count
			// in their new roles.
			current, total = st.view.target, st.total
		}
		if total < 2 {
			continue
		}
		planned[m.Name] = true
		if st == nil {
			st = &modelPlan{generated: map[string]float64{}, view: planView{Model: m.Name, History: []planWave{}}}
			l.models[m.Name] = st
		}
		if st.planner == nil || st.total != total {
			// A new pool (pods came or left): a new planner, its dwell
			// reset.
			p, err := plan.New(l.cfg.PlannerConfig(total), time.Now)
			if err != nil {
				panic("BUG: gateway: a validated plan section makes an invalid planner: " + err.Error())
			}
			st.planner, st.total = p, total
		}
		st.view.current = current
		missing := missingRole(current)
		switch {
		case missing != "":
			// Requests that find no pod of a role fail routing before they
			// are counted, so there is no demand to split: say so, and
			// claim no target rather than one with no pod of a role.
			st.view.target, st.view.needP, st.view.needD = plan.Ratio{}, 0, 0
			st.view.Reason = "hold: the model has no " + missing + " pods; the planner needs pods of both roles to measure and split"
		case st.view.Reason == "" || st.view.target == plan.Ratio{}:
			// The first tick, or the missing role's pods are back.
			st.view.target, st.view.Reason = current, "hold: no window observed yet"
		}
		dt := 0.0 // the first reading only sets the baseline
		if !st.lastTick.IsZero() {
			dt = now.Sub(st.lastTick).Seconds()
		}
		st.lastTick = now
		c, err := l.counts(m, st, dt)
		if err != nil {
			// The window is left open: the next reading covers it.
			if missing == "" {
				st.view.Reason, st.blind = "hold: the other replicas' counts are not known: "+err.Error(), true
			}
			continue
		}
		blind := st.blind
		st.blind = false
		d, ok := st.observer.Observe(now, c, prefillCapacity(m), decodeCapacity(m, l.cfg))
		if !ok {
			if blind && missing == "" {
				// The counts are back, as the first reading.
				st.view.Reason = "hold: no window observed yet"
			}
			continue
		}
		st.view.ObservedAt, st.view.Window = now, &d
		if st.wave != nil {
			if d.Validate() == nil {
				st.view.needP, st.view.needD = d.Needs()
			}
			st.view.Reason = fmt.Sprintf("hold: switch %s → %s in progress", st.wave.From, st.wave.To)
			continue
		}
		if missing != "" {
			continue
		}
		if err := st.planner.Observe(plan.Window{Demand: d, Current: current}); err != nil {
			st.view.Reason = "hold: " + err.Error()
			continue
		}
		dec := st.planner.Plan()
		st.view.target, st.view.needP, st.view.needD, st.view.Reason = dec.Target, dec.NeedPrefill, dec.NeedDecode, dec.Reason
		if !dec.Switch {
			continue
		}
		// A replica that does not act still lets its planner take the
		// switch: its dwell runs with the acting replica's.
		acts, holder, replicas := l.acting()
		actuators, off := l.actuators, ""
		if replicas > 1 && l.cfg.SwitchRoles {
			// switch_roles re-roles pods in this replica's pool only: the
			// other replicas would route to them in their old roles.
			actuators = slices.DeleteFunc(slices.Clone(actuators), func(a namedActuator) bool { return a.name == switchRolesActuator })
			off = fmt.Sprintf("switch_roles re-roles this replica's pods only, and %d replicas plan", replicas)
		}
		switch {
		case len(l.actuators) == 0:
			st.view.Reason += " (advice only: no actuator is configured)"
		case !acts:
			st.view.Reason += fmt.Sprintf(" (advice only: replica %q holds the plan lease and acts)", holder)
		case len(actuators) == 0:
			st.view.Reason += " (advice only: " + off + ")"
		default:
			if off != "" {
				st.view.Reason += " (webhook only: " + off + ")"
			}
			l.startWave(ctx, m.Name, st, dec, now, actuators)
		}
	}
	// A model a reload removed, or left too few pods to split, shows no
	// split: its last one would read as the pool's. One whose switch is
	// running stays until the switch ends.
	for name, st := range l.models {
		if !planned[name] && st.wave == nil {
			delete(l.models, name)
		}
	}
}

// acting says whether this replica runs the actuators, which replica
// holds the plan lease, and how many replicas plan: without Redis this
// one, alone.
func (l *planLoop) acting() (acts bool, holder string, replicas int64) {
	if l.share == nil {
		return true, "", 1
	}
	return l.share.lease()
}

// missingRole names the role current has no pod of, "" when it has both.
func missingRole(current plan.Ratio) string {
	switch {
	case current.Prefill == 0:
		return config.RolePrefill
	case current.Decode == 0:
		return config.RoleDecode
	}
	return ""
}

// planCounts reads the counters this replica keeps of model m's requests:
// every count of plan.Counts but the output.
func (g *Gateway) planCounts(m *pool.Model) plan.Counts {
	stats := g.metrics.model(m)
	var c plan.Counts
	for _, k := range stats.pd.Kinds {
		c.Requests += float64(k.Get())
	}
	c.Requests += float64(stats.uncascaded.Load())
	c.Finished = float64(stats.generated.Load())
	c.PromptTokens, c.CachedTokens = float64(stats.promptTokens.Get()), float64(stats.cachedTokens.Get())
	return c
}

// planCountsByModel is planCounts of every model, by name.
func (g *Gateway) planCountsByModel() map[string]plan.Counts {
	models := g.pool.Load().Models
	out := make(map[string]plan.Counts, len(models))
	for _, m := range models {
		out[m.Name] = g.planCounts(m)
	}
	return out
}

// counts reads model m's cumulative counters, the fleet's: every
// replica's requests and the pods' output. dt is the time since the last
// reading, over which a pod without a token counter is credited its
// throughput. An error says the other replicas' counts are not known.
func (l *planLoop) counts(m *pool.Model, st *modelPlan, dt float64) (plan.Counts, error) {
	c := l.g.planCounts(m)
	var err error
	if l.share != nil {
		c, err = l.share.counts(m.Name, c)
	}
	for _, p := range m.Pods {
		st.countOutput(p.Config.Name, p.Config.Role, p.Scraped(), dt)
	}
	if st.wave == nil {
		// The pods a switch released are out of m until it ends, and
		// keep their baselines.
		st.forgetGone(m.Pods)
	}
	c.OutputTokens = st.output
	return c, err
}

// forgetGone drops the token baselines of the pods that left the model:
// they would pile up as pods come and go, and one back under the same
// name would be credited what it generated away from the model.
func (st *modelPlan) forgetGone(pods []*pool.Pod) {
	for name := range st.generated {
		if !slices.ContainsFunc(pods, func(p *pool.Pod) bool { return p.Config.Name == name }) {
			delete(st.generated, name)
		}
	}
}

// countOutput adds to st.output what the pod name, serving role, generated
// since its last reading s (nil before its first scrape); dt is as counts
// takes it.
func (st *modelPlan) countOutput(name, role string, s *pool.Scraped, dt float64) {
	if s == nil {
		return
	}
	// A prefill pod's token is the decode pod's first one too. Its counter
	// still moves the baseline: a pod switched back to decode must not
	// bring its prefill tokens with it.
	decodes := role != config.RolePrefill
	if s.GeneratedTokens < 0 {
		if decodes && s.TokensPerSec > 0 && dt > 0 {
			st.output += s.TokensPerSec * dt
		}
		return
	}
	if last, seen := st.generated[name]; decodes && seen {
		if s.GeneratedTokens < last {
			last = 0 // the pod restarted: all it counts is new
		}
		st.output += s.GeneratedTokens - last
	}
	st.generated[name] = s.GeneratedTokens
}

// prefillCapacity is the mean learned prefill speed of m's prefill pods on
// uncached tokens (tokens/s).
func prefillCapacity(m *pool.Model) float64 {
	if len(m.Prefill) == 0 {
		return 0
	}
	sum := 0.0
	for _, p := range m.Prefill {
		sum += p.Speed.TokensPerSec()
	}
	return sum / float64(len(m.Prefill))
}

// decodeCapacity is the mean output throughput of m's decode pods under
// the TPOT target (tokens/s), from each pod's learned step-time line. A pod
// that cannot meet the target even alone counts what it does one sequence
// at a time: it still serves.
func decodeCapacity(m *pool.Model, cfg config.Plan) float64 {
	sum, n := 0.0, 0
	for _, p := range m.Decode {
		base, perSeq := p.DecodeLine().Line()
		c := plan.DecodeCapacity(base, perSeq, cfg.DecodeMaxBatch, cfg.TPOTSLO)
		if c == 0 {
			c = plan.DecodeCapacity(base, perSeq, 1, 0)
		}
		if c > 0 && !math.IsInf(c, 1) {
			sum, n = sum+c, n+1
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// startWave runs actuators on dec in the background; l.mu is held.
func (l *planLoop) startWave(ctx context.Context, model string, st *modelPlan, dec plan.Decision, now time.Time, actuators []namedActuator) {
	w := &planWave{At: now, From: dec.Current.String(), To: dec.Target.String(), Moves: dec.Moves, Reason: dec.Reason}
	st.wave = w
	st.view.Switches += int64(dec.Moves)
	st.view.Waves++
	l.g.log.Info("plan: switching roles", "model", model, "from", w.From, "to", w.To, "reason", dec.Reason)
	l.g.background(func() {
		var errs []error
		for _, a := range actuators {
			err := a.Apply(ctx, model, dec)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a.name, err))
			}
			if errors.Is(err, plan.ErrLeaseLost) {
				// The new holder acts; draining pods for nothing would
				// only cost their requests.
				break
			}
		}
		err := errors.Join(errs...)
		l.mu.Lock()
		defer l.mu.Unlock()
		w.TookSec = time.Since(now).Seconds()
		if err != nil {
			w.Error = err.Error()
			st.view.Failures++
			st.view.LastError = w.Error
			l.g.log.Warn("plan: switch failed", "model", model, "to", w.To, "err", err)
		}
		st.view.History = append(st.view.History, *w)
		if len(st.view.History) > planHistory {
			st.view.History = slices.Delete(st.view.History, 0, len(st.view.History)-planHistory)
		}
		st.wave = nil
	})
}

// servePlan serves GET /admin/plan.
func (g *Gateway) servePlan(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Enabled   bool     `json:"enabled"`
		WindowSec float64  `json:"window_sec"`
		Actuators []string `json:"actuators"`
		// Acting says this replica runs the actuators, Replicas how many
		// replicas plan (0 while Redis is out of reach). With Redis,
		// Replica is this one's id and LeaseHolder the acting one's.
		Acting      bool       `json:"acting"`
		Replicas    int64      `json:"replicas"`
		Replica     string     `json:"replica,omitempty"`
		LeaseHolder string     `json:"lease_holder,omitempty"`
		Models      []planView `json:"models"`
	}{Actuators: []string{}, Models: []planView{}}
	if l := g.plan; l != nil {
		out.Enabled, out.WindowSec = true, l.cfg.WindowSec
		for _, a := range l.actuators {
			out.Actuators = append(out.Actuators, a.name)
		}
		out.Acting, out.LeaseHolder, out.Replicas = l.acting()
		if l.share != nil {
			out.Replica = l.share.id
		}
		l.mu.Lock()
		for _, name := range l.modelNames() {
			v := l.models[name].view
			v.Current, v.Target = v.current.String(), v.target.String()
			if v.target == (plan.Ratio{}) {
				v.Target = "none"
			}
			v.NeedP, v.NeedD = v.needP, v.needD
			v.Needed = plan.Ratio{Prefill: int(math.Ceil(v.needP)), Decode: int(math.Ceil(v.needD))}.String()
			v.Switching = l.models[name].wave != nil
			v.History = slices.Clone(v.History)
			out.Models = append(out.Models, v)
		}
		l.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// modelNames are the planned models, sorted; l.mu is held.
func (l *planLoop) modelNames() []string {
	names := make([]string, 0, len(l.models))
	for name := range l.models {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// writeMetrics writes the plan's series with their help texts. Before a
// model's first window its target is its current split and its need 0.
func (l *planLoop) writeMetrics(w io.Writer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := l.modelNames()
	// value's ok is false for a model without the series.
	gauge := func(name, help string, value func(v *planView) (p, d float64, ok bool)) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for _, m := range names {
			p, d, ok := value(&l.models[m].view)
			if !ok {
				continue
			}
			fmt.Fprintf(w, "%s{model=%s,role=\"prefill\"} %g\n%s{model=%s,role=\"decode\"} %g\n", name, promtext.Label(m), p, name, promtext.Label(m), d)
		}
	}
	gauge("pdlb_plan_current_instances", "Prefill and decode pods the model's pool runs, a pod being switched counted in its new role.",
		func(v *planView) (float64, float64, bool) {
			return float64(v.current.Prefill), float64(v.current.Decode), true
		})
	gauge("pdlb_plan_target_instances", "The split of the model's pool the planner would run.",
		func(v *planView) (float64, float64, bool) {
			// None while a role has no pods: no split to propose.
			return float64(v.target.Prefill), float64(v.target.Decode), v.target != plan.Ratio{}
		})
	gauge("pdlb_plan_needed_instances", "Instances of each role the last window's load keeps busy (the planner's need, unrounded).",
		func(v *planView) (float64, float64, bool) { return v.needP, v.needD, true })
	counter := func(name, help string, value func(v *planView) float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		for _, m := range names {
			fmt.Fprintf(w, "%s{model=%s} %g\n", name, promtext.Label(m), value(&l.models[m].view))
		}
	}
	counter("pdlb_plan_role_switches_total", "Pods the planner moved to another role.",
		func(v *planView) float64 { return float64(v.Switches) })
	counter("pdlb_plan_switch_failures_total", "Switch waves in which an actuator (webhook, switch_roles) failed.",
		func(v *planView) float64 { return float64(v.Failures) })
}

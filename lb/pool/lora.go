package pool

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/route"
	"pdlb/radix"
)

// Adapter is a LoRA adapter: a name clients send that the pods of its
// base model serve, with block keys of its own.
type Adapter struct {
	Name string
	// Base is the base model's name.
	Base string
	// Path is where a pod loads it from; "" when the pods load it
	// themselves (vLLM's --lora-modules), and every pod of Base has it.
	Path string
	// Seed is the chain seed of its prompts' block keys: the engine
	// hashes the adapter's name into every block (radix.SeedWith).
	Seed uint64
	// listedOnly: no model config declares it (a pod's scrape or its
	// adapters named it), and only the pods that list or declare it
	// serve it; declared are the pods whose config declares it
	// (config.Pod.Adapters), by name.
	listedOnly bool
	declared   map[string]bool
}

func newAdapter(name, base, path string) *Adapter {
	return &Adapter{Name: name, Base: base, Path: path, Seed: radix.SeedWith(radix.Seed(base), name, "")}
}

// Alias is a public name for models or adapters, drawn by weight.
type Alias struct {
	Name    string
	Targets []string
	// Cum are the targets' cumulative weights; the last is the total.
	Cum []float64
}

// Target draws one of the alias's targets by weight from u in [0, 1).
func (a *Alias) Target(u float64) string {
	x := u * a.Cum[len(a.Cum)-1]
	for i, c := range a.Cum {
		if x < c {
			return a.Targets[i]
		}
	}
	return a.Targets[len(a.Targets)-1]
}

// names are a snapshot's public names besides its models': the
// configured adapters and the aliases.
type names struct {
	adapters map[string]*Adapter
	aliases  map[string]*Alias
}

// buildNames fills s's adapters and aliases from cfg, and each model's
// LoRA settings.
func (s *Snapshot) buildNames(cfg *config.Config) {
	s.names = names{adapters: map[string]*Adapter{}, aliases: map[string]*Alias{}}
	for _, m := range s.Models {
		m.LoRA = cfg.ModelFor(m.Name).LoRA
		for _, a := range m.LoRA.Adapters {
			s.names.adapters[a.Name] = newAdapter(a.Name, m.Name, a.Path)
		}
	}
	for _, m := range s.Models {
		for _, p := range m.Pods {
			// Validated with the config.
			declared, _ := config.ParseAdapters(p.Config.Adapters)
			for _, d := range declared {
				a := s.names.adapters[d.Name]
				if a == nil {
					a = newAdapter(d.Name, m.Name, d.Path)
					a.listedOnly = true
					s.names.adapters[d.Name] = a
				}
				if a.declared == nil {
					a.declared = map[string]bool{}
				}
				a.declared[p.Config.Name] = true
			}
		}
	}
	for _, a := range cfg.Aliases {
		al := &Alias{Name: a.Name}
		total := 0.0
		for _, t := range a.Targets {
			total += t.Weight
			al.Targets, al.Cum = append(al.Targets, t.Model), append(al.Cum, total)
		}
		s.names.aliases[a.Name] = al
	}
}

// Alias returns the alias called name, or nil.
func (s *Snapshot) Alias(name []byte) *Alias { return s.names.aliases[string(name)] }

// Resolve finds what serves name: a model (adapter nil), or an adapter and
// its base model, configured or listed by one of the base model's pods;
// nil when nothing does. Lookups allocate nothing.
func (s *Snapshot) Resolve(name []byte) (*Model, *Adapter) {
	if m := s.byName[string(name)]; m != nil {
		return m, nil
	}
	if a := s.names.adapters[string(name)]; a != nil {
		return s.byName[a.Base], a
	}
	for _, m := range s.Models {
		for _, p := range m.Pods {
			if v := p.lora.view.Load(); v != nil {
				if a := v.listed[string(name)]; a != nil {
					return m, a
				}
			}
		}
	}
	return nil, nil
}

// Adapters lists every adapter of the snapshot's models: configured, then
// declared or listed by the pods, each once, in a stable order.
func (s *Snapshot) Adapters() []*Adapter {
	var out []*Adapter
	seen := map[string]bool{}
	add := func(a *Adapter) {
		if !seen[a.Name] {
			seen[a.Name] = true
			out = append(out, a)
		}
	}
	for _, m := range s.Models {
		for _, a := range m.LoRA.Adapters {
			add(s.names.adapters[a.Name])
		}
		var learned []*Adapter
		for _, a := range s.names.adapters {
			if a.listedOnly && a.Base == m.Name {
				learned = append(learned, a)
			}
		}
		for _, p := range m.Pods {
			if v := p.lora.view.Load(); v != nil {
				for _, a := range v.listed {
					learned = append(learned, a)
				}
			}
		}
		slices.SortFunc(learned, func(a, b *Adapter) int { return strings.Compare(a.Name, b.Name) })
		for _, a := range learned {
			add(a)
		}
	}
	return out
}

// podLoRA is a pod's adapters as the gateway knows them: what its scrapes
// say (view), and the adapters the gateway sent it most recently (slots),
// which stand for the engine's LRU of adapters in GPU slots between
// scrapes.
type podLoRA struct {
	view atomic.Pointer[loraView]
	// marks numbers the gateway's loads that ended on the pod
	// (markListed), so a scrape tells those after it asked apart.
	marks atomic.Uint64
	// mu guards slots and loads, and orders the view's writers.
	mu sync.Mutex
	// slots holds at most max_loras adapter names, least recently placed
	// first; loads are the dynamic loads under way, by adapter.
	slots []string
	loads map[string]*AdapterLoad
}

// loraView is one scrape's word on a pod's adapters; immutable.
type loraView struct {
	// MaxLoras is the pod's max_lora (0: it does not say).
	MaxLoras int
	// Active are the adapters it runs or queues requests of.
	Active []string
	// listed are the adapters it serves, by name: those in /v1/models
	// with the pod's model as parent, and the active ones, and those the
	// gateway loaded (loaded: by their mark) since the scrape asked.
	listed map[string]*Adapter
	loaded map[string]uint64
}

// Has reports whether the pod serves a: every pod has a configured
// adapter the pods load themselves; any other only where the pod listed
// it.
func (p *Pod) Has(a *Adapter) bool {
	if (a.Path == "" && !a.listedOnly && a.Base == p.Config.Model) || a.declared[p.Config.Name] {
		return true
	}
	v := p.lora.view.Load()
	return v != nil && v.listed[a.Name] != nil
}

// AdapterSec is what placement charges for running a on p before its
// prefill (seconds; route.AdapterCost): a is in one of the pod's slots
// when the pod's scrape reports it active or the gateway sent it lately.
func (p *Pod) AdapterSec(a *Adapter, l *config.LoRA) float64 {
	maxLoras := l.MaxLoras
	var active []string
	if v := p.lora.view.Load(); v != nil {
		if v.MaxLoras > 0 {
			maxLoras = v.MaxLoras
		}
		active = v.Active
	}
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	// The slots taken: the gateway's own, and those the scrape saw busy.
	used := len(p.lora.slots)
	for _, n := range active {
		if !slices.Contains(p.lora.slots, n) {
			used++
		}
	}
	held := slices.Contains(active, a.Name) || slices.Contains(p.lora.slots, a.Name)
	return route.AdapterCost(held, used, maxLoras, l.AdapterLoadSec)
}

// UseAdapter records that the gateway sent p a request of a: it takes a
// slot, the least recently used one when all are taken, as the engine's
// LRU does.
func (p *Pod) UseAdapter(a *Adapter, l *config.LoRA) {
	maxLoras := l.MaxLoras
	if v := p.lora.view.Load(); v != nil && v.MaxLoras > 0 {
		maxLoras = v.MaxLoras
	}
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	s := slices.DeleteFunc(p.lora.slots, func(n string) bool { return n == a.Name })
	if len(s) >= maxLoras {
		s = slices.Delete(s, 0, len(s)-maxLoras+1)
	}
	p.lora.slots = append(s, a.Name)
}

// Adapter fit tiers: how a pod suits a request of an adapter. Placement
// keeps the pods of the best tier present: those that serve the adapter or
// are loading it, else those with a free slot to load it into, else the
// others the gateway can load it on (a load there evicts an adapter), so
// its load evicts no adapter while a slot is free elsewhere. A pod that
// neither serves it nor can be given it (no path, or load_adapters off)
// is never kept: it would answer 404, and a fallback model may serve.
const (
	fitServes uint8 = iota
	fitFreeSlot
	fitEvicts
	fitNever
)

// adapterFit is p's tier for a request of a, and its AdapterSec.
func (p *Pod) adapterFit(a *Adapter, l *config.LoRA) (tier uint8, sec float64) {
	sec = p.AdapterSec(a, l)
	load, serves := p.adapterState(a)
	switch {
	case serves || load != nil:
		return fitServes, sec
	case a.Path == "" || !l.LoadAdapters:
		return fitNever, sec
	case sec <= l.AdapterLoadSec:
		return fitFreeSlot, sec
	}
	return fitEvicts, sec
}

// FillAdapter prepares the candidates of m for a request of a: it keeps
// those of the best fit tier (cands keeps its order), each with its
// AdapterSec. When no pod serves a, the caller loads it on its pick.
func (m *Model) FillAdapter(cands []route.Candidate, a *Adapter) []route.Candidate {
	kept, best := cands[:0], fitNever
	j := 0
	for _, c := range cands {
		// cands come from m.Combined in order (AppendCombined).
		for m.Combined[j].ID != c.Pod {
			j++
		}
		tier, sec := m.Combined[j].adapterFit(a, &m.LoRA)
		if tier > best || tier == fitNever {
			continue
		}
		if tier < best {
			// kept never runs ahead of c: nothing unread is overwritten.
			kept, best = kept[:0], tier
		}
		c.AdapterSec = sec
		kept = append(kept, c)
	}
	return kept
}

// FillAdapterPD prepares a PD decision's candidates (cands[i] is pods[i])
// for a request of a as FillAdapter does the combined ones, role by role:
// prefill, decode and combined pods outside their role's best fit tier
// are marked down, the others get their AdapterSec, so the prefill and the
// decode pod of a pair both serve a, or load it where none of their role
// does. tiers is scratch, returned grown.
func (m *Model) FillAdapterPD(cands []route.PDCandidate, pods []*Pod, a *Adapter, tiers []uint8) []uint8 {
	tiers = slices.Grow(tiers[:0], len(cands))[:len(cands)]
	var best [route.RoleDecode + 1]uint8
	for r := range best {
		best[r] = fitNever - 1 // fitNever pods go down whatever the best
	}
	for i := range cands {
		c := &cands[i]
		if c.Down {
			continue
		}
		tiers[i], c.AdapterSec = pods[i].adapterFit(a, &m.LoRA)
		best[c.Role] = min(best[c.Role], tiers[i])
	}
	for i := range cands {
		if c := &cands[i]; !c.Down && tiers[i] > best[c.Role] {
			c.Down = true
		}
	}
	return tiers
}

// scrapedLoRA takes in what a scrape of p's /metrics and /v1/models says
// of its adapters; listed false says /v1/models did not answer, and the
// adapters known before stay. since is p's marks when the scrape asked
// /v1/models: an adapter the gateway loaded after that stays too, as the
// pod may have answered before the load.
func (p *Pod) scrapedLoRA(info engines.LoRAInfo, cards []engines.ModelCard, listed bool, since uint64) {
	v := &loraView{MaxLoras: info.MaxLoras, listed: map[string]*Adapter{}, loaded: map[string]uint64{}}
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	if old := p.lora.view.Load(); old != nil {
		if !listed {
			maps.Copy(v.listed, old.listed)
		}
		for n, mark := range old.loaded {
			if mark > since || !listed {
				v.listed[n], v.loaded[n] = old.listed[n], mark
			}
		}
	}
	v.Active = append(append(v.Active, info.Running...), info.Waiting...)
	learn := func(name string) {
		a := newAdapter(name, p.Config.Model, "")
		a.listedOnly = true
		v.listed[name] = a
	}
	for _, n := range v.Active {
		learn(n)
	}
	for _, c := range cards {
		if c.Parent == p.Config.Model && c.ID != p.Config.Model {
			learn(c.ID)
		}
	}
	p.lora.view.Store(v)
}

// markListed records that p now serves a (the gateway loaded it there),
// until a scrape that asked after says otherwise.
func (p *Pod) markListed(a *Adapter) {
	v := &loraView{listed: map[string]*Adapter{}, loaded: map[string]uint64{}}
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	if old := p.lora.view.Load(); old != nil {
		v.MaxLoras, v.Active = old.MaxLoras, old.Active
		maps.Copy(v.listed, old.listed)
		maps.Copy(v.loaded, old.loaded)
	}
	v.listed[a.Name], v.loaded[a.Name] = a, p.lora.marks.Add(1)
	p.lora.view.Store(v)
}

// scrapeLoRA reads p's adapters from its /metrics text and, when it
// reports LoRA there, its /v1/models.
func (c *Checker) scrapeLoRA(client *fasthttp.HostClient, p *Pod, metrics []byte) {
	info, ok := engines.ParseLoRAInfo(metrics)
	if !ok {
		return
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + p.Config.Address + "/v1/models")
	p.Authorize(req)
	var cards []engines.ModelCard
	since := p.lora.marks.Load()
	err := client.DoTimeout(req, resp, c.cfg.Timeout)
	if err == nil && resp.StatusCode() == fasthttp.StatusOK {
		cards, err = engines.ParseModelList(resp.Body())
	}
	p.scrapedLoRA(info, cards, err == nil && resp.StatusCode() == fasthttp.StatusOK, since)
}

// Aliases lists the snapshot's alias names, sorted.
func (s *Snapshot) Aliases() []string {
	out := make([]string, 0, len(s.names.aliases))
	for n := range s.names.aliases {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// AdapterLoad is one load of an adapter on a pod through its engine's API.
type AdapterLoad struct {
	done chan struct{}
	err  error
}

// Done is closed when the load is over; Err then says how it went.
func (l *AdapterLoad) Done() <-chan struct{} { return l.done }

// Err waits for the load to end: nil when the pod serves the adapter
// now, else why not.
func (l *AdapterLoad) Err() error {
	<-l.done
	return l.err
}

// loadGate orders the decisions to load adapters on a model's pods (it
// outlives a snapshot: Build hands it on). A pick reads begun before it
// looks at which pods serve or load its adapter; a load begins under mu
// only while begun is still what that pick read, then begun counts it.
// So of two picks that each found no pod loading the adapter, the later
// one to begin a load sees begun moved, and picks again among pods that
// now include the one loading it: one load per burst, not one per pick.
type loadGate struct {
	mu    sync.Mutex
	begun atomic.Uint64
}

// LoadsBegun counts the adapter loads begun on m's pods; a pick reads it
// before FillAdapter or FillAdapterPD, for LoadAdapter.
func (m *Model) LoadsBegun() uint64 { return m.loads.begun.Load() }

// LoadAdapter makes pods (a pick's prefill and decode pod, or one pod
// twice) serve a: loads[i] is the load pods[i] waits for, nil when it
// serves a already; a load under way is joined, else one begins through
// the engine's API (engines.AdapterPaths), bounded by timeout, and
// started says so. seen is LoadsBegun read before the pick looked at the
// pods: when a load must begin and another began since, which the pick
// did not see, none begins and ok is false: pick again.
func (m *Model) LoadAdapter(a *Adapter, pods [2]*Pod, seen uint64, timeout time.Duration) (loads [2]*AdapterLoad, started [2]bool, ok bool) {
	m.loads.mu.Lock()
	defer m.loads.mu.Unlock()
	for i, p := range pods {
		if i == 1 && p == pods[0] {
			break
		}
		l, serves := p.adapterState(a)
		loads[i], started[i] = l, l == nil && !serves
	}
	if !started[0] && !started[1] {
		return loads, started, true
	}
	if m.loads.begun.Load() != seen {
		return [2]*AdapterLoad{}, [2]bool{}, false
	}
	for i, p := range pods {
		if started[i] {
			loads[i] = p.startAdapterLoad(a, timeout)
		}
	}
	m.loads.begun.Add(1)
	return loads, started, true
}

// adapterState is the load of a under way on p, or whether p serves a.
// The load is looked up first: one that succeeds marks p as serving a
// before it is forgotten (startAdapterLoad), so p never seems to do
// neither in between.
func (p *Pod) adapterState(a *Adapter) (l *AdapterLoad, serves bool) {
	if l = p.pendingLoad(a); l != nil {
		return l, false
	}
	return nil, p.Has(a)
}

// startAdapterLoad begins a's load on p; the caller holds the model's
// loadGate and found none under way. Until it ends the pod counts as
// serving a (FillAdapter keeps it), so a burst of requests for a lands on
// it, not on a load each.
func (p *Pod) startAdapterLoad(a *Adapter, timeout time.Duration) *AdapterLoad {
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	if p.lora.loads == nil {
		p.lora.loads = map[string]*AdapterLoad{}
	}
	l := &AdapterLoad{done: make(chan struct{})}
	p.lora.loads[a.Name] = l
	go func() {
		l.err = p.loadAdapter(a, timeout)
		if l.err == nil {
			p.markListed(a)
		}
		p.lora.mu.Lock()
		delete(p.lora.loads, a.Name)
		p.lora.mu.Unlock()
		close(l.done)
	}()
	return l
}

// loadAdapter makes the engine's load call.
func (p *Pod) loadAdapter(a *Adapter, timeout time.Duration) error {
	path, _, err := engines.AdapterPaths(p.Engine)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(engines.AdapterRequest{Name: a.Name, Path: a.Path})
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("http://" + p.Config.Address + path)
	p.Authorize(req)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := p.Client.DoTimeout(req, resp, timeout); err != nil {
		return err
	}
	return engines.AdapterLoaded(p.Engine, resp.StatusCode(), resp.Body())
}

// pendingLoad is the load of a under way on p, or nil.
func (p *Pod) pendingLoad(a *Adapter) *AdapterLoad {
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	return p.lora.loads[a.Name]
}

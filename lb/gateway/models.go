package gateway

import (
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// Model names: a request's "model" is a model, a LoRA adapter of one (its
// base model's pods serve it, with keys of its own), or an alias drawn to
// one of those; a model with no pod to serve it falls back to the next of
// its fallback list.

// headerModel names the model or adapter that served the request.
const headerModel = "x-pdlb-model"

// resolveModel finds what serves x's model, and sets x's adapter and the
// x-pdlb-model header; nil when nothing does. Only an alias's request
// allocates: its body is rewritten to the target's name.
func (g *Gateway) resolveModel(ctx *fasthttp.RequestCtx, x *completion) *pool.Model {
	snap := g.pool.Load()
	name := x.req.Model
	if len(name) == 0 {
		// The pod serves it with its own model: one the gateway can name
		// only when it serves one.
		if len(snap.Models) != 1 || snap.Models[0].Engine.RequiresModel() {
			return nil
		}
		x.req.Model = append(x.req.Model, snap.Models[0].Name...)
		name = x.req.Model
	}
	if al := snap.Alias(name); al != nil {
		x.served = al.Target(rand.Float64())
		name = []byte(x.served)
		ctx.Request.SetBody(x.req.WithModel(ctx.PostBody(), x.served))
	}
	m, a := snap.Resolve(name)
	if m == nil {
		return nil
	}
	x.snap, x.adapter, x.fallbacks = snap, a, m.LoRA.Fallback
	if a != nil {
		g.metrics.model(m).adapters.counter(a.Name).Inc()
	}
	ctx.Response.Header.SetBytesV(headerModel, name)
	return m
}

// unresolved is the error for x, whose model resolveModel found nothing
// to serve: a 404 for a name, a 400 for none, which lists the models a
// client may name when there are several.
func (g *Gateway) unresolved(x *completion) *openai.Error {
	if len(x.req.Model) > 0 {
		return openai.ModelNotFound(x.req.Model)
	}
	e := openai.MissingParam("model")
	if snap := g.pool.Load(); len(snap.Models) > 1 {
		names := make([]string, len(snap.Models))
		for i, m := range snap.Models {
			names[i] = m.Name
		}
		slices.Sort(names)
		e.Message += ": this gateway serves " + strings.Join(names, ", ")
	}
	return e
}

// keySeed is the seed of x's block keys on m: its adapter's, whose blocks
// the engine keys apart from the base model's, or m's own.
func keySeed(m *pool.Model, x *completion) uint64 {
	if x.adapter != nil {
		return x.adapter.Seed
	}
	return m.Seed
}

// fallBack moves x, which its model cannot serve now, to the next model of
// the first model's fallback list that has a pod: the request is picked
// anew there, its prompt tokenized anew when that model's tokenizer is
// another (on a worker, stageRetokenize, where the event loop is not to
// tokenize it). False when none is left.
func (g *Gateway) fallBack(x *completion) bool { return g.nextModel(x, true) }

// nextModel is fallBack; whole says x.ids are its model's whole ids (a
// refused tokenization leaves them part made).
func (g *Gateway) nextModel(x *completion, whole bool) bool {
	if !x.req.Kind.Generates() {
		// Another model's embeddings or token ids would pass for the
		// asked model's: an error is better.
		return false
	}
	snap := g.pool.Load()
	later := false
	for len(x.fallbacks) > 0 {
		name := x.fallbacks[0]
		x.fallbacks = x.fallbacks[1:]
		m := snap.Model([]byte(name))
		if m == nil {
			continue
		}
		res, err := strategyOf(x, m)
		if err != nil || (res.PD == nil && len(m.Combined) == 0) {
			continue // no strategy of m's serves it, or no pod
		}
		if !whole || !sameIDs(x, m) {
			var f *failure
			if f, later = g.tokenizeHere(x, m); later {
				g.metrics.model(m).offLoop.Inc()
			} else if whole = f == nil; !whole {
				continue // m's engine would refuse the prompt
			}
		}
		x.dropUpstream() // x.up was built with the old body
		x.ctx.Request.SetBody(x.req.WithModel(x.ctx.PostBody(), name))
		x.ctx.Response.Header.Set(headerModel, name)
		x.rebind(snap, m, res)
		x.served, x.adapter, x.last = name, nil, nil
		if later {
			// Counted once its engine takes the prompt (retokenize).
			x.stage = stageRetokenize
			return true
		}
		x.stage = stagePick
		g.metrics.model(m).fallbacks.Inc()
		return true
	}
	return false
}

// sameIDs says x.ids, made for x.m, are m's too: m's engine makes no
// other ids of the prompt (its tokenizer, or its truncation), and its
// keys are made of those.
func sameIDs(x *completion, m *pool.Model) bool {
	return m.Prompt == x.m.Prompt && m.Engine == x.req.Engine
}

// rebind moves x onto model m of snapshot s, routed as res says. What
// its pick made of the model it leaves is made anew at its next one: the
// prefix lookup (m's index, slots and block size), and the PD decision,
// no leg of which ran.
func (x *completion) rebind(s *pool.Snapshot, m *pool.Model, res route.Resolved) {
	if x.pd != nil {
		x.pd.Release()
		x.pd = nil
	}
	x.snap, x.m = s, m
	x.policy, x.policyCache, x.cascade, x.looked = res.Policy, res.UsesCache, res.PD, false
}

// follow moves x, on a worker, onto the model of x.m's name in s, a
// snapshot published since x.m's: a reload or discovery changed the
// fleet, and x picks among that model's pods as they are now, as Envoy's
// retries pick among a cluster's hosts as they are. Its strategy,
// adapter and stored response's pod are resolved there as for a new
// request, its prompt tokenized anew where the model's engine makes other
// ids of it. Its fallbacks and an alias's draw stay those x came with:
// as Envoy's route, they are chosen once a request, and x.fallbacks is
// the rest of its first model's list, part of it tried (nextModel looks
// each up in the newest snapshot, passing by those that left). False, x
// unmoved, when s has no model of that name, or not x's adapter: x goes
// on as for a model without a pod (a fallback, else a 503, not a new
// request's 404: the model was served when x came, and a client may
// retry). f, x unmoved, is the model's refusal of x's prompt or strategy
// header now, which answers x as a new request.
func (g *Gateway) follow(x *completion, s *pool.Snapshot) (moved bool, f *failure) {
	m, a := x.modelIn(s), x.adapter
	if m != nil && a != nil {
		var base *pool.Model
		if base, a = s.Resolve([]byte(a.Name)); base != m || a == nil {
			m = nil
		}
	}
	if m == nil {
		return false, nil
	}
	res, f := resolveStrategy(x, m)
	if f != nil {
		return false, f
	}
	if !sameIDs(x, m) {
		if f, _ = g.tokenizeHere(x, m); f != nil {
			return false, f
		}
	}
	x.rebind(s, m, res)
	x.adapter = a
	g.settleHome(x, m)
	return true, nil
}

// modelIn is the model of x.m's name in s, a snapshot published since
// x.m's (follow, seekStored); nil when s serves none.
func (x *completion) modelIn(s *pool.Snapshot) *pool.Model { return s.Model([]byte(x.m.Name)) }

// retokenize tokenizes x's prompt, on a worker, for the fallback model
// fallBack moved it to on an event loop, and moves on to its pick. A
// prompt that model's engine would refuse moves x to the next fallback;
// none left, x fails as a model without a pod would (its own failure, a
// 429 or a pod's 503, is gone by then). It runs under advance's
// tokenizing slot, which the later fallbacks' tokenizations hold too.
func (g *Gateway) retokenize(x *completion) {
	f, _ := g.tokenize(x, x.m, x.ctx.PostBody(), false)
	switch {
	case f == nil:
		x.stage = stagePick
		g.metrics.model(x.m).fallbacks.Inc()
	case g.nextModel(x, false):
	default:
		x.last, x.stage = answer(openai.NoHealthyPod(x.req.Model)), stageFail
	}
}

// fallBackFrom moves x to a fallback model when f, the failure that ends
// x before anything reached its client, is one the model is unavailable
// by: no pod (503) or shedding (429), not the gateway's shutdown.
func (g *Gateway) fallBackFrom(x *completion, f *failure) bool {
	s := f.E.Status
	return f != shuttingDown && (s == fasthttp.StatusServiceUnavailable || s == fasthttp.StatusTooManyRequests) && g.fallBack(x)
}

// unavailableAnswer takes a pod's 503 head, sent before any byte reached
// the client, as its model's unavailability: x moves to a fallback model.
// False when x has none left, and the 503 goes to the client.
func (g *Gateway) unavailableAnswer(x *completion) bool {
	if x.resp.StatusCode() != fasthttp.StatusServiceUnavailable || len(x.fallbacks) == 0 || x.pd != nil {
		return false
	}
	// The pod is given back only when x moves on (fallBack releases the
	// answer): a 503 relayed after all is finish's to give back.
	if !g.fallBack(x) {
		return false
	}
	g.unplace(x, x.pod)
	// An attempt x moved on from, as a retry's: the access log lists it.
	x.retriedFrom = append(x.retriedFrom, podUnavailable(x.pod))
	return true
}

// renderModels is the body of GET /v1/models: the models, then their
// adapters with the base model as parent, as vLLM lists them, then the
// aliases.
func renderModels(s *pool.Snapshot) []byte {
	b := []byte(`{"object":"list","data":[`)
	card := func(id, parent string) {
		if b[len(b)-1] != '[' {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = openai.AppendJSONString(b, id)
		b = append(b, `,"object":"model","owned_by":"pdlb"`...)
		if parent != "" {
			b = append(b, `,"parent":`...)
			b = openai.AppendJSONString(b, parent)
		}
		b = append(b, '}')
	}
	for _, m := range s.Models {
		card(m.Name, "")
	}
	for _, a := range s.Adapters() {
		card(a.Name, a.Base)
	}
	for _, al := range s.Aliases() {
		card(al, "")
	}
	return append(b, "]}"...)
}

// loadAdapter makes sure pre and dec, the pods of x's pick on m (the
// same pod twice for one pod), serve x's adapter: where one does not and
// m lets the gateway load adapters, the pick begins the load, or joins
// one under way, and x.loads are the loads adapterReady waits for. seen
// is m.LoadsBegun read before the pick looked at the pods; false says
// another pick began a load since, which this pick did not see: it picks
// again, and nothing began.
func (g *Gateway) loadAdapter(m *pool.Model, x *completion, pre, dec *pool.Pod, seen uint64) bool {
	x.loads = [2]*pool.AdapterLoad{}
	a, l := x.adapter, &m.LoRA
	if a == nil || a.Path == "" || !l.LoadAdapters || (pre.Has(a) && dec.Has(a)) {
		return true
	}
	pods := [2]*pool.Pod{pre, dec}
	loads, started, ok := m.LoadAdapter(a, pods, seen, l.AdapterLoadTimeout)
	if !ok {
		return false
	}
	x.loads = loads
	for i, p := range pods {
		if started[i] {
			g.metrics.model(m).adapterLoads.Inc()
			g.log.Info("loading LoRA adapter", "adapter", a.Name, "pod", p.Config.Name)
		}
	}
	return true
}

// adapterReady waits for the adapter loads of x's pick (loadAdapter), on
// a worker. False says x moved to one, to be picked anew there (the
// loading pods are then its pick); a failed load fails x with 503.
func (g *Gateway) adapterReady(x *completion) bool {
	if x.loads == [2]*pool.AdapterLoad{} {
		return true
	}
	if !x.via.block(x) {
		x.stage = stagePick
		return false
	}
	pods := [2]*pool.Pod{x.pod, x.pod}
	if x.cascade != nil {
		pods[0], pods[1] = placedPD(x)
	}
	for i, load := range x.loads {
		if load == nil {
			continue
		}
		// A load may take adapter_load_timeout: the client's leaving or
		// the shutdown's grace ending stops the wait, the load runs on.
		select {
		case <-load.Done():
		case <-frontend.WatchClient(x.ctx):
		case <-g.aborted:
		}
		if f := g.interrupted(x); f != nil {
			x.last, x.stage = f, stageFail
			return true
		}
		if err := load.Err(); err != nil {
			x.last, x.stage = answer(&openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
				Message: "The LoRA adapter `" + x.adapter.Name + "` could not be loaded on pod " + pods[i].Config.Name + ": " + err.Error()}), stageFail
			return true
		}
	}
	return true
}

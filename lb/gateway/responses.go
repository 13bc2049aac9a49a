package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// The Responses API's stored responses. vLLM keeps a response it stored
// (store: true, the API's default, kept under
// VLLM_ENABLE_RESPONSES_API_STORE) in its API server's memory, so only
// the pod that made it can answer a follow-up naming it
// (previous_response_id), a retrieval (GET /v1/responses/{id}) or a
// cancel; any other pod answers 404. The gateway names each stored
// response itself ("request_id", which vLLM names the response after,
// added to the body when the client sent none) and remembers the pod
// that answered it, and the API key that made it: requests naming it go
// to that pod alone, and only for that key. One it does not know (made
// through another replica, or before a restart) is sought on the model's
// pods (seekStored), or each model's for a call that names none; with
// api_keys, only one whose id was made for the asking key (madeFor): a
// pod's answer does not say whose it is. So a keyed client names its
// responses only with ids made for its key.

// homes remembers the pod of each stored response (or conversation)
// put within its last max puts: an id is forgotten once max puts came
// after its last (then sought as one the gateway never saw), so a
// conversation's key, put at each turn, stays while it is busy.
type homes struct {
	mu   sync.Mutex
	byID map[string]slotted
	// order is a ring of the ids by when they were last put, the oldest
	// at next once it is full; "" marks a place left by an id put again
	// or deleted.
	order []string
	next  int
}

// slotted is a home and its id's place in order.
type slotted struct {
	home
	at int
}

// maxRememberedID is the longest response id or prompt_cache_key of a
// client's the gateway remembers (vLLM's ids are 37 bytes): a longer one
// goes unremembered, so the tables' bound bounds their memory.
const maxRememberedID = 256

// home is where a stored response lives: its model and pod, by name (a
// reload may rebuild both), and the name of the API key that made it
// ("" without api_keys).
type home struct{ model, pod, owner string }

// hiddenFrom reports whether response id, whose home is h when known,
// is to be answered as unknown to key (nil: api_keys are off, and every
// response is anyone's): a known one is another key's; an unknown one
// (made through another replica, or before a restart) was not made for
// key (madeFor), since a pod's answer, were it sought, would not say
// whose it is.
func (h home) hiddenFrom(key *limits.Key, known bool, id []byte) bool {
	if key == nil {
		return false
	}
	if known {
		return h.owner != key.Name
	}
	return !madeFor(id, key)
}

// madeFor reports whether id is one made for key, by nameResponse or by
// the key's holder: resp_ and 32 hex digits whose second half is key's
// tag of the first.
func madeFor(id []byte, key *limits.Key) bool {
	var b [16]byte
	digits, ok := bytes.CutPrefix(id, []byte("resp_"))
	if !ok || hex.DecodedLen(len(digits)) != len(b) {
		return false
	}
	if _, err := hex.Decode(b[:], digits); err != nil {
		return false
	}
	return key.TaggedID(b)
}

func newHomes(max int) *homes {
	if max <= 0 {
		return nil
	}
	return &homes{byID: make(map[string]slotted), order: make([]string, 0, min(max, 1024))}
}

// put records that id lives on h, as the most recent id: one put before
// leaves its old place empty, and when the ring is full the id in the
// place it takes is forgotten. The methods of a nil table (max_stored_responses 0)
// remember nothing.
func (t *homes) put(id string, h home, max int) {
	if t == nil || id == "" || len(id) > maxRememberedID {
		return // "" marks a hole in order
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[id]; ok {
		t.order[old.at] = ""
	}
	at := len(t.order)
	if at < max {
		t.order = append(t.order, id)
	} else {
		at = t.next
		if gone := t.order[at]; gone != "" {
			delete(t.byID, gone)
		}
		t.order[at] = id
		t.next = (at + 1) % max
	}
	t.byID[id] = slotted{h, at}
}

// len is how many ids the table holds.
func (t *homes) len() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// get returns id's home.
func (t *homes) get(id []byte) (home, bool) {
	if t == nil {
		return home{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[string(id)]
	return e.home, ok
}

// forget drops id (a deleted response), leaving its place empty.
func (t *homes) forget(id []byte) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byID[string(id)]; ok {
		t.order[e.at] = ""
		delete(t.byID, string(id))
	}
}

// storedMethods are the methods a stored response's paths take, by the
// part of the path after its id.
var storedMethods = map[string][]string{"": {"GET", "DELETE"}, "cancel": {"POST"}, "input_items": {"GET"}}

// serveStored serves a request about a stored response (GET or DELETE
// /v1/responses/{id}, POST .../cancel, GET .../input_items) with its
// method, else answers 405.
func (g *Gateway) serveStored(ctx *fasthttp.RequestCtx, sub string) *openai.Error {
	allow := storedMethods[sub]
	if !slices.Contains(allow, string(ctx.Method())) {
		ctx.Response.Header.Set("Allow", strings.Join(allow, ", "))
		e := openai.MethodNotAllowed(ctx.Method(), ctx.Path())
		writeFailure(ctx, answer(e))
		return e
	}
	g.serveCompletion(ctx, openai.KindStored)
	return nil
}

// storedNotFound is vLLM's 404 for a stored response id it does not hold
// (its _make_not_found_error), byte for byte: the code is the status.
func storedNotFound(id []byte) *openai.Error {
	return &openai.Error{Status: fasthttp.StatusNotFound, Type: openai.TypeInvalidRequest, Param: "response_id",
		Message: "Response with id '" + string(id) + "' not found.", CodeIsStatus: true}
}

// foreignResponseID is the 400 for a stored response's request_id that
// was not made for the request's API key (madeFor).
func foreignResponseID() *openai.Error {
	return openai.InvalidValue("request_id", "must be resp_ and 32 hex digits whose last 16 are the API key's tag of the first 16, as the gateway makes them; or absent")
}

// placeStored reads where x, a Responses API request, must go: the pod of
// the stored response it names (x.home), when the gateway knows it, or
// the pod its conversation went to (x.prefer). A KindStored request takes
// its model from there, and streams when its query says stream=true (a
// retrieval resumed as vLLM's); false when it was answered: 404 when its
// response is another API key's (home.hiddenFrom), or unknown and no
// model has combined pods to search; 400 when it names the response it
// makes with an id not made for its key.
func (g *Gateway) placeStored(ctx *fasthttp.RequestCtx, x *completion) bool {
	switch x.req.Kind {
	case openai.KindStored:
		id, _, _ := openai.StoredID(ctx.Path())
		h, ok := g.homes.get(id)
		if h.hiddenFrom(x.found, ok, id) {
			// Another key's answers as one no pod holds, so that ids do
			// not leak.
			g.fail(ctx, x, nil, answer(storedNotFound(id)))
			return false
		}
		models := g.pool.Load().Models
		if ok {
			// Its pod's model now: a reload may have moved the pod to
			// another. One whose pod left, or was renamed, is sought.
			i := slices.IndexFunc(models, func(m *pool.Model) bool { return combinedNamed(m, h.pod) >= 0 })
			if i < 0 {
				g.homes.forget(id)
				h, ok = home{}, false
			} else {
				h.model = models[i].Name
			}
		}
		if !ok {
			// Unknown here (made through another replica, or before a
			// restart): the pods are asked in turn (seekStored), of
			// each model that has combined pods, as the call names none.
			i := slices.IndexFunc(models, hasCombined)
			if i < 0 {
				g.fail(ctx, x, nil, answer(storedNotFound(id)))
				return false
			}
			h.model = models[i].Name
			x.seekAll = slices.ContainsFunc(models[i+1:], hasCombined)
		}
		x.home = h
		x.req.Model = append(x.req.Model[:0], h.model...)
		x.req.Stream = ctx.QueryArgs().GetBool("stream")
	case openai.KindResponses:
		if x.found != nil && x.req.ResponseIDSet && !x.req.NoStore && !madeFor(x.req.ResponseID, x.found) {
			// vLLM stores a response in the place of one with its id: a
			// name not the key's could take another key's over. Refused
			// whether or not the id exists, which so stays unknown.
			g.fail(ctx, x, nil, answer(foreignResponseID()))
			return false
		}
		if len(x.req.Previous) > 0 {
			h, ok := g.homes.get(x.req.Previous)
			if h.hiddenFrom(x.found, ok, x.req.Previous) {
				// As a retrieval's, and as vLLM answers a follow-up of
				// a response it does not hold.
				g.fail(ctx, x, nil, answer(storedNotFound(x.req.Previous)))
				return false
			}
			x.home = h
		}
		if len(x.req.CacheKey) > 0 && x.home.pod == "" {
			x.prefer, _ = g.conversations.get(x.req.CacheKey)
		}
	}
	return true
}

// nameResponse names x's response, when it is to be stored: its own
// "request_id", or a new one added to its body.
func (g *Gateway) nameResponse(ctx *fasthttp.RequestCtx, x *completion) {
	if g.homes == nil || x.req.Kind != openai.KindResponses || x.req.NoStore {
		return
	}
	if x.req.ResponseIDSet {
		// The client's name (one null or "" is vLLM's to judge).
		if n := len(x.req.ResponseID); n > 0 && n <= maxRememberedID {
			x.respID = append(x.respID[:0], x.req.ResponseID...)
		}
		return
	}
	// As vLLM names one: resp_ and a random UUID's 32 hex digits, which
	// no one can guess (a response's id is all it takes to read it). For
	// a key, the second half is its tag of the first, so any replica with
	// the same api_keys can tell whose it is (madeFor).
	var b [16]byte
	_, _ = rand.Read(b[:])
	if x.found != nil {
		x.found.TagID(&b)
	}
	x.respID = hex.AppendEncode(append(x.respID[:0], "resp_"...), b[:])
	ctx.Request.SetBody(x.req.WithResponseID(ctx.PostBody(), string(x.respID)))
}

// seekStored moves x, which names a stored response the gateway does not
// know (another replica, or this one before a restart, saw it made), on
// to the model's next pod after its pod answered 404, as vLLM answers for
// a response it does not hold (before any engine work); false leaves the
// answer to be relayed: x names none, or every pod said it holds none.
func (g *Gateway) seekStored(x *completion) bool {
	m := g.seeks(x)
	if m == nil {
		return false
	}
	if n, _ := unasked(x, m, x.pod); n == 0 {
		return false
	}
	g.dropAnswer(x)
	e := storedNotFound(storedIDOf(x.ctx, x))
	x.last = &failure{E: e, Pod: x.pod}
	seekOn(x, &failure{E: e, Pod: x.pod, Reason: fail.NotFound})
	return true
}

// seekPast moves x's search on past its pod, which failed with f before
// any byte of its answer: the pod, which may hold the response, is asked
// no more, and unsought names it. False when x seeks nothing.
func (g *Gateway) seekPast(x *completion, f *failure) bool {
	if g.seeks(x) == nil {
		return false
	}
	x.last = f
	seekOn(x, f)
	return true
}

// seekPastFault moves x's search on past its pod, which answered a 5xx
// but 503 (vLLM's answer to an exception in its handler, or a proxy's in
// front of the pod): vLLM answers a retrieval, cancel or follow-up of an
// id it does not hold with 404, and of one it holds with 200 or a 4xx
// (400: a bad id, a cancel of a finished response), so the 5xx says
// nothing of the response, and the pod counts as one not asked
// (unsought names it). False when x seeks nothing: the 5xx is relayed.
func (g *Gateway) seekPastFault(x *completion) bool {
	status := x.resp.StatusCode()
	if !fail.IsFault(status) || g.seeks(x) == nil {
		return false
	}
	g.dropAnswer(x)
	if x.reachesEngine() {
		g.podFailed(x.pod) // as respond counts a 5xx relayed
	}
	return g.seekPast(x, &failure{E: openai.UpstreamError(fmt.Sprintf("pod %s answered %d", x.pod.Config.Name, status)),
		Pod: x.pod, Reason: fail.Fault})
}

// seeks is the model whose pods x asks in turn for the stored response it
// names, which the gateway does not know (the model's as the fleet is
// now: follow); nil when x names none, or one whose pod is known.
func (g *Gateway) seeks(x *completion) *pool.Model {
	if x.home.pod != "" || storedIDOf(x.ctx, x) == nil {
		return nil
	}
	if s := g.pool.Load(); s != x.snap {
		return x.modelIn(s)
	}
	return x.m
}

// seekOn sends x's search to its next pod, after f on its last one. Each
// pod is asked once, and asking the next is the search, not a retry:
// whatever the retry budget, retry_on and retries, the pods without the
// response answer 404 before any engine work. Once no pod is left to ask,
// the pick answers unsought.
func seekOn(x *completion, f *failure) {
	x.downMoves++ // as a move off a dead pod: no retry spent
	// An attempt x moved on from, as a retry's: the access log lists it.
	x.retriedFrom = append(x.retriedFrom, f)
	x.stage, x.seeking, x.asked = stagePick, true, true
}

// seekModel moves x's search (seekAll) on to the next model after x's,
// in the fleet's order, that has combined pods: false when none is left.
func (g *Gateway) seekModel(x *completion) bool {
	if !x.seekAll {
		return false
	}
	s := g.pool.Load()
	// -1 when a reload took x's model away: the search goes on from the
	// first model, whose pods it asked are not asked again.
	i := slices.IndexFunc(s.Models, func(m *pool.Model) bool { return m.Name == x.m.Name })
	for _, m := range s.Models[i+1:] {
		if !hasCombined(m) {
			continue
		}
		res, err := strategyFor(x, m)
		if err != nil {
			continue
		}
		x.req.Model = append(x.req.Model[:0], m.Name...)
		x.ctx.Response.Header.Set(headerModel, m.Name)
		x.rebind(s, m, res)
		x.stage, x.asked = stagePick, true
		return true
	}
	return false
}

func hasCombined(m *pool.Model) bool { return len(m.Combined) > 0 }

// unsought is the answer to x's search for its stored response once no
// pod of m (or of any model, seekAll) is left to ask: nil when each pod
// said it holds none (vLLM's 404 stands), else 503 counting those that
// failed or are down, any of which may hold it: a 404 would tell the
// client it is gone.
func unsought(x *completion, m *pool.Model) *failure {
	n, first := unasked(x, m, nil)
	if n == 0 {
		return nil
	}
	which := "pod `" + first.Config.Name + "`"
	if n > 1 {
		which += " among them"
	}
	of := fmt.Sprintf("the model's %d pods", len(m.Combined))
	if x.seekAll {
		total := 0
		for _, m := range searched(x, m) {
			total += len(m.Combined)
		}
		of = fmt.Sprintf("the %d pods of the models", total)
	}
	return answer(&openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
		Message: fmt.Sprintf("Response with id '%s' is on none of the pods that answered; %d of %s (%s) failed or are down, and may hold it.",
			storedIDOf(x.ctx, x), n, of, which)})
}

// unasked counts the pods of x's search (of m, or of every model:
// searched) that did not answer it with 404 (nor did last, when not nil,
// which just did), and returns the first of them.
func unasked(x *completion, m *pool.Model, last *pool.Pod) (n int, first *pool.Pod) {
	for _, m := range searched(x, m) {
		for _, p := range m.Combined {
			if (last != nil && p.ID == last.ID) || slices.ContainsFunc(x.retriedFrom, func(f *failure) bool { return f.Reason == fail.NotFound && f.Pod.ID == p.ID }) {
				continue
			}
			if n == 0 {
				first = p
			}
			n++
		}
	}
	return n, first
}

// searched is the models whose pods x's search asks: m, x's model, or
// with seekAll each model of the fleet as it is now.
func searched(x *completion, m *pool.Model) []*pool.Model {
	if x.seekAll {
		return x.g.pool.Load().Models
	}
	return []*pool.Model{m}
}

// storedIDOf is the stored response x, a request of ctx, names, nil when
// none.
func storedIDOf(ctx *fasthttp.RequestCtx, x *completion) []byte {
	switch x.req.Kind {
	case openai.KindResponses:
		if len(x.req.Previous) > 0 {
			return x.req.Previous
		}
	case openai.KindStored:
		id, _, _ := openai.StoredID(ctx.Path())
		return id
	}
	return nil
}

// stored records where x's response lives, now that pod answered it, or
// forgets one a DELETE removed.
func (g *Gateway) stored(x *completion, m *pool.Model, pod *pool.Pod, status int) {
	if status != fasthttp.StatusOK {
		return
	}
	h, max := home{model: m.Name, pod: pod.Config.Name}, g.cfg.MaxStoredResponses
	if x.found != nil {
		h.owner = x.found.Name
	}
	if id := storedIDOf(x.ctx, x); id != nil && x.home.pod == "" && !(x.req.Kind == openai.KindStored && x.ctx.IsDelete()) {
		// Found by seekStored, or by load.
		g.homes.put(string(id), h, max)
	}
	if k := x.req.CacheKey; x.req.Kind == openai.KindResponses && len(k) > 0 {
		g.conversations.put(string(k), h, max)
	}
	switch {
	case len(x.respID) > 0:
		g.homes.put(string(x.respID), h, max)
	case x.req.Kind == openai.KindStored && x.ctx.IsDelete():
		id, _, _ := openai.StoredID(x.ctx.Path())
		g.homes.forget(id)
	}
}

// keepHome keeps of cands, m's combined pods that x may go to, only the
// pod named name; if it is not among them, none. With soft (a
// conversation's pod, which holds its earlier turns in its prefix cache)
// all instead, and all too while that pod is overloaded as SGLang's
// router's cache_aware counts it against the least loaded candidate
// (more requests in flight by both balance thresholds): then the
// conversation goes by load, and moves.
func keepHome(m *pool.Model, cands []route.Candidate, name string, soft bool) []route.Candidate {
	if j := combinedNamed(m, name); j >= 0 {
		for _, c := range cands {
			if c.Pod != m.CombinedLoads[j].ID {
				continue
			}
			if soft && overloaded(c, cands) {
				return cands
			}
			return append(cands[:0], c)
		}
	}
	if soft {
		return cands
	}
	return cands[:0]
}

// combinedNamed is the index of m's combined pod named name, -1 if none.
func combinedNamed(m *pool.Model, name string) int {
	return slices.IndexFunc(m.Combined, func(p *pool.Pod) bool { return p.Config.Name == name })
}

// overloaded reports whether c has more requests in flight than the least
// loaded of cands by route.DefaultBalanceAbsThreshold and by
// route.DefaultBalanceRelThreshold times.
func overloaded(c route.Candidate, cands []route.Candidate) bool {
	lo := c.InFlight
	for i := range cands {
		lo = min(lo, cands[i].InFlight)
	}
	return float64(c.InFlight-lo) > route.DefaultBalanceAbsThreshold && float64(c.InFlight) > route.DefaultBalanceRelThreshold*float64(lo)
}

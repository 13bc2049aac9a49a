package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/lb/admit"
	"pdlb/lb/frontend"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// Explaining a routing decision. A client that sends "x-pdlb-debug:
// explain" (with the admin token in x-pdlb-admin-token, unless
// tracing.explain lets everyone) gets its decision back: every pod of
// the model with its score, cached depth, load and predicted TTFT, and why
// it was not chosen; in the x-pdlb-explain response header, or as an SSE
// comment before a stream's first event.
//
// GET /admin/explain?model=M shows the last tracing.explain_history
// decisions of M. Building an explanation allocates, so the ring records
// only while someone reads it: a read arms recording for explainArmed,
// and the hot path, when nobody has read recently, pays one atomic load.
// Requests that ask for their own explanation are recorded too.

// Headers of an explanation.
const (
	headerDebug      = "x-pdlb-debug"
	headerAdminToken = "x-pdlb-admin-token"
	headerExplain    = "x-pdlb-explain"
)

// explainArmed is how long a read of /admin/explain keeps the ring
// recording.
const explainArmed = time.Minute

// explainer keeps the recent decisions per model.
type explainer struct {
	history int
	// tokenSum is the admin token's SHA-256, nil without a token; open
	// lets every client ask.
	tokenSum []byte
	open     bool
	// armedUntil is when recording stops (unix nanoseconds), set by a read;
	// zero when unarmed.
	armedUntil atomic.Int64
	mu         sync.Mutex
	rings      map[string]*explainRing
}

// explainRing is a model's last decisions, oldest first from next.
type explainRing struct {
	items []*explanation
	next  int
}

func newExplainer(token string, open bool, history int) *explainer {
	e := &explainer{history: history, open: open, rings: map[string]*explainRing{}}
	if token != "" {
		sum := sha256.Sum256([]byte(token))
		e.tokenSum = sum[:]
	}
	return e
}

// asked says the request wants its decision explained and may have it.
// A nil e (a gateway built without New, in tests) explains nothing.
func (e *explainer) asked(debug, token []byte) bool {
	if e == nil || string(debug) != "explain" {
		return false
	}
	if e.open {
		return true
	}
	if e.tokenSum == nil || len(token) == 0 {
		return false
	}
	sum := sha256.Sum256(token)
	return subtle.ConstantTimeCompare(sum[:], e.tokenSum) == 1
}

// recording says the ring wants decisions now. Unarmed (zero, as it
// turns once past) it reads no clock: most requests are never explained.
func (e *explainer) recording() bool {
	if e == nil {
		return false
	}
	until := e.armedUntil.Load()
	if until == 0 {
		return false
	}
	if time.Now().UnixNano() < until {
		return true
	}
	e.armedUntil.CompareAndSwap(until, 0)
	return false
}

func (e *explainer) record(x *explanation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rings[x.Model]
	if r == nil {
		r = &explainRing{}
		e.rings[x.Model] = r
	}
	if len(r.items) < e.history {
		r.items = append(r.items, x)
		return
	}
	r.items[r.next] = x
	r.next = (r.next + 1) % e.history
}

// recent is model's decisions, oldest first.
func (e *explainer) recent(model string) []*explanation {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rings[model]
	if r == nil {
		return []*explanation{}
	}
	return append(append([]*explanation{}, r.items[r.next:]...), r.items[:r.next]...)
}

// explanation is one decision as a client or an operator reads it.
type explanation struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id,omitempty"`
	Model     string    `json:"model"`
	Policy    string    `json:"policy"`
	Attempt   int       `json:"attempt"`
	// Kind is "combined" for a plain pick, else the PD decision's kind
	// (pair, local, combined), with the cascade's steps that fired.
	Kind    string   `json:"kind"`
	Fired   []string `json:"fired,omitempty"`
	Pod     string   `json:"pod,omitempty"`
	Prefill string   `json:"prefill_pod,omitempty"`
	Decode  string   `json:"decode_pod,omitempty"`
	// PredictedTTFT is the chosen placement's (seconds).
	PredictedTTFT float64 `json:"predicted_ttft_s"`
	// Rank is the data-parallel rank of the pod (the prefill pod) the
	// request names, when it names one or its rank was busy (rankFor).
	Rank       *rankView       `json:"data_parallel_rank,omitempty"`
	Candidates []candidateView `json:"candidates"`
}

// rankView is the rank a request names and why: it holds CachedTokens of
// the prompt, every other rank of its pod OthersTokens at most. Busy: the
// rank was too busy (rankBusy), and the request names none.
type rankView struct {
	Rank         int  `json:"rank"`
	CachedTokens int  `json:"cached_tokens"`
	OthersTokens int  `json:"others_cached_tokens"`
	Busy         bool `json:"busy,omitempty"`
}

// candidateView is one pod of a decision.
type candidateView struct {
	Pod  string `json:"pod"`
	Role string `json:"role"`
	// Score is the policy's (lower is better); absent where the policy
	// picks without one.
	Score        *float64 `json:"score,omitempty"`
	CachedTokens int      `json:"cached_tokens"`
	InFlight     int      `json:"in_flight"`
	QueuedTokens float64  `json:"queued_prefill_tokens"`
	ActiveTokens float64  `json:"active_tokens"`
	Running      int      `json:"running"`
	Waiting      int      `json:"waiting"`
	KVUsage      float64  `json:"kv_usage"`
	// PredictedTTFT: its queue and this prompt's uncached part at its
	// prefill speed (seconds); absent for a decode pod.
	PredictedTTFT *float64 `json:"predicted_ttft_s,omitempty"`
	// Chosen is the part it plays ("pod", "prefill", "decode"); Skipped
	// why it plays none.
	Chosen  string `json:"chosen,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// observePick runs after every successful pick: it predicts x's TTFT for
// the access log and the trace, and explains the decision when asked.
// With neither on, it is two nil checks and an atomic load.
func (g *Gateway) observePick(x *completion, start time.Time) {
	if g.access == nil && !x.tr.rec && !x.explain && !g.explain.recording() {
		return
	}
	pre, dec := x.pod, x.pod
	if x.pd != nil {
		pre, dec = placedPD(x)
	}
	x.predictedTTFT, _ = g.predict(x, pre, dec)
	x.tr.picked(x, start)
	if x.explain || g.explain.recording() {
		e := g.explainPick(x)
		x.explained = e
		g.explain.record(e)
	}
}

// explainPick explains x's latest pick.
func (g *Gateway) explainPick(x *completion) *explanation {
	e := &explanation{Time: time.Now(), RequestID: string(x.reqID), Model: x.m.Name,
		Policy: policyName(x), Attempt: x.attempts + 1, PredictedTTFT: x.predictedTTFT, Kind: "combined"}
	uncached := func(c *route.Candidate) *float64 {
		v := admit.TTFT(c.QueuedPrefillTokens, float64(max(x.routeReq.PromptTokens-c.CachedTokens, 0)), c.PrefillTokensPerSec, 0)
		return &v
	}
	view := func(p *pool.Pod, c *route.Candidate) candidateView {
		return candidateView{Pod: p.Config.Name, Role: p.Config.Role, CachedTokens: c.CachedTokens, InFlight: c.InFlight,
			QueuedTokens: c.QueuedPrefillTokens, ActiveTokens: c.ActiveTokens, Running: c.Running, Waiting: c.Waiting, KVUsage: c.KVUsage}
	}
	pre := x.pod
	if x.pd != nil {
		pre, _ = placedPD(x)
	}
	if pin := g.rankFor(x, pre); pin.pinned || pin.busy {
		bs := x.m.BlockSize
		e.Rank = &rankView{Rank: int(pin.rank), CachedTokens: int(pin.blocks) * bs, OthersTokens: int(pin.next) * bs, Busy: pin.busy}
	}
	if x.pd != nil {
		g.explainPD(x, e, view, uncached)
		return e
	}
	e.Pod = x.pod.Config.Name
	policy := x.m.Policy
	if x.policy != nil {
		policy = x.policy
	}
	scores := make([]float64, len(x.cands))
	route.Scores(policy, &x.routeReq, x.cands, scores)
	for _, p := range x.m.Combined {
		i := candidateOf(x.cands, p.ID)
		if i < 0 {
			v := candidateView{Pod: p.Config.Name, Role: p.Config.Role, Skipped: "unavailable (unhealthy, ejected or draining)"}
			if tried(x.tried, p.ID) {
				v.Skipped = "tried already"
			}
			e.Candidates = append(e.Candidates, v)
			continue
		}
		c := &x.cands[i]
		v := view(p, c)
		v.PredictedTTFT = uncached(c)
		if s := scores[i]; !math.IsNaN(s) && !math.IsInf(s, 0) {
			v.Score = &s
		}
		switch {
		case p == x.pod:
			v.Chosen = "pod"
		case v.Score != nil:
			v.Skipped = "higher score"
		default:
			v.Skipped = "not the policy's pick"
		}
		e.Candidates = append(e.Candidates, v)
	}
	return e
}

// candidateOf is the index in cands of the pod with ID id, -1 if none.
func candidateOf(cands []route.Candidate, id int32) int {
	for i := range cands {
		if cands[i].Pod == id {
			return i
		}
	}
	return -1
}

// explainPD explains a PD cascade's decision.
func (g *Gateway) explainPD(x *completion, e *explanation, view func(*pool.Pod, *route.Candidate) candidateView, ttft func(*route.Candidate) *float64) {
	p := x.pd
	d := p.Decision
	e.Kind, e.Fired = pdKindName(d.Kind), firedNames(d.Fired)
	pre, dec := placedPD(x)
	if d.Kind == route.PDPair {
		e.Prefill, e.Decode = pre.Config.Name, dec.Config.Name
	} else {
		e.Pod = pre.Config.Name
	}
	n := x.routeReq.PromptTokens
	for i := range p.Cands {
		c, pod := &p.Cands[i], p.Pods[i]
		v := view(pod, &c.Candidate)
		if c.Role != route.RoleDecode {
			v.PredictedTTFT = ttft(&c.Candidate)
		}
		switch {
		case d.Kind == route.PDPair && i == d.Prefill:
			v.Chosen = "prefill"
		case d.Kind != route.PDCombined && i == d.Decode:
			v.Chosen = "decode"
		case d.Kind == route.PDCombined && i == d.Combined:
			v.Chosen = "pod"
		case tried(x.tried, pod.ID):
			v.Skipped = "tried already"
		case c.Down:
			v.Skipped = "unavailable (unhealthy, ejected or draining)"
		case n < c.BucketMin || (c.BucketMax > 0 && n > c.BucketMax):
			v.Skipped = "outside its prompt-length bucket"
		default:
			v.Skipped = "the cascade preferred another"
		}
		e.Candidates = append(e.Candidates, v)
	}
}

// firedNames names the cascade steps that fired.
func firedNames(f route.PDFired) []string {
	names := []string{"no_pair", "overflow", "prefill_imbalance", "decode_count", "decode_throughput", "decode_drain", "bucket_band", "local_prefill"}
	var out []string
	for i, n := range names {
		if f&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// explainJSON renders x's explanation on one line.
func explainJSON(x *explanation) []byte {
	b, err := json.Marshal(x)
	if err != nil {
		panic("BUG: gateway: explanation does not marshal: " + err.Error())
	}
	return b
}

// writeExplain sends x's explanation ahead of its stream's first event,
// once, as an SSE comment, which clients ignore.
func writeExplain(w *frontend.StreamWriter, x *completion) error {
	if x.explained == nil {
		return nil
	}
	b := append(append([]byte(": "+headerExplain+" "), explainJSON(x.explained)...), '\n', '\n')
	x.explained = nil
	_, err := w.Write(b)
	return err
}

// serveExplain is GET /admin/explain?model=M: M's recent decisions. It
// arms recording, so a first read may find none; a model the fleet does
// not serve gets a 404, not an empty list to wait on.
func (g *Gateway) serveExplain(w http.ResponseWriter, r *http.Request) {
	g.explain.armedUntil.Store(time.Now().Add(explainArmed).UnixNano())
	model := r.URL.Query().Get("model")
	if model == "" {
		http.Error(w, "admin: explain needs ?model=", http.StatusBadRequest)
		return
	}
	if m, _ := g.pool.Load().Resolve([]byte(model)); m == nil {
		g.modelNotFound(w, model)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"model": model, "recording_for_s": int(explainArmed.Seconds()), "decisions": g.explain.recent(model)})
}

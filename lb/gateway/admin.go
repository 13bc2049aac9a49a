package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"
)

// Admin returns the admin listener's handler: /metrics, /debug/pprof/* and
// /admin/pods, /admin/index (and POST /admin/index/match) and /admin/plan. It runs on net/http: nothing here is on the request path,
// and pprof plugs in as is.
func (g *Gateway) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", g.serveMetrics)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /admin/pods", g.servePods)
	mux.HandleFunc("GET /admin/index", g.serveIndex)
	mux.HandleFunc("POST /admin/index/match", g.serveIndexMatch)
	mux.HandleFunc("GET /admin/plan", g.servePlan)
	mux.HandleFunc("GET /admin/explain", g.serveExplain)
	return mux
}

// modelNotFound answers an admin request about a model the fleet does
// not serve (an adapter's name counts as served) with a 404 naming it
// and the models it serves, one of which the caller may have meant.
func (g *Gateway) modelNotFound(w http.ResponseWriter, model string) {
	var served []string
	for _, m := range g.pool.Load().Models {
		served = append(served, m.Name)
	}
	http.Error(w, "no model "+model+" in the fleet; it serves: "+strings.Join(served, ", "), http.StatusNotFound)
}

// Metrics is the handler of the metrics listener: GET /metrics, the
// admin listener's, and nothing else.
func (g *Gateway) Metrics() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", g.serveMetrics)
	return mux
}

func (g *Gateway) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = g.metrics.writePrometheus(w)
}

// podView is one pod in GET /admin/pods.
type podView struct {
	Name      string  `json:"name"`
	Model     string  `json:"model"`
	Address   string  `json:"address"`
	Engine    string  `json:"engine"`
	Role      string  `json:"role"`
	Roleset   string  `json:"roleset,omitempty"`
	Weight    float64 `json:"weight"`
	Healthy   bool    `json:"healthy"`
	Ejected   bool    `json:"ejected"`
	Ejections int64   `json:"ejections"`
	InFlight  int64   `json:"in_flight"`
	// RemoteInFlight is the other gateway replicas' requests in flight on
	// the pod as of the shared ledger's last sync (0 when not shared).
	RemoteInFlight int64       `json:"remote_in_flight"`
	Metrics        *scrapeView `json:"metrics"`
	// Load is what the token ledgers charge the pod, in tokens, including
	// the other gateway replicas' charges when the ledger is shared through
	// Redis.
	Load ledgerView `json:"token_load"`
}

type ledgerView struct {
	Active float64 `json:"active"`
	KV     float64 `json:"kv"`
	Decode float64 `json:"decode"`
}

type scrapeView struct {
	Running      float64   `json:"running"`
	Waiting      float64   `json:"waiting"`
	KVUsage      float64   `json:"kv_usage"`
	TokensPerSec float64   `json:"tokens_per_sec"`
	ScrapedAt    time.Time `json:"scraped_at"`
}

func (g *Gateway) servePods(w http.ResponseWriter, _ *http.Request) {
	now := g.ledger.Now()
	pods := g.pool.Load().Pods
	out := make([]podView, 0, len(pods))
	for _, p := range pods {
		v := podView{
			Name: p.Config.Name, Model: p.Config.Model, Address: p.Config.Address,
			Engine: string(p.Engine), Role: p.Config.Role, Roleset: p.Config.Roleset, Weight: p.Config.Weight,
			Healthy: p.Healthy(), Ejected: p.Ejected(now), Ejections: p.Ejections(), InFlight: p.InFlight(),
		}
		v.RemoteInFlight, _ = g.ledger.Remote(p.ID)
		active, kv := g.ledger.Prefill(p.ID)
		v.Load.Active, v.Load.KV = float64(active), float64(kv)
		v.Load.Decode, _ = g.ledger.Decode(p.ID, g.ledger.Now())
		if s := p.Scraped(); s != nil {
			v.Metrics = &scrapeView{Running: s.Running, Waiting: s.Waiting, KVUsage: s.KVUsage, TokensPerSec: s.TokensPerSec, ScrapedAt: s.At}
		}
		out = append(out, v)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"pods": out})
}

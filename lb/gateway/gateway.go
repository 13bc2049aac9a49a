// Package gateway is pdlb's request path: it takes an OpenAI request from a
// front end, picks a pod, forwards the body byte for byte, and relays the
// response (SSE event by event) back, with errors in OpenAI's shape.
package gateway

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
)

// Gateway serves the OpenAI API over a pool of pods. Create it with New,
// serve Handler on a front end and Admin on the admin listener, and Close it.
type Gateway struct {
	cfg     config.Config
	pool    pool.Pool
	checker *pool.Checker
	metrics *gatewayMetrics
	log     *slog.Logger
	// inFlight counts requests between parsing and their last byte.
	inFlight atomic.Int64
	// models is the body of GET /v1/models, rendered once per snapshot.
	models []byte
}

// New builds a gateway over a validated configuration and starts its health
// checks.
func New(cfg config.Config, log *slog.Logger) (*Gateway, error) {
	snap, err := pool.Build(&cfg, dialUpstream)
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: log, models: renderModels(snap)}
	g.metrics = newMetrics(snap, &g.inFlight)
	g.pool.Publish(snap)
	g.checker = pool.StartChecker(snap, cfg.Health, log)
	return g, nil
}

// Close stops the health checks and closes idle upstream connections.
func (g *Gateway) Close() {
	g.checker.Close()
	for _, p := range g.pool.Load().Pods {
		p.Client.CloseIdleConnections()
	}
}

// Snapshot returns the current view of the fleet.
func (g *Gateway) Snapshot() *pool.Snapshot { return g.pool.Load() }

// Handler serves the OpenAI API.
func (g *Gateway) Handler(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch string(path) {
	case "/v1/chat/completions":
		g.serveCompletion(ctx, openai.KindChat)
	case "/v1/completions":
		g.serveCompletion(ctx, openai.KindCompletion)
	case "/v1/models":
		if !allow(ctx, fasthttp.MethodGet) {
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(g.models)
	case "/health":
		// Liveness: the process serves requests.
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/ready":
		g.serveReady(ctx)
	default:
		writeError(ctx, openai.InvalidURL(ctx.Method(), path))
	}
}

// ErrorHandler answers what fasthttp rejects before the handler runs (an
// oversized body, a malformed request line) in OpenAI's error shape.
func (g *Gateway) ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, openai.BodyTooLarge(g.cfg.MaxBodyBytes))
		return
	}
	writeError(ctx, &openai.Error{Status: fasthttp.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: "Malformed HTTP request: " + err.Error()})
}

// serveReady answers 200 when every model has an available pod, else 503
// naming those that have none.
func (g *Gateway) serveReady(ctx *fasthttp.RequestCtx) {
	now := time.Now().UnixNano()
	var missing []byte
	for _, m := range g.pool.Load().Models {
		ok := false
		for _, p := range m.Combined {
			ok = ok || p.Available(now)
		}
		if !ok {
			missing = append(append(missing, ' '), m.Name...)
		}
	}
	if missing != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("no available pod for:" + string(missing) + "\n")
		return
	}
	ctx.SetBodyString("ready\n")
}

func allow(ctx *fasthttp.RequestCtx, method string) bool {
	if string(ctx.Method()) == method {
		return true
	}
	ctx.Response.Header.Set("Allow", method)
	writeError(ctx, openai.MethodNotAllowed(ctx.Method(), ctx.Path()))
	return false
}

func renderModels(s *pool.Snapshot) []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, m := range s.Models {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, m.Name)
		b = append(b, `,"object":"model","owned_by":"pdlb"}`...)
	}
	return append(b, "]}"...)
}

// exchange is the per-request state, pooled so a request allocates nothing
// the next one could reuse.
type exchange struct {
	req     *openai.Request
	rreq    route.Request
	cands   []route.Candidate
	pods    []*pool.Pod
	scratch []float64
	tried   []int32
	buf     []byte
	events  openai.Splitter
	tokens  openai.TokenCounter
	start   time.Time
}

var exchangePool = sync.Pool{New: func() any {
	return &exchange{buf: make([]byte, 32<<10)}
}}

func acquireExchange() *exchange {
	x := exchangePool.Get().(*exchange)
	x.req = openai.AcquireRequest()
	x.start = time.Now()
	return x
}

func releaseExchange(x *exchange) {
	openai.ReleaseRequest(x.req)
	x.req = nil
	x.cands, x.pods, x.tried = x.cands[:0], x.pods[:0], x.tried[:0]
	x.events.Reset()
	x.tokens.Reset()
	exchangePool.Put(x)
}

// pick chooses an available combined pod of m that x has not tried yet, or
// nil if none is left.
func (g *Gateway) pick(m *pool.Model, x *exchange) *pool.Pod {
	now := time.Now().UnixNano()
	x.cands, x.pods = x.cands[:0], x.pods[:0]
	for _, p := range m.Combined {
		if !p.Available(now) || tried(x.tried, p.ID) {
			continue
		}
		c := route.Candidate{Pod: p.ID, InFlight: int(p.InFlight()), Weight: p.Config.Weight}
		if s := p.Scraped(); s != nil {
			c.HasMetrics = true
			c.Running, c.Waiting, c.KVUsage = int(s.Running), int(s.Waiting), s.KVUsage
		}
		x.cands = append(x.cands, c)
		x.pods = append(x.pods, p)
	}
	if cap(x.scratch) < len(x.cands) {
		x.scratch = make([]float64, len(x.cands))
	}
	x.rreq = route.Request{PromptTokens: x.req.PromptTokens(), Rand: rand.Uint64()}
	i := m.Policy.Pick(&x.rreq, x.cands, x.scratch[:len(x.cands)])
	if i < 0 {
		return nil
	}
	return x.pods[i]
}

func tried(ids []int32, id int32) bool {
	for _, t := range ids {
		if t == id {
			return true
		}
	}
	return false
}

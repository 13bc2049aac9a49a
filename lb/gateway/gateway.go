// Package gateway is pdlb's request path: it takes an OpenAI request from a
// front end, picks a pod, forwards the body byte for byte, and relays the
// response (SSE event by event) back, with errors in OpenAI's shape.
//
// A completion request reads in this order: serve.go (Handler's parse
// stage), stages.go (pick, admit, attempt, and every retry), transport.go
// (the event loop's connection or a worker's call), relay.go (respond,
// relay, finish), errors.go (lb/fail's one error type, written).
// placement.go and admission.go are the pick's and admission's helpers;
// pd.go decides a PD pair and pd_host.go lends the request to its
// exchange, which lb/pd drives; lb/upstream holds the pods' connections.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"pdlb/internal/spaced"
	"pdlb/internal/tracing"
	"pdlb/lb/accesslog"
	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/frontend"
	"pdlb/lb/kvindex"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// Gateway serves the OpenAI API over a pool of pods. Create it with New,
// serve Handler on a front end and Admin on the admin listener, and Close it.
type Gateway struct {
	cfg     config.Config
	pool    pool.Pool
	checker *pool.Checker
	metrics *gatewayMetrics
	log     *slog.Logger
	// keys are the clients' API keys and their limits (nil: none
	// needed), replaced by a reload.
	keys atomic.Pointer[limits.Keys]
	// corsPolicy answers browsers' cross-origin calls (cors.go).
	corsPolicy corsPolicy
	// tokenizing holds a slot per request read or tokenized off the event
	// loops (stageParse, stageTokenize, stageRetokenize), GOMAXPROCS of
	// them: no more at once than the cores, as the loops themselves took
	// them one at a time each, so a burst of large prompts neither outruns
	// the loops for the cores nor holds each one's rendering and ids at
	// once.
	tokenizing chan struct{}
	// homes remembers the pods of stored responses, conversations those
	// of Responses API conversations by prompt_cache_key (responses.go);
	// nil when max_stored_responses is 0.
	homes, conversations *homes
	// conns caps client connections per address; fds keeps the last file
	// descriptors for accepting, and dial opens pods' connections through
	// it.
	conns *limits.Conns
	fds   *limits.FDs
	dial  pool.DialFunc
	// ledger holds the token charges of every pod; admit is nil when
	// admission is off.
	ledger *ledger.Ledger
	admit  *admit.Controller
	// mu serialises reloads; it guards checker and kv, which a reload
	// replaces, and held, and is never taken on the request path.
	mu sync.Mutex
	// held are the pods a planner took out of the fleet to switch their
	// roles, by name, until it puts them back (planFleet). A reload or a
	// discovery update meanwhile leaves them out, as their new versions.
	held map[string]config.Pod
	// draining is set by Drain.
	draining atomic.Bool
	// ejectMu serialises passive ejections (podFailed), which are rare.
	ejectMu sync.Mutex
	// keptLog and notSentLog space the lines of a pod kept in at the
	// ejection cap and of a request moved to another pod.
	keptLog, notSentLog spaced.Lines
	// inexactLog spaces the warning for prompts routed without the index
	// because they could not be tokenized as the engine would.
	inexactLog spaced.Lines
	// kv follows the pods' KV events into the models' prefix indexes;
	// ranked is its kvFeeds.ranked, for requests to read without g.mu.
	kv     *kvFeeds
	ranked atomic.Pointer[map[int32]*kvindex.Pod]
	// stop ends the background loops (ledger janitor, shared ledger).
	stop context.CancelFunc
	bg   sync.WaitGroup
	// aborting is set when a shutdown's grace is over: relays end their
	// streams at their next read, which AbortStreams brings forward for
	// what works on workers (aborts: pod calls, relays reading their
	// pods' connections); requests waiting for admission, a retry or an
	// adapter's load stop waiting (interrupted).
	aborting atomic.Bool
	aborted  chan struct{} // closed with aborting set, for waits that select
	aborts   struct {
		sync.Mutex
		set map[upstream.Cutter]struct{}
	}
	// nextID numbers requests for the ledger and the admission queue.
	nextID atomic.Uint64
	// epoch is when the gateway started: time zero of admission's clock.
	epoch time.Time
	// inFlight counts requests between parsing and their last byte.
	inFlight atomic.Int64
	// shared: the ledger is shared with other replicas (sharedledger.go);
	// set in New.
	shared bool
	// redis is redis.address's client, nil without one; closed after the
	// background loops that use it. replica names this gateway there
	// (redis.replica_id, or a random one).
	redis   *redis.Client
	replica string
	// exchanges are the loops that exchange with the other replicas
	// through redis, for pdlb_redis_exchange_up; set up by New.
	exchanges []exchange
	// plan is the planning loop, nil when plan.enabled is off (plan.go).
	plan *planLoop
	// access is the access log, nil when access_log is off (accesslog.go).
	access *accesslog.Log
	// tracer is nil when tracing is off; explain keeps decisions (trace.go,
	// explain.go).
	tracer  *tracing.Tracer
	tracing *tracing.Provider
	explain *explainer
}

// New builds a gateway over a validated configuration and starts its health
// checks.
func New(cfg config.Config, log *slog.Logger) (*Gateway, error) {
	fds, err := limits.NewFDs(log)
	if err != nil {
		return nil, err
	}
	dial := upstream.Dialer(fds)
	snap, err := pool.Build(&cfg, dial, nil)
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: log, epoch: time.Now(), conns: limits.NewConns(cfg.Access.Conns), fds: fds, dial: dial,
		corsPolicy: newCORS(cfg.CORS), homes: newHomes(cfg.MaxStoredResponses),
		conversations: newHomes(cfg.MaxStoredResponses), tokenizing: make(chan struct{}, runtime.GOMAXPROCS(0)), aborted: make(chan struct{})}
	g.logIgnoredKnobs(snap)
	if cfg.Admission.Enabled {
		if g.admit, err = admit.New(cfg.Admission.AdmitConfig()); err != nil {
			return nil, err
		}
	}
	keys, err := limits.NewKeys(cfg.Access.APIKeys)
	if err != nil {
		return nil, err
	}
	g.keys.Store(keys)
	g.ledger = ledger.New(cfg.TokenLoad, ledger.Env{Logger: log})
	g.ledger.SetPods(ledgerMembers(snap))
	if g.kv, err = startKVFeeds(snap, nil, log); err != nil {
		return nil, err
	}
	g.ranked.Store(&g.kv.ranked)
	if cfg.AccessLog != "" {
		if g.access, err = accesslog.Open(cfg.AccessLog, log); err != nil {
			g.kv.close(nil)
			return nil, err
		}
	}
	if err := g.startObserving(os.LookupEnv); err != nil {
		g.kv.close(nil)
		if g.access != nil {
			_ = g.access.Close()
		}
		return nil, err
	}
	g.metrics = newMetrics(&g.inFlight)
	g.metrics.set.NewGauge("pdlb_stored_responses", func() float64 { return float64(g.homes.len()) })
	g.metrics.set.NewGauge("pdlb_responses_conversations", func() float64 { return float64(g.conversations.len()) })
	g.metrics.addModels(snap)
	g.ledger.RegisterMetrics(g.metrics.set)
	g.metrics.set.RegisterMetricsWriter(func(w io.Writer) { g.keys.Load().WritePrometheus(w) })
	g.metrics.set.RegisterMetricsWriter(g.conns.WritePrometheus)
	g.metrics.set.RegisterMetricsWriter(g.fds.WritePrometheus)
	g.metrics.set.RegisterMetricsWriter(g.writeDynamicMetrics)
	if g.access != nil {
		g.metrics.set.RegisterMetricsWriter(g.access.WritePrometheus)
	}
	g.pool.Publish(snap)
	g.checker = pool.StartChecker(snap, cfg.Health, cfg.Upstream.KeepaliveTimeout, log)
	ctx, cancel := context.WithCancel(context.Background())
	g.stop = cancel
	g.background(func() { g.ledger.RunJanitor(ctx) })
	g.background(func() { g.rebuildBuckets(ctx) })
	if cfg.Redis.Address != "" {
		g.redis, g.replica = newRedis(cfg.Redis.Address, log), cfg.Redis.ReplicaID
		if g.replica == "" {
			g.replica = ledger.NewReplicaID()
		}
	}
	if cfg.Redis.Address != "" && cfg.TokenLoad.SharedLedger {
		g.startSharedLedger(ctx)
	}
	if cfg.Redis.Address != "" {
		g.shareKeyLimits(ctx)
	}
	g.startPlan(ctx)
	return g, nil
}

func (g *Gateway) background(f func()) {
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		f()
	}()
}

// Reload applies a new fleet (pods and models) and API keys without
// dropping connections or requests: pods whose configuration is unchanged
// keep their state and connections, models keep their series, requests in
// flight finish on the snapshot they started with, a key kept keeps its
// counts, and one removed is refused from then on while its requests in
// flight finish. The listeners' certificate lists are the server's to
// apply (lb.Server.Reload). Every other setting is read on the request
// path and changes only on restart; Reload refuses a configuration that
// changes one.
func (g *Gateway) Reload(cfg config.Config) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reloadHoldingLocked(cfg)
}

// reloadHoldingLocked is reloadLocked for a fleet from outside (the
// operator's configuration, discovery): the pods the planner holds stay
// out of it, held as cfg has them now; one cfg lacks is held no more, so
// the planner does not bring it back. mu is held.
func (g *Gateway) reloadHoldingLocked(cfg config.Config) error {
	if len(g.held) == 0 {
		return g.reloadLocked(cfg)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	held := map[string]config.Pod{}
	cfg.Pods = slices.DeleteFunc(slices.Clone(cfg.Pods), func(p config.Pod) bool {
		if _, ok := g.held[p.Name]; ok {
			held[p.Name] = p
			return true
		}
		return false
	})
	if err := g.reloadLocked(cfg); err != nil {
		return err
	}
	g.held = held
	return nil
}

// reloadLocked is Reload with mu held.
func (g *Gateway) reloadLocked(cfg config.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	same := cfg
	same.Pods, same.Models, same.Access.APIKeys = g.cfg.Pods, g.cfg.Models, g.cfg.Access.APIKeys
	same.TLS.Certificates, same.TLS.AdminCertificates = g.cfg.TLS.Certificates, g.cfg.TLS.AdminCertificates
	if d := config.Diff(g.cfg, same); d != "" {
		return fmt.Errorf("%w: %s needs a restart (only pods, models, api_keys and certificate lists change on reload)", config.ErrInvalid, d)
	}
	keys, err := g.keys.Load().Reload(cfg.Access.APIKeys)
	if err != nil {
		return err
	}
	prev := g.pool.Load()
	snap, err := pool.Build(&cfg, g.dial, prev)
	if err != nil {
		return err
	}
	kv, err := startKVFeeds(snap, g.kv, g.log)
	if err != nil {
		return err
	}
	snap.Commit()
	g.logIgnoredKnobs(snap)
	g.ledger.SetPods(ledgerMembers(snap))
	g.metrics.addModels(snap)
	g.pool.Publish(snap)
	keys.Install(time.Now())
	g.keys.Store(keys)
	g.cfg.Pods, g.cfg.Models, g.cfg.Access.APIKeys = cfg.Pods, cfg.Models, cfg.Access.APIKeys
	// The server serves cfg's certificate lists once this returns nil.
	g.cfg.TLS.Certificates, g.cfg.TLS.AdminCertificates = cfg.TLS.Certificates, cfg.TLS.AdminCertificates
	g.checker.Close()
	g.checker = pool.StartChecker(snap, cfg.Health, cfg.Upstream.KeepaliveTimeout, g.log)
	g.kv.close(kv)
	g.kv = kv
	g.ranked.Store(&kv.ranked)
	// Pods that left keep their connections only as long as requests in
	// flight use them, and are out of the picks of requests that still
	// hold prev (a PD decode leg moved, a pick racing the reload): their
	// health is no longer checked, and they may be shutting down.
	kept := map[*fasthttp.HostClient]bool{}
	for _, p := range snap.Pods {
		kept[p.Client] = true
	}
	for _, p := range prev.Pods {
		if !kept[p.Client] {
			p.Client.CloseIdleConnections()
			p.Leave()
		}
	}
	g.log.Info("configuration reloaded", "pods", len(snap.Pods), "models", len(snap.Models))
	return nil
}

// logIgnoredKnobs names, at start and on each reload, the profiles whose
// conditional disaggregation s's models ignore: their decode pods refuse a
// request that did not go through the exchange.
func (g *Gateway) logIgnoredKnobs(s *pool.Snapshot) {
	for _, m := range s.Models {
		if m.Profiles == nil || len(m.Decode) == 0 {
			continue
		}
		for _, name := range m.Profiles.IgnoredLocalPrefill() {
			g.log.Warn("pd.local_prefill_max_tokens ignored: this engine's decode pods refuse a request without the prefill/decode exchange's fields, so every request takes the exchange",
				"model", m.Name, "profile", name, "engine", m.Decode[0].Config.Engine)
		}
	}
}

// ledgerMembers are s's pods as the ledger knows them: by id, which a pod
// keeps across reloads, so its counters follow it; by UID (else name)
// among replicas.
func ledgerMembers(s *pool.Snapshot) []ledger.Member {
	m := make([]ledger.Member, len(s.Pods))
	for i, p := range s.Pods {
		m[i] = ledger.Member{ID: p.ID, Name: p.Config.Name, Key: p.Config.UID, Load: p}
	}
	return m
}

// Config returns the configuration in force, the pods the planner holds
// out of routing among its pods: reloading it (SIGHUP without a config
// file) changes nothing, and keeps them held.
func (g *Gateway) Config() config.Config {
	g.mu.Lock()
	defer g.mu.Unlock()
	cfg := g.cfg
	if len(g.held) > 0 {
		cfg.Pods = slices.Clone(cfg.Pods)
		for _, name := range sortedKeys(g.held) {
			cfg.Pods = append(cfg.Pods, g.held[name])
		}
	}
	return cfg
}

// SetPods replaces the fleet, as a discovery source reports it. It runs
// under mu, as a reload does, so a reload landing at the same time is
// neither undone nor undoes it.
func (g *Gateway) SetPods(pods []config.Pod) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	cfg := g.cfg
	cfg.Pods = pods
	return g.reloadHoldingLocked(cfg)
}

// editPods reloads with the fleet edit makes of the pods in force and of
// the held ones (a slice and a map of its own; the map is held from then
// on), under mu as SetPods.
func (g *Gateway) editPods(edit func(pods []config.Pod, held map[string]config.Pod) []config.Pod) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	cfg := g.cfg
	held := maps.Clone(g.held)
	if held == nil {
		held = map[string]config.Pod{}
	}
	cfg.Pods = edit(slices.Clone(cfg.Pods), held)
	if err := g.reloadLocked(cfg); err != nil {
		return err
	}
	g.held = held
	return nil
}

// AbortStreams ends what still runs at the end of a shutdown's grace:
// every stream still relayed, with an error event, and every pod call of
// a request still waiting for its answer, with a 503 that says to retry.
// On a worker at once (its pod call is cut, its relay's read woken: the
// abort Cut); on an event loop a relay at its next read, and the front
// end's AbortRelays ends the rest.
func (g *Gateway) AbortStreams() {
	if !g.aborting.Swap(true) {
		close(g.aborted)
	}
	g.aborts.Lock()
	defer g.aborts.Unlock()
	for c := range g.aborts.set {
		c.Cut()
	}
}

// abortCut is the end of the shutdown's grace as an upstream.Cut: a
// watched call is cut by AbortStreams, or at once once it ran. A
// registry, not a goroutine or a timer per call.
type abortCut struct{ g *Gateway }

func (a abortCut) Watch(c upstream.Cutter) {
	g := a.g
	g.aborts.Lock()
	if g.aborts.set == nil {
		g.aborts.set = make(map[upstream.Cutter]struct{})
	}
	g.aborts.set[c] = struct{}{}
	g.aborts.Unlock()
	// After the registration: either AbortStreams finds c, or c finds
	// the flag it set first.
	if g.aborting.Load() {
		c.Cut()
	}
}

func (a abortCut) Unwatch(c upstream.Cutter) {
	g := a.g
	g.aborts.Lock()
	defer g.aborts.Unlock()
	delete(g.aborts.set, c)
}

// Conns is the per-address cap on client connections, for the front end.
func (g *Gateway) Conns() *limits.Conns { return g.conns }

// FDs is the open-files guard, for the front end's accepts and dials.
func (g *Gateway) FDs() *limits.FDs { return g.fds }

// Drain announces a shutdown to come while requests are still served:
// /ready answers 503, so balancers and Kubernetes stop sending new
// clients, and every answer closes its connection, so keep-alive clients
// reconnect elsewhere.
func (g *Gateway) Drain() { g.draining.Store(true) }

// Close stops the health checks, KV-event feeds and background loops, and
// closes idle upstream connections.
func (g *Gateway) Close() {
	g.stop()
	g.bg.Wait()
	if g.redis != nil {
		_ = g.redis.Close()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.checker.Close()
	g.kv.close(nil)
	for _, p := range g.pool.Load().Pods {
		p.Client.CloseIdleConnections()
	}
	g.stopTracing()
	if g.access != nil {
		if err := g.access.Close(); err != nil {
			g.log.Warn("closing the access log", "err", err)
		}
	}
}

// ReopenLogs opens the access log's file anew, after rotation moved it.
func (g *Gateway) ReopenLogs() error {
	if g.access == nil {
		return nil
	}
	return g.access.Reopen()
}

// Handler serves the OpenAI API.
func (g *Gateway) Handler(ctx *fasthttp.RequestCtx) {
	var start time.Time
	if g.access != nil {
		start = time.Now()
	}
	if g.draining.Load() {
		// Each client moves to another replica after this answer.
		ctx.SetConnectionClose()
	}
	path := pathOf(ctx)
	if n := ctx.Request.Header.Len(); n > g.cfg.MaxHeaders {
		ctx.SetConnectionClose()
		g.corsFields(ctx)
		e := &openai.Error{Status: fasthttp.StatusRequestHeaderFieldsTooLarge, Type: openai.TypeInvalidRequest,
			Message: "The request has " + strconv.Itoa(n) + " header fields; the limit is " + strconv.Itoa(g.cfg.MaxHeaders) + "."}
		writeFailure(ctx, answer(e))
		// Counted under no model, as ErrorHandler's 431 for too many
		// header bytes.
		g.metrics.countRequest(nil, e.Status)
		g.logPlain(ctx, start, e)
		return
	}
	if preflight, e := g.cors(ctx); preflight {
		g.logPlain(ctx, start, e)
		return
	}
	var e *openai.Error
	if kind, ok := openai.KindFromPath(path); ok {
		if e = notAllowed(ctx, fasthttp.MethodPost); e == nil {
			// Logged when its answer is done.
			g.serveCompletion(ctx, kind)
			return
		}
		g.metrics.countRequest(nil, fasthttp.StatusMethodNotAllowed)
		g.logPlain(ctx, start, e)
		return
	}
	if _, sub, ok := openai.StoredID(path); ok {
		if e = g.serveStored(ctx, sub); e == nil {
			return // logged when its answer is done
		}
		g.metrics.countRequest(nil, e.Status)
		g.logPlain(ctx, start, e)
		return
	}
	switch string(path) {
	case "/v1/models":
		if e = notAllowed(ctx, fasthttp.MethodGet); e != nil {
			break
		}
		// Keys guard every API path, as OpenAI's: the list names the
		// models and adapters served.
		if _, d := g.keys.Load().Lookup(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), ctx.Request.Header.Peek("X-Api-Key")); !d.OK() {
			e = d.Error()
			writeFailure(ctx, answer(e))
			break
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(renderModels(g.pool.Load()))
	case "/health":
		// Liveness: the process serves requests.
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/ready":
		g.serveReady(ctx)
	default:
		e = openai.InvalidURL(ctx.Method(), path)
		writeFailure(ctx, answer(e))
	}
	if e != nil {
		// Under no model, as the API paths' refusals: a client with a
		// wrong base URL or no key shows on the dashboards.
		g.metrics.countRequest(nil, e.Status)
	}
	g.logPlain(ctx, start, e)
}

// ErrorHandler answers what the front end rejects before the handler runs
// (an oversized body or head, a malformed request line) in OpenAI's error
// shape, counted under no model.
func (g *Gateway) ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	if e := g.requestError(ctx, err); e != nil {
		g.corsFields(ctx)
		writeFailure(ctx, answer(e))
		g.metrics.countRequest(nil, e.Status)
		g.logPlain(ctx, time.Time{}, e)
	}
}

// requestError is the answer to a request the front end could not read,
// nil when there is none to give.
func (g *Gateway) requestError(ctx *fasthttp.RequestCtx, err error) *openai.Error {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		return openai.BodyTooLarge(g.cfg.MaxBodyBytes)
	}
	if frontend.HeadTooLarge(err) {
		return &openai.Error{Status: fasthttp.StatusRequestHeaderFieldsTooLarge, Type: openai.TypeInvalidRequest,
			Message: "The request's headers exceed the limit of " + strconv.Itoa(g.cfg.MaxHeaderBytes) + " bytes."}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		if r, ok := ctx.Conn().(interface{ Received() bool }); ok && !r.Received() {
			// The client never sent a byte: no request to answer (see
			// limits.Conns). Closing first makes fasthttp's write of
			// the error response fail silently.
			_ = ctx.Conn().Close()
			return nil
		}
		return &openai.Error{Status: fasthttp.StatusRequestTimeout, Type: openai.TypeInvalidRequest,
			Message: "The request was not received within " + g.cfg.ClientReadTimeout.String() + "."}
	}
	return &openai.Error{Status: fasthttp.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: "Malformed HTTP request: " + frontend.ErrorText(err)}
}

// serveReady answers 200 when every model has an available pod, else 503
// naming those that have none.
func (g *Gateway) serveReady(ctx *fasthttp.RequestCtx) {
	if g.draining.Load() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("draining\n")
		return
	}
	now := g.ledger.Now()
	snap := g.pool.Load()
	if len(snap.Models) == 0 {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("no pods yet\n")
		return
	}
	var missing []byte
	for _, m := range snap.Models {
		if !servable(m, now) {
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

// servable reports whether m can serve a request now: an available
// combined pod, or an available prefill and decode pod in one roleset
// (pairs never cross rolesets).
func servable(m *pool.Model, now int64) bool {
	for _, p := range m.Combined {
		if p.Available(now) {
			return true
		}
	}
	prefill := make([]bool, len(m.Rolesets))
	for _, p := range m.Prefill {
		prefill[p.Roleset] = prefill[p.Roleset] || p.Available(now)
	}
	for _, p := range m.Decode {
		if prefill[p.Roleset] && p.Available(now) {
			return true
		}
	}
	return false
}

// notAllowed answers 405 (with Allow) and returns the error when ctx's
// method is not method; nil when it is.
func notAllowed(ctx *fasthttp.RequestCtx, method string) *openai.Error {
	if string(ctx.Method()) == method {
		return nil
	}
	ctx.Response.Header.Set("Allow", method)
	e := openai.MethodNotAllowed(ctx.Method(), ctx.Path())
	writeFailure(ctx, answer(e))
	return e
}

package sim

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/chat"
	"pdlb/engines/tokenize"
	"pdlb/kvxfer"
	"pdlb/radix"
)

// Pod is one live simulated engine: an HTTP server speaking the OpenAI API
// the way the engine it plays does, in front of a scheduler that applies the
// timing model to wall time divided by Speedup.
type Pod struct {
	cfg     Config
	seed    uint64 // engineSeed(model, HashSeed)
	created int64  // unix seconds, for /v1/models
	routes  map[string]route
	m       *podMetrics
	sched   *scheduler
	lora    *adapters // registered LoRA adapters
	// responses are the Responses API's stored responses (responses.go).
	responses responseStore
	ln        net.Listener
	srv       *fasthttp.Server
	served    chan struct{} // closed when Serve returned
	// xfer serves a prefill pod's held KV (nil until the pod first plays
	// prefill; kept after it leaves the role, so decode pods can still pull
	// what it held); transport pulls a decode leg's.
	xfer      atomic.Pointer[kvxfer.Server]
	transport kvxfer.Transport
	// role is the role served and the state of a role switch; active
	// counts the generation requests being served, which a switch drains
	// (roleswitch.go).
	role   atomic.Pointer[roleView]
	active atomic.Int64
	// switchMu orders starting a switch before Close waits for switching.
	switchMu  sync.Mutex
	switching sync.WaitGroup

	connMu sync.Mutex
	conns  map[net.Conn]struct{} // open client connections, for Kill
	// accepted counts the client connections accepted, for Stats.
	accepted atomic.Int64
	killed   bool

	closeOnce sync.Once
	closeErr  error
}

type route struct {
	get, post bool
	h         func(ctx *fasthttp.RequestCtx)
}

// Timing of the HTTP side.
const (
	// disconnectPoll is how often a waiting handler checks whether its
	// client hung up (wall time).
	disconnectPoll = 20 * time.Millisecond
	// idleTimeout closes a keep-alive connection idle this long: uvicorn's
	// timeout_keep_alive, 5 s by default, under vLLM, SGLang and
	// trtllm-serve alike.
	idleTimeout = 5 * time.Second
	// idleWorker is how long fasthttp keeps an idle worker goroutine, and
	// how often its pool's cleaner wakes; the cleaner notices Close only
	// then, so this bounds how long a pod's last goroutine outlives it.
	idleWorker   = 250 * time.Millisecond
	shutdownWait = 10 * time.Second
	maxBodySize  = 64 << 20
)

// Start validates cfg (after defaults), listens and serves until Close.
func Start(cfg Config) (*Pod, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("sim: pod %s: %w", cfg.Name, err)
	}
	if cfg.Name == defaultNamePrefix+DefaultListen {
		cfg.Name = defaultNamePrefix + ln.Addr().String()
	}
	start := time.Now()
	p := &Pod{
		cfg:       cfg,
		seed:      engineSeed(cfg.Model, cfg.HashSeed),
		created:   start.Unix(),
		ln:        ln,
		served:    make(chan struct{}),
		transport: kvxfer.TCP{},
		conns:     map[net.Conn]struct{}{},
	}
	p.role.Store(&roleView{Role: cfg.Role, State: StateServing})
	if cfg.Role == RolePrefill {
		if err := p.listenKV(); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("sim: pod %s: %w", cfg.Name, err)
		}
	}
	p.m = newPodMetrics(cfg, func() float64 { return time.Since(start).Seconds() * cfg.Speedup })
	p.sched = newScheduler(cfg, p.m, start)
	p.lora = newAdapters(cfg)
	p.routes = p.routeTable()
	p.srv = &fasthttp.Server{
		Handler:               p.serveHTTP,
		Name:                  "pdlb-sim",
		IdleTimeout:           idleTimeout,
		MaxIdleWorkerDuration: idleWorker,
		MaxRequestBodySize:    maxBodySize,
		CloseOnShutdown:       true,
		NoDefaultContentType:  true,
		ConnState:             p.trackConn,
		Logger:                quietOnceKilled{p},
	}
	go p.sched.run()
	go func() {
		defer close(p.served)
		_ = p.srv.Serve(ln) // returns nil on Shutdown; other errors end the pod the same way
	}()
	return p, nil
}

// Addr returns the host:port the pod listens on.
func (p *Pod) Addr() string { return p.ln.Addr().String() }

// Config returns the pod's configuration, defaults applied; its Role is
// the role the pod started in (Role says the one it serves now).
func (p *Pod) Config() Config { return p.cfg }

// KVXferAddr returns the host:port of a prefill pod's KV transfer server
// (SGLang's bootstrap server), "" on a pod that never played prefill.
func (p *Pod) KVXferAddr() string {
	if x := p.xfer.Load(); x != nil {
		return x.Addr()
	}
	return ""
}

// listenKV starts the pod's KV transfer server.
func (p *Pod) listenKV() error {
	x, err := kvxfer.Listen(kvxfer.ServerConfig{Listen: p.cfg.KVXferListen, Pace: p.kvPace})
	if err != nil {
		return err
	}
	p.xfer.Store(x)
	return nil
}

// quietOnceKilled is the pod server's logger: the standard logger, as
// fasthttp's default, until Kill cuts the connections under their
// handlers, whose writes then fail by the hundred ("use of closed network
// connection") where a crashed engine would say nothing.
type quietOnceKilled struct{ p *Pod }

func (l quietOnceKilled) Printf(format string, args ...any) {
	l.p.connMu.Lock()
	killed := l.p.killed
	l.p.connMu.Unlock()
	if !killed {
		log.Printf(format, args...)
	}
}

// trackConn keeps the set of open connections Kill cuts.
func (p *Pod) trackConn(c net.Conn, state fasthttp.ConnState) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	switch state {
	case fasthttp.StateNew:
		if p.killed {
			_ = c.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.accepted.Add(1)
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(p.conns, c)
	}
}

// Kill stops the pod as a crash does: every client connection is cut at
// once, mid-stream responses included (their clients see the connection
// break, not an end of stream), then the pod closes.
func (p *Pod) Kill() error {
	p.connMu.Lock()
	p.killed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.connMu.Unlock()
	return p.Close()
}

// Close aborts the requests in flight (streams end with finish_reason
// "abort", as vLLM's do when it shuts down), waits for their responses to
// be written, closes the listener and connections and stops every
// goroutine. It is safe to call more than once.
func (p *Pod) Close() error {
	p.closeOnce.Do(func() {
		close(p.sched.done)
		<-p.sched.exited
		// A role switch under way ends on done, and none starts once
		// done is closed (SwitchRole checks it under switchMu, so taking
		// the lock orders its Add before this Wait); after it no one
		// starts the KV transfer server.
		p.switchMu.Lock()
		p.switchMu.Unlock()
		p.switching.Wait()
		if x := p.xfer.Load(); x != nil {
			// Drops what is held, which ends prefill legs waiting for
			// pickup.
			_ = x.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
		defer cancel()
		p.closeErr = p.srv.ShutdownWithContext(ctx)
		// Shutdown closes only listeners Serve has registered; one closed
		// right after Start may run before Serve does, so close ours too.
		_ = p.ln.Close()
		<-p.served
	})
	return p.closeErr
}

// Stats is a snapshot of a pod's scheduler and counters.
type Stats struct {
	Running, Waiting int // requests admitted to the batch, and queued
	UsedBlocks       int // KV blocks held by running requests, a shared one once
	KVUsage          float64
	PromptTokens     int64 // prompt tokens prefilled
	GeneratedTokens  int64
	QueriedTokens    int64 // prompt tokens looked up in the prefix cache
	HitTokens        int64 // of which found cached
	Finished         int64 // requests finished, aborted ones included
	Aborted          int64
	// HeldKVBlocks are the blocks of finished prefill legs a prefill pod
	// holds for pickup (part of UsedBlocks).
	HeldKVBlocks int
	// KVPulls and KVPullFailures count a decode pod's KV transfers;
	// KVExpired a prefill pod's holds nobody picked up in time.
	KVPulls, KVPullFailures, KVExpired int64
	// Accepted counts the HTTP connections the pod accepted: a client
	// that keeps its connections alive opens few.
	Accepted int64
	// AdapterLoads counts the LoRA adapters the pod brought into a GPU
	// slot: a swap each once its slots are full.
	AdapterLoads int64
}

// Stats returns the pod's current state; the gauges are as of the
// scheduler's last wake-up.
func (p *Pod) Stats() Stats {
	m := p.m
	s := Stats{
		Running:         int(m.running.Load()),
		Waiting:         int(m.waiting.Load()),
		UsedBlocks:      int(m.usedBlocks.Load()),
		KVUsage:         m.kvUsage(),
		PromptTokens:    m.promptTokens.Load(),
		GeneratedTokens: m.tokens.generated.Load(),
		QueriedTokens:   m.tokens.queried.Load(),
		HitTokens:       m.tokens.hit.Load(),
		Aborted:         m.finished[finishAbort].Load(),
		HeldKVBlocks:    int(m.pinnedBlocks.Load()),
		KVPulls:         m.kvPulls.Load(),
		KVPullFailures:  m.kvPullFailures.Load(),
		KVExpired:       m.kvExpired.Load(),
		Accepted:        p.accepted.Load(),
		AdapterLoads:    m.adapterLoads.Load(),
	}
	for r := finishStop; r < numFinish; r++ {
		s.Finished += m.finished[r].Load()
	}
	return s
}

// ResetPrefixCache drops the pod's prefix cache, reporting AllBlocksCleared
// to the KV event sink; false when the pod is closing.
func (p *Pod) ResetPrefixCache() bool { return p.sched.send(schedMsg{kind: msgClearCache}) }

func (p *Pod) routeTable() map[string]route {
	post := func(h func(*fasthttp.RequestCtx)) route { return route{post: true, h: h} }
	get := func(h func(*fasthttp.RequestCtx)) route { return route{get: true, h: h} }
	rt := map[string]route{
		"/v1/chat/completions": post(func(ctx *fasthttp.RequestCtx) { p.generate(ctx, true) }),
		"/v1/completions":      post(func(ctx *fasthttp.RequestCtx) { p.generate(ctx, false) }),
		"/v1/models":           get(p.models),
		"/health":              get(p.health),
		"/metrics":             get(p.metrics),
		"/admin/role":          {get: true, post: true, h: p.serveRole},
	}
	switch p.cfg.Engine {
	case engines.VLLM:
		rt["/tokenize"] = post(p.tokenize)
		rt["/v1/responses"] = post(p.createResponse)
		rt["/v1/messages"] = post(p.createMessage)
		rt["/v1/messages/count_tokens"] = post(p.countTokens)
		rt["/v1/audio/transcriptions"] = post(p.speechToText("transcribe"))
		rt["/v1/audio/translations"] = post(p.speechToText("translate"))
		rt["/reset_prefix_cache"] = post(p.resetPrefixCache)
		rt["/version"] = get(p.version)
	case engines.SGLang:
		rt["/abort_request"] = post(p.abortRequest)
		rt["/get_server_info"] = get(p.serverInfo)
		rt["/flush_cache"] = route{get: true, post: true, h: p.resetPrefixCache}
	case engines.TRTLLM:
		rt["/version"] = get(p.version)
		rt["/server_info"] = get(p.trtServerInfo)
	}
	if load, unload, err := engines.AdapterPaths(p.cfg.Engine); err == nil && p.cfg.loraEnabled() {
		rt[load], rt[unload] = post(p.loadAdapter), post(p.unloadAdapter)
	}
	return rt
}

func (p *Pod) serveHTTP(ctx *fasthttp.RequestCtx) {
	if p.cfg.Engine != engines.TRTLLM && p.cors(ctx) {
		return
	}
	if !p.authorized(ctx) {
		return
	}
	if rest, ok := responsesRoute(string(ctx.Path())); ok && p.cfg.Engine == engines.VLLM {
		p.serveStoredResponse(ctx, rest)
		return
	}
	r, ok := p.routes[string(ctx.Path())]
	if !ok {
		// FastAPI's answers, which vLLM, SGLang and trtllm-serve share.
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		writeJSON(ctx, []byte(`{"detail":"Not Found"}`))
		return
	}
	if !(r.get && (ctx.IsGet() || ctx.IsHead()) || r.post && ctx.IsPost()) {
		ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
		writeJSON(ctx, []byte(`{"detail":"Method Not Allowed"}`))
		return
	}
	r.h(ctx)
}

// cors answers as vLLM's and SGLang's servers do (Starlette's CORS
// middleware) with their settings: any origin, method and header, and
// credentials for SGLang alone (vLLM's --allow-credentials is off by
// default). A request with Origin gets Access-Control-Allow-Origin: *, or
// its origin when credentials go with it (a preflight; a request with a
// Cookie); a preflight is answered here, true. trtllm-serve has no CORS.
func (p *Pod) cors(ctx *fasthttp.RequestCtx) bool {
	origin := ctx.Request.Header.Peek(fasthttp.HeaderOrigin)
	if origin == nil {
		return false
	}
	credentials := p.cfg.Engine == engines.SGLang
	preflight := ctx.IsOptions() && ctx.Request.Header.Peek(fasthttp.HeaderAccessControlRequestMethod) != nil
	h := &ctx.Response.Header
	if credentials && (preflight || ctx.Request.Header.Peek(fasthttp.HeaderCookie) != nil) {
		h.SetBytesV(fasthttp.HeaderAccessControlAllowOrigin, origin)
		h.Set(fasthttp.HeaderVary, fasthttp.HeaderOrigin)
	} else {
		h.Set(fasthttp.HeaderAccessControlAllowOrigin, "*")
	}
	if credentials {
		h.Set(fasthttp.HeaderAccessControlAllowCredentials, "true")
	}
	if !preflight {
		return false
	}
	h.Set(fasthttp.HeaderAccessControlAllowMethods, "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT")
	h.Set(fasthttp.HeaderAccessControlMaxAge, "600")
	if asked := ctx.Request.Header.Peek(fasthttp.HeaderAccessControlRequestHeaders); asked != nil {
		h.SetBytesV(fasthttp.HeaderAccessControlAllowHeaders, asked)
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("OK")
	return true
}

func writeJSON(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// sseContentType is what the engines' streamed answers are.
const sseContentType = "text/event-stream; charset=utf-8"

// writeError answers code with the pod's engine's error body (errorBody).
func (p *Pod) writeError(ctx *fasthttp.RequestCtx, code int, typ, param, msg string) {
	ctx.SetStatusCode(code)
	writeJSON(ctx, errorBody(p.cfg.Engine, code, typ, param, msg))
}

// failAccepted answers a request that failed after the engine accepted
// it: with writeError, or, for a streamed request on SGLang, as SGLang
// fails a stream it started (a scheduler abort carrying a status): 200,
// an error event typed by the status's name, then [DONE]
// (create_streaming_error_response in its OpenAI serving code).
func (p *Pod) failAccepted(ctx *fasthttp.RequestCtx, stream bool, code int, typ, msg string) {
	if !stream || p.cfg.Engine != engines.SGLang {
		p.writeError(ctx, code, typ, "", msg)
		return
	}
	ctx.SetContentType(sseContentType)
	ctx.SetBody(streamError(engines.SGLang, code, typ, msg))
}

// streamError is the end of a stream that failed after its head went
// out: the engine's error event, then [DONE] (vLLM's and SGLang's
// create_streaming_error_response). vLLM's error body is one already;
// SGLang types it by the status's name.
func streamError(k engines.Kind, code int, typ, msg string) []byte {
	if k == engines.SGLang {
		typ = strings.ToUpper(strings.ReplaceAll(fasthttp.StatusMessage(code), " ", "_"))
	}
	body := errorBody(k, code, typ, "", msg)
	if k != engines.VLLM {
		body = append(append([]byte(`{"error":`), body...), '}')
	}
	return append(append([]byte("data: "), body...), "\n\ndata: [DONE]\n\n"...)
}

// refuse answers 400 for a request the engine would not serve, or 500
// for one its server fails (serverFault); a message vLLM refuses before
// rendering gets vLLM's own body, naming the field (the other engines
// name it in their own shape).
func (p *Pod) refuse(ctx *fasthttp.RequestCtx, err error) {
	var re *chat.RequestError
	var fault serverFault
	switch {
	case errors.As(err, &fault):
		p.writeError(ctx, fasthttp.StatusInternalServerError, "InternalServerError", "", "Internal server error: "+string(fault))
	case errors.As(err, &re) && p.cfg.Engine == engines.VLLM:
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetContentType("application/json")
		ctx.SetBody(re.AppendBody(nil))
	case re != nil:
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", re.Param, re.Message)
	default:
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", err.Error())
	}
}

func (p *Pod) checkModel(ctx *fasthttp.RequestCtx, model string) bool {
	if model == "" || model == p.cfg.Model || p.lora.has(model) {
		return true
	}
	p.writeError(ctx, fasthttp.StatusNotFound, "NotFoundError", "model", fmt.Sprintf("The model `%s` does not exist.", model))
	return false
}

// parseBody decodes a JSON request body, answering 400 when it is not one.
func (p *Pod) parseBody(ctx *fasthttp.RequestCtx, v any) bool {
	if err := json.Unmarshal(ctx.PostBody(), v); err != nil {
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

// requestTokens renders and tokenizes the prompts of a chat or completions
// request as the pod's engine would: a chat's one, or each prompt of a
// completion batch on its own (the engines run each as its own request);
// with the model's tokenizer and chat template when the pod has them
// (cfg.Prompt), else with the stand-in; then it cuts each where the
// engine cuts such a prompt. Chat messages the engine would refuse are a
// *chat.RequestError either way.
func (p *Pod) requestTokens(body []byte, req *genRequest, isChat bool) ([][]uint32, error) {
	keep, right, err := req.truncation(p.cfg.Engine, body, p.cfg.MaxModelLen, isChat)
	if err != nil {
		return nil, err
	}
	if isChat {
		ids, src, special, err := p.chatTokens(body, req)
		if err != nil {
			return nil, err
		}
		return [][]uint32{p.kept(ids, src, special, keep, right)}, nil
	}
	raws, err := completionPrompts(req.Prompt)
	if err != nil {
		return nil, err
	}
	prompts := make([][]uint32, len(raws))
	for i, raw := range raws {
		ids, src, special, err := p.completionTokens(raw, req)
		if err != nil {
			return nil, err
		}
		prompts[i] = p.kept(ids, src, special, keep, right)
	}
	return prompts, nil
}

// kept is the part of a prompt's ids the engine keeps under truncation:
// the last keep (-1: all), or the first if right, where the engine cuts a
// prompt src made.
func (p *Pod) kept(ids []uint32, src idSource, special bool, keep int, right bool) []uint32 {
	switch {
	case keep < 0 || keep >= len(ids) || !p.cfg.Engine.TruncatesPrompt(src == idsClient):
		return ids
	case src == idsTokenizer:
		// HF's truncation spares the special tokens it added.
		return p.cfg.Prompt.Tokenizer().Truncate(ids, keep, right, special)
	case right:
		return ids[:keep]
	}
	return ids[len(ids)-keep:]
}

// idSource is where a prompt's ids came from.
type idSource uint8

const (
	idsClient    idSource = iota // the request's own token ids
	idsStandIn                   // the stand-in tokenizer's, of the prompt's text
	idsTokenizer                 // cfg.Prompt's tokenizer's, of the prompt's text
)

// completionTokens is one completions prompt's ids before truncation; src
// says who made them, and special that cfg.Prompt's tokenizer added its
// special tokens.
func (p *Pod) completionTokens(raw json.RawMessage, req *genRequest) (ids []uint32, src idSource, special bool, err error) {
	if p.cfg.Prompt != nil {
		if s, ok := promptString(raw); ok {
			add := req.AddSpecialTokens == nil || bool(*req.AddSpecialTokens)
			return p.cfg.Prompt.Completion(nil, []byte(s), add), idsTokenizer, add, nil
		}
	}
	ids, text, err := promptTokens(nil, raw)
	if text {
		src = idsStandIn
	}
	return ids, src, false, err
}

// chatTokens is a chat's prompt ids before truncation, as
// completionTokens's. A TensorRT-LLM chat's prompt_token_ids (a
// generation leg's copy of the context response's) replace its messages'
// rendering.
func (p *Pod) chatTokens(body []byte, req *genRequest) (ids []uint32, src idSource, special bool, err error) {
	if p.cfg.Engine == engines.TRTLLM && len(req.PromptTokenIDs) > 0 {
		return req.PromptTokenIDs, idsClient, false, nil
	}
	c := chat.AcquireConversation()
	defer chat.ReleaseConversation(c)
	if err := c.ParseRequest(body); err != nil {
		return nil, idsStandIn, false, err
	}
	if p.cfg.Prompt != nil {
		add := req.AddSpecialTokens != nil && bool(*req.AddSpecialTokens)
		ids, err := p.cfg.Prompt.AppendChat(nil, c, add)
		// What the template engine cannot render as Python would (media
		// parts, say) the sim still serves, with the stand-in's count, as
		// the real engine serves it.
		if !errors.Is(err, chat.ErrInexact) {
			return ids, idsTokenizer, add, err
		}
	}
	text, err := renderChat(nil, req.Messages, req.AddGenerationPrompt == nil || bool(*req.AddGenerationPrompt))
	if err != nil {
		return nil, idsStandIn, false, err
	}
	return tokenize.Append(make([]uint32, 0, tokenize.Count(text)), text), idsStandIn, false, nil
}

// generate serves /v1/chat/completions and /v1/completions. Each of the
// n answers to each prompt of a completion batch is its own scheduler
// request; the answer has n choices per prompt and their usage summed, as
// every engine answers a batch.
func (p *Pod) generate(ctx *fasthttp.RequestCtx, isChat bool) {
	if !p.enter(ctx) {
		return
	}
	// A stream is served by its body writer after this returns; the writer
	// leaves when the stream ends.
	handedOff := false
	var span *genSpan
	produced, finished := 0, finishNone
	defer func() {
		if !handedOff {
			p.leave()
			span.end(produced, finished)
		}
	}()
	var req genRequest
	if !p.parseBody(ctx, &req) {
		return
	}
	if mct := req.MaxCompletionTokens; !isChat || mct != nil && !p.cfg.Engine.ReadsMaxCompletionTokens(int(*mct)) {
		// Chat's field alone: vLLM's and SGLang's CompletionRequest have
		// none and ignore it (max_tokens, else the default, counts); an
		// SGLang chat's 0 leaves max_tokens to count.
		req.MaxCompletionTokens = nil
	}
	if p.cfg.Engine == engines.VLLM {
		// Refused while parsing the body, before the model is looked up.
		if err := checkStreamOptions(ctx.PostBody(), bool(req.Stream)); err != nil {
			p.refuse(ctx, err)
			return
		}
	}
	if !p.checkModel(ctx, req.Model) {
		return
	}
	prompts, err := p.requestTokens(ctx.PostBody(), &req, isChat)
	var legs []pdLeg
	if err == nil {
		legs, err = p.legsOf(&req, len(prompts))
	}
	rank, named := 0, false
	if err == nil {
		rank, named, err = p.namedRank(ctx)
	}
	switch {
	case errors.Is(err, errNoBootstrapRoom), errors.As(err, new(rankRangeError)):
		// The scheduler aborts it once it arrives, after a stream began.
		p.failAccepted(ctx, bool(req.Stream), fasthttp.StatusBadRequest, "BadRequestError", err.Error())
		return
	case errors.Is(err, errBootstrapIndex):
		p.writeError(ctx, fasthttp.StatusInternalServerError, "InternalServerError", "", err.Error())
		return
	}
	salt, saltErr := req.cacheSalt(p.cfg.Engine, isChat)
	err = cmp.Or(err, saltErr)
	n := 1
	if err == nil {
		n, err = req.choices(p.cfg.Engine)
	}
	if err == nil && !isChat {
		err = req.completionBudget(p.cfg.Engine, ctx.PostBody())
	}
	var echo []string
	if err == nil && !isChat && p.cfg.Engine == engines.VLLM && bool(req.Echo) {
		echo, err = req.echoTexts()
	}
	if err == nil && n > 1 && legs[0].kind != legPlain {
		err = badRequest("n = %d on a %s leg: the sim serves n above 1 on plain requests only", n, legNames[legs[0].kind])
	}
	lengths := make([]int, len(prompts))
	for i, tokens := range prompts {
		if err == nil && len(tokens) == 0 {
			err = badRequest("the prompt is empty")
		}
		lengths[i] = len(tokens)
	}
	if err != nil {
		p.refuse(ctx, err)
		return
	}
	promptTotal := sum(lengths)
	kind := legs[0].kind
	span = p.startSpan(ctx, kind, req.Model, promptTotal)
	// The response id follows vLLM: the X-Request-Id header, else the
	// request_id parameter, else a random one. SGLang aborts by rid.
	id := cmp.Or(string(ctx.Request.Header.Peek("X-Request-Id")), req.RequestID, req.RID,
		fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64()))
	rid := cmp.Or(req.RID, id)
	lora := ""
	if req.Model != p.cfg.Model {
		lora = req.Model // checkModel let only an adapter's name through
	}
	// vLLM generates one token for an echo of max_tokens 0, and answers
	// the prompt alone; its context check read the 0 (requestTokens).
	echoOnly := echo != nil && req.MaxTokens != nil && *req.MaxTokens == 0
	if echoOnly {
		one := laxInt(1)
		req.MaxTokens = &one
	}
	rs := make([]*request, 0, len(prompts)*n)
	texts := make([]textStream, 0, len(prompts)*n)
	for i, tokens := range prompts {
		seed := radix.SeedWith(p.seed, lora, salt)
		keys := radix.AppendBlockKeys(make([]uint64, 0, len(tokens)/p.cfg.Physics.BlockSize), seed, tokens, p.cfg.Physics.BlockSize)
		text := newTextStream(p.cfg.Seed, tokens)
		// Each of the prompt's n answers is a request of its own, as
		// vLLM fans a request out into n child requests.
		for j := range n {
			r := newRequest()
			if kind == legDecode {
				r = newRemoteRequest()
			}
			if len(rs) > 0 {
				// One waiter follows them all.
				r.notify = rs[0].notify
			}
			r.tokens = tokens
			r.rank, r.placed = rank, named
			if !named && kind == legPrefill && p.cfg.Engine == engines.SGLang {
				// SGLang's prefill default, follow_bootstrap_room
				// (ServerArgs._handle_load_balance_method): its decode
				// side finds the KV on the room's rank.
				r.rank, r.placed = int(legs[i].room%uint64(p.cfg.DataParallelSize)), true
			}
			if !p.setMaxTokens(ctx, r, &req, isChat) {
				return
			}
			if kind == legPrefill {
				// The prefill leg yields the first token only, whatever the
				// body asks, and keeps its KV for the decode pod.
				r.pin = true
				if r.maxTokens > 1 {
					r.maxTokens, r.limitReason = 1, finishLength
				}
			}
			// Each answer's keys grow apart: no room to share.
			r.salt, r.lora, r.seed, r.keys = salt, lora, seed, keys[:len(keys):len(keys)]
			r.text = text.sample(j)
			// A batch's requests are named after the choices' places:
			// rid-0, rid-1 on vLLM, rid_0, rid_1 on SGLang (its
			// GenerateReqInput).
			r.rid = rid
			if len(prompts)*n > 1 {
				r.rid = rid + p.batchSep() + strconv.Itoa(len(rs))
			}
			rs, texts = append(rs, r), append(texts, r.text)
		}
	}
	respID := "cmpl-" + id
	if isChat {
		respID = "chatcmpl-" + id
	}
	for _, r := range rs {
		if !p.sched.send(schedMsg{kind: msgSubmit, req: r}) {
			p.writeError(ctx, fasthttp.StatusServiceUnavailable, "ServiceUnavailableError", "", "the engine is shutting down")
			return
		}
	}
	conn := ctx.Conn()
	if kind == legDecode && !req.Stream {
		// A whole answer's head comes with its body; a stream's goes
		// before the pull (below).
		if !p.pullKV(ctx, span, rs, legs, func(err error) {
			p.failAccepted(ctx, false, fasthttp.StatusInternalServerError, "InternalServerError", err.Error())
		}) {
			return
		}
	}
	created := time.Now().Unix()
	model := cmp.Or(rs[0].lora, p.cfg.Model)
	var sse *sseWriter
	if req.Stream {
		sse = p.streamWriter(&req, isChat, respID, created, model, lengths, n)
		if echo != nil {
			sse.echo, sse.echoOnly, sse.echoed = echo, echoOnly, make([]bool, len(rs))
		}
	}
	if kind == legPrefill {
		produced, finished = len(rs), finishLength
		if p.cfg.Engine != engines.SGLang {
			// vLLM's and TensorRT-LLM's handoff fields are in a whole
			// body: their routers send the prefill leg stream false.
			sse = nil
		}
		p.answerPrefill(ctx, rs, legs, isChat, respID, created, texts, sse)
		return
	}
	if sse == nil {
		outs := p.waitAll(rs, conn, nil)
		if outs == nil {
			return // the client is gone
		}
		choices := make([]choice, len(outs))
		for i, o := range outs {
			choices[i] = choice{text: texts[i].appendText(nil, 0, o.produced), reason: o.reason}
			if echo != nil {
				choices[i].echo, choices[i].echoOnly = echo[i/n], echoOnly
			}
		}
		produced, finished = totals(outs)
		writeJSON(ctx, appendFullResponse(nil, p.cfg.Engine, isChat, respID, created, model, choices, promptTotal, produced, nil))
		return
	}
	ctx.SetContentType(sseContentType)
	// The engines' OpenAI servers answer a stream with Starlette's
	// StreamingResponse, whose head goes out before the body generator
	// runs: before the prefill, and on a decode pod before the KV pull.
	ctx.Response.ImmediateHeaderFlush = true
	handedOff = true
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer p.leave()
		if kind == legDecode && !p.pullKV(ctx, span, rs, legs, func(err error) {
			// Past the head: as vLLM's stream generator fails, an error
			// event, then [DONE].
			_, _ = w.Write(streamError(p.cfg.Engine, fasthttp.StatusInternalServerError, "InternalServerError", err.Error()))
			_ = w.Flush()
		}) {
			span.end(0, finishNone)
			return
		}
		var buf, piece []byte
		sent := make([]int, len(rs))
		left, completion := len(rs), 0
		outs := p.waitAll(rs, conn, func(i, n int, reason uint8) bool {
			span.token()
			piece = texts[i].appendText(piece[:0], sent[i], n)
			buf = sse.appendDelta(buf[:0], i, piece, n, reason)
			sent[i] = n
			if reason != finishNone {
				left, completion = left-1, completion+n
				if left == 0 {
					buf = sse.appendEnd(buf, completion)
				}
			}
			_, err := w.Write(buf)
			if err == nil {
				err = w.Flush()
			}
			return err == nil
		})
		span.end(totals(outs))
	})
}

// rankRangeError is SGLang's refusal of a data-parallel rank the pod
// lacks, once it accepted the request (TokenizerManager.generate_request).
type rankRangeError struct{ rank, size int }

func (e rankRangeError) Error() string {
	return fmt.Sprintf("routed_dp_rank=%d out of range [0, %d)", e.rank, e.size)
}

// namedRank reads the data-parallel rank a request names in its
// X-Data-Parallel-Rank header, as vLLM (OpenAIServing._get_data_parallel_rank)
// and SGLang (extract_routed_dp_rank_from_header) do; named is false
// without one. vLLM ignores a value that is no integer, SGLang refuses it;
// both refuse a rank the pod lacks. TensorRT-LLM reads no such header.
func (p *Pod) namedRank(ctx *fasthttp.RequestCtx) (rank int, named bool, err error) {
	v := ctx.Request.Header.Peek("X-Data-Parallel-Rank")
	if v == nil || p.cfg.Engine == engines.TRTLLM {
		return 0, false, nil
	}
	rank, err = strconv.Atoi(strings.TrimSpace(string(v)))
	switch {
	case err != nil && p.cfg.Engine == engines.SGLang:
		return 0, false, badRequest("Invalid X-Data-Parallel-Rank header: must be an integer, got '%s'", v)
	case err != nil:
		return 0, false, nil
	case rank >= 0 && rank < p.cfg.DataParallelSize:
		return rank, true, nil
	case p.cfg.Engine == engines.SGLang:
		return 0, false, rankRangeError{rank, p.cfg.DataParallelSize}
	}
	return 0, false, badRequest("data_parallel_rank %d is out of range [0, %d).", rank, p.cfg.DataParallelSize)
}

// streamWriter is the SSE writer of a streamed answer to req, with usage
// as its stream_options ask (an unset include_usage takes the engine's
// default).
func (p *Pod) streamWriter(req *genRequest, isChat bool, id string, created int64, model string, prompts []int, n int) *sseWriter {
	usage, continuous := false, false
	if o := req.StreamOptions; o != nil {
		usage = p.cfg.Engine.IncludeUsageDefault()
		if o.IncludeUsage.set {
			usage = o.IncludeUsage.val
		}
		continuous = bool(o.ContinuousUsageStats) && (usage || p.cfg.Engine.ContinuousUsageAlone())
	}
	return newSSEWriter(p.cfg.Engine, isChat, id, created, model, usage, continuous, p.cfg.Engine == engines.TRTLLM, prompts, n)
}

// setMaxTokens sets r's output length from the request, answering 400 as
// vLLM does when it is not positive or the context cannot hold it
// (TensorRT-LLM in its own words, and it holds a budget over the
// context's rest to that rest). A request without one, or with null,
// runs to its natural length (DefaultMaxTokens), but a completion on
// vLLM or SGLang is held to their CompletionRequest's default (16) as to
// its own max_tokens (vLLM's normalize_null_max_tokens gives null the
// default too; SGLang refused it in completionBudget), and stops there
// unless it ends sooner.
func (p *Pod) setMaxTokens(ctx *fasthttp.RequestCtx, r *request, req *genRequest, isChat bool) bool {
	prompt, limit := len(r.tokens), p.cfg.MaxModelLen
	mt := req.MaxCompletionTokens
	if mt == nil {
		mt = req.MaxTokens
	}
	budget := req.outputBudget(p.cfg.Engine, isChat)
	natural, reason := p.cfg.DefaultMaxTokens, finishStop
	if budget > 0 && budget < natural {
		natural, reason = budget, finishLength
	}
	trt := p.cfg.Engine == engines.TRTLLM
	switch {
	case trt && prompt >= limit:
		// TensorRT-LLM's worker (_deduce_max_tokens) first checks the
		// room the prompt leaves, whatever the budget.
		rest := limit - prompt
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", fmt.Sprintf(
			"`default_max_tokens` (%d) must be greater than 0, `default_max_tokens` (%d) = max_seq_len (%d) - `splited_prompt_len` (%d) - `query_token_len` (0)",
			rest, rest, limit, prompt))
		return false
	case trt && mt != nil && *mt < 1:
		// trtllm-serve's models take any int; its executor's worker
		// refuses it (_deduce_max_tokens), and the server answers the
		// error's text.
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", fmt.Sprintf("`max_tokens` (%d) must be greater than 0", *mt))
		return false
	case mt != nil && *mt < 1:
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "max_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d.", *mt))
		return false
	case trt && prompt+max(budget, 0) > limit:
		// It holds a larger budget to that room, with a warning.
		r.maxTokens, r.limitReason = limit-prompt, finishLength
	case prompt+max(budget, 0) > limit || prompt >= limit:
		want := prompt + max(budget, 0)
		p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			limit, want, prompt, want-prompt))
		return false
	case mt != nil:
		r.maxTokens, r.limitReason = int(*mt), finishLength
	case prompt+natural > limit:
		r.maxTokens, r.limitReason = limit-prompt, finishLength
	default:
		r.maxTokens, r.limitReason = natural, reason
	}
	if p.cfg.Engine == engines.VLLM && req.MinTokens != nil {
		// vLLM's SamplingParams._verify_args, against the max_tokens it
		// resolved: the request's (or a completion's default), else what
		// the context leaves.
		maxTokens := limit - prompt
		if budget >= 0 {
			maxTokens = budget
		}
		var msg string
		switch n := int(*req.MinTokens); {
		case n < 0:
			msg = fmt.Sprintf("min_tokens must be greater than or equal to 0, got %d.", n)
		case n > maxTokens:
			msg = fmt.Sprintf("min_tokens must be less than or equal to max_tokens=%d, got %d.", maxTokens, n)
		}
		if msg != "" {
			p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", msg)
			return false
		}
	}
	return true
}

// outcome is how one request ended: the tokens it produced and its
// finish reason.
type outcome struct {
	produced int
	reason   uint8
}

// totals is the tokens a batch's requests produced, and the finish reason
// of the last.
func totals(outs []outcome) (produced int, reason uint8) {
	for _, o := range outs {
		produced, reason = produced+o.produced, o.reason
	}
	return produced, reason
}

func sum(ns []int) (total int) {
	for _, n := range ns {
		total += n
	}
	return total
}

// waitAll follows rs, which share one notify channel, until each finished
// or the client hung up, calling deliver (when not nil) with request i's
// tokens produced so far each time they change. A false from deliver, or
// a closed connection, cancels every request. It returns how each ended,
// nil if cancelled.
func (p *Pod) waitAll(rs []*request, conn net.Conn, deliver func(i, produced int, reason uint8) bool) []outcome {
	poll := time.NewTicker(disconnectPoll)
	defer poll.Stop()
	cancel := func() []outcome {
		for _, r := range rs {
			p.sched.send(schedMsg{kind: msgCancel, req: r})
		}
		return nil
	}
	outs := make([]outcome, len(rs))
	delivered := make([]int, len(rs))
	left := len(rs)
	for {
		select {
		case <-rs[0].notify:
		case <-poll.C:
			if connGone(conn) {
				return cancel()
			}
			continue
		case <-p.sched.exited:
			// The scheduler finished everything it knew of; a request
			// that reached it too late is aborted here.
		}
		for i, r := range rs {
			if outs[i].reason != finishNone {
				continue
			}
			n, reason := r.load()
			if reason == finishNone && isClosed(p.sched.exited) {
				reason = finishAbort
			}
			if deliver != nil && (n > delivered[i] || reason != finishNone) {
				if !deliver(i, n, reason) {
					return cancel()
				}
				delivered[i] = n
			}
			if reason != finishNone {
				outs[i], left = outcome{n, reason}, left-1
			}
		}
		if left == 0 {
			return outs
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// tokenize serves vLLM's POST /tokenize, with the tokens the sim computes for
// the same prompt in a generation request. It truncates nothing, as vLLM's
// has no truncate_prompt_tokens.
func (p *Pod) tokenize(ctx *fasthttp.RequestCtx) {
	var req genRequest
	if !p.parseBody(ctx, &req) || !p.checkModel(ctx, req.Model) {
		return
	}
	var tokens []uint32
	var err error
	if req.Messages != nil {
		tokens, _, _, err = p.chatTokens(ctx.PostBody(), &req)
	} else {
		tokens, _, _, err = p.completionTokens(req.Prompt, &req)
	}
	if err != nil {
		p.refuse(ctx, err)
		return
	}
	if tokens == nil {
		tokens = []uint32{}
	}
	body, _ := json.Marshal(struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}{len(tokens), p.cfg.MaxModelLen, tokens, nil})
	writeJSON(ctx, body)
}

// models serves GET /v1/models in vLLM's ModelList shape.
func (p *Pod) models(ctx *fasthttp.RequestCtx) {
	owner := map[engines.Kind]string{engines.VLLM: "vllm", engines.SGLang: "sglang", engines.TRTLLM: "tensorrt_llm"}[p.cfg.Engine]
	type permission struct {
		ID                 string  `json:"id"`
		Object             string  `json:"object"`
		Created            int64   `json:"created"`
		AllowCreateEngine  bool    `json:"allow_create_engine"`
		AllowSampling      bool    `json:"allow_sampling"`
		AllowLogprobs      bool    `json:"allow_logprobs"`
		AllowSearchIndices bool    `json:"allow_search_indices"`
		AllowView          bool    `json:"allow_view"`
		AllowFineTuning    bool    `json:"allow_fine_tuning"`
		Organization       string  `json:"organization"`
		Group              *string `json:"group"`
		IsBlocking         bool    `json:"is_blocking"`
	}
	type card struct {
		ID          string       `json:"id"`
		Object      string       `json:"object"`
		Created     int64        `json:"created"`
		OwnedBy     string       `json:"owned_by"`
		Root        string       `json:"root"`
		Parent      *string      `json:"parent"`
		MaxModelLen *int         `json:"max_model_len"`
		Permission  []permission `json:"permission"`
	}
	perm := []permission{{
		ID: "modelperm-" + strconv.FormatUint(p.seed, 16), Object: "model_permission", Created: p.created,
		AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
	}}
	cards := []card{{
		ID: p.cfg.Model, Object: "model", Created: p.created, OwnedBy: owner, Root: p.cfg.Model,
		MaxModelLen: &p.cfg.MaxModelLen, Permission: perm,
	}}
	// Adapters as vLLM lists them: root their path, parent the base
	// model, max_model_len null.
	names, paths := p.lora.list()
	for i, n := range names {
		cards = append(cards, card{ID: n, Object: "model", Created: p.created, OwnedBy: owner, Root: paths[i], Parent: &p.cfg.Model, Permission: perm})
	}
	body, _ := json.Marshal(struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{"list", cards})
	writeJSON(ctx, body)
}

// metrics serves GET /metrics: Prometheus text for vllm and sglang, a JSON
// list of iteration stats for trtllm.
func (p *Pod) metrics(ctx *fasthttp.RequestCtx) {
	if p.cfg.Engine == engines.TRTLLM {
		body, _ := json.Marshal([]trtllmStats{p.m.trtllm(p.cfg.Physics.MaxBatch, time.Now().Format("01-02-2006 15:04:05"))})
		writeJSON(ctx, body)
		return
	}
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	p.m.writePrometheus(ctx)
	p.writeLoRAInfo(ctx)
}

func (p *Pod) version(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, []byte(`{"version":"pdlb-sim"}`))
}

// resetPrefixCache serves vLLM's POST /reset_prefix_cache and SGLang's
// /flush_cache.
func (p *Pod) resetPrefixCache(ctx *fasthttp.RequestCtx) {
	if !p.ResetPrefixCache() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		return
	}
	if p.cfg.Engine == engines.SGLang {
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("Cache flushed.\n")
	}
}

// batchSep joins a batch's rid and a request's place in it.
func (p *Pod) batchSep() string {
	if p.cfg.Engine == engines.SGLang {
		return "_"
	}
	return "-"
}

// abortRequest serves SGLang's POST /abort_request {"rid": …, "abort_all": …}.
func (p *Pod) abortRequest(ctx *fasthttp.RequestCtx) {
	var req struct {
		RID      string `json:"rid"`
		AbortAll bool   `json:"abort_all"`
	}
	if !p.parseBody(ctx, &req) {
		return
	}
	m := schedMsg{kind: msgAbortRID, rid: req.RID}
	if req.AbortAll {
		m.kind = msgAbortAll
	}
	if !p.sched.send(m) {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
}

// disaggregationMode is SGLang's --disaggregation-mode of the pod's role.
func (p *Pod) disaggregationMode() string {
	if r := p.Role(); r != RoleCombined {
		return r
	}
	return "null"
}

// bootstrapPort is the port of a prefill pod's bootstrap (KV transfer)
// server; 0 on other roles.
func (p *Pod) bootstrapPort() int {
	_, port, _ := net.SplitHostPort(p.KVXferAddr())
	n, _ := strconv.Atoi(port)
	return n
}

// serverInfo serves SGLang's GET /get_server_info: the server arguments a
// router reads, and the scheduler's internal state.
func (p *Pod) serverInfo(ctx *fasthttp.RequestCtx) {
	host, port, _ := net.SplitHostPort(p.Addr())
	portN, _ := strconv.Atoi(port)
	// One state a data-parallel rank, as its scheduler answers
	// get_internal_state.
	states := make([]map[string]any, len(p.m.ranks))
	for i := range states {
		states[i] = map[string]any{"last_gen_throughput": p.m.ranks[i].tokens.throughput(p.m.now())}
	}
	body, _ := json.Marshal(map[string]any{
		"model_path":                    p.cfg.Model,
		"served_model_name":             p.cfg.Model,
		"tokenizer_path":                p.cfg.Model,
		"host":                          host,
		"port":                          portN,
		"context_length":                p.cfg.MaxModelLen,
		"max_running_requests":          p.cfg.Physics.MaxBatch,
		"max_total_num_tokens":          p.cfg.Physics.CacheBlocks * p.cfg.Physics.BlockSize,
		"page_size":                     p.cfg.Physics.BlockSize,
		"disaggregation_mode":           p.disaggregationMode(),
		"disaggregation_bootstrap_port": p.bootstrapPort(),
		"internal_states":               states,
		"version":                       "pdlb-sim",
	})
	writeJSON(ctx, body)
}

package gateway

import (
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/ledger"
)

// serveCompletion is the request path of /v1/chat/completions and
// /v1/completions.
func (g *Gateway) serveCompletion(ctx *fasthttp.RequestCtx, kind openai.Kind) {
	x := takeCompletion(ctx)
	x.hdr.read(&ctx.Request.Header)
	x.reqID = requestIDOf(x.reqID[:0], ctx, x.hdr[hdrRequestID])
	key, d := g.keys.Load().Lookup(x.hdr[hdrAuthorization], x.hdr[hdrAPIKey])
	if !d.OK() {
		g.fail(ctx, x, nil, refused(d))
		return
	}
	x.g, x.ctx, x.req.Kind, x.found = g, ctx, kind, key
	if l := frontend.LoopOf(ctx); l != nil && len(ctx.PostBody()) > readOnLoopMax {
		// Read on a worker (stageParse): a large body's parse (the
		// stand-in's rendering included) and its tokenization would
		// hold up every connection of the loop.
		x.stage = stageParse
		l.Detach(x)
		return
	}
	if g.parse(x, false) {
		g.advance(x)
	}
}

// parse reads x's request, resolves its model and begins it (begin); it
// reports whether x goes on. offLoop says x came to a worker to be read,
// which the model's off-loop counter counts for a generation's prompt.
func (g *Gateway) parse(x *completion, offLoop bool) bool {
	ctx, kind := x.ctx, x.req.Kind
	var err error
	switch kind {
	case openai.KindStored:
		x.req.Kind = kind // no body to read
	case openai.KindAudio:
		err = x.req.ParseForm(ctx.PostBody(), ctx.Request.Header.ContentType())
	default:
		err = x.req.Parse(kind, ctx.PostBody())
	}
	if err != nil {
		var e *openai.Error
		if !errors.As(err, &e) {
			panic("BUG: gateway: openai.Request.Parse returned " + err.Error())
		}
		g.fail(ctx, x, nil, answer(e))
		return false
	}
	if x.req.UsageHidden() {
		// The engine's usage counts the stream's output, which its events
		// undercount where they hold several tokens; pass hides it.
		ctx.Request.SetBody(x.req.WithUsage(ctx.PostBody()))
	}
	if !g.placeStored(ctx, x) {
		return false
	}
	m := g.resolveModel(ctx, x)
	if m == nil {
		g.fail(ctx, x, nil, answer(g.unresolved(x)))
		return false
	}
	g.settleHome(x, m)
	if x.prefer.model != m.Name {
		x.prefer = home{}
	}
	g.nameResponse(ctx, x)
	x.m = m
	if offLoop && x.req.Kind.Outputs() {
		// A prompt read off the loop (not an upload's or an
		// embedding's input).
		g.metrics.model(m).offLoop.Inc()
	}
	return g.begin(x)
}

// settleHome keeps x's stored response's pod (x.home) where x, of model
// m, can go to it.
func (g *Gateway) settleHome(x *completion, m *pool.Model) {
	if x.home.model != m.Name {
		// The response x names is another model's, which an alias did not
		// pick this time: x is sought on this one's pods, as an unknown
		// one.
		x.home = home{}
	} else if x.home.pod != "" && combinedNamed(m, x.home.pod) < 0 {
		// Its pod left the fleet, or was renamed, on a reload: forgotten,
		// x seeks it (seekStored).
		g.homes.forget(storedIDOf(x.ctx, x))
		x.home.pod = ""
	}
}

// tokenizeLater moves x, whose tokenization would hold up loop l, to a
// worker, which begins it (stageTokenize).
func (g *Gateway) tokenizeLater(l *frontend.Loop, x *completion) {
	g.metrics.model(x.m).offLoop.Inc()
	x.stage = stageTokenize
	l.Detach(x)
}

// begin takes x, parsed and of model x.m, from its tokenization to its
// first pick, and sets the transport it goes on with: false when x is
// answered (refused) or moved to a worker.
func (g *Gateway) begin(x *completion) bool {
	ctx, m, key := x.ctx, x.m, x.found
	// Tokenized before the key's token budget is charged, so the budget
	// counts the engine's tokens.
	if f, later := g.tokenizeHere(x, m); later {
		g.tokenizeLater(frontend.LoopOf(ctx), x)
		return false
	} else if f != nil {
		g.fail(ctx, x, m, f)
		return false
	}
	d := key.Admit(x.start, budgeted(x, ctx.PostBody()))
	x.rateHead = d.AppendHeaders(x.rateHead[:0], rateDialect(pathOf(ctx)))
	if !d.OK() {
		g.fail(ctx, x, m, refused(d))
		return false
	}
	x.key = key
	var e *openai.Error
	if x.class, e = classOf(x.hdr[hdrPriority]); e != nil {
		g.fail(ctx, x, m, answer(e))
		return false
	}
	if !g.enter(x) {
		g.fail(ctx, x, m, &failure{
			E:          openai.Overloaded("the gateway has " + strconv.Itoa(g.cfg.MaxInFlight) + " requests in flight, its max_in_flight"),
			RetryAfter: 1,
		})
		return false
	}
	x.ticket = ledger.Ticket{ID: g.nextID.Add(1)}
	l := frontend.LoopOf(ctx)
	if l != nil {
		x.ticket.Lane = l.Lane()
	}
	if !g.resolve(ctx, x, m) {
		return false
	}
	x.explain = g.explain.asked(x.hdr[hdrDebug], x.hdr[hdrAdminToken])
	g.startTrace(x)
	x.stage = stagePick
	if l != nil {
		x.via = loopTransport{l}
		if x.req.Stream && !l.CanRelay() {
			// A stream that is the connection's last answer is written
			// by a worker (a PD exchange moves to one at its pick).
			l.Detach(x)
			return false
		}
	} else {
		x.via = workerTransport{}
	}
	return true
}

// The largest request body the event loop reads itself: a larger one is
// parsed and tokenized on a worker (stageParse), which costs its request a
// handoff and the worker's upstream call (tens of microseconds). A body
// parses at 0.7-3.8 GB/s (lb/openai's BenchmarkExtract), and text the
// tokenizer has not seen takes about 20 us a KiB. A conversation its
// template's Jinja engine renders (tools, tool calls and results, names,
// parts, a template's own refusals of its fast path) is rendered whole,
// seen turns too (engines/prompt's BenchmarkMessagesAgentLoop: 1.1 ms for
// 23 KB; LongAgentLoop, 3.4 ms for 150 KB), where the fast path copies it:
// a chat over jinjaOnLoopMax is rendered on the loop on the fast path
// alone, and encoded there when at most unseenOnLoopMax of it is new
// (tokenize); the Responses and Messages APIs' conversions, which make
// Jinja's conversations, go to a worker past jinjaOnLoopMax.
const (
	jinjaOnLoopMax  = 16 << 10
	unseenOnLoopMax = 16 << 10
	readOnLoopMax   = 64 << 10
)

// tokenizeHere tokenizes x's prompt for m where x is served, unless that
// is an event loop the tokenization would hold up: later then says so,
// and x is to be tokenized on a worker (tokenizesOffLoop, or a chat over
// jinjaOnLoopMax that its template's fast path refuses or that has much
// new text).
func (g *Gateway) tokenizeHere(x *completion, m *pool.Model) (f *failure, later bool) {
	body := x.ctx.PostBody()
	onLoop := frontend.LoopOf(x.ctx) != nil
	if onLoop && tokenizesOffLoop(x, m, body) {
		return nil, true
	}
	return g.tokenize(x, m, body, onLoop && x.req.Kind == openai.KindChat && len(body) > jinjaOnLoopMax)
}

// tokenizesOffLoop reports whether x, of model m, is to be tokenized on a
// worker from the start: a Responses or Messages request over
// jinjaOnLoopMax whose prompt m's tokenizer encodes (keying).
func tokenizesOffLoop(x *completion, m *pool.Model, body []byte) bool {
	if len(body) <= jinjaOnLoopMax || (x.req.Kind != openai.KindResponses && x.req.Kind != openai.KindMessages) {
		return false
	}
	_, encodes := keying(x, m)
	return encodes
}

// finish ends a request that reached a pod.
func (g *Gateway) finish(x *completion, m *pool.Model, pod *pool.Pod, resp *fasthttp.Response, status int) {
	g.logCompletion(x.ctx, x, pod, status, x.failure)
	g.observeEnd(x, pod, status, x.failure)
	if x.pd != nil {
		x.pd.End(pod, status)
	}
	_ = resp.CloseBodyStream()
	if resp != &x.own {
		fasthttp.ReleaseResponse(resp) // a PD exchange's; x's own goes with x
	}
	// Only a first token times the pod's prefill (pass): an answer that
	// ends without one may have failed at once, so no time is passed.
	x.idleStart = false
	g.prefillDone(x, pod, time.Time{})
	g.ledger.Finish(x.ticket)
	if x.reachesEngine() {
		pod.Release(x.sequences())
	}
	g.leave(x)
	stats := g.metrics.model(m)
	if x.req.Kind.Outputs() {
		// The model's generation latency and output: an embedding or a
		// tokenization would pull them down.
		// One clock read (x.start has the monotonic one), where time.Now
		// takes two: under a VM's kvm-clock each is a costly vDSO call.
		stats.e2e.Update(time.Since(x.start).Seconds())
		if status == fasthttp.StatusOK {
			stats.generated.Add(1)
		}
	}
	stats.completionTokens.Add(x.counted.Tokens())
	g.metrics.countRequest(m, status)
	releaseCompletion(x)
}

// rateDialect is whose rate-limit headers a keyed answer on path carries:
// Anthropic's on its Messages API, whose clients read its names (and its
// errors, writeFailure), OpenAI's on the others.
func rateDialect(path []byte) limits.Dialect {
	if openai.MessagesPath(path) {
		return limits.Anthropic
	}
	return limits.OpenAI
}

// refused is the failure for a request its API key does not allow now.
func refused(d limits.Decision) *failure {
	return &failure{E: d.Error(), RetryAfter: d.RetryAfterSeconds()}
}

// fail answers a request that never reached a pod.
func (g *Gateway) fail(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, f *failure) {
	x.dropUpstream()
	g.leave(x)
	g.ledger.Finish(x.ticket)
	// The id the access log names it by, as on a pod's answer, and the pod
	// that failed it, if one did.
	ctx.Response.Header.SetBytesV(headerRequestID, x.reqID)
	if f.Pod != nil {
		ctx.Response.Header.Set(headerPod, f.Pod.Config.Name)
	}
	addFields(ctx, x.rateHead)
	writeFailure(ctx, f)
	g.logCompletion(ctx, x, f.Pod, f.E.Status, f.E)
	g.observeEnd(x, nil, f.E.Status, f.E)
	g.metrics.countRequest(m, f.E.Status)
	took := time.Since(x.start).Seconds()
	if m != nil && x.req.Kind.Outputs() {
		// Timed as finish times a pod's answer, error or not: the
		// histogram has each of m's requests that pdlb_requests_total has.
		g.metrics.model(m).e2e.Update(took)
	}
	if f.E.Status == fasthttp.StatusTooManyRequests {
		g.metrics.shed.Update(took)
	}
	if x.rejected {
		// Admission's rejection stands: no fallback model decided x anew.
		g.admit.Rejected(x.class)
	}
	releaseCompletion(x)
}

// responseTimeout bounds the wait for a pod's answer: a stream's headers,
// or a whole answer.
func (g *Gateway) responseTimeout(stream bool) time.Duration {
	if stream {
		return g.cfg.Upstream.ResponseTimeout
	}
	return g.cfg.Upstream.WholeResponseTimeout
}

// answerTimeout is responseTimeout for x's attempt. A call about a stored
// response (retrieve, cancel, delete, input_items) is a look-up a pod
// answers at once, however it is read: one held past response_timeout
// is a pod that will not answer (a search moves past it), not a
// generation still running.
func (g *Gateway) answerTimeout(x *completion) time.Duration {
	return g.responseTimeout(x.req.Stream || x.req.Kind == openai.KindStored)
}

// resolve resolves x's profile and strategy on m: a registry policy named
// by the header is left in x.policy for the combined path, the cascade of a
// "pd" strategy in x.cascade. Bad headers are answered, and resolve reports
// false.
func (g *Gateway) resolve(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model) bool {
	res, f := resolveStrategy(x, m)
	if f != nil {
		g.fail(ctx, x, m, f)
		return false
	}
	x.cascade, x.policy, x.policyCache = res.PD, res.Policy, res.UsesCache
	if x.req.Kind.RunsAsChat() && x.cascade == nil {
		g.metrics.model(m).uncascaded.Add(1)
	}
	return true
}

// resolveStrategy is strategyFor, refused with the client's 400 when x's
// headers name a profile or strategy m does not have.
func resolveStrategy(x *completion, m *pool.Model) (route.Resolved, *failure) {
	res, err := strategyFor(x, m)
	if err != nil {
		return res, answer(openai.InvalidValue(route.HeaderRoutingStrategy, err.Error()))
	}
	return res, nil
}

// budgeted is the input tokens x charges its API key's token budget: its
// prompt's, or for the other APIs, whose prompt is not read, and a
// prompt read as empty, the body's size at the stand-in's 4 bytes a
// token; an audio form's text fields alone, so, since its audio is no
// text (requests_per_minute and max_concurrent bound uploads). Only the
// budget counts them so: a pod's ledger and queue, which they would hold
// up as prefill work, get nothing. A request the engine does not run
// (reachesEngine: a tokenization, Anthropic's count_tokens) spends its
// request alone: clients count a prompt's tokens before sending it.
func budgeted(x *completion, body []byte) int {
	if !x.reachesEngine() {
		return 0
	}
	if x.req.Kind == openai.KindAudio {
		return tokenize.CountLen(x.req.FormTextBytes)
	}
	if x.req.Kind.Outputs() {
		// A Responses input the gateway cannot render (the engine
		// judges it) has no prompt tokens: its body is charged.
		if n := x.req.PromptTokens(); n > 0 {
			return n
		}
	}
	return tokenize.CountLen(len(body))
}

// strategyFor is strategyOf for x's kind: the engines' other APIs have no
// prompt to match and nothing to prefill and decode, so whatever the
// model and headers say, a combined pod with the fewest requests in
// flight answers them (otherPolicy); nor do they fall back to another
// model (fallBack). A Responses or Messages request is routed by the
// model's policy among its combined pods: the engine runs the
// prefill/decode exchange of chats and completions only.
func strategyFor(x *completion, m *pool.Model) (route.Resolved, error) {
	switch {
	case x.req.Kind == openai.KindMessages && m.Profiles != nil && m.Profiles.Engine == engines.VLLM:
		// vLLM runs a Messages request's prefill/decode exchange as a
		// chat's (its kv_transfer_params in and out); SGLang's Messages
		// API drops its exchange fields.
		return strategyOf(x, m)
	case x.req.Kind.RunsAsChat():
		res, err := strategyOf(x, m)
		res.PD = nil
		return res, err
	case !x.req.Kind.Generates():
		return route.Resolved{Policy: otherPolicy}, nil
	}
	return strategyOf(x, m)
}

var otherPolicy route.Policy = route.ScorePolicy{Scorer: route.LeastRequest{}}

// strategyOf is the profile and strategy x's headers choose on m; none
// (the model's policy) when m has no profiles.
func strategyOf(x *completion, m *pool.Model) (route.Resolved, error) {
	if m.Profiles == nil {
		return route.Resolved{}, nil
	}
	// The header strings are made only when a client sends them.
	return m.Profiles.Resolve(string(x.hdr[hdrProfile]), string(x.hdr[hdrStrategy]))
}

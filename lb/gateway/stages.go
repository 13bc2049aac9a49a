package gateway

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
)

// A completion request runs through these stages, in this order, on
// either transport; x.stage is the next one to run. serveCompletion
// parses a request on the goroutine it came on (parse), or moves a large
// one to stageParse; respond (relay.go) runs the respond and relay
// stages, which end in finish.
type stage uint8

const (
	// stageParse reads x, on a worker, and takes it to its first pick
	// (parse): a body over readOnLoopMax leaves the event loop before
	// its parse.
	stageParse stage = iota
	// stageTokenize tokenizes x, on a worker, and takes it to its first
	// pick (begin): a prompt read on the event loop whose tokenization
	// would hold it up (tokenizesOffLoop, or a chat its template's fast
	// path refused or with much new text: tokenize).
	stageTokenize
	// stageRetokenize tokenizes x, on a worker, for the fallback model
	// fallBack moved it to on an event loop (retokenize), then picks.
	stageRetokenize
	// stagePick chooses a pod, or a PD decision, among those not tried;
	// a retry backs off first.
	stagePick
	// stageAdmit asks admission about the first attempt: admit, wait, or
	// shed.
	stageAdmit
	// stageAttempt sends the request to the pick.
	stageAttempt
	// stageAwait waits for the attempt's outcome (answered).
	stageAwait
	// stageRespond relays the pod's answer, whose head is in.
	stageRespond
	// stageRelay: the answer is the client's; finish ends x.
	stageRelay
	// stageGone ends x whose client left while its pod worked on it.
	stageGone
	// stageFail answers x with x.last, no pod's answer.
	stageFail
)

// advance runs x's stages from x.stage until x is answered, waits for its
// transport (the event loop calls Answered), or moves to a worker (Run).
// Each transition is written once, for the plain and the PD path and for
// both transports.
func (g *Gateway) advance(x *completion) {
	for {
		switch x.stage {
		case stageParse, stageTokenize, stageRetokenize:
			// A fallback's tokenization is the only one of the three
			// asked for on the loop: the others were detached to a
			// worker already.
			if x.stage == stageRetokenize && !x.via.block(x) {
				return
			}
			// Each holds a tokenizing slot while it reads or tokenizes.
			g.tokenizing <- struct{}{}
			goOn := true
			switch x.stage {
			case stageParse:
				goOn = g.parse(x, true)
			case stageTokenize:
				goOn = g.begin(x)
			default:
				g.retokenize(x)
			}
			<-g.tokenizing
			if !goOn {
				return
			}
		case stagePick:
			if !g.pickStage(x) {
				return
			}
		case stageAdmit:
			if !g.admitStage(x) {
				return
			}
		case stageAttempt:
			if !g.attemptStage(x) {
				return
			}
		case stageAwait, stageRelay:
			return
		case stageRespond:
			x.stage = stageRelay
			g.respond(x.ctx, x, x.m, x.pod, x.resp)
			return
		case stageGone:
			x.stage = stageRelay
			g.finish(x, x.m, x.pod, x.resp, fail.StatusClientClosed)
			return
		case stageFail:
			g.fail(x.ctx, x, x.m, x.last)
			return
		}
	}
}

// pickStage picks for x's next attempt and moves on to admission, or to
// stageFail when no pod is left. A retry waits on a worker, and a PD pick
// is made on one: false says x moved to one.
func (g *Gateway) pickStage(x *completion) bool {
	if x.cascade != nil && !x.via.block(x) {
		// A prefill/decode exchange blocks: a request of a PD strategy,
		// or moved to a PD model by a fallback, picks on a worker.
		return false
	}
	if x.attempts > 0 && !x.asked {
		if !x.via.block(x) {
			return false
		}
		// Back off a little, with jitter, so a fleet-wide hiccup is not
		// met by every request retrying in lockstep.
		time.Sleep(time.Duration(rand.Int64N(int64(retryBackoff) << min(x.attempts-1, maxBackoffShift))))
		waited := !x.budgetWait || g.awaitRetry(x)
		if f := g.interrupted(x); f != nil {
			x.last, x.stage = f, stageFail
			return true
		}
		if !waited {
			x.stage = stageFail // the last attempt's failure
			return true
		}
	}
	moved := true
	if s := g.pool.Load(); s != x.snap {
		// A reload or discovery changed the fleet since x's model was
		// resolved: x picks among its model's pods as they are now, on a
		// worker, which may tokenize the prompt anew or decide a PD pair.
		if !x.via.block(x) {
			return false
		}
		var f *failure
		if moved, f = g.follow(x, s); f != nil {
			x.last, x.stage = f, stageFail
			return true
		}
	}
	x.asked = false
	picked, start := false, x.tr.mark()
	switch {
	case !moved:
		// Its model left the fleet: x goes on as for a model without a pod.
	case x.cascade != nil:
		if e := choicesRefused(x); e != nil {
			x.last, x.stage = answer(e), stageFail
			return true
		}
		picked = g.pickPD(x) == nil
	default:
		x.pod = g.pick(x.m, x, sessionOf(x))
		picked = x.pod != nil
	}
	switch {
	case picked:
		g.retried(x)
		g.observePick(x, start)
		x.stage = stageAdmit
		return g.adapterReady(x)
	case g.fallBack(x):
		// picked anew on a fallback model
	case x.last == nil && x.cascade == nil && !x.req.Kind.Generates() && len(x.m.Combined) == 0:
		// Not a passing state a retry would outlast: a 400 names it.
		x.last, x.stage = answer(&openai.Error{Status: fasthttp.StatusBadRequest, Type: openai.TypeInvalidRequest,
			Message: "The model `" + x.m.Name + "` is served by prefill and decode pods only; " + string(x.ctx.Path()) + " goes to a combined pod."}), stageFail
	case g.seekModel(x):
		// on to the next model's pods
	case x.last == nil && x.home.pod != "":
		x.last, x.stage = answer(&openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServer,
			Message: "The stored response this request names is on pod `" + x.home.pod + "`, which is not available now."}), stageFail
	case x.last == nil:
		x.last, x.stage = answer(openai.NoHealthyPod(x.req.Model)), stageFail
	case x.seeking:
		// The pods not asked may hold the stored response x seeks; when
		// a reload left only pods that said 404, the last one's stands.
		if f := unsought(x, x.m); f != nil {
			if x.retryFrom != nil {
				// Not x's answer now: the access log lists it.
				x.retriedFrom, x.retryFrom = append(x.retriedFrom, x.retryFrom), nil
			}
			x.last = f
		}
		x.stage = stageFail
	default:
		x.stage = stageFail // the last attempt's failure says more
	}
	return true
}

// admitStage asks admission about x's first attempt (a retry was admitted
// already). A deferral waits on a worker, where x is picked anew and the
// wait goes on: false says x moved to one.
func (g *Gateway) admitStage(x *completion) bool {
	if g.admit == nil || x.attempts > 0 || x.admitted || !x.req.Kind.Outputs() {
		// Admission predicts a generation's latency: the other APIs
		// have none to predict.
		x.stage = stageAttempt
		return true
	}
	predictOn := func() (float64, float64) { return g.predict(x, x.pod, x.pod) }
	var replace func()
	if x.cascade != nil {
		// A PD pair keeps its pods while it waits: their queues drain.
		predictOn = func() (float64, float64) { pre, dec := placedPD(x); return g.predict(x, pre, dec) }
	} else {
		replace = func() {
			if p := g.pick(x.m, x, sessionOf(x)); p != nil {
				x.pod = p
			}
		}
	}
	var f *failure
	if x.deferred {
		var repick bool
		if f, repick = g.awaitAdmission(x, x.deferral, predictOn, replace); repick {
			// Its pick was made among pods that may have left, or in a
			// fleet without the pods that joined since: x picks again
			// on the fleet as it is now (follow), its deferral kept.
			x.stage = stagePick
			return true
		}
		x.deferred = false
		x.tr.admitted(g.epoch.Add(time.Duration(x.deferral.since*float64(time.Second))), f)
		if f == nil {
			// Its pick anew (replace) may have begun loading its adapter
			// on the pod: the pod has it once the load is done. On this
			// worker, adapterReady waits.
			x.stage, x.admitted = stageAttempt, true
			return g.adapterReady(x)
		}
	} else {
		since := g.clock()
		ttft, tpot := predictOn()
		var wait bool
		if wait, f = g.admitNow(x, since, ttft, tpot); wait {
			x.deferral = admitWait{since, ttft, tpot}
			x.deferred, x.stage = true, stagePick
			if !x.via.block(x) {
				return false
			}
			return true
		}
	}
	if f != nil && !g.fallBackFrom(x, f) {
		x.last, x.stage = f, stageFail
	} else if f == nil {
		x.stage, x.admitted = stageAttempt, true
	}
	return true
}

// attemptStage makes x's attempt. A PD pair's exchange is carried out
// whole here (its legs run on this worker); an attempt on one pod goes
// out through x.via, and answered moves x on. False says x is answered:
// the relay owns it, and once finished it is back in its pool, where
// nothing may touch it.
func (g *Gateway) attemptStage(x *completion) bool {
	if x.pod != nil && x.pod.Config.TLS && !x.via.block(x) {
		return false // the loop's own connections speak no TLS: a worker dials
	}
	x.attempts++
	// Only the scan of this attempt's answer sets it (the loop's Send, a
	// worker's DoCut).
	x.head.Raw = false
	if x.pd != nil && x.pd.Decision.Kind == route.PDPair {
		// Held since an attempt on one pod failed; the legs build their
		// own.
		x.dropUpstream()
		switch f := x.pd.RunPair(); f {
		case nil:
			return false
		case pd.ProbeTaken:
			return pickAgain(x)
		default:
			g.failed(x, f)
			return true
		}
	}
	if x.resp == nil {
		x.resp = &x.own
	}
	// The event loop renders a POST itself (appendUpstream); x.up, once
	// made, serves the later attempts on pods of the same API key.
	if x.up != nil && !bytes.Equal(x.upAuth, x.pod.Auth()) {
		x.dropRequest()
	}
	if x.up == nil && !(x.via.renders() && x.req.Kind != openai.KindStored) {
		x.up, x.upAuth = fasthttp.AcquireRequest(), x.pod.Auth()
		g.buildUpstream(x.ctx, x.up, x.reqID, x.pod)
		if x.req.Kind == openai.KindStored {
			// Its method, and its query (stream, starting_after, limit),
			// on the path routed: the id escaped anew, dot segments
			// resolved, in origin form.
			x.up.Header.SetMethodBytes(x.ctx.Method())
			x.up.SetRequestURIBytes(x.ctx.URI().RequestURI())
		}
	}
	g.pinRank(x)
	x.tried = append(x.tried, x.pod.ID)
	x.back = slices.DeleteFunc(x.back, func(id int32) bool { return id == x.pod.ID })
	if x.up != nil {
		x.up.Header.SetHost(x.pod.Config.Address)
	}
	x.within, x.hedged = g.firstByteWithin(x, x.pod, x.pod)
	if !g.place(x.m, x, x.pod, !x.panicked) {
		return pickAgain(x)
	}
	x.tr.attempt(x.pod, x.attempts)
	if x.up != nil {
		inject(x.tr.attemptContext(), x.up)
	}
	x.stage = stageAwait
	x.via.send(x)
	return true
}

// pickAgain sends x back to its pick after another request became the
// half-open pod's probe since x picked it: x picks again, elsewhere (the
// pod stays tried), no attempt made and admission done.
func pickAgain(x *completion) bool {
	x.attempts--
	x.stage = stagePick
	return true
}

// answered takes in the outcome of x's attempt on one pod: the head of
// the pod's answer (err nil; a 200 stream's first body bytes too), or why
// none came.
func (x *completion) answered(err error) {
	g := x.g
	x.tr.answered(err)
	if x.pd != nil {
		// The pod of a PD decision: its pending-decode pick ends with the
		// send, and a decode pod names itself.
		x.pd.Ticket.Done()
		if err == nil && x.pod.Role == route.RoleDecode {
			x.ctx.Response.Header.Set(pd.HeaderDecodePod, x.pod.Config.Name)
		}
	}
	switch {
	case err == nil && x.resp.StatusCode() == fasthttp.StatusServiceUnavailable && (g.shed(x) || g.unavailableAnswer(x)):
		// picked anew: on another pod of the model (retry_on: 503), else
		// on a fallback model
	case err == nil && x.resp.StatusCode() == fasthttp.StatusNotFound && g.seekStored(x):
		// picked anew: another pod may hold the stored response
	case err == nil && g.seekPastFault(x):
		// picked anew: the pod could not say whether it holds it
	case err == nil:
		// Sent for good; x.resp stays: the relay finishes with it. A
		// retry that got its answer's head retries no more (Envoy
		// releases its budget there too), however long the answer.
		g.retryAnswered(x)
		x.dropRequest()
		x.stage = stageRespond
	case errors.Is(err, frontend.ErrClientGone):
		// The event loop closed the pod's connection with the client's,
		// which tells the pod to stop; not its failure. A prefill cut
		// short times nothing.
		x.dropRequest()
		x.idleStart, x.stage = false, stageGone
	case err == upstream.ErrCut:
		g.unplace(x, x.pod)
		x.last, x.stage = fail.ClientLeft, stageFail
	case errors.Is(err, frontend.ErrAborted):
		// The shutdown's grace is over (AbortRelays on a loop, callPod on
		// a worker): not the pod's failure, and no retry; the client is
		// told to retry.
		g.unplace(x, x.pod)
		x.last, x.stage = shuttingDown, stageFail
	default:
		g.unplace(x, x.pod)
		g.callFailed(x.pod, err, x.reachesEngine())
		f := g.podFailure(x.pod, err, x.within)
		if f.Reason == fail.Timeout && x.hedged {
			f.Reason = fail.Hung
		}
		if !g.seekPast(x, f) {
			g.failed(x, f)
		}
	}
}

// dropAnswer lets go of the answer x's pod gave, which x passes over for
// another pod, and of x's place on that pod.
func (g *Gateway) dropAnswer(x *completion) {
	_ = x.resp.CloseBodyStream()
	x.resp.Reset()
	g.unplace(x, x.pod)
}

// shed moves x on to another pod after its pod answered 503, when
// upstream.retry_on lists 503 and tryAgain allows it, or x's search for
// a stored response goes on (seekOn); false leaves the answer to be
// relayed. The answer is whole (a 503 is never relayed as a stream), and
// dropped.
func (g *Gateway) shed(x *completion) bool {
	f := podUnavailable(x.pod)
	search := g.seeks(x) != nil
	if !search && !g.tryAgain(x, f) {
		return false
	}
	g.dropAnswer(x)
	x.last, x.stage = f, stagePick
	if search {
		seekOn(x, f)
	}
	return true
}

// Answered continues x on the event loop once its attempt's outcome is in
// (frontend.Done).
func (x *completion) Answered(err error) {
	x.answered(err)
	x.g.advance(x)
}

// Run continues x on a worker (frontend.Task) from the stage it reached on
// the event loop.
func (x *completion) Run() {
	x.via = workerTransport{}
	x.g.advance(x)
}

// failed moves x on from an attempt that failed with f: to another pick
// if tryAgain allows it, else to answering f.
func (g *Gateway) failed(x *completion, f *failure) {
	x.last, x.stage = f, stageFail
	if !g.mayRetry(x, f) {
		return
	}
	x.stage = stagePick
	x.retryAfter(f)
	if !g.takeRetry(x, foundOut(f)) {
		// pickStage waits for a place in the budget.
		x.budgetWait, x.worked = true, g.metrics.retry.answered.Load()
	}
}

// mayRetry says f allows a retry (MayRetry: a pod failed x before any
// byte of its answer came) for a reason upstream.retry_on lists, and x has
// attempts left (upstream.retries after the first). Moves off pods found
// dead (freeMove) spend none. A request that only its stored response's
// pod can answer (x.home) has nowhere else to go.
func (g *Gateway) mayRetry(x *completion, f *failure) bool {
	spent := x.attempts - x.downMoves
	if freeMove(x, f) {
		spent--
	}
	return f.MayRetry() && g.retryOn(f.Reason) && spent <= g.cfg.Upstream.Retries && x.home.pod == ""
}

// tryAgain decides a retry that cannot wait: mayRetry, and the retry
// budget has room now, or f's pod is found out (takeRetry). The caller
// counts it (retried) once x has its pod.
func (g *Gateway) tryAgain(x *completion, f *failure) bool {
	if !g.mayRetry(x, f) {
		return false
	}
	if !g.takeRetry(x, foundOut(f)) {
		g.metrics.retry.exhausted.Inc()
		return false
	}
	x.retryAfter(f)
	return true
}

// retryAfter makes f the failure x's next pick retries, which retried
// counts once the pick found x a pod; f's pod may take x again once it
// is back (mayReturn), which f decides as it comes.
func (x *completion) retryAfter(f *failure) {
	x.retryFrom = f
	if mayReturn(f) {
		x.back = append(x.back, f.Pod.ID)
	}
}

// awaitRetry waits, on a worker, up to retryBudgetWait for x's place in
// the retry budget (its last failure's retry was refused one). It takes
// one once another retry has worked since x's was refused (not since the
// wait began: the worker may start it after those answers came): a pod
// that failed with many requests sends their retries at once, and the
// healthy pods' first answers free places for the rest, while under a
// fleet-wide failure no retry works and the budget stays as Envoy's. It
// goes on without one once the failed pod is found out (a check, or a
// refused connection): as for a pod found dead, its requests are what it
// held. False: neither came in time, or x is to wait no more (interrupted).
func (g *Gateway) awaitRetry(x *completion) bool {
	x.budgetWait = false
	m := g.metrics.retry
	for deadline := time.Now().Add(retryBudgetWait); ; {
		if (m.answered.Load() != x.worked && g.takeRetry(x, false)) || (foundOut(x.last) && g.takeRetry(x, true)) {
			return true
		}
		if g.interrupted(x) != nil || time.Now().After(deadline) {
			m.exhausted.Inc()
			return false
		}
		time.Sleep(retryBackoff)
	}
}

// foundOut says f's pod failed more than f's request: the checks found it
// dead, or a refused connection took it out. Its requests are what it
// held, so their retries go on whatever the retry budget.
func foundOut(f *failure) bool { return f.Reason == fail.Down || !f.Pod.Healthy() }

// freeMove says x's move on from f spends no retry: f's pod was found
// dead (fail.Down) on x's first attempt on it. The checks, not the
// request, failed it, and the pods bound such moves; a pod x went back
// to (mayReturn) that is found dead again spends one, so a fleet whose
// pods keep dying and coming back cannot hold x for ever.
func freeMove(x *completion, f *failure) bool {
	if f.Reason != fail.Down || !f.MayRetry() {
		return false
	}
	i := slices.Index(x.tried, f.Pod.ID)
	return i < 0 || !slices.Contains(x.tried[i+1:], f.Pod.ID)
}

// mayReturn says x may go back to f's pod once the checks find it
// healthy again: nothing of x is left there (its connection was refused,
// or closed before a byte of its answer as the checks found the pod
// dead), and f's pod is out, so its being available again says a check
// passed since. A pod that hung past a deadline, reset the connection or
// shed x was not found out by it: x does not go back to those.
func mayReturn(f *failure) bool {
	return (f.Reason == fail.Refused || f.Reason == fail.Down) && foundOut(f)
}

// retryBudgetWait bounds how long a retry waits for a place in the retry
// budget, so that under a fleet-wide failure clients still get their
// error fast.
const retryBudgetWait = 250 * time.Millisecond

// retried counts x's retry after x.retryFrom, if one is due, and logs
// it, spaced: x has a pod to go to. A retry that found none is no retry:
// its failure is x's answer.
func (g *Gateway) retried(x *completion) {
	f := x.retryFrom
	if f == nil {
		return
	}
	x.retryFrom = nil
	if freeMove(x, f) {
		x.downMoves++
	}
	g.metrics.retry.byReason[f.Reason].Inc()
	x.retriedFrom = append(x.retriedFrom, f)
	if held, ok := g.notSentLog.Allow(g.ledger.Now(), notSentLogEvery); ok {
		g.log.Warn("pod failed a request before answering; trying another", "pod", f.Pod.Config.Name, "reason", string(f.Reason), "err", f.E.Message, "suppressed", held)
	}
}

// notSentLogEvery spaces the lines of requests moved to another pod.
const notSentLogEvery = time.Second

// retryBackoff is the longest first wait before a retry (it doubles per
// attempt); a retry goes to another pod, so it need not wait long.
const retryBackoff = 5 * time.Millisecond

// maxBackoffShift caps the doubling (5 ms << 10: about 5 s), which a
// long retry list (upstream.retries) would overflow.
const maxBackoffShift = 10

// enter counts x in flight unless max_in_flight requests already are;
// leave, on every way out (finish, fail), gives the count back.
func (g *Gateway) enter(x *completion) bool {
	n := g.inFlight.Add(1)
	if g.cfg.MaxInFlight > 0 && n > int64(g.cfg.MaxInFlight) {
		g.inFlight.Add(-1)
		return false
	}
	x.inFlight = true
	return true
}

func (g *Gateway) leave(x *completion) {
	g.leaveRetry(x)
	if x.deferred {
		// Deferred, and ended before its wait began (no pod left on the
		// worker, an adapter that failed to load): its queue entry would
		// stand at the head, and every later deferred request behind it.
		x.deferred = false
		g.admit.Withdraw(x.ticket.ID)
	}
	if x.inFlight {
		x.inFlight = false
		g.inFlight.Add(-1)
	}
}

package gateway

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/admit"
	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// completion is the state of one completion request, pooled so a request
// allocates nothing the next one could reuse.
type completion struct {
	// First the fields each event of a relayed stream reads, together:
	// its events come milliseconds apart, when x has left the caches, and
	// each cache line they span is a miss an event.
	//
	// The request's own, for its parts that run as a frontend.Task or
	// frontend.Done: the gateway, the parsed body, a plain attempt's pod,
	// the PD exchange of a request cascade routes, the client's context,
	// the model and the snapshot it is of (a pick on another follows the
	// fleet: follow), a plain attempt's upstream request and response.
	g    *Gateway
	req  *openai.Request
	pod  *pool.Pod
	pd   *pd.Call
	ctx  *fasthttp.RequestCtx
	m    *pool.Model
	snap *pool.Snapshot
	up   *fasthttp.Request
	resp *fasthttp.Response
	// failure is the error the gateway answered with itself after the
	// request reached a pod (a stream that broke), for the access log.
	failure *openai.Error
	// A stream's: its model's metrics and its tokens' timing.
	modelStats *modelMetrics
	times      tokenTimes
	events     openai.Splitter
	counted    openai.TokenCounter
	// nextSeq is the sequence number of a Responses API stream's next
	// event: the gateway's own error event, should the stream break.
	nextSeq int
	// explain says the client asked for its decision, explained is the
	// explanation still to send (explain.go); tr is the request's spans
	// (trace.go).
	explain   bool
	explained *explanation
	tr        reqTrace

	hdr clientHeaders
	// found is the client's API key, nil when keys are off: the access
	// log names it, admitted or not. key is found once it admitted the
	// request; releasing the completion returns its concurrency slot and
	// charges its output.
	key, found *limits.Key
	// rateHead is the header lines of found's standing at admission
	// (limits.Decision.AppendHeaders), which every answer to x carries;
	// empty when the key has no rate limit, or keys are off.
	rateHead []byte
	// ticket names the request (ticket.ID) and holds its ledger charge.
	ticket   ledger.Ticket
	class    admit.Class
	routeReq route.Request
	cands    []route.Candidate
	scratch  []float64
	// tried is the pods x was sent to, a pod once per attempt on it;
	// back those of them it may go to again (mayReturn) once available.
	tried, back []int32
	// stage is the next of the request's stages to run (stages.go), via
	// the transport it runs on; attempts counts the attempts made, and
	// last is the latest one's failure, or what ends the request.
	stage    stage
	via      transport
	attempts int
	// panicked: the last pick took a pod whatever its breaker's state
	// (panic.go), so its attempt claims no half-open probe; seeking:
	// x asks the pods in turn for a stored response (seekStored), which
	// never panics, and asked: its last pod just said it has none, so
	// the next pick goes at once (a failure's retry still backs off and
	// waits for the budget); admitted: admission let x through, so a
	// pick again after a lost probe does not ask it anew.
	panicked, seeking, asked, admitted bool
	// seekAll: x is a call by an id the gateway does not know while it
	// serves several models, which no request names: its search asks
	// the combined pods of each model in turn (seekModel).
	seekAll bool
	// downMoves: attempts given up on pods found dead, which spend no
	// retry (mayRetry).
	downMoves int
	last      *failure
	// retriedFrom is each attempt that failed and was retried, in order,
	// for the access log (the failure x is answered with is not one);
	// retryFrom is the failure x is to be retried after, counted and
	// listed (retried) once a pick found x a pod.
	retriedFrom []*failure
	retryFrom   *failure
	// within bounds the current attempt's wait for its first answer byte,
	// shorter than the response timeout when hedged (firstByteWithin);
	// retrying: x holds a place in the retry budget (takeRetry);
	// budgetWait: x is to wait for one before its retry (awaitRetry);
	// worked: how many retries' answers had begun when x's was refused.
	within     time.Duration
	hedged     bool
	hedge      hedgeCut // a worker's first-byte deadline (giveUp)
	retrying   bool
	budgetWait bool
	worked     int64
	// inFlight: the request holds one of max_in_flight (enter, leave).
	inFlight bool
	// logHead is what the access log line needs of the request, kept
	// before a stream's relay (keepLogHead).
	logHead []byte
	// wait is what a relay waiting for its pod's next bytes reads into
	// (see relay): one byte, so an idle stream holds no buffer; primed
	// is how many of its bytes the attempt read, which the relay passes
	// on first (workerTransport.send).
	wait   [1]byte
	primed int
	// client wakes the relay's read when the client leaves; out is a
	// worker relay's client writer, which BeforeRead flushes.
	client clientLeft
	out    *frontend.StreamWriter
	// home is the pod of the stored response x names, when the gateway
	// knows it: x goes there alone; prefer the pod its conversation
	// (prompt_cache_key) went to last, which x goes to while it is
	// available; respID names the response x makes, when it is to be
	// stored (responses.go).
	home, prefer home
	respID       []byte
	start        time.Time

	// The prompt as the prefix index sees it: its ids as the model's
	// engine computes them (empty unless the model has a tokenizer; see
	// tokenize), block keys, and each pod's matched depth in blocks (by
	// pool.Pod.Slot). A completion batch's prompts are the engine's
	// requests of their own, each keyed from the root: idEnds and chains
	// say where each prompt's ids and keys end (empty for one prompt),
	// and depth sums their matches, chainDepth holding each in turn.
	ids        []uint32
	idEnds     []int
	keys       []uint64
	chains     []int
	depth      []int32
	chainDepth []int32
	looked     bool

	// The placement: the chosen candidate, the uncached tokens charged to
	// its prefill queue, and whether that queue was empty (then the first
	// token times the pod's prefill speed).
	chosen    route.Candidate
	uncached  int64
	idleStart bool
	firstSeen bool
	// pin is the data-parallel rank of the attempt's pod that the attempt
	// names (pinRank); rankOnUp says x.up carries it.
	pin      rankPin
	rankOnUp bool

	// policy, when set, replaces the model's policy for this request (a
	// routing-strategy header naming one), and policyCache says it reads
	// prefix matches; cascade routes a request whose strategy is "pd" (pd
	// is its prefill/decode exchange).
	policy      route.Policy
	policyCache bool
	cascade     *route.PDRouter

	// own is the plain attempt's resp, kept with x for life with its body
	// buffer (KeepBodyBuffer): taken from fasthttp's pools, a response
	// and its body buffer cost four pool operations a request, and the
	// body pool's size calibration counts every return on one counter
	// that both event loops' cores share.
	own fasthttp.Response
	// upAuth is the pod API key up carries (pool.Pod.Auth).
	upAuth []byte
	// head is the answer's header lines when the event loop scanned
	// them (Raw), which resp's header then lacks; reqID is the
	// request's X-Request-Id (requestIDOf).
	head  upstream.AnswerHead
	reqID []byte
	// countedOn: the model whose prompt token counters counted x last
	// (place), so that each model counts a request once.
	countedOn *modelMetrics
	// deferred: admission deferred x before it moved to a worker, as
	// deferral says; rejected: its last decision rejected x, counted when
	// x is answered (fail) unless a fallback model's decision replaces it.
	deferred, rejected bool
	deferral           admitWait
	// What the request's model name resolved to (models.go): its LoRA
	// adapter (nil for none), the name that served it when an alias or a
	// fallback chose it ("" otherwise), and the fallbacks left to try.
	adapter   *pool.Adapter
	served    string
	fallbacks []string
	// tiers is the PD path's scratch for its pods' adapter fit; loads
	// are the adapter loads the pick's pods wait for (loadAdapter).
	tiers []uint8
	loads [2]*pool.AdapterLoad
	// predictedTTFT is its pick's prediction (seconds; 0 when nothing
	// reads it).
	predictedTTFT float64
}

// completionPool's completions keep their openai.Request (recycled with
// them) and their own response: one pool for all three.
var completionPool = sync.Pool{New: func() any {
	x := &completion{req: openai.NewRequest()}
	x.own.KeepBodyBuffer = true
	return x
}}

// maxKeptBody bounds the body buffer a completion's own response keeps
// (bytes): a larger answer's goes to the collector, as fasthttp's body
// pool drops buffers past the sizes it mostly sees.
const maxKeptBody = 64 << 10

// resetOwn readies x's own response for its next attempt or request.
func (x *completion) resetOwn() {
	x.own.ReleaseBody(maxKeptBody)
	x.own.Reset()
}

// acquireCompletion takes the request's start, its RequestCtx's Time (set
// as its head was read), so that no clock is read for it again.
func acquireCompletion(start time.Time) *completion {
	x := completionPool.Get().(*completion)
	x.start = start
	return x
}

// takeCompletion is acquireCompletion for ctx, with one its loop kept
// (releaseCompletion) when ctx is served on one.
func takeCompletion(ctx *fasthttp.RequestCtx) *completion {
	if l := frontend.LoopOf(ctx); l != nil {
		if x, ok := l.TakeSpare().(*completion); ok {
			x.start = ctx.Time()
			return x
		}
	}
	return acquireCompletion(ctx.Time())
}

// releaseCompletion gives x back: to the loop it was served on, if it
// was (then this runs there), which the loop's next request takes.
func releaseCompletion(x *completion) {
	via := x.via
	x.req.Recycle()
	if x.resp != nil {
		x.resetOwn()
	}
	x.cands, x.tried, x.back, x.failure = x.cands[:0], x.tried[:0], x.back[:0], nil
	clear(x.retriedFrom)
	x.retriedFrom = x.retriedFrom[:0]
	x.stage, x.via, x.attempts, x.downMoves, x.last, x.retryFrom = stagePick, nil, 0, 0, nil, nil
	x.panicked, x.seeking, x.asked, x.admitted, x.seekAll = false, false, false, false, false
	x.within, x.hedged, x.budgetWait, x.primed = 0, false, false, 0
	x.logHead, x.times, x.reqID, x.head.Raw = x.logHead[:0], tokenTimes{}, x.reqID[:0], false
	x.ids, x.idEnds, x.keys, x.chains, x.looked = x.ids[:0], x.idEnds[:0], x.keys[:0], x.chains[:0], false
	x.uncached, x.idleStart, x.firstSeen, x.ticket = 0, false, false, ledger.Ticket{}
	x.pin, x.rankOnUp, x.hedge.timer = rankPin{}, false, nil
	x.class = admit.Interactive
	if x.key != nil {
		x.key.Done(time.Now(), x.counted.Tokens())
		x.key = nil
	}
	x.found, x.rateHead = nil, x.rateHead[:0]
	x.policy, x.policyCache, x.cascade = nil, false, nil
	x.adapter, x.served, x.fallbacks, x.loads = nil, "", nil, [2]*pool.AdapterLoad{}
	x.home, x.prefer, x.respID = home{}, home{}, x.respID[:0]
	x.g, x.ctx, x.m, x.snap, x.up, x.upAuth, x.resp, x.pod, x.modelStats, x.countedOn = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
	x.deferred, x.rejected, x.hdr, x.client.conn, x.out = false, false, clientHeaders{}, nil, nil
	if x.pd != nil {
		x.pd.Release()
		x.pd = nil
	}
	x.events.Reset()
	x.counted.Reset()
	x.nextSeq = 0
	if t, ok := via.(loopTransport); ok && t.l.GiveSpare(x) {
		return
	}
	completionPool.Put(x)
}

// AppendRequest renders x's attempt on x.pod for the event loop's Send
// (appendUpstream).
func (x *completion) AppendRequest(dst []byte) []byte { return x.g.appendUpstream(dst, x) }

// dropRequest gives back x.up, x's request to a pod, when it was made.
func (x *completion) dropRequest() {
	if x.up != nil {
		fasthttp.ReleaseRequest(x.up)
		x.up, x.upAuth = nil, nil
	}
}

// dropUpstream gives back x's request to a pod and its response.
func (x *completion) dropUpstream() {
	x.dropRequest()
	if x.resp != nil {
		x.resetOwn()
		x.resp = nil
	}
}

// clientLeft reports whether x's client has closed its connection, as far
// as its front end can tell. It is asked only on a worker's waits (a
// deferral, a retry's), which may last seconds: on fasthttp it watches the
// connection from the first ask on (frontend.WatchClient).
func (x *completion) clientLeft() bool {
	select {
	case <-frontend.WatchClient(x.ctx):
		return true
	default:
		return false
	}
}

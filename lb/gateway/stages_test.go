package gateway

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/fail"
	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// scripted is a transport whose sends end as a script says, without a
// socket: errs[i] is the outcome of the i-th send (nil: a 200 answer).
// An async send leaves the outcome to the test (Answered), as the event
// loop does; block false moves a waiting request "to a worker".
type scripted struct {
	errs     []error
	async    bool
	blocks   bool
	sent     []string
	detached int
	relayed  bool
}

func (s *scripted) send(x *completion) {
	s.sent = append(s.sent, x.pod.Config.Name)
	if s.async {
		return
	}
	err := errUnscripted
	if len(s.errs) > 0 {
		err, s.errs = s.errs[0], s.errs[1:]
	}
	switch err {
	case nil:
		x.resp.SetStatusCode(fasthttp.StatusOK)
		x.resp.SetBodyString(`{"choices":[]}`)
	case errAnswered503:
		x.resp.SetStatusCode(fasthttp.StatusServiceUnavailable)
		x.resp.SetBodyString(`{"error":{"message":"queue full","type":"server_error"}}`)
		err = nil
	}
	x.answered(err)
}

// errUnscripted is the outcome of a send past the script's: the pod
// reset the connection, as a test that sent more than it meant to counts
// it (a failed attempt), rather than a panic.
var errUnscripted = fmt.Errorf("scripted: a send past the script: %w", fasthttp.ErrConnectionClosed)

func (s *scripted) relay(x *completion, pod *pool.Pod, resp *fasthttp.Response) {
	s.relayed = true
	x.g.finish(x, x.m, pod, resp, fasthttp.StatusOK)
}

// renders as the event loop does when async: a request's x.up is then
// never made.
func (s *scripted) renders() bool { return s.async }

func (s *scripted) block(*completion) bool {
	if !s.blocks {
		s.detached++
	}
	return s.blocks
}

// stagesGateway is a gateway over three pods of one model, with neither
// health checks nor sockets.
func stagesGateway(t *testing.T, retries int, adm *admit.ClassConfig) (*Gateway, *pool.Model) {
	t.Helper()
	cfg := config.Default()
	cfg.Upstream.Retries = retries
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	for i := range 3 {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	return testGateway(t, cfg, upstream.Dialer(nil), adm)
}

// bareGateway is a gateway over cfg's pods (validated, then built with
// dial) with its ledger and metrics, and nothing started: no health
// checks, feeds or tracing.
func bareGateway(tb testing.TB, cfg config.Config, dial pool.DialFunc) (*Gateway, *pool.Snapshot) {
	tb.Helper()
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	snap, err := pool.Build(&cfg, dial, nil)
	if err != nil {
		tb.Fatal(err)
	}
	g := &Gateway{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), epoch: time.Now(), tokenizing: make(chan struct{}, 1), aborted: make(chan struct{})}
	g.ledger = ledger.New(cfg.TokenLoad, ledger.Env{})
	g.ledger.SetPods(ledgerMembers(snap))
	g.metrics = newMetrics(&g.inFlight)
	g.metrics.addModels(snap)
	g.pool.Publish(snap)
	return g, snap
}

// testGateway is a gateway over cfg's pods, dialed with dial, without
// health checks; adm, if set, is every class's admission.
func testGateway(t *testing.T, cfg config.Config, dial pool.DialFunc, adm *admit.ClassConfig) (*Gateway, *pool.Model) {
	t.Helper()
	g, snap := bareGateway(t, cfg, dial)
	keys, err := limits.NewKeys(nil)
	if err != nil {
		t.Fatal(err)
	}
	g.keys.Store(keys)
	if adm != nil {
		c := admit.DefaultConfig()
		c.Classes[admit.Interactive], c.Classes[admit.Batch] = *adm, *adm
		if g.admit, err = admit.New(c); err != nil {
			t.Fatal(err)
		}
	}
	return g, snap.Models[0]
}

// startCompletion is a parsed request of class at its pick stage.
func startCompletion(t *testing.T, g *Gateway, m *pool.Model, via transport, class admit.Class) (*completion, *fasthttp.RequestCtx) {
	t.Helper()
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/completions")
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
	x := acquireCompletion(time.Now())
	if err := x.req.Parse(openai.KindCompletion, []byte(`{"model":"m","prompt":"say something long enough to count"}`)); err != nil {
		t.Fatal(err)
	}
	if !g.enter(x) {
		t.Fatal("not entered")
	}
	x.class = class
	x.ticket = ledger.Ticket{ID: g.nextID.Add(1)}
	x.g, x.ctx, x.m, x.snap, x.via, x.stage = g, ctx, m, g.pool.Load(), via, stagePick
	return x, ctx
}

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}

// errAnswered503 scripts a pod's 503 answer.
var errAnswered503 = errors.New("scripted: the pod answered 503")

// TestStages runs the plain path's stages over a scripted transport: each
// case is how the attempts end, and what the client gets.
func TestStages(t *testing.T) {
	type tc struct {
		name    string
		retries int
		errs    []error
		// retryOn replaces upstream.retry_on; busy requests hold the
		// retry budget already (of its minimum, 3); firstByte is
		// upstream.first_byte.factor.
		retryOn   []string
		busy      int64
		firstByte float64
		// sends is how many attempts go out; status the request's, as
		// counted; retried the retries counted, by reason; exhausted
		// those the budget refused.
		sends     int
		status    int
		retried   map[fail.Reason]uint64
		exhausted uint64
	}
	f := func(c tc) {
		t.Helper()
		g, m := stagesGateway(t, c.retries, nil)
		if c.retryOn != nil {
			g.cfg.Upstream.Retry.On = c.retryOn
		}
		g.cfg.Upstream.Retry.FirstByte.Factor = c.firstByte
		g.metrics.retry.inFlight.Store(c.busy)
		s := &scripted{errs: c.errs, blocks: true}
		x, ctx := startCompletion(t, g, m, s, admit.Interactive)
		// A whole answer's first byte is predicted from its max_tokens.
		x.req.MaxTokens = 16
		g.advance(x)
		if len(s.sent) != c.sends || counted(g, m) != c.status {
			t.Errorf("%s: %d sends, status %d; want %d, %d (%s)", c.name, len(s.sent), counted(g, m), c.sends, c.status, ctx.Response.Body())
		}
		if len(s.sent) == 2 && s.sent[0] == s.sent[1] {
			t.Errorf("%s: retried on the same pod %s", c.name, s.sent[0])
		}
		if n := g.inFlight.Load(); n != 0 {
			t.Errorf("%s: %d in flight after the end", c.name, n)
		}
		if n := g.metrics.retry.inFlight.Load(); n != c.busy {
			t.Errorf("%s: %d retries in flight after the end, want the %d busy", c.name, n, c.busy)
		}
		for reason, n := range g.metrics.retry.byReason {
			if n.Get() != c.retried[reason] {
				t.Errorf("%s: %d retries for %q, want %d", c.name, n.Get(), reason, c.retried[reason])
			}
		}
		if n := g.metrics.retry.exhausted.Get(); n != c.exhausted {
			t.Errorf("%s: budget refused %d retries, want %d", c.name, n, c.exhausted)
		}
		for _, p := range m.Pods {
			if p.InFlight() != 0 || p.QueuedPrefill() != 0 {
				t.Errorf("%s: pod %s keeps %d in flight, %d tokens queued", c.name, p.Config.Name, p.InFlight(), p.QueuedPrefill())
			}
			if active, _ := g.ledger.Prefill(p.ID); active != 0 {
				t.Errorf("%s: pod %s keeps a ledger charge of %d", c.name, p.Config.Name, active)
			}
		}
	}
	once := func(r fail.Reason) map[fail.Reason]uint64 { return map[fail.Reason]uint64{r: 1} }
	f(tc{name: "answered", retries: 1, errs: []error{nil}, sends: 1, status: 200})
	f(tc{name: "dial refused, then answered", retries: 1, errs: []error{errRefused, nil}, sends: 2, status: 200, retried: once(fail.Refused)})
	f(tc{name: "dial refused everywhere", retries: 1, errs: []error{errRefused, errRefused}, sends: 2, status: 502, retried: once(fail.Refused)})
	f(tc{name: "dial refused, no retries", retries: 0, errs: []error{errRefused}, sends: 1, status: 502})
	f(tc{name: "every connection busy, then answered", retries: 1, errs: []error{fasthttp.ErrNoFreeConns, nil}, sends: 2, status: 200, retried: once(fail.Refused)})
	f(tc{name: "reset before the first byte, then answered", retries: 1, errs: []error{fasthttp.ErrConnectionClosed, nil}, sends: 2, status: 200, retried: once(fail.Reset)})
	f(tc{name: "reset before the first byte, retry_on refused", retries: 1, retryOn: []string{config.RetryOnRefused},
		errs: []error{fasthttp.ErrConnectionClosed}, sends: 1, status: 502})
	f(tc{name: "reset mid-answer", retries: 1, errs: []error{io.ErrUnexpectedEOF}, sends: 1, status: 502})
	f(tc{name: "timeout, then answered", retries: 1, errs: []error{fasthttp.ErrTimeout, nil}, sends: 2, status: 200, retried: once(fail.Timeout)})
	f(tc{name: "timeout everywhere", retries: 2, errs: []error{fasthttp.ErrTimeout, fasthttp.ErrTimeout, fasthttp.ErrTimeout}, sends: 3, status: 504,
		retried: map[fail.Reason]uint64{fail.Timeout: 2}})
	f(tc{name: "stalled mid-answer", retries: 1, errs: []error{frontend.ErrAnswerStalled}, sends: 1, status: 504})
	f(tc{name: "hung past the first-byte deadline, then answered", retries: 1, firstByte: 3, errs: []error{fasthttp.ErrTimeout, nil},
		sends: 2, status: 200, retried: once(fail.Hung)})
	f(tc{name: "retry_on none", retries: 1, retryOn: []string{config.RetryOnNone}, errs: []error{errRefused}, sends: 1, status: 502})
	f(tc{name: "503 relayed by default", retries: 1, errs: []error{errAnswered503}, sends: 1, status: 503})
	f(tc{name: "503, retry_on 503, then answered", retries: 1, retryOn: []string{config.RetryOn503}, errs: []error{errAnswered503, nil},
		sends: 2, status: 200, retried: once(fail.Unavailable)})
	f(tc{name: "503 everywhere, retry_on 503", retries: 1, retryOn: []string{config.RetryOn503}, errs: []error{errAnswered503, errAnswered503},
		sends: 2, status: 503, retried: once(fail.Unavailable)})
	f(tc{name: "budget spent", retries: 1, busy: 3, errs: []error{fasthttp.ErrConnectionClosed}, sends: 1, status: 502, exhausted: 1})
	f(tc{name: "budget has room", retries: 1, busy: 2, errs: []error{fasthttp.ErrConnectionClosed, nil}, sends: 2, status: 200, retried: once(fail.Reset)})
	f(tc{name: "client gone on a worker", retries: 1, errs: []error{upstream.ErrCut}, sends: 1, status: fail.StatusClientClosed})
	f(tc{name: "client gone on the loop", retries: 1, errs: []error{frontend.ErrClientGone}, sends: 1, status: fail.StatusClientClosed})
}

// TestFirstByteHedgedOnlyWithARetry: an attempt gets the first-byte
// deadline only when giving up on it could lead to another pod: attempts
// left, timeouts in retry_on, and a pod of the model not tried yet.
func TestFirstByteHedgedOnlyWithARetry(t *testing.T) {
	f := func(name string, retries int, retryOn []string, tried int, want bool) {
		t.Helper()
		g, m := stagesGateway(t, retries, nil)
		g.cfg.Upstream.Retry.FirstByte.Factor = 3
		if retryOn != nil {
			g.cfg.Upstream.Retry.On = retryOn
		}
		x, _ := startCompletion(t, g, m, &scripted{}, admit.Interactive)
		defer g.leave(x)
		x.req.MaxTokens = 16
		for _, p := range m.Combined[:tried] {
			x.attempts++
			x.tried = append(x.tried, p.ID)
		}
		if _, hedged := g.firstByteWithin(x, m.Combined[0], m.Combined[0]); hedged != want {
			t.Errorf("%s: hedged %v, want %v", name, hedged, want)
		}
	}
	f("first of two attempts", 1, nil, 1, true)
	f("last attempt", 1, nil, 2, false)
	f("no retries", 0, nil, 1, false)
	f("retry_on without timeout", 1, []string{config.RetryOnReset}, 1, false)
	f("every pod tried", 5, nil, 3, false)
}

// TestFirstByteHedgedWithFallbackOrDecode: a retry may also go to a
// fallback model, or on a PD model to another decode pod: the hedge stays
// on for those (it was off where the model had no other combined pod).
func TestFirstByteHedgedWithFallbackOrDecode(t *testing.T) {
	t.Run("fallback", func(t *testing.T) {
		cfg := config.Default()
		cfg.Upstream.Retries = 1
		cfg.Upstream.Retry.FirstByte.Factor = 3
		cfg.Models = []config.Model{{Name: "m", Policy: "least_request", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n", Policy: "least_request"}}
		cfg.Pods = []config.Pod{{Name: "hung", Model: "m", Address: "127.0.0.1:10000"}, {Name: "ok", Model: "n", Address: "127.0.0.1:10001"}}
		cfg.Provision()
		g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
		s := &scripted{errs: []error{fasthttp.ErrTimeout, nil}, blocks: true}
		x, ctx := startCompletion(t, g, m, s, admit.Interactive)
		ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
		x.fallbacks = m.LoRA.Fallback
		x.req.MaxTokens = 16
		g.advance(x)
		if fmt.Sprint(s.sent) != "[hung ok]" {
			t.Fatalf("sent to %v", s.sent)
		}
		if n := g.metrics.retry.byReason[fail.Hung].Get(); n != 1 {
			t.Errorf("%d hedged retries, want 1 (its retry went to fallback n)", n)
		}
	})
	t.Run("decode", func(t *testing.T) {
		cfg := config.Default()
		cfg.Upstream.Retries = 1
		cfg.Upstream.Retry.FirstByte.Factor = 3
		cfg.Models = []config.Model{{Name: "m"}}
		pod := func(name, role string, port int) config.Pod {
			return config.Pod{Name: name, Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", port), Role: role, Roleset: "a"}
		}
		cfg.Pods = []config.Pod{pod("p0", "prefill", 10000), pod("d0", "decode", 10001), pod("d1", "decode", 10002)}
		cfg.Provision()
		g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
		x, _ := startCompletion(t, g, m, &scripted{}, admit.Interactive)
		defer g.leave(x)
		x.req.MaxTokens = 16
		d0 := m.Decode[0]
		x.attempts++
		x.tried = append(x.tried, d0.ID)
		if _, hedged := g.firstByteWithin(x, d0, d0); !hedged {
			t.Errorf("decode pod d0 with d1 not tried: not hedged")
		}
		// No retry takes a decode pod that is down.
		d1 := m.Decode[1]
		d1.Refused()
		if _, hedged := g.firstByteWithin(x, d0, d0); hedged || d1.Available(g.ledger.Now()) {
			t.Errorf("hedged with the only other decode pod down")
		}
	})
}

// counted is the one status g counted for m's requests, 0 for none.
func counted(g *Gateway, m *pool.Model) int {
	status := 0
	for i, c := range g.metrics.model(m).requests {
		if c.Get() > 0 && i < len(statusCodes) {
			status = statusCodes[i]
		}
	}
	return status
}

// TestStagesOnTheLoop: where a request must wait (a retry's backoff, an
// admission deferral) the event loop's transport moves it to a worker,
// which goes on from the stage it reached.
func TestStagesOnTheLoop(t *testing.T) {
	g, m := stagesGateway(t, 1, nil)
	loop := &scripted{async: true}
	x, _ := startCompletion(t, g, m, loop, admit.Interactive)
	g.advance(x)
	if x.stage != stageAwait || len(loop.sent) != 1 {
		t.Fatalf("after the loop's send: stage %d, %d sends", x.stage, len(loop.sent))
	}
	x.Answered(errRefused)
	if x.stage != stagePick || loop.detached != 1 || x.last == nil || !x.last.MayRetry() {
		t.Fatalf("after a refused dial on the loop: stage %d, detached %d, last %v", x.stage, loop.detached, x.last)
	}
	worker := &scripted{errs: []error{nil}, blocks: true}
	x.via = worker
	g.advance(x)
	if len(worker.sent) != 1 || worker.sent[0] == loop.sent[0] || counted(g, m) != 200 || g.inFlight.Load() != 0 {
		t.Fatalf("on the worker: sent to %v after %v, status %d, %d in flight", worker.sent, loop.sent, counted(g, m), g.inFlight.Load())
	}
}

// TestRetryBudgetWorkedBeforeTheWait: a retry the budget refused waits
// for a place once another retry has worked since the refusal, though
// that retry's answer came before the wait began on a worker (which a
// loaded machine starts late): the burst's last requests were answered
// 502 when the wait counted answers from its own start.
func TestRetryBudgetWorkedBeforeTheWait(t *testing.T) {
	g, m := stagesGateway(t, 1, nil)
	r := g.metrics.retry
	r.inFlight.Store(3) // the budget's minimum, all taken
	loop := &scripted{async: true}
	x, _ := startCompletion(t, g, m, loop, admit.Interactive)
	g.advance(x)
	x.Answered(fasthttp.ErrConnectionClosed)
	if !x.budgetWait || loop.detached != 1 {
		t.Fatalf("after a reset with the budget spent: waits %v, detached %d", x.budgetWait, loop.detached)
	}
	// One of the retries holding the budget has its answer begin.
	r.answered.Add(1)
	r.inFlight.Add(-1)
	worker := &scripted{errs: []error{nil}, blocks: true}
	x.via = worker
	start := time.Now()
	g.advance(x)
	if len(worker.sent) != 1 || counted(g, m) != 200 || r.exhausted.Get() != 0 {
		t.Fatalf("on the worker after %v: %d sends, status %d, %d refused by the budget", time.Since(start), len(worker.sent), counted(g, m), r.exhausted.Get())
	}
	if n := r.inFlight.Load(); n != 2 {
		t.Fatalf("%d retries in flight after the end, want the 2 still busy", n)
	}
}

// TestRetryWaitEndsAtShutdown: a retry waiting for a place in the retry
// budget when the shutdown's grace ends goes out no more: its client gets
// the shutdown's 503 at once, not the failed attempt's error once the wait
// runs out.
func TestRetryWaitEndsAtShutdown(t *testing.T) {
	g, m := stagesGateway(t, 1, nil)
	g.metrics.retry.inFlight.Store(3) // the budget's minimum, all taken
	loop := &scripted{async: true}
	x, ctx := startCompletion(t, g, m, loop, admit.Interactive)
	g.advance(x)
	x.Answered(fasthttp.ErrConnectionClosed)
	if !x.budgetWait {
		t.Fatal("the retry does not wait for the budget")
	}
	g.AbortStreams()
	worker := &scripted{blocks: true}
	x.via = worker
	g.advance(x)
	if len(worker.sent) != 0 || ctx.Response.StatusCode() != 503 || !strings.Contains(string(ctx.Response.Body()), "shutting down") || g.inFlight.Load() != 0 {
		t.Errorf("%d sends, got %d %q, %d in flight; want the shutdown's 503", len(worker.sent), ctx.Response.StatusCode(), ctx.Response.Body(), g.inFlight.Load())
	}
}

// TestStagesAdmission: a request admission sheds is answered 429 with
// Retry-After before any send; one it defers waits on a worker, picked
// anew.
func TestStagesAdmission(t *testing.T) {
	tight := &admit.ClassConfig{TTFTSLO: 1e-9}
	g, m := stagesGateway(t, 1, tight)
	s := &scripted{blocks: true}
	x, ctx := startCompletion(t, g, m, s, admit.Interactive)
	g.advance(x)
	if len(s.sent) != 0 || ctx.Response.StatusCode() != 429 || string(ctx.Response.Header.Peek("Retry-After")) == "" || g.inFlight.Load() != 0 {
		t.Fatalf("shed: %d sends, status %d, Retry-After %q, %d in flight", len(s.sent), ctx.Response.StatusCode(), ctx.Response.Header.Peek("Retry-After"), g.inFlight.Load())
	}

	g, m = stagesGateway(t, 1, &admit.ClassConfig{TTFTSLO: 1e-9, MaxWait: 60})
	loop := &scripted{}
	x, _ = startCompletion(t, g, m, loop, admit.Batch)
	g.advance(x)
	if len(loop.sent) != 0 || loop.detached != 1 || x.stage != stagePick || !x.deferred {
		t.Fatalf("deferred on the loop: %d sends, detached %d, stage %d, deferred %v", len(loop.sent), loop.detached, x.stage, x.deferred)
	}
	g.admit.Withdraw(x.ticket.ID)
	g.fail(x.ctx, x, m, fail.ClientLeft)
}

// TestDeferredThenNoPod: a request admission deferred on the loop, whose
// pick on the worker finds no pod left, is answered 503 and leaves the
// deferral queue: an entry left behind would stand at its head, and every
// later deferred request would wait behind it until its max wait ran out.
func TestDeferredThenNoPod(t *testing.T) {
	g, m := stagesGateway(t, 1, &admit.ClassConfig{TTFTSLO: 1e-9, MaxWait: 60})
	loop := &scripted{}
	x, ctx := startCompletion(t, g, m, loop, admit.Batch)
	g.advance(x)
	if !x.deferred || loop.detached != 1 {
		t.Fatalf("not deferred on the loop: deferred %v, detached %d", x.deferred, loop.detached)
	}
	for _, p := range m.Pods {
		p.Refused() // the pods fail their checks meanwhile
	}
	x.via = &scripted{blocks: true}
	g.advance(x)
	if ctx.Response.StatusCode() != 503 || g.inFlight.Load() != 0 {
		t.Fatalf("status %d, %d in flight", ctx.Response.StatusCode(), g.inFlight.Load())
	}
	if d, ok := g.admit.Head(); ok {
		t.Fatalf("request %d ended, and is still in the deferral queue (%d waiting)", d.ID, g.admit.Stats(admit.Batch).Waiting)
	}
}

// TestDeferredWaitersExpireTheirOwn: a deferred request whose wait runs
// out leaves the queue itself, not the oldest expired one: that one's
// client may leave next, its waiter find its entry gone, and the first
// request's entry would stay at the head for good, every later deferred
// request waiting behind it.
func TestDeferredWaitersExpireTheirOwn(t *testing.T) {
	g, m := stagesGateway(t, 1, &admit.ClassConfig{TTFTSLO: 1e-9, MaxWait: 0.02})
	older, _ := startCompletion(t, g, m, &scripted{}, admit.Batch)
	g.advance(older)
	newer, ctx := startCompletion(t, g, m, &scripted{}, admit.Batch)
	g.advance(newer)
	if !older.deferred || !newer.deferred {
		t.Fatalf("not both deferred: %v %v", older.deferred, newer.deferred)
	}
	newer.via = &scripted{blocks: true}
	g.advance(newer) // waits past its max wait
	if ctx.Response.StatusCode() != 429 {
		t.Fatalf("the expired request got %d", ctx.Response.StatusCode())
	}
	if n := g.admit.Stats(admit.Batch).Rejected; n != 1 {
		t.Fatalf("%d rejected after one wait ran out, want 1", n)
	}
	// The older request's client leaves, as its waiter sees it.
	g.admit.Withdraw(older.ticket.ID)
	g.fail(older.ctx, older, m, fail.ClientLeft)
	if d, ok := g.admit.Head(); ok {
		t.Fatalf("both requests ended, and request %d is still in the deferral queue", d.ID)
	}
}

// TestProbeTakenRetry: a panic retry (every other pod ejected) goes to an
// ejected pod whatever it holds in flight, as before the half-open probe
// was claimed; it looped, picking that pod and giving it back, until the
// pod's requests ended.
func TestProbeTakenRetry(t *testing.T) {
	g, m := stagesGateway(t, 2, nil)
	for _, i := range []int{1, 2} {
		m.Pods[i].Acquire(1) // a request in flight on it
		m.Pods[i].Eject(g.ledger.Now(), time.Minute)
	}
	s := &scripted{errs: []error{fasthttp.ErrConnectionClosed, nil}, blocks: true}
	x, _ := startCompletion(t, g, m, s, admit.Interactive)
	done := make(chan struct{})
	go func() { g.advance(x); close(done) }()
	select {
	case <-done:
		if len(s.sent) != 2 {
			t.Errorf("sent to %v", s.sent)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("the retry still looping after 2 s; sent to %v", s.sent)
		for _, i := range []int{1, 2} {
			m.Pods[i].Release(1)
		}
		<-done
	}
}

// TestProbeTakenAdmittedOnce: a request whose half-open pod another took
// as its probe since its pick goes elsewhere without being admitted anew
// (which counted it twice, and could defer or shed one admitted).
func TestProbeTakenAdmittedOnce(t *testing.T) {
	g, m := stagesGateway(t, 0, &admit.ClassConfig{TTFTSLO: 1000})
	for _, p := range m.Pods {
		p.Eject(g.ledger.Now(), 0) // half-open, idle
	}
	s := &scripted{errs: []error{nil}, blocks: true}
	x, _ := startCompletion(t, g, m, s, admit.Interactive)
	if !g.pickStage(x) || !g.admitStage(x) || x.stage != stageAttempt {
		t.Fatalf("stage %d", x.stage)
	}
	taken := x.pod
	if !taken.AcquireProbe(1) { // another loop's request
		t.Fatal("probe")
	}
	g.advance(x)
	if st := g.admit.Stats(admit.Interactive); st.Admitted != 1 {
		t.Errorf("admission counted %d admitted for one request", st.Admitted)
	}
	if len(s.sent) != 1 || s.sent[0] == taken.Config.Name {
		t.Errorf("sent to %v; %s was taken", s.sent, taken.Config.Name)
	}
	taken.Release(1)
}

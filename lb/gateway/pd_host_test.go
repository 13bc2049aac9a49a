package gateway

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/fail"
	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
)

// inMemoryPair is a gateway over a prefill pod "pre" and a decode pod
// "dec" of model "m", one roleset, both answered by h over an in-memory
// listener.
func inMemoryPair(t *testing.T, h fasthttp.RequestHandler) (*Gateway, *pool.Model) {
	t.Helper()
	return inMemoryGateway(t, h, nil,
		config.Pod{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
		config.Pod{Name: "dec", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"})
}

// inMemoryGateway is a gateway over pods of model "m", every one
// answered by h over an in-memory listener; adm, if set, is every
// class's admission.
func inMemoryGateway(t *testing.T, h fasthttp.RequestHandler, adm *admit.ClassConfig, pods ...config.Pod) (*Gateway, *pool.Model) {
	t.Helper()
	ln := fasthttputil.NewInmemoryListener()
	t.Cleanup(func() { ln.Close() })
	srv := &fasthttp.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	dial := func(string, time.Duration, *tls.Config) (net.Conn, error) { return ln.Dial() }
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = pods
	return testGateway(t, cfg, dial, adm)
}

// startLongStream is a streamed completion of a prompt long enough to
// time a prefill by, at its pick stage on a worker.
func startLongStream(t *testing.T, g *Gateway, m *pool.Model) (*completion, *fasthttp.RequestCtx) {
	t.Helper()
	x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
	body := `{"model":"m","prompt":"` + strings.Repeat("a long prompt to prefill ", 400) + `","stream":true}`
	if err := x.req.Parse(openai.KindCompletion, []byte(body)); err != nil {
		t.Fatal(err)
	}
	ctx.Request.SetBodyString(body)
	return x, ctx
}

// answerPair answers a vLLM pair's legs: the prefill leg with KV
// parameters, the decode leg with the completion.
func answerPair(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if bytes.Contains(ctx.PostBody(), []byte(`"do_remote_decode":true`)) {
		ctx.SetBodyString(`{"kv_transfer_params":{"remote_engine_id":"e"}}`)
		return
	}
	ctx.SetBodyString(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}`)
}

// TestPDAnswerLeavesTheCompletion: a PD attempt that answers the client
// finishes its completion, which goes back to its pool; the stages must
// not touch it after that (another request may hold it by then). Both
// of the cascade's kinds that answer inside the attempt are played: a
// pair and the decode pod alone.
func TestPDAnswerLeavesTheCompletion(t *testing.T) {
	for _, kind := range []route.PDKind{route.PDPair, route.PDLocal} {
		g, m := inMemoryPair(t, answerPair)
		opts := route.DefaultPDOptions()
		if kind == route.PDLocal {
			opts.LocalPrefillMaxTokens = 1 << 20
		}
		r, err := route.NewPDRouter(opts)
		if err != nil {
			t.Fatal(err)
		}
		x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
		ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
		x.cascade = r
		g.advance(x)
		if ctx.Response.StatusCode() != 200 || g.inFlight.Load() != 0 {
			t.Fatalf("kind %d: status %d (%s), %d in flight", kind, ctx.Response.StatusCode(), ctx.Response.Body(), g.inFlight.Load())
		}
		if pre := string(ctx.Response.Header.Peek(pd.HeaderPrefillPod)); (pre == "pre") != (kind == route.PDPair) ||
			string(ctx.Response.Header.Peek(pd.HeaderDecodePod)) != "dec" {
			t.Fatalf("kind %d: answered by prefill pod %q, decode pod %q", kind, pre, ctx.Response.Header.Peek(pd.HeaderDecodePod))
		}
		// releaseCompletion left it at stagePick; a stage written after
		// the answer would show.
		if x.stage != stagePick || x.ctx != nil {
			t.Errorf("kind %d: the completion was touched after it was released: stage %d", kind, x.stage)
		}
	}
}

// TestPDDecodeChargeCountsChoices: the decode pod's ledger charge of a
// request of n choices grows as n sequences do, each generating its own
// output into KV (ledger.Prompt.Sequences): a second after its pick, a
// request of 8 choices weighs 8 s of output growth, not 1.
func TestPDDecodeChargeCountsChoices(t *testing.T) {
	var g *Gateway
	var dec *pool.Pod
	var ageSec float64
	g, m := inMemoryPair(t, func(ctx *fasthttp.RequestCtx) {
		if !bytes.Contains(ctx.PostBody(), []byte(`"do_remote_decode":true`)) {
			_, ageSec = g.ledger.Decode(dec.ID, g.ledger.Now()+int64(time.Second))
		}
		answerPair(ctx)
	})
	dec = m.Decode[0]
	r, err := route.NewPDRouter(route.DefaultPDOptions())
	if err != nil {
		t.Fatal(err)
	}
	x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
	body := `{"model":"m","prompt":"say something long enough to count","n":8}`
	if err := x.req.Parse(openai.KindCompletion, []byte(body)); err != nil {
		t.Fatal(err)
	}
	ctx.Request.SetBodyString(body)
	x.cascade = r
	g.advance(x)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if ageSec < 8 {
		t.Fatalf("decode charge aged %v s a second after its pick, want at least 8 (8 choices)", ageSec)
	}
}

// TestPDStages runs the PD decisions that send the whole request to one
// pod (here PDLocal: the decode pod prefills itself) through the plain
// attempt's stages over a scripted transport: each case is how the
// attempts end, and what the client gets. The decode pod's pending pick
// ends with the send; an answer names the decode pod.
func TestPDStages(t *testing.T) {
	type tc struct {
		name    string
		retries int
		errs    []error
		sends   int
		status  int
	}
	f := func(c tc) {
		t.Helper()
		cfg := config.Default()
		cfg.Upstream.Retries = c.retries
		cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
		cfg.Pods = []config.Pod{
			{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
			{Name: "dec0", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
			{Name: "dec1", Model: "m", Address: "127.0.0.1:10003", Role: config.RoleDecode, Roleset: "a"},
		}
		g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
		opts := route.DefaultPDOptions()
		opts.LocalPrefillMaxTokens = 1 << 20
		r, err := route.NewPDRouter(opts)
		if err != nil {
			t.Fatal(err)
		}
		s := &scripted{errs: c.errs, blocks: true}
		x, ctx := startCompletion(t, g, m, s, admit.Interactive)
		x.cascade = r
		g.advance(x)
		if len(s.sent) != c.sends || counted(g, m) != c.status {
			t.Errorf("%s: %d sends, status %d; want %d, %d (%s)", c.name, len(s.sent), counted(g, m), c.sends, c.status, ctx.Response.Body())
		}
		if len(s.sent) == 2 && s.sent[0] == s.sent[1] {
			t.Errorf("%s: retried on the same pod %s", c.name, s.sent[0])
		}
		if dec := string(ctx.Response.Header.Peek(pd.HeaderDecodePod)); (c.status == 200) != (dec == s.sent[len(s.sent)-1]) {
			t.Errorf("%s: %s %q after sends to %v", c.name, pd.HeaderDecodePod, dec, s.sent)
		}
		if n := g.inFlight.Load(); n != 0 {
			t.Errorf("%s: %d in flight after the end", c.name, n)
		}
		for _, p := range m.Pods {
			if p.InFlight() != 0 || p.QueuedPrefill() != 0 || p.Pending().Load() != 0 {
				t.Errorf("%s: pod %s keeps %d in flight, %d tokens queued, %d pending", c.name, p.Config.Name, p.InFlight(), p.QueuedPrefill(), p.Pending().Load())
			}
		}
	}
	f(tc{name: "answered", retries: 1, errs: []error{nil}, sends: 1, status: 200})
	f(tc{name: "decode pod refused, then the other answered", retries: 1, errs: []error{errRefused, nil}, sends: 2, status: 200})
	f(tc{name: "refused everywhere", retries: 1, errs: []error{errRefused, errRefused}, sends: 2, status: 502})
	f(tc{name: "reset before the first byte, then the other answered", retries: 1, errs: []error{fasthttp.ErrConnectionClosed, nil}, sends: 2, status: 200})
	f(tc{name: "timeout everywhere", retries: 1, errs: []error{fasthttp.ErrTimeout, fasthttp.ErrTimeout}, sends: 2, status: 504})
	f(tc{name: "reset mid-answer", retries: 1, errs: []error{io.ErrUnexpectedEOF}, sends: 1, status: 502})
	f(tc{name: "client gone", retries: 1, errs: []error{upstream.ErrCut}, sends: 1, status: fail.StatusClientClosed})
}

// TestPDFailedPrefillTeachesNoSpeed: a prefill leg that failed computed
// nothing the gateway can time (here its pod sheds it with a 503 at
// once), so the pod's learned prefill speed stays as it was: a pod that
// fails fast must not look fast to the conductor policy and admission.
func TestPDFailedPrefillTeachesNoSpeed(t *testing.T) {
	g, m := inMemoryPair(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"error":{"message":"queue full","type":"server_error"}}`)
	})
	r, err := route.NewPDRouter(route.DefaultPDOptions())
	if err != nil {
		t.Fatal(err)
	}
	x, ctx := startLongStream(t, g, m)
	x.cascade = r
	pre := m.Prefill[0]
	speed := pre.Speed.TokensPerSec()
	g.advance(x)
	if ctx.Response.StatusCode() != fasthttp.StatusServiceUnavailable {
		t.Fatalf("status %d (%s), want the prefill pod's 503", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if got := pre.Speed.TokensPerSec(); got != speed {
		t.Fatalf("a prefill leg shed at once taught the pod a prefill speed of %.0f tokens/s (was %.0f)", got, speed)
	}
}

// recordHosts is answerPair's handler that also records the Host of each
// request it answers, which hosts returns.
func recordHosts() (answer func(*fasthttp.RequestCtx), hosts func() []string) {
	var mu sync.Mutex
	var seen []string
	answer = func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		seen = append(seen, string(ctx.Host()))
		mu.Unlock()
		answerPair(ctx)
	}
	return answer, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// runPastTakenProbe picks and admits x with the PD router, wanting a
// decision of kind, lets another loop's request take the probe of the
// pod chosen names, runs x on, and returns that pod.
func runPastTakenProbe(t *testing.T, g *Gateway, x *completion, kind route.PDKind, chosen func(*completion) *pool.Pod) *pool.Pod {
	t.Helper()
	r, err := route.NewPDRouter(route.DefaultPDOptions())
	if err != nil {
		t.Fatal(err)
	}
	x.cascade = r
	if !g.pickStage(x) || !g.admitStage(x) || x.stage != stageAttempt || x.pd.Decision.Kind != kind {
		t.Fatalf("stage %d, decision %d", x.stage, x.pd.Decision.Kind)
	}
	taken := chosen(x)
	if !taken.AcquireProbe(1) {
		t.Fatal("probe")
	}
	g.advance(x)
	taken.Release(1)
	return taken
}

// TestPDProbeTaken: a pair whose half-open prefill pod another request
// took as its one probe since the decision is not sent there: it is
// decided anew, on the other prefill pod, without being admitted again,
// and leaves nothing counted on the pod it lost.
func TestPDProbeTaken(t *testing.T) {
	answer, hosts := recordHosts()
	g, m := inMemoryGateway(t, answer, &admit.ClassConfig{TTFTSLO: 1000},
		config.Pod{Name: "pre0", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
		config.Pod{Name: "pre1", Model: "m", Address: "127.0.0.1:10003", Role: config.RolePrefill, Roleset: "a"},
		config.Pod{Name: "dec", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"})
	for _, p := range m.Prefill {
		p.Eject(g.ledger.Now(), 0) // half-open, idle
	}
	x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
	ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
	taken := runPastTakenProbe(t, g, x, route.PDPair, func(x *completion) *pool.Pod { return x.pd.Pre })
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d (%s)", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if slices.Contains(hosts(), taken.Config.Address) || string(ctx.Response.Header.Peek(pd.HeaderPrefillPod)) == taken.Config.Name {
		t.Errorf("legs sent to %v, prefilled on %s; %s (%s) was taken", hosts(), ctx.Response.Header.Peek(pd.HeaderPrefillPod), taken.Config.Name, taken.Config.Address)
	}
	if st := g.admit.Stats(admit.Interactive); st.Admitted != 1 {
		t.Errorf("admission counted %d admitted for one request", st.Admitted)
	}
	if n := g.inFlight.Load(); n != 0 {
		t.Errorf("%d in flight after the end", n)
	}
	for _, p := range m.Pods {
		if active, _ := g.ledger.Prefill(p.ID); p.InFlight() != 0 || p.QueuedPrefill() != 0 || p.Pending().Load() != 0 || active != 0 {
			t.Errorf("pod %s keeps %d in flight, %d tokens queued, %d pending, %d active tokens charged", p.Config.Name, p.InFlight(), p.QueuedPrefill(), p.Pending().Load(), active)
		}
	}
}

// TestPDCombinedProbeAfterPanic: a PD decision is made among available
// pods, so the whole request it sends to a half-open combined pod takes
// that pod's one probe, even when the request's last pick (another
// model's, before a fallback) was a panic pick, which takes none.
func TestPDCombinedProbeAfterPanic(t *testing.T) {
	answer, hosts := recordHosts()
	g, m := inMemoryGateway(t, answer, nil,
		config.Pod{Name: "comb0", Model: "m", Address: "127.0.0.1:10001", Role: config.RoleCombined},
		config.Pod{Name: "comb1", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleCombined})
	for _, p := range m.Pods {
		p.Eject(g.ledger.Now(), 0) // half-open, idle
	}
	x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
	x.panicked = true
	taken := runPastTakenProbe(t, g, x, route.PDCombined, func(x *completion) *pool.Pod { return x.pod })
	if ctx.Response.StatusCode() != 200 || slices.Contains(hosts(), taken.Config.Address) {
		t.Errorf("status %d, sent to %v; %s (%s) was taken", ctx.Response.StatusCode(), hosts(), taken.Config.Name, taken.Config.Address)
	}
	for _, p := range m.Pods {
		if p.InFlight() != 0 {
			t.Errorf("pod %s keeps %d in flight", p.Config.Name, p.InFlight())
		}
	}
}

// TestPDDecodeProbePending: a pair's decode pod counts it in flight only
// once its decode leg is sent, after the prefill leg; until then its
// pending pick holds a half-open decode pod's one probe, so neither a
// decision nor a decode leg moved off a refusing pod takes that pod.
func TestPDDecodeProbePending(t *testing.T) {
	g, m, r := onePrefillTwoDecode(t)
	// Else a first attempt that finds no pair goes beside the probes
	// (TestPDPanics).
	g.cfg.Health.PanicRouting = false
	// Each decode pod half-open, idle, and picked by a pair whose prefill
	// leg still runs.
	held := make([]route.PendingTicket, len(m.Decode))
	for i, d := range m.Decode {
		d.Eject(g.ledger.Now(), 0)
		held[i] = d.Pending().Pick()
	}
	x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
	x.cascade = r
	if err := g.pickPD(x); err == nil && x.pd.Decision.Kind == route.PDPair {
		t.Errorf("paired with %s, whose probe a pending pick holds", x.pd.Dec.Config.Name)
	}
	held[0].Done()
	if err := g.pickPD(x); err != nil || x.pd.Decision.Kind != route.PDPair || x.pd.Dec != m.Decode[0] {
		t.Fatalf("decision %d on %v (%v), want a pair with dec0", x.pd.Decision.Kind, x.pd.Dec, err)
	}
	// The decode leg's connection is refused: dec1's probe is still held.
	x.attempts = 1
	x.tried = append(x.tried, m.Decode[0].ID)
	if x.MoveDecode(&failure{E: openai.UpstreamError("refused"), Pod: m.Decode[0], Reason: fail.Refused}) {
		t.Errorf("moved to %s, whose probe a pending pick holds", x.pd.Dec.Config.Name)
	}
	held[1].Done()
	g.fail(ctx, x, m, fail.ClientLeft)
	for _, d := range m.Decode {
		if n := d.Pending().Load(); n != 0 || d.InFlight() != 0 {
			t.Errorf("pod %s keeps %d pending, %d in flight", d.Config.Name, n, d.InFlight())
		}
	}
}

// TestPDPanics: a PD request's first attempt that finds no available
// pair (every decode pod ejected, or half-open with its probe held; the
// prefill pod half-open with its probe out) is paired among the pods whose
// checks pass, placed beside any probe, and counted as a panic pick; not
// when the checks fail them too, nor with a fallback model left. A retry
// is paired among the pods it has not tried, whatever their state. None
// is with health.panic_routing off.
func TestPDPanics(t *testing.T) {
	f := func(name string, prepare func(*Gateway, *pool.Model, *completion), pairs bool) {
		t.Helper()
		g, m, r := onePrefillTwoDecode(t)
		x, _ := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
		defer g.leave(x)
		x.cascade = r
		prepare(g, m, x)
		err := g.pickPD(x)
		paired := err == nil && x.pd.Decision.Kind == route.PDPair
		if paired != pairs {
			t.Errorf("%s: paired %v (%v), want %v", name, paired, err, pairs)
		}
		if n := g.metrics.model(m).panics.Get(); n != map[bool]uint64{true: 1}[pairs] {
			t.Errorf("%s: pdlb_panic_picks_total %d", name, n)
		}
		// The exchange places the pair beside a probe too.
		if paired && !x.PlacePair(x.pd.Pre, x.pd.Dec) {
			t.Errorf("%s: the pair was not placed", name)
		}
	}
	ejected := func(g *Gateway, m *pool.Model, _ *completion) {
		for _, d := range m.Decode {
			d.Eject(g.ledger.Now(), time.Minute)
		}
	}
	f("decode pods ejected", ejected, true)
	f("decode pods half-open, probes held", func(g *Gateway, m *pool.Model, _ *completion) {
		for _, d := range m.Decode {
			d.Eject(g.ledger.Now(), 0)
			held := d.Pending().Pick()
			t.Cleanup(held.Done)
		}
	}, true)
	f("prefill pod half-open, its probe out", func(g *Gateway, m *pool.Model, _ *completion) {
		pre := m.Prefill[0]
		pre.Eject(g.ledger.Now(), 0)
		pre.Acquire(1) // the probe
		t.Cleanup(func() { pre.Release(1) })
	}, true)
	f("decode pods down", func(_ *Gateway, m *pool.Model, _ *completion) {
		for _, d := range m.Decode {
			d.Refused()
		}
	}, false)
	f("decode pods ejected, a fallback left", func(g *Gateway, m *pool.Model, x *completion) {
		ejected(g, m, x)
		x.fallbacks = []string{"other"}
	}, false)
	f("decode pods ejected, a retry", func(g *Gateway, m *pool.Model, x *completion) {
		ejected(g, m, x)
		x.attempts = 1
	}, true)
	f("decode pods down, a retry", func(_ *Gateway, m *pool.Model, x *completion) {
		for _, d := range m.Decode {
			d.Refused()
		}
		x.attempts = 1
	}, true)
	f("decode pods ejected, a retry that tried them", func(g *Gateway, m *pool.Model, x *completion) {
		ejected(g, m, x)
		x.attempts = 1
		for _, d := range m.Decode {
			x.tried = append(x.tried, d.ID)
		}
	}, false)
	f("decode pods ejected, panic routing off", func(g *Gateway, m *pool.Model, x *completion) {
		ejected(g, m, x)
		g.cfg.Health.PanicRouting = false
	}, false)
}

// TestPDMoveDecodeIndexesTheNewPod: a decode leg moved off a refusing pod
// is indexed as holding the prompt on its new pod, as PlacePair indexes
// the first one: the next turn of the conversation is routed by it.
func TestPDMoveDecodeIndexesTheNewPod(t *testing.T) {
	g, m, r := onePrefillTwoDecode(t)
	x, ctx := startLongStream(t, g, m)
	x.cascade = r
	if err := g.pickPD(x); err != nil || x.pd.Decision.Kind != route.PDPair {
		t.Fatalf("decision %d (%v), want a pair", x.pd.Decision.Kind, err)
	}
	if !x.PlacePair(x.pd.Pre, x.pd.Dec) {
		t.Fatal("the pair was not placed")
	}
	refused := x.pd.Dec
	x.attempts = 1
	x.tried = append(x.tried, refused.ID)
	if !x.MoveDecode(&failure{E: openai.UpstreamError("refused"), Pod: refused, Reason: fail.Refused}) {
		t.Fatal("the decode leg was not moved")
	}
	depth := make([]int32, m.Slots)
	m.Prefix.Match(x.keys, depth)
	if len(x.keys) == 0 || depth[x.pd.Dec.Slot] != int32(len(x.keys)) {
		t.Errorf("%s, the decode leg's new pod, holds %d of the prompt's %d blocks in the index", x.pd.Dec.Config.Name, depth[x.pd.Dec.Slot], len(x.keys))
	}
	g.fail(ctx, x, m, fail.ClientLeft)
}

// TestPDMoveDecodePanics: a decode leg the chosen pod refused moves to the
// other decode pod when that one is ejected or found down too, a panic
// pick (the pair's retry would run the prefill again), unless it was
// tried or panic routing is off: then the pair's own failure decides. The
// exchange runs within its attempt (attemptStage counted it: attempts 1).
func TestPDMoveDecodePanics(t *testing.T) {
	f := func(name string, prepare func(*Gateway, *completion, *pool.Pod), moves bool) {
		t.Helper()
		g, m, r := onePrefillTwoDecode(t)
		x, ctx := startLongStream(t, g, m)
		defer g.fail(ctx, x, m, fail.ClientLeft)
		x.cascade = r
		if err := g.pickPD(x); err != nil || x.pd.Decision.Kind != route.PDPair || !x.PlacePair(x.pd.Pre, x.pd.Dec) {
			t.Fatalf("%s: decision %d (%v), want a pair placed", name, x.pd.Decision.Kind, err)
		}
		refused := x.pd.Dec
		other := m.Decode[0]
		if other == refused {
			other = m.Decode[1]
		}
		x.attempts = 1
		x.tried = append(x.tried, refused.ID)
		prepare(g, x, other)
		moved := x.MoveDecode(&failure{E: openai.UpstreamError("refused"), Pod: refused, Reason: fail.Refused})
		if moved != moves || (moved && x.pd.Dec != other) {
			t.Errorf("%s: moved %v to %s, want %v", name, moved, x.pd.Dec.Config.Name, moves)
		}
		if n := g.metrics.model(m).panics.Get(); n != map[bool]uint64{true: 1}[moves] {
			t.Errorf("%s: pdlb_panic_picks_total %d", name, n)
		}
	}
	ejected := func(g *Gateway, _ *completion, d *pool.Pod) { d.Eject(g.ledger.Now(), time.Minute) }
	f("the other ejected", ejected, true)
	f("the other down", func(_ *Gateway, _ *completion, d *pool.Pod) { d.Refused() }, true)
	f("the other ejected and tried", func(g *Gateway, x *completion, d *pool.Pod) {
		ejected(g, x, d)
		x.tried = append(x.tried, d.ID)
	}, false)
	f("the other ejected, panic routing off", func(g *Gateway, x *completion, d *pool.Pod) {
		ejected(g, x, d)
		g.cfg.Health.PanicRouting = false
	}, false)
	// The move spends a retry, and a retry panics before it falls back
	// (mayPanic): the fallback model has none of the prefill's KV.
	f("the other ejected, a fallback model left", func(g *Gateway, x *completion, d *pool.Pod) {
		ejected(g, x, d)
		x.fallbacks = []string{"other"}
	}, true)
}

// onePrefillTwoDecode is an in-memory gateway over a prefill pod and two
// decode pods of one roleset, and a PD router with AIBrix's defaults.
func onePrefillTwoDecode(t *testing.T) (*Gateway, *pool.Model, *route.PDRouter) {
	t.Helper()
	g, m := inMemoryGateway(t, answerPair, nil,
		config.Pod{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
		config.Pod{Name: "dec0", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
		config.Pod{Name: "dec1", Model: "m", Address: "127.0.0.1:10003", Role: config.RoleDecode, Roleset: "a"})
	r, err := route.NewPDRouter(route.DefaultPDOptions())
	if err != nil {
		t.Fatal(err)
	}
	return g, m, r
}

// TestPDLocalRequestsTeachDrainRate: a decode pod's drain rate, which
// the cascade's drain step divides its running requests by, counts the
// whole requests it serves (PDLocal: it prefills them itself) as it
// counts pair legs: those run among its requests, and a pod serving only
// them would read as draining nothing (rate 0: unknown, which turns the
// drain step off for the whole model).
func TestPDLocalRequestsTeachDrainRate(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.PD.LocalPrefillMaxTokens = 1 << 20
	cfg.Health.Interval = time.Hour
	cfg.Health.MetricsInterval = 10 * time.Millisecond
	for _, role := range []string{config.RolePrefill, config.RoleDecode} {
		p, err := sim.Start(sim.Config{Name: role, Model: "m", Engine: engines.VLLM, Role: role, Speedup: 200, DefaultMaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		cfg.Pods = append(cfg.Pods, config.Pod{Name: role, Model: "m", Address: p.Addr(), Engine: "vllm", Role: role, Roleset: "a"})
	}
	g := started(t, cfg)
	m := g.pool.Load().Models[0]
	dec, local := m.Decode[0], g.metrics.model(m).pd.Kinds[route.PDLocal]
	// Requests until a scrape has seen one finish, or many more scrapes
	// than that takes went by.
	for deadline := time.Now().Add(5 * time.Second); dec.DrainRate() == 0 && time.Now().Before(deadline); {
		postN(t, g, 1, "/v1/completions", `{"model":"m","prompt":"a short prompt"}`)
	}
	if local.Get() == 0 {
		t.Fatal("no request was routed PDLocal")
	}
	if dec.DrainRate() == 0 {
		t.Fatalf("decode pod %s finished every PDLocal request sent to it, and its drain rate reads 0", dec.Config.Name)
	}
}

// TestPDDecodeLegAfterEjection: pairs decided on a decode pod that turns
// unavailable before their prefill legs end (ejected, or found down) send
// it no decode leg while another decode pod is available; once half-open
// it takes one of them, its probe, and the other goes to the other pod.
func TestPDDecodeLegAfterEjection(t *testing.T) {
	const dec0Addr, dec1Addr = "127.0.0.1:10002", "127.0.0.1:10003"
	f := func(name string, out func(dec0 *pool.Pod, now int64), want ...string) {
		t.Helper()
		// Decode legs to dec0 wait, so the first is in flight when the
		// second goes out.
		var mu sync.Mutex
		var decodes []string
		arrived, release := make(chan struct{}, 2), make(chan struct{})
		g, m := inMemoryGateway(t, func(ctx *fasthttp.RequestCtx) {
			if !bytes.Contains(ctx.PostBody(), []byte(`"do_remote_decode":true`)) {
				mu.Lock()
				decodes = append(decodes, string(ctx.Host()))
				mu.Unlock()
				if string(ctx.Host()) == dec0Addr {
					arrived <- struct{}{}
					select {
					case <-release:
					case <-time.After(time.Second):
					}
				}
			}
			answerPair(ctx)
		}, nil,
			config.Pod{Name: "pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
			config.Pod{Name: "dec0", Model: "m", Address: dec0Addr, Role: config.RoleDecode, Roleset: "a"},
			config.Pod{Name: "dec1", Model: "m", Address: dec1Addr, Role: config.RoleDecode, Roleset: "a"})
		r, err := route.NewPDRouter(route.DefaultPDOptions())
		if err != nil {
			t.Fatal(err)
		}
		dec0, dec1 := m.Decode[0], m.Decode[1]
		var xs [2]*completion
		for i := range xs {
			x, ctx := startCompletion(t, g, m, workerTransport{}, admit.Interactive)
			ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
			x.cascade = r
			x.tried = append(x.tried, dec1.ID) // decided on dec0
			if err := g.pickPD(x); err != nil || x.pd.Decision.Kind != route.PDPair || x.pd.Dec != dec0 {
				t.Fatalf("%s: decision %d on %v (%v), want a pair with dec0", name, x.pd.Decision.Kind, x.pd.Dec, err)
			}
			x.tried, x.stage = x.tried[:0], stageAttempt
			xs[i] = x
		}
		out(dec0, g.ledger.Now())
		done := make(chan struct{})
		go func() { g.advance(xs[0]); close(done) }()
		if want[0] == dec0Addr {
			<-arrived // the half-open pod's probe is out
		} else {
			<-done
		}
		g.advance(xs[1])
		close(release)
		<-done
		if fmt.Sprint(decodes) != fmt.Sprint(want) {
			t.Errorf("%s: decode legs sent to %v, want %v", name, decodes, want)
		}
		for _, p := range m.Pods {
			if p.InFlight() != 0 || p.Pending().Load() != 0 {
				t.Errorf("%s: pod %s keeps %d in flight, %d pending", name, p.Config.Name, p.InFlight(), p.Pending().Load())
			}
		}
	}
	f("ejected", func(d *pool.Pod, now int64) { d.Eject(now, time.Hour) }, dec1Addr, dec1Addr)
	f("down", func(d *pool.Pod, _ int64) { d.Refused() }, dec1Addr, dec1Addr)
	f("half-open", func(d *pool.Pod, now int64) { d.Eject(now, 0) }, dec0Addr, dec1Addr)
}

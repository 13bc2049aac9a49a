package gateway

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/admit"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
)

// TestPanicRetry: a retry that finds no untried pod available goes to an
// untried pod that is not (panic routing), but never to one that left the
// fleet (a reload that raced the pick: the request still holds the
// snapshot naming it); a first attempt with no pod available goes to a
// pod the health checks pass, ejected or not, and is answered 503
// without a send when the checks pass none.
func TestPanicRetry(t *testing.T) {
	reset := fasthttp.ErrConnectionClosed
	for _, c := range []panicCase{
		{"two pods ejected, reset, then answered", []int{1, 2}, nil, nil, []error{reset, nil}, 2, 200, 1},
		{"two pods ejected, reset everywhere", []int{1, 2}, nil, nil, []error{reset, reset, reset}, 3, 502, 2},
		{"every pod ejected, answered", []int{0, 1, 2}, nil, nil, []error{nil}, 1, 200, 1},
		{"every pod ejected, reset everywhere", []int{0, 1, 2}, nil, nil, []error{reset, reset, reset}, 3, 502, 3},
		{"two pods left, reset", nil, []int{1, 2}, nil, []error{reset, nil}, 1, 502, 0},
		{"one pod ejected, one left, reset, then answered", []int{1}, []int{2}, nil, []error{reset, nil, nil}, 2, 200, 1},
		{"every pod down", nil, nil, []int{0, 1, 2}, nil, 0, 503, 0},
		{"two pods down, one ejected, answered", []int{0}, nil, []int{1, 2}, []error{nil}, 1, 200, 1},
	} {
		c.run(t, true)
	}
}

// TestPanicRoutingOff: with health.panic_routing false, a first attempt
// with no pod available is answered 503 without a send, whatever the
// checks say, and a retry with no untried pod available ends with the
// last attempt's answer; nothing counts as a panic pick.
func TestPanicRoutingOff(t *testing.T) {
	reset := fasthttp.ErrConnectionClosed
	for _, c := range []panicCase{
		{"every pod ejected", []int{0, 1, 2}, nil, nil, nil, 0, 503, 0},
		{"two pods down, one ejected", []int{0}, nil, []int{1, 2}, nil, 0, 503, 0},
		{"two pods ejected, reset", []int{1, 2}, nil, nil, []error{reset, nil}, 1, 502, 0},
		{"one pod ejected, reset, then answered", []int{2}, nil, nil, []error{reset, nil}, 2, 200, 0},
	} {
		c.run(t, false)
	}
}

// panicCase is a case of TestPanicRetry: the model's pods ejected, left
// and down (their health checks failing) as listed, and the outcomes of
// the sends (errs); the sends made, the status counted and the panic
// picks counted are as wanted, with health.panic_routing as run gets it.
type panicCase struct {
	name                  string
	ejected, left, down   []int
	errs                  []error
	sends, status, panics int
}

func (c panicCase) run(t *testing.T, panicRouting bool) {
	t.Helper()
	g, m := stagesGateway(t, 2, nil)
	g.cfg.Health.PanicRouting = panicRouting
	for _, i := range c.ejected {
		m.Pods[i].Eject(g.ledger.Now(), time.Minute)
	}
	for _, i := range c.left {
		m.Pods[i].Leave()
	}
	for _, i := range c.down {
		m.Pods[i].Refused()
	}
	s := &scripted{errs: c.errs, blocks: true}
	x, ctx := startCompletion(t, g, m, s, admit.Interactive)
	g.advance(x)
	if len(s.sent) != c.sends || counted(g, m) != c.status {
		t.Errorf("%s: sent to %v, status %d; want %d sends, %d (%s)", c.name, s.sent, counted(g, m), c.sends, c.status, ctx.Response.Body())
	}
	if n := g.metrics.model(m).panics.Get(); n != uint64(c.panics) {
		t.Errorf("%s: pdlb_panic_picks_total %d, want %d", c.name, n, c.panics)
	}
	for i, p := range s.sent {
		for _, q := range s.sent[:i] {
			if p == q {
				t.Errorf("%s: sent to %v: a pod tried twice", c.name, s.sent)
			}
		}
		for _, j := range c.left {
			if p == m.Pods[j].Config.Name {
				t.Errorf("%s: sent to %v: %s left the fleet", c.name, s.sent, p)
			}
		}
	}
}

// TestFirstAttemptBesideProbes: a first attempt while every pod is
// half-open with its one probe out (each recovering from an ejection, its
// probe a whole generation long) goes to one of them beside its probe,
// rather than 503, and so does one that lost its pod's probe to another
// request between its pick and its send; a model with a fallback left
// moves there instead.
func TestFirstAttemptBesideProbes(t *testing.T) {
	probing := func() (*Gateway, *pool.Model) {
		g, m := stagesGateway(t, 2, nil)
		for _, p := range m.Combined {
			p.Eject(g.ledger.Now(), 0)
			p.Acquire(1) // the probe
			t.Cleanup(func() { p.Release(1) })
		}
		return g, m
	}
	g, m := probing()
	s := &scripted{errs: []error{nil}, blocks: true}
	x, ctx := startCompletion(t, g, m, s, admit.Interactive)
	g.advance(x)
	if len(s.sent) != 1 || counted(g, m) != 200 {
		t.Fatalf("sent to %v, status %d (%s); want one send beside a probe, 200", s.sent, counted(g, m), ctx.Response.Body())
	}
	if n := g.metrics.model(m).panics.Get(); n != 1 {
		t.Errorf("pdlb_panic_picks_total %d, want 1", n)
	}

	// The one pod the checks pass, half-open and idle: x picks it, and
	// another request takes its probe before x's attempt goes.
	g, m = stagesGateway(t, 2, nil)
	m.Pods[1].Refused()
	m.Pods[2].Refused()
	m.Pods[0].Eject(g.ledger.Now(), 0)
	s = &scripted{errs: []error{nil}, blocks: true}
	x, ctx = startCompletion(t, g, m, s, admit.Interactive)
	if !g.pickStage(x) || !g.admitStage(x) || x.pod != m.Pods[0] {
		t.Fatalf("stage %d, pod %v", x.stage, x.pod)
	}
	if !m.Pods[0].AcquireProbe(1) {
		t.Fatal("probe")
	}
	defer m.Pods[0].Release(1)
	g.advance(x)
	if len(s.sent) != 1 || counted(g, m) != 200 {
		t.Fatalf("after losing the probe: sent to %v, status %d (%s); want the pod beside its probe, 200", s.sent, counted(g, m), ctx.Response.Body())
	}

	g, m = probing()
	x, _ = startCompletion(t, g, m, &scripted{}, admit.Interactive)
	defer g.leave(x)
	x.fallbacks = []string{"other"}
	if pod := g.pick(m, x, ""); pod != nil {
		t.Fatalf("picked %s beside its probe with a fallback model left", pod.Config.Name)
	}
}

// TestRetryBackBesideProbe: a tokenization that goes back to a pod it
// left (mayReturn) takes it while the pod is half-open with its one probe
// out, as its first pick would (a tokenization is no probe: pool's
// AppendCombined); a completion keeps off it, and finds no pod.
func TestRetryBackBesideProbe(t *testing.T) {
	f := func(kind openai.Kind, want string) {
		t.Helper()
		g, m := stagesGateway(t, 2, nil)
		x, _ := startCompletion(t, g, m, &scripted{}, admit.Interactive)
		defer g.leave(x)
		if err := x.req.Parse(kind, []byte(`{"model":"m","prompt":"say something long enough to count"}`)); err != nil {
			t.Fatal(err)
		}
		back := m.Combined[0]
		back.Eject(g.ledger.Now(), 0)
		back.Acquire(1) // the probe
		defer back.Release(1)
		for _, p := range m.Combined {
			x.attempts++
			x.tried = append(x.tried, p.ID)
		}
		x.back = append(x.back, back.ID)
		got := ""
		if pod := g.pick(m, x, ""); pod != nil {
			got = pod.Config.Name
		}
		if got != want {
			t.Errorf("kind %v: picked %q, want %q", kind, got, want)
		}
	}
	f(openai.KindTokenizer, "p0")
	f(openai.KindCompletion, "")
}

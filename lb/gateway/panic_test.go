package gateway

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/admit"
	"pdlb/lb/openai"
)

// TestPanicRetry: a retry that finds no untried pod available goes to an
// untried pod that is not (panic routing), but never to one that left the
// fleet (a reload that raced the pick: the request still holds the
// snapshot naming it); a first attempt with no pod available is answered
// 503 without a send.
func TestPanicRetry(t *testing.T) {
	f := func(name string, ejected, left []int, errs []error, sends, status int) {
		t.Helper()
		g, m := stagesGateway(t, 2, nil)
		for _, i := range ejected {
			m.Pods[i].Eject(g.ledger.Now(), time.Minute)
		}
		for _, i := range left {
			m.Pods[i].Leave()
		}
		s := &scripted{errs: errs, blocks: true}
		x, ctx := startCompletion(t, g, m, s, admit.Interactive)
		g.advance(x)
		if len(s.sent) != sends || counted(g, m) != status {
			t.Errorf("%s: sent to %v, status %d; want %d sends, %d (%s)", name, s.sent, counted(g, m), sends, status, ctx.Response.Body())
		}
		for i, p := range s.sent {
			for _, q := range s.sent[:i] {
				if p == q {
					t.Errorf("%s: sent to %v: a pod tried twice", name, s.sent)
				}
			}
			for _, j := range left {
				if p == m.Pods[j].Config.Name {
					t.Errorf("%s: sent to %v: %s left the fleet", name, s.sent, p)
				}
			}
		}
	}
	reset := fasthttp.ErrConnectionClosed
	f("two pods ejected, reset, then answered", []int{1, 2}, nil, []error{reset, nil}, 2, 200)
	f("two pods ejected, reset everywhere", []int{1, 2}, nil, []error{reset, reset, reset}, 3, 502)
	f("every pod ejected", []int{0, 1, 2}, nil, nil, 0, 503)
	f("two pods left, reset", nil, []int{1, 2}, []error{reset, nil}, 1, 502)
	f("one pod ejected, one left, reset, then answered", []int{1}, []int{2}, []error{reset, nil, nil}, 2, 200)
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

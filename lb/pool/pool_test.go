package pool

import (
	"math"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/lb/route"
)

// TestSequences: a request's sequences count while it is in flight and
// not when a half-open pod refuses it as a second probe.
func TestSequences(t *testing.T) {
	p := &Pod{podState: &podState{}}
	p.set(flagHealthy, true)
	p.Acquire(8)
	p.Acquire(1)
	if p.InFlight() != 2 || p.Sequences() != 9 {
		t.Fatalf("%d requests, %d sequences in flight, want 2 and 9", p.InFlight(), p.Sequences())
	}
	p.Release(8)
	p.set(flagHalfOpen, true)
	if p.AcquireProbe(4) || p.Sequences() != 1 {
		t.Fatalf("a refused probe: %d sequences in flight, want 1", p.Sequences())
	}
	p.Release(1)
	if !p.AcquireProbe(4) || p.Sequences() != 4 {
		t.Fatalf("the probe: %d sequences in flight, want 4", p.Sequences())
	}
}

func TestCircuitBreaker(t *testing.T) {
	p := &Pod{podState: &podState{}}
	p.set(flagHealthy, true)
	const sec = int64(time.Second)
	f := func(now int64, wantState int, wantAvailable bool) {
		t.Helper()
		if got := p.Circuit(now); got != wantState {
			t.Fatalf("at %ds: state %d, want %d", now/sec, got, wantState)
		}
		if got := p.Available(now); got != wantAvailable {
			t.Fatalf("at %ds: available %v, want %v", now/sec, got, wantAvailable)
		}
	}
	f(0, CircuitClosed, true)
	// Three consecutive failures open the circuit for 10 s.
	for i := 0; i < 3; i++ {
		if p.ReportFailure(3) != (i == 2) {
			t.Fatalf("failure %d: due for ejection %v", i+1, i != 2)
		}
	}
	p.Eject(0, 10*time.Second)
	f(5*sec, CircuitOpen, false)
	// Then half-open: one probe at a time.
	f(11*sec, CircuitHalfOpen, true)
	if !p.AcquireProbe(1) {
		t.Fatal("a half-open pod with nothing in flight refuses its probe")
	}
	// A second pick that saw it available before the probe was counted.
	if p.AcquireProbe(1) || p.InFlight() != 1 {
		t.Fatalf("a half-open pod took a second probe: %d in flight", p.InFlight())
	}
	f(11*sec, CircuitHalfOpen, false)
	// A request beside the engine's work passes beside the probe.
	if !p.available(11*sec, true) {
		t.Fatal("a half-open pod with its probe in flight refuses a tokenization")
	}
	// A failed probe opens it again at once, without three failures.
	p.Release(1)
	if !p.ReportFailure(3) {
		t.Fatal("a failed probe is not due to reopen the circuit")
	}
	p.Eject(12*sec, 10*time.Second)
	f(13*sec, CircuitOpen, false)
	// A successful probe closes it.
	f(23*sec, CircuitHalfOpen, true)
	p.ReportSuccess()
	f(23*sec, CircuitClosed, true)
	if !p.AcquireProbe(1) || !p.AcquireProbe(1) {
		t.Fatal("a closed pod refused a request")
	}
	f(23*sec, CircuitClosed, true)
	if p.Ejections() != 2 || p.UpstreamErrors() != 4 {
		t.Fatalf("ejections %d, errors %d", p.Ejections(), p.UpstreamErrors())
	}
	// A failed health check takes the pod out whatever the circuit says.
	p.set(flagHealthy, false)
	f(23*sec, CircuitClosed, false)
}

// TestAvailablePD: a PD decision's pending pick on a half-open decode pod
// is its one probe until the decode leg counts in flight, and until that
// leg ends; a closed pod takes any number.
func TestAvailablePD(t *testing.T) {
	p := &Pod{podState: &podState{}}
	p.set(flagHealthy, true)
	pick := p.Pending().Pick()
	if !p.AvailablePD(0) {
		t.Fatal("a closed pod with a pending pick refuses another")
	}
	p.Eject(0, 0)
	if p.AvailablePD(0) {
		t.Fatal("a half-open pod with a pending pick takes another")
	}
	p.Acquire(1) // the decode leg is sent, then its answer's head comes
	pick.Done()
	if p.AvailablePD(0) {
		t.Fatal("a half-open pod with its probe in flight takes another")
	}
	p.Release(1)
	if !p.AvailablePD(0) {
		t.Fatal("an idle half-open pod refuses its probe")
	}
}

// TestLeave: a pod that left is passed by for good, healthy, closed
// circuit and idle as it is.
func TestLeave(t *testing.T) {
	p := &Pod{podState: &podState{}}
	p.set(flagHealthy, true)
	p.Leave()
	if p.Available(0) {
		t.Fatal("a pod that left is available")
	}
	p.ReportSuccess()
	if p.Available(int64(time.Hour)) {
		t.Fatal("a pod that left is available again after a success")
	}
	if !p.Left() {
		t.Fatal("a pod that left is not Left")
	}
}

func TestFill(t *testing.T) {
	p := &Pod{ID: 7, Slot: 2, podState: &podState{}}
	p.Speed.Init(5000, 0)
	p.weight.Store(math.Float64bits(2))
	p.Acquire(1)
	p.AddQueuedPrefill(300)
	l := p.Load()
	match := Match{Depth: []int32{0, 0, 40}, BlockSize: 16, PromptTokens: 600}
	var c route.Candidate
	l.Fill(&c, &match)
	want := route.Candidate{Pod: 7, CachedTokens: 600, InFlight: 1, QueuedPrefillTokens: 300, PrefillTokensPerSec: 5000, Weight: 2}
	if c != want {
		t.Fatalf("before a scrape: %+v, want %+v", c, want)
	}
	p.setScraped(&Scraped{Load: engines.Load{Running: 12, Waiting: 3, KVUsage: 0.75}})
	l.Fill(&c, &Match{})
	want.HasMetrics, want.Running, want.Waiting, want.KVUsage = true, 12, 3, 0.75
	if c != want {
		t.Fatalf("after a scrape: %+v, want %+v", c, want)
	}
}

// TestMayEject: at most maxPercent of a model's pods ejected at once, and
// always one.
func TestMayEject(t *testing.T) {
	const sec = int64(time.Second)
	model := func(n int) *Model {
		m := &Model{}
		for i := 0; i < n; i++ {
			m.Pods = append(m.Pods, &Pod{podState: &podState{}})
		}
		return m
	}
	for _, tc := range []struct {
		pods, ejected, percent int
		want                   bool
	}{
		{10, 0, 10, true},
		{10, 1, 10, false},
		{20, 1, 10, true},
		{20, 2, 10, false},
		{4, 0, 0, true},
		{4, 1, 0, false},
		{4, 3, 100, true},
		{1, 0, 10, true},
	} {
		m := model(tc.pods)
		for _, p := range m.Pods[:tc.ejected] {
			p.Eject(0, 10*time.Second)
		}
		if got := m.MayEject(5*sec, tc.percent); got != tc.want {
			t.Errorf("%d of %d pods ejected, max %d%%: may eject another = %v, want %v", tc.ejected, tc.pods, tc.percent, got, tc.want)
		}
		// Once their ejection ran out, they count no more.
		if !m.MayEject(11*sec, tc.percent) {
			t.Errorf("%d pods whose ejection ended still count", tc.ejected)
		}
	}
}

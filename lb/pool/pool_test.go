package pool

import (
	"testing"
	"time"
)

func TestCircuitBreaker(t *testing.T) {
	p := &Pod{podState: &podState{}}
	p.healthy.Store(true)
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
		p.ReportFailure(0, 3, 10*time.Second)
	}
	f(5*sec, CircuitOpen, false)
	// Then half-open: one probe at a time.
	f(11*sec, CircuitHalfOpen, true)
	p.Acquire()
	f(11*sec, CircuitHalfOpen, false)
	// A failed probe opens it again at once, without three failures.
	p.Release()
	if !p.ReportFailure(12*sec, 3, 10*time.Second) {
		t.Fatal("a failed probe did not reopen the circuit")
	}
	f(13*sec, CircuitOpen, false)
	// A successful probe closes it.
	f(23*sec, CircuitHalfOpen, true)
	p.ReportSuccess()
	f(23*sec, CircuitClosed, true)
	p.Acquire()
	f(23*sec, CircuitClosed, true)
	if p.Ejections() != 2 || p.UpstreamErrors() != 4 {
		t.Fatalf("ejections %d, errors %d", p.Ejections(), p.UpstreamErrors())
	}
	// A failed health check takes the pod out whatever the circuit says.
	p.healthy.Store(false)
	f(23*sec, CircuitClosed, false)
}

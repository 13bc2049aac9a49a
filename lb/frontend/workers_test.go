package frontend

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// jobFunc runs a func as a job.
type jobFunc func()

func (f jobFunc) work() { f() }

// idleWorkers waits until w has n idle workers and returns them.
func idleWorkers(t *testing.T, w *workers, n int) []*worker {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		w.mu.Lock()
		ready := append([]*worker(nil), w.ready...)
		w.mu.Unlock()
		if len(ready) == n {
			return ready
		}
	}
	t.Fatalf("want %d idle workers", n)
	return nil
}

// burst runs n jobs on w at once and returns its n idle workers once
// they all ended.
func burst(t *testing.T, w *workers, n int) []*worker {
	t.Helper()
	release := make(chan struct{})
	var started sync.WaitGroup
	for range n {
		started.Add(1)
		w.run(jobFunc(func() { started.Done(); <-release }))
	}
	started.Wait()
	close(release)
	return idleWorkers(t, w, n)
}

// TestWorkersReuse: a job goes to the worker idle last, and a burst
// makes as many workers as jobs ran at once, no more.
func TestWorkersReuse(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := newWorkers()
	defer w.stop()
	ready := burst(t, w, 3)
	done := make(chan struct{})
	w.run(jobFunc(func() { close(done) }))
	<-done
	again := idleWorkers(t, w, 3)
	if again[2] != ready[2] || again[0] != ready[0] {
		t.Fatal("the job did not go to the worker idle last, or the stack's order changed")
	}
}

// TestWorkersReap: workers idle for the idle time end; one kept busy
// stays.
func TestWorkersReap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := newWorkers()
	w.idle = 200 * time.Millisecond
	defer w.stop()
	warm := burst(t, w, 3)[2]
	// The worker idle last takes a job every few milliseconds, so it is
	// never idle for long; the others are.
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := make(chan struct{})
		w.run(jobFunc(func() { close(done) }))
		<-done
		w.mu.Lock()
		ready := append([]*worker(nil), w.ready...)
		w.mu.Unlock()
		if len(ready) == 1 && ready[0] == warm {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers, want the warm one alone", len(ready))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWorkersStop: stop ends the idle workers and, once their jobs end,
// the busy ones; a job run after stop still runs.
func TestWorkersStop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := newWorkers()
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	for range 4 {
		started.Add(1)
		finished.Add(1)
		w.run(jobFunc(func() { started.Done(); <-release; finished.Done() }))
	}
	started.Wait()
	w.run(jobFunc(func() {}))
	w.stop()
	w.stop()
	close(release)
	finished.Wait()
	done := make(chan struct{})
	w.run(jobFunc(func() { close(done) }))
	<-done
	idleWorkers(t, w, 0)
}

// BenchmarkWorkers is a job's handoff to an idle worker and back, as an
// HTTP/2 stream's: with several jobs in flight at once, each waiting for
// the next to be handed over.
func BenchmarkWorkers(b *testing.B) {
	w := newWorkers()
	defer w.stop()
	const inFlight = 16
	done := make(chan struct{}, inFlight)
	j := jobFunc(func() { done <- struct{}{} })
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if i >= inFlight {
			<-done
		}
		w.run(j)
	}
	for i := 0; i < min(b.N, inFlight); i++ {
		<-done
	}
}

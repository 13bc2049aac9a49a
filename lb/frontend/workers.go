package frontend

import (
	"sync"
	"time"
)

// workers runs jobs (connections' queues, HTTP/2 streams) on goroutines
// kept between requests: a goroutine made per request would grow its
// stack to the handler's depth each time (a profile showed the copying),
// one kept has grown already.
//
// An idle worker waits on its own channel, on a stack: run hands a job to
// the one idle last, so the few goroutines a load needs stay warm and the
// rest stay idle until the reaper ends them. A job costs a lock and a
// channel send, and its worker a lock and a clock read after it: no
// timer and no select.
type workers struct {
	mu      sync.Mutex
	ready   []*worker // idle, the longest idle first
	stopped bool      // by stop: a worker exits after its job
	quit    chan struct{}
	idle    time.Duration // how long a worker stays idle (workerIdle)
	reaping sync.Once     // the reaper starts with the first worker
	once    sync.Once
}

// worker is one goroutine of workers.
type worker struct {
	jobs      chan job // buffered: run never waits for the worker
	idleSince time.Time
}

// job is what a worker runs.
type job interface{ work() }

// workerIdle is how long a worker stays idle before the reaper ends it
// (the reaper looks every workerIdle, so it goes within twice that).
const workerIdle = 10 * time.Second

func newWorkers() *workers { return &workers{quit: make(chan struct{}), idle: workerIdle} }

// run runs j on an idle worker, or on a new one.
func (w *workers) run(j job) {
	w.mu.Lock()
	if n := len(w.ready); n > 0 {
		k := w.ready[n-1]
		w.ready[n-1] = nil
		w.ready = w.ready[:n-1]
		w.mu.Unlock()
		k.jobs <- j
		return
	}
	w.mu.Unlock()
	w.reaping.Do(func() { go w.reap() })
	go w.loop(&worker{jobs: make(chan job, 1)}, j)
}

// loop runs k's jobs, from j on, until it is told to stop (a nil job) or
// finds the workers stopped after a job.
func (w *workers) loop(k *worker, j job) {
	for ; j != nil; j = <-k.jobs {
		j.work()
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return
		}
		k.idleSince = time.Now()
		w.ready = append(w.ready, k)
		w.mu.Unlock()
	}
}

// reap ends the workers idle for w.idle, every w.idle, and all idle ones
// at stop.
func (w *workers) reap() {
	t := time.NewTicker(w.idle)
	defer t.Stop()
	for {
		var now time.Time
		select {
		case now = <-t.C:
		case <-w.quit:
		}
		w.mu.Lock()
		all, n := len(w.ready), len(w.ready)
		if !now.IsZero() {
			n = 0
			for n < all && now.Sub(w.ready[n].idleSince) >= w.idle {
				n++
			}
		}
		old := append([]*worker(nil), w.ready[:n]...)
		w.ready = append(w.ready[:0], w.ready[n:]...)
		clear(w.ready[len(w.ready):all])
		w.mu.Unlock()
		for _, k := range old {
			k.jobs <- nil
		}
		if now.IsZero() {
			return
		}
	}
}

// stop ends every worker once it is idle; a job run after stop still
// runs, on a worker that then ends. stopped is set before the reaper
// wakes, so no worker goes idle after the reaper ended the idle ones.
func (w *workers) stop() {
	w.once.Do(func() {
		w.mu.Lock()
		w.stopped = true
		w.mu.Unlock()
		close(w.quit)
	})
}

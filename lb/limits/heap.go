package limits

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// HeapHeadroom is the least the heap grows between two collections under
// HeapFloor, in bytes.
const HeapHeadroom = 64 << 20

// HeapFloor keeps the collector from running before the heap has grown by
// headroom bytes since the last collection, or by GOGC's 100% of the live
// heap when that is more. A gateway's live heap is a few MiB, so with
// GOGC alone it collects after every few MiB allocated, which a load of
// TLS handshakes or HTTP/2 streams allocates many times a second. After
// each collection it sets the GC percent to max(100, headroom/(live heap
// + stacks + globals)), so a process whose sum is over headroom collects
// as with the default; GOMEMLIMIT still caps the heap.
//
// An operator's GOGC, set in the environment, is left alone: HeapFloor
// then does nothing. stop ends the tuning and puts GOGC's default back.
func HeapFloor(headroom uint64) (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	t := &heapTuner{headroom: headroom, percent: 100}
	t.sample[0].Name = "/gc/heap/live:bytes"
	t.sample[1].Name = "/gc/scan/stack:bytes"
	t.sample[2].Name = "/gc/scan/globals:bytes"
	t.adjust()
	t.arm()
	return t.stop
}

// heapTuner's mu orders stop with the finalizer's adjust, which the
// runtime runs on its finalizer goroutine, one at a time.
type heapTuner struct {
	headroom uint64
	mu       sync.Mutex
	stopped  bool
	percent  int               // the GC percent last set
	sample   [3]metrics.Sample // what the GC percent applies to
}

func (t *heapTuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	debug.SetGCPercent(100)
}

// heapSentinel is garbage from the moment it is made: its finalizer runs
// after the next collection. It holds a pointer, so it is not batched
// with other small objects (which could keep it from being finalized).
type heapSentinel struct{ t *heapTuner }

// arm has the tuner called after the next collection.
func (t *heapTuner) arm() {
	runtime.SetFinalizer(&heapSentinel{t: t}, func(s *heapSentinel) {
		if s.t.adjust() {
			s.t.arm()
		}
	})
}

// adjust sets the GC percent from the last collection's live heap,
// stacks and globals, the sum the pacer applies the GC percent to (a
// proxy with thousands of connections' goroutines may have more stack
// than heap); a change under an eighth is not worth the call. false:
// the tuner was stopped.
func (t *heapTuner) adjust() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.sample[:])
	p := heapPercent(t.headroom, t.sample[0].Value.Uint64()+t.sample[1].Value.Uint64()+t.sample[2].Value.Uint64())
	if d := p - t.percent; d > t.percent/8 || -d > t.percent/8 {
		debug.SetGCPercent(p)
		t.percent = p
	}
	return true
}

// heapPercent is the GC percent that lets the heap grow by headroom
// before the next collection, scanned being the live heap, stacks and
// globals it applies to; never less than the default. Before the first
// collection scanned is 0; the runtime's own least heap goal (4 MiB)
// stands in for it.
func heapPercent(headroom, scanned uint64) int {
	scanned = max(scanned, 4<<20)
	return int(max(100, headroom*100/scanned))
}

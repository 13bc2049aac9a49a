package limits

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

func TestHeapPercent(t *testing.T) {
	for _, tc := range []struct {
		scanned uint64
		want    int
	}{
		{0, 1600},        // before the first collection: the runtime's 4 MiB
		{8 << 20, 800},   // 8 MiB scanned: 64 MiB of headroom is 800%
		{64 << 20, 100},  // the headroom is GOGC's default share
		{1 << 30, 100},   // never less than the default
		{100 << 20, 100}, // over the headroom
	} {
		if got := heapPercent(HeapHeadroom, tc.scanned); got != tc.want {
			t.Errorf("scanned %d: %d%%, want %d%%", tc.scanned, got, tc.want)
		}
	}
}

// gcPercent is the runtime's GC percent now.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// scanned is what the last collection's GC percent applies to: the live
// heap, the stacks and the globals.
func scanned() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() + s[1].Value.Uint64() + s[2].Value.Uint64()
}

// near reports whether the tuner would leave got for want (adjust).
func near(got, want int) bool { return max(got-want, want-got) <= got/8 }

// TestHeapFloor: after a collection the GC percent is the one that gives
// the heap its headroom, until stop puts the default back; with GOGC in
// the environment it is left alone.
func TestHeapFloor(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	if _, set := os.LookupEnv("GOGC"); !set {
		stop := HeapFloor(HeapHeadroom)
		var want int
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			if want = heapPercent(HeapHeadroom, scanned()); near(gcPercent(), want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := gcPercent(); !near(got, want) || want <= 100 {
			t.Fatalf("GC percent %d, want %d or within an eighth of it (over 100 for this test's small heap)", got, want)
		}
		stop()
		runtime.GC()
		runtime.GC()
		if got := gcPercent(); got != 100 {
			t.Fatalf("GC percent %d after stop, want the default back", got)
		}
	}
	t.Setenv("GOGC", "100")
	stop := HeapFloor(HeapHeadroom)
	defer stop()
	runtime.GC()
	runtime.GC()
	if got := gcPercent(); got != 100 {
		t.Fatalf("with GOGC set, the GC percent went to %d", got)
	}
}

// parked is a goroutine with a stack of some depth that waits for wait,
// as a connection's does.
func parked(depth int, up *sync.WaitGroup, wait <-chan struct{}) byte {
	var pad [512]byte
	if depth == 0 {
		up.Done()
		<-wait
		return pad[0]
	}
	return parked(depth-1, up, wait) + pad[depth%512]
}

// TestHeapFloorStacks: goroutine stacks count in what the GC percent
// applies to, so thousands of parked connections' goroutines on a small
// heap do not multiply the headroom: the heap still grows by about it.
func TestHeapFloorStacks(t *testing.T) {
	if _, set := os.LookupEnv("GOGC"); set {
		t.Skip("GOGC is set: HeapFloor does nothing")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	wait := make(chan struct{})
	var wg, up sync.WaitGroup
	for range 5000 {
		up.Add(1)
		wg.Go(func() { parked(12, &up, wait) })
	}
	defer func() { close(wait); wg.Wait() }()
	up.Wait()
	stop := HeapFloor(HeapHeadroom)
	defer stop()
	// A collection scans the stacks; the next one's goal is set from
	// the percent the tuner chose after the first.
	runtime.GC()
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(10 * time.Millisecond)
		runtime.GC()
		if near(gcPercent(), heapPercent(HeapHeadroom, scanned())) || time.Now().After(deadline) {
			break
		}
	}
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/gc/scan/stack:bytes"}}
	metrics.Read(s)
	live, goal, stacks := s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
	if goal-live > 2*HeapHeadroom {
		t.Fatalf("live heap %d MiB, stacks %d MiB, GC percent %d: the heap may grow %d MiB before the next collection, want about %d",
			live>>20, stacks>>20, gcPercent(), (goal-live)>>20, HeapHeadroom>>20)
	}
}

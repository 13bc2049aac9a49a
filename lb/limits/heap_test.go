package limits

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestHeapPercent(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, 1600},        // before the first collection: the runtime's 4 MiB
		{8 << 20, 800},   // 8 MiB live: 64 MiB of headroom is 800%
		{64 << 20, 100},  // the headroom is GOGC's default share
		{1 << 30, 100},   // never less than the default
		{100 << 20, 100}, // over the headroom
	} {
		if got := heapPercent(HeapHeadroom, tc.live); got != tc.want {
			t.Errorf("live %d: %d%%, want %d%%", tc.live, got, tc.want)
		}
	}
}

// gcPercent is the runtime's GC percent now.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// near reports whether the tuner would leave got for want (adjust).
func near(got, want int) bool { return max(got-want, want-got) <= got/8 }

// TestHeapFloor: after a collection the GC percent is the one that gives
// the live heap its headroom; with GOGC in the environment it is left
// alone.
func TestHeapFloor(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	if _, set := os.LookupEnv("GOGC"); !set {
		stop := HeapFloor(HeapHeadroom)
		var want int
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			metrics.Read(s)
			if want = heapPercent(HeapHeadroom, s[0].Value.Uint64()); near(gcPercent(), want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		if got := gcPercent(); !near(got, want) || want <= 100 {
			t.Fatalf("GC percent %d, want %d or within an eighth of it (over 100 for this test's small heap)", got, want)
		}
	}
	debug.SetGCPercent(100)
	t.Setenv("GOGC", "100")
	stop := HeapFloor(HeapHeadroom)
	defer stop()
	runtime.GC()
	runtime.GC()
	if got := gcPercent(); got != 100 {
		t.Fatalf("with GOGC set, the GC percent went to %d", got)
	}
}

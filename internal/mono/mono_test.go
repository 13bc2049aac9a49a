package mono

import (
	"math"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	f := func(tm time.Time, want int64) {
		t.Helper()
		if got := Of(tm); got != want {
			t.Fatalf("Of(%v) = %d, want %d", tm, got, want)
		}
	}
	f(time.Time{}, Never)
	f(epoch, 0)
	f(epoch.Add(time.Second), int64(time.Second))
	f(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), Never) // saturates
	f(time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), math.MinInt64)
	if got := Time(Never); !got.IsZero() {
		t.Fatalf("Time(Never) = %v, want the zero time", got)
	}
}

package spaced

import (
	"sync"
	"testing"
	"time"
)

// TestLines: one line per interval goes out, carrying the count of
// those held back since the one before; racing callers let exactly one
// through.
func TestLines(t *testing.T) {
	var s Lines
	sec := int64(time.Second)
	step := func(now int64, wantOK bool, wantHeld int64) {
		t.Helper()
		if held, ok := s.Allow(now, time.Second); ok != wantOK || held != wantHeld {
			t.Fatalf("at %v: allow %v with %d held back, want %v with %d", time.Duration(now), ok, held, wantOK, wantHeld)
		}
	}
	step(5*sec, true, 0)
	step(5*sec+1, false, 0)
	step(6*sec-1, false, 0)
	step(6*sec, true, 2)
	step(9*sec, true, 0)

	var passed sync.WaitGroup
	var mu sync.Mutex
	through := 0
	for range 64 {
		passed.Go(func() {
			if _, ok := s.Allow(20*sec, time.Second); ok {
				mu.Lock()
				through++
				mu.Unlock()
			}
		})
	}
	passed.Wait()
	if through != 1 {
		t.Fatalf("%d racing callers let through at once, want 1", through)
	}
	step(21*sec, true, 63)
}

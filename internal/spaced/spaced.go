// Package spaced lets one log line of a kind through per interval and
// counts the lines held back, which the next line reports. A condition
// that comes with every request or every batch (pods at their connection
// cap, the open-files limit, a KV-event publisher restarting in a loop)
// would otherwise log a line each time: a write(2) per request, thousands a
// second, exactly when the gateway is busiest.
package spaced

import (
	"sync/atomic"
	"time"
)

// Lines spaces the lines of one kind. The zero value lets the first line
// through; it is safe for concurrent use.
type Lines struct {
	last atomic.Int64 // when a line last went out (the caller's clock, ns), 0 before
	held atomic.Int64 // lines held back since
}

// Allow reports whether a line may go out at now (nanoseconds on any clock
// the caller keeps to), every apart, and how many were held back before
// it. Of callers racing for one slot, exactly one is let through.
func (s *Lines) Allow(now int64, every time.Duration) (held int64, ok bool) {
	last := s.last.Load()
	if (last != 0 && now-last < int64(every)) || !s.last.CompareAndSwap(last, now) {
		s.held.Add(1)
		return 0, false
	}
	return s.held.Swap(0), true
}

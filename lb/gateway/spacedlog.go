package gateway

import (
	"sync/atomic"
	"time"
)

// spacedLog lets one line of a kind through per interval and counts the
// lines held back, which the next line reports. A condition that comes
// with every request (pods at their connection cap, the gateway at its
// open-files limit, a whole model failing) would otherwise log a line per
// request: a write(2) on the event loop, thousands a second, exactly when
// the gateway is busiest.
type spacedLog struct {
	last atomic.Int64 // when a line last went out (the ledger's clock), 0 before
	held atomic.Int64 // lines held back since
}

// allow reports whether a line may go out at now, every apart, and how
// many were held back before it.
func (s *spacedLog) allow(now int64, every time.Duration) (held int64, ok bool) {
	last := s.last.Load()
	if (last != 0 && now-last < int64(every)) || !s.last.CompareAndSwap(last, now) {
		s.held.Add(1)
		return 0, false
	}
	return s.held.Swap(0), true
}

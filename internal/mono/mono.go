// Package mono is the process's monotonic clock as one int64: nanoseconds
// since the process began, which a step of the wall clock (NTP at boot, a
// resume, date -s, a VM migration) does not move. Timeouts and the stamps
// they compare are kept on it; a wall time is for what people or other
// processes read.
package mono

import (
	"math"
	"time"
)

// epoch is the clock's origin; its monotonic reading is what every
// reading is taken against.
var epoch = time.Now()

// Never stands for the zero time.Time, which means no deadline.
const Never = math.MaxInt64

// Now reads the clock: one clock read, where time.Now takes two (wall and
// monotonic).
func Now() int64 { return int64(time.Since(epoch)) }

// Of is t on the clock (Never for the zero time), by t's monotonic reading
// when it has one (time.Now's). Sub saturates, so a time centuries away is
// Never and one long past is long past.
func Of(t time.Time) int64 {
	if t.IsZero() {
		return Never
	}
	return int64(t.Sub(epoch))
}

// Time turns a reading back into a time.Time, as deadlines on net.Conn
// take it (the zero time for Never).
func Time(n int64) time.Time {
	if n == Never {
		return time.Time{}
	}
	return epoch.Add(time.Duration(n))
}

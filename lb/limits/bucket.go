package limits

import (
	"math"
	"sync/atomic"
	"time"
)

// bucket is a token bucket that holds one minute's allowance, kept in the
// form of the generic cell rate algorithm (GCRA, ITU-T I.371): instead of a
// level and a refill time it stores one number, the theoretical arrival
// time tat — the instant (unix ns) at which the bucket will be full again.
// Taking n units moves tat by n×interval; the bucket has room while tat
// stays within one minute of now. One int64 is updated with compare-and-
// swap, so a check is lock-free and allocates nothing.
//
// The zero bucket (interval 0) has no limit.
type bucket struct {
	tat atomic.Int64
	// interval is the time one unit takes to refill, ns: a minute divided
	// by the per-minute allowance.
	interval int64
	// perMinute is the allowance, for messages.
	perMinute int64
}

// capacity is how far tat may run ahead of now: the whole minute's
// allowance.
const capacity = int64(time.Minute)

func newBucket(perMinute int) bucket {
	if perMinute <= 0 {
		return bucket{}
	}
	return bucket{interval: max(capacity/int64(perMinute), 1), perMinute: int64(perMinute)}
}

func (b *bucket) limited() bool { return b.interval != 0 }

// cost is the time n units take to refill, saturated so a huge n cannot
// overflow tat.
func (b *bucket) cost(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if n > math.MaxInt64/4/b.interval {
		return math.MaxInt64 / 4
	}
	return n * b.interval
}

// fits reports whether n units can ever be taken: no more than a minute's
// allowance.
func (b *bucket) fits(n int64) bool { return !b.limited() || b.cost(n) <= capacity }

// take takes n units at now (unix ns) if the bucket holds them, else
// returns how long until it will.
func (b *bucket) take(now, n int64) (ok bool, wait time.Duration) {
	if !b.limited() {
		return true, 0
	}
	c := b.cost(n)
	for {
		tat := b.tat.Load()
		next := max(tat, now) + c
		if next-now > capacity {
			return false, time.Duration(next - capacity - now)
		}
		if b.tat.CompareAndSwap(tat, next) {
			return true, 0
		}
	}
}

// charge takes n units whether or not the bucket holds them: usage that
// already happened. The debt delays later takes.
func (b *bucket) charge(now, n int64) {
	if !b.limited() {
		return
	}
	c := b.cost(n)
	for {
		tat := b.tat.Load()
		if b.tat.CompareAndSwap(tat, max(tat, now)+c) {
			return
		}
	}
}

// refund gives back n units taken by a request that was then refused by
// another limit.
func (b *bucket) refund(n int64) {
	if b.limited() {
		b.tat.Add(-b.cost(n))
	}
}

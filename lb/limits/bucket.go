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
// swap, so a check is lock-free and allocates nothing. Its rate is passed
// in, so that a reload may change it under the units already taken.
type bucket struct {
	tat atomic.Int64
	// unsynced is the cost (ns) taken, charged or refunded here since the
	// last exchange with the other replicas (Sync), which adds it to the
	// bucket they share.
	unsynced atomic.Int64
}

// rate is a bucket's allowance. The zero rate (interval 0) has no limit.
type rate struct {
	// interval is the time one unit takes to refill, ns: a minute divided
	// by the per-minute allowance.
	interval int64
	// perMinute is the allowance, for messages.
	perMinute int64
}

// capacity is how far tat may run ahead of now: the whole minute's
// allowance.
const capacity = int64(time.Minute)

func newRate(perMinute int) rate {
	if perMinute <= 0 {
		return rate{}
	}
	return rate{interval: max(capacity/int64(perMinute), 1), perMinute: int64(perMinute)}
}

func (r rate) limited() bool { return r.interval != 0 }

// cost is the time n units take to refill, saturated so a huge n cannot
// overflow tat.
func (r rate) cost(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if n > math.MaxInt64/4/r.interval {
		return math.MaxInt64 / 4
	}
	return n * r.interval
}

// fits reports whether n units can ever be taken: no more than a minute's
// allowance.
func (r rate) fits(n int64) bool { return !r.limited() || r.cost(n) <= capacity }

// take takes n units at r and now (unix ns) if the bucket holds them, else
// returns how long until it will.
func (b *bucket) take(r rate, now, n int64) (ok bool, wait time.Duration) {
	if !r.limited() {
		return true, 0
	}
	c := r.cost(n)
	for {
		tat := b.tat.Load()
		next := max(tat, now) + c
		if next-now > capacity {
			return false, time.Duration(next - capacity - now)
		}
		if b.tat.CompareAndSwap(tat, next) {
			b.unsynced.Add(c)
			return true, 0
		}
	}
}

// standing is what the bucket holds at now (unix ns) for r: the units it
// could take now, remaining = (capacity - (tat - now)) / interval, floored
// at 0 (a debt Done charged) and at most r's allowance; and the time until
// it is full again, reset = tat - now, floored at 0: the reading of
// OpenAI's x-ratelimit-remaining-* and x-ratelimit-reset-* headers.
func (b *bucket) standing(r rate, now int64) (remaining int64, reset time.Duration) {
	ahead := max(b.tat.Load()-now, 0)
	return min(max((capacity-ahead)/r.interval, 0), r.perMinute), time.Duration(ahead)
}

// charge takes n units at r whether or not the bucket holds them: usage
// that already happened. The debt delays later takes.
func (b *bucket) charge(r rate, now, n int64) {
	if !r.limited() {
		return
	}
	c := r.cost(n)
	for {
		tat := b.tat.Load()
		if b.tat.CompareAndSwap(tat, max(tat, now)+c) {
			b.unsynced.Add(c)
			return
		}
	}
}

// refund gives back n units taken at r by a request that was then refused
// by another limit, while current reports r still the bucket's rate. A
// reload's rerate since has rescaled them into the new rate's units,
// which a refund at r would miscount (a raised limit would forgive other
// requests' units): they stay taken then, the safe error of one unit.
// current is checked between the load of tat and its swap, so a rerate
// in between fails the swap and the loop checks again.
func (b *bucket) refund(r rate, n int64, current func() bool) {
	if !r.limited() {
		return
	}
	c := r.cost(n)
	for {
		tat := b.tat.Load()
		if !current() {
			return
		}
		if b.tat.CompareAndSwap(tat, tat-c) {
			b.unsynced.Add(-c)
			return
		}
	}
}

// rerate keeps the units taken by now at from for the bucket's new rate
// to: a limit raised has its new room at once, one lowered is nearer to
// full. Units taken with no limit were not counted: the bucket starts
// empty.
func (b *bucket) rerate(from, to rate, now int64) {
	for {
		tat := b.tat.Load()
		next := int64(0)
		if from.limited() && to.limited() && tat > now {
			// In float64, saturated as cost: the product of two int64s
			// may overflow.
			d := float64(tat-now) / float64(from.interval) * float64(to.interval)
			next = now + int64(min(d, math.MaxInt64/4))
		}
		if b.tat.CompareAndSwap(tat, next) {
			return
		}
	}
}

// adopt takes the shared bucket's tat (unix ns), which holds every
// replica's units up to the last exchange, plus the units taken here since:
// the other replicas' units now count here too. A local tat already ahead
// of it stays.
func (b *bucket) adopt(shared int64) {
	for {
		tat := b.tat.Load()
		want := shared + b.unsynced.Load()
		if want <= tat || b.tat.CompareAndSwap(tat, want) {
			return
		}
	}
}

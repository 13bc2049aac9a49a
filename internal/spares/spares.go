// Package spares keeps values an event loop's work gave back, for its next
// work to take before a shared pool's: with more in flight than a
// sync.Pool's one private slot, its Get and Put go through the pool's
// chain, locked operations both. A List is its loop's alone.
package spares

// Max bounds what a List keeps: about a loop's requests in flight at once
// under load; the rest go to the pool (or the collector).
const Max = 256

// List is a stack of spares. low is the fewest it held since trimmed, at
// trimmed (the caller's clock) when Trim last let go of those not taken.
type List[T any] struct {
	list    []T
	low     int
	trimmed int64
}

// Len is how many it keeps.
func (s *List[T]) Len() int { return len(s.list) }

// Take returns the last one given back, if any.
func (s *List[T]) Take() (v T, ok bool) {
	n := len(s.list)
	if n == 0 {
		return v, false
	}
	v = s.list[n-1]
	var zero T
	s.list[n-1] = zero
	s.list = s.list[:n-1]
	s.low = min(s.low, n-1)
	return v, true
}

// Give keeps v, false when Max are kept already.
func (s *List[T]) Give(v T) bool {
	if len(s.list) == Max {
		return false
	}
	s.list = append(s.list, v)
	return true
}

// Trim lets go (drop) of those not taken since the last trim, the oldest,
// once every period (of now's clock): a burst's go back to the collector,
// not stay with the loop for good.
func (s *List[T]) Trim(now, every int64, drop func(T)) {
	if now-s.trimmed < every {
		return
	}
	idle := s.low
	for _, v := range s.list[:idle] {
		drop(v)
	}
	n := copy(s.list, s.list[idle:])
	clear(s.list[n:])
	s.list = s.list[:n]
	s.low, s.trimmed = n, now
}

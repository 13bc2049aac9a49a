package frontend

// spares keeps what a loop's requests gave back, for its next ones to take
// before a shared pool's: with more in flight than a sync.Pool's one
// private slot, its Get and Put go through the pool's chain, locked
// operations both. On the loop only. low is the fewest it held since
// trimmed, the coarse clock's reading when the sweep last let go of those
// the loop had not taken (trim).
type spares[T any] struct {
	list    []T
	low     int
	trimmed int64
}

// maxSpares bounds what a loop keeps of one kind: about its connections'
// requests in flight at once under load; the rest go to the pool.
const maxSpares = 256

// take returns the last one given back, if any.
func (s *spares[T]) take() (v T, ok bool) {
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

// give keeps v, false when maxSpares are kept already.
func (s *spares[T]) give(v T) bool {
	if len(s.list) == maxSpares {
		return false
	}
	s.list = append(s.list, v)
	return true
}

// trim lets go (drop) of those not taken since the last trim, the oldest,
// once a tick: a burst's go back to the collector with the pool's, not
// stay with the loop for good.
func (s *spares[T]) trim(now int64, drop func(T)) {
	if now-s.trimmed < int64(tick) {
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

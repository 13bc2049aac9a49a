package spares

import (
	"slices"
	"testing"
)

// TestTakeGive: the last given is the first taken; past Max none is kept.
func TestTakeGive(t *testing.T) {
	var s List[int]
	if _, ok := s.Take(); ok {
		t.Fatal("an empty list gave a spare")
	}
	s.Give(1)
	s.Give(2)
	if v, _ := s.Take(); v != 2 {
		t.Fatalf("took %d, want the last given (2)", v)
	}
	for i := range Max {
		if kept := s.Give(i); kept != (i < Max-1) {
			t.Fatalf("spare %d: kept %v with %d held", i, kept, s.Len())
		}
	}
	if s.Len() != Max {
		t.Fatalf("Len %d, want %d", s.Len(), Max)
	}
}

// TestTrim: once a period, the spares kept and not taken since the last
// trim are let go, the oldest first.
func TestTrim(t *testing.T) {
	const every = 100
	var s List[int]
	for i := range 4 {
		s.Give(i)
	}
	var dropped []int
	drop := func(v int) { dropped = append(dropped, v) }
	s.Trim(every, every, drop) // the first: nothing was counted before it
	if s.Len() != 4 {
		t.Fatalf("the first trim left %d spares of 4", s.Len())
	}
	used, _ := s.Take()
	s.Give(used)
	s.Trim(every+every/2, every, drop)
	if s.Len() != 4 {
		t.Fatalf("a trim within the period left %d spares of 4", s.Len())
	}
	s.Trim(2*every, every, drop)
	if s.Len() != 1 || s.list[0] != used {
		t.Errorf("after the period %v spares left, want the one taken (%d)", s.list, used)
	}
	if !slices.Equal(dropped, []int{0, 1, 2}) {
		t.Errorf("let go of %v, want the three not taken, oldest first", dropped)
	}
}

package pool

import "fmt"

// ids hands out the ids of one space (pods' ids in a snapshot, or in a
// prefix index): a slot in the low bits bits, lowest free first so slots
// stay dense, and a generation above them. A freed slot is handed out
// again under its next generation, so no two pods that held it one after
// another share an id. A snapshot holds its own copy (clone), immutable
// once published.
type ids struct {
	bits uint
	// spare are the ids to hand out next: freed slots at their next
	// generation.
	spare []int32
	// next is the lowest slot never handed out.
	next int32
}

func (s ids) clone() ids {
	s.spare = append([]int32(nil), s.spare...)
	return s
}

// take hands out an id, or fails when every slot is taken.
func (s *ids) take() (int32, error) {
	if len(s.spare) == 0 {
		if s.next == 1<<s.bits {
			return 0, fmt.Errorf("pool: more than %d pods", 1<<s.bits)
		}
		s.next++
		return s.next - 1, nil
	}
	low, mask := 0, int32(1)<<s.bits-1
	for i, id := range s.spare {
		if id&mask < s.spare[low]&mask {
			low = i
		}
	}
	id := s.spare[low]
	s.spare = append(s.spare[:low], s.spare[low+1:]...)
	return id, nil
}

// free gives id's slot back and returns the id its next holder gets: the
// next generation, back to the first after the last an int32 holds.
func (s *ids) free(id int32) int32 {
	next := id + 1<<s.bits
	if next < 0 {
		next = id & (1<<s.bits - 1)
	}
	s.spare = append(s.spare, next)
	return next
}

package gateway

import (
	"strconv"
	"testing"
)

// TestHomesBound: past its bound the table forgets the oldest ids, one
// for each new one; an id put again, deleted or not, keeps its place and
// takes its new home.
func TestHomesBound(t *testing.T) {
	const max = 3
	h := newHomes(max)
	for i := range 5 {
		h.put("r"+strconv.Itoa(i), home{model: "m", pod: "p" + strconv.Itoa(i)}, max)
	}
	for i := range 5 {
		got, ok := h.get([]byte("r" + strconv.Itoa(i)))
		if ok != (i >= 2) || ok && got.pod != "p"+strconv.Itoa(i) {
			t.Errorf("r%d: %v %v", i, got, ok)
		}
	}
	h.put("r4", home{model: "m", pod: "q"}, max)
	h.forget([]byte("r3"))
	if _, ok := h.get([]byte("r3")); ok {
		t.Error("r3 deleted, still found")
	}
	h.put("r3", home{model: "m", pod: "p3"}, max)
	h.put("r5", home{model: "m", pod: "p5"}, max)
	if len(h.byID) != max || len(h.order) != max {
		t.Errorf("%d ids held, order %v", len(h.byID), h.order)
	}
	for id, pod := range map[string]string{"r3": "p3", "r4": "q", "r5": "p5"} {
		if got, ok := h.get([]byte(id)); !ok || got.pod != pod {
			t.Errorf("%s: %v %v", id, got, ok)
		}
	}
	if newHomes(0) != nil {
		t.Error("a bound of 0 keeps a table")
	}
}

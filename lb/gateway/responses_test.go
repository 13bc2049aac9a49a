package gateway

import (
	"strconv"
	"testing"

	"pdlb/lb/route"
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

// TestKeepHomeOverloaded: a conversation keeps to its pod until that pod
// has more requests in flight than the least loaded by both of
// cache_aware's balance thresholds (64 more, and 1.5 times); a stored
// response's pod is kept whatever its load.
func TestKeepHomeOverloaded(t *testing.T) {
	_, m := stagesGateway(t, 0, nil)
	home := m.Combined[0].Config.Name
	cands := func(load ...int) []route.Candidate {
		out := make([]route.Candidate, len(load))
		for i, n := range load {
			out[i] = route.Candidate{Pod: m.CombinedLoads[i].ID, InFlight: n}
		}
		return out
	}
	for _, c := range []struct {
		load []int
		soft bool
		kept int // candidates left
	}{
		{[]int{10, 0, 0}, true, 1},
		{[]int{64, 0, 5}, true, 1},      // 64 more: not past the absolute threshold
		{[]int{100, 40, 70}, true, 1},   // 60 more
		{[]int{100, 35, 70}, true, 3},   // 65 more, and 2.9 times
		{[]int{200, 135, 140}, true, 1}, // 65 more, 1.48 times
		{[]int{100, 0, 0}, false, 1},
	} {
		if got := keepHome(m, cands(c.load...), home, c.soft); len(got) != c.kept || c.kept == 1 && got[0].Pod != m.CombinedLoads[0].ID {
			t.Errorf("%v soft %v: kept %v", c.load, c.soft, got)
		}
	}
}

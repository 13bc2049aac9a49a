package plan

import (
	"fmt"
	"slices"
	"testing"
)

// pool writes instances as "name:role/roleset[:inflight]" with role p or d.
func pool(t *testing.T, specs ...string) []Instance {
	t.Helper()
	var out []Instance
	for _, s := range specs {
		var name, role, set string
		var busy int64
		n, _ := fmt.Sscanf(s, "%s %s %s %d", &name, &role, &set, &busy)
		if n < 3 {
			t.Fatalf("bad spec %q", s)
		}
		out = append(out, Instance{Name: name, Address: name + ":80", Role: map[string]string{"p": RolePrefill, "d": RoleDecode}[role], Roleset: set, InFlight: busy})
	}
	return out
}

// apply returns pool with changes made, as "name role roleset" lines.
func apply(p []Instance, changes []Change) []string {
	var out []string
	for _, in := range p {
		for _, c := range changes {
			if c.Name == in.Name {
				in.Role, in.Roleset = c.Role, c.Roleset
			}
		}
		out = append(out, in.Name+" "+in.Role+" "+in.Roleset)
	}
	return out
}

func TestReassign(t *testing.T) {
	f := func(p []Instance, target Ratio, wantSwitch []string, want ...string) {
		t.Helper()
		changes := Reassign(p, target)
		var switched []string
		for _, c := range changes {
			if c.Switch {
				switched = append(switched, c.Name)
			}
		}
		if !slices.Equal(switched, wantSwitch) {
			t.Errorf("%v to %v: switches %v, want %v (changes %+v)", p, target, switched, wantSwitch, changes)
		}
		if got := apply(p, changes); !slices.Equal(got, want) {
			t.Errorf("%v to %v:\n got %q\nwant %q", p, target, got, want)
		}
	}
	two := pool(t, "p0 p A", "d0 d A", "p1 p B", "d1 d B")
	// Nothing to do.
	f(two, Ratio{2, 2}, nil, "p0 prefill A", "d0 decode A", "p1 prefill B", "d1 decode B")
	// Every roleset is down to one decode pod: d0 (first by name) becomes
	// prefill in B, the only roleset with a decode pod left, and A, left
	// with prefill pods only, is dissolved into B.
	f(two, Ratio{3, 1}, []string{"d0"}, "p0 prefill B", "d0 prefill B", "p1 prefill B", "d1 decode B")
	// The least busy pod moves.
	f(pool(t, "p0 p A 3", "d0 d A", "p1 p B 1", "d1 d B"), Ratio{1, 3}, []string{"p1"},
		"p0 prefill A", "d0 decode A", "p1 decode A", "d1 decode A")
	// Pods leave the roleset with the most of their role, and join the
	// one with the fewest of their new role: rolesets stay complete.
	f(pool(t, "p0 p A", "p1 p A", "p2 p A", "d0 d A", "p3 p B", "d1 d B"), Ratio{2, 4}, []string{"p0", "p1"},
		"p0 decode A", "p1 decode B", "p2 prefill A", "d0 decode A", "p3 prefill B", "d1 decode B")
	// From one roleset, everything stays in it.
	f(pool(t, "a p S", "b p S", "c p S", "d d S"), Ratio{1, 3}, []string{"a", "b"},
		"a decode S", "b decode S", "c prefill S", "d decode S")
	// A pool smaller than the target moves what it has.
	f(pool(t, "a p S", "b d S"), Ratio{3, 0}, []string{"b"}, "a prefill S", "b prefill S")
}

func TestRegroup(t *testing.T) {
	f := func(p []Instance, want ...string) {
		t.Helper()
		if got := apply(p, Regroup(p)); !slices.Equal(got, want) {
			t.Errorf("%v:\n got %q\nwant %q", p, got, want)
		}
	}
	f(pool(t, "a p A", "b d A", "c p B"), "a prefill A", "b decode A", "c prefill A")
	// Incomplete rolesets spread over the complete ones by fewest of the role.
	f(pool(t, "a p A", "b d A", "c p B", "d d B", "e p C", "f p C", "g d D"),
		"a prefill A", "b decode A", "c prefill B", "d decode B", "e prefill A", "f prefill B", "g decode A")
	// No complete roleset: nothing to join.
	f(pool(t, "a p A", "b d B"), "a prefill A", "b decode B")
}

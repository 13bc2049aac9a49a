package discovery

import (
	"context"
	"errors"
	"testing"

	"pdlb/lb/config"
)

// scripted is a Source that reports what the test sends it and ends with
// the error the test sends.
type scripted struct {
	lists chan []Pod
	end   chan error
}

func newScripted() *scripted { return &scripted{lists: make(chan []Pod), end: make(chan error, 1)} }

func (s *scripted) Run(ctx context.Context, report func([]Pod)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-s.end:
			return err
		case l := <-s.lists:
			report(l)
		}
	}
}

func pod(name, model string) Pod {
	return Pod{Pod: config.Pod{Name: name, Model: model, Address: name}}
}

func TestUnionMergesLatestLists(t *testing.T) {
	s, a, b := newScripted(), newScripted(), newScripted()
	w := follow(t, Union(quiet, s, a, b))
	// The first report is the union at once, sorted.
	s.lists <- []Pod{pod("s1", "m"), pod("s0", "m")}
	w.expect("s0 m    s0", "s1 m    s1")
	a.lists <- []Pod{pod("a1:1", "m"), pod("a0:1", "m")}
	w.expect("a0:1 m    a0:1", "a1:1 m    a1:1", "s0 m    s0", "s1 m    s1")
	// A name both sources report: the earlier source's pod is kept.
	b.lists <- []Pod{pod("a0:1", "other"), pod("b0:1", "m")}
	w.expect("a0:1 m    a0:1", "a1:1 m    a1:1", "b0:1 m    b0:1", "s0 m    s0", "s1 m    s1")
	// A source's new list replaces its old one only.
	a.lists <- nil
	w.expect("a0:1 other    a0:1", "b0:1 m    b0:1", "s0 m    s0", "s1 m    s1")
}

func TestUnionStopsOnError(t *testing.T) {
	a, b := newScripted(), newScripted()
	boom := errors.New("boom")
	done := make(chan error)
	go func() { done <- Union(quiet, a, b).Run(context.Background(), func([]Pod) {}) }()
	a.end <- boom
	if err := <-done; err != boom {
		t.Fatalf("Run = %v, want %v", err, boom)
	}
}

func TestUnionOfNothing(t *testing.T) {
	w := follow(t, Union(quiet))
	if got := w.next(); len(got) != 0 {
		t.Fatalf("got %v", got)
	}
}

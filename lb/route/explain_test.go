package route

import (
	"math"
	"testing"
)

func TestPolicyName(t *testing.T) {
	for _, name := range Names() {
		p, err := New(name, DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		if got := PolicyName(p); got != name {
			t.Errorf("PolicyName(New(%q)) = %q", name, got)
		}
	}
}

func TestScores(t *testing.T) {
	cands := []Candidate{{InFlight: 3, Weight: 1}, {InFlight: 1, Weight: 1}}
	out := make([]float64, 2)
	Scores(ScorePolicy{LeastRequest{}}, &Request{}, cands, out)
	if !(out[1] < out[0]) {
		t.Errorf("least_request scores %v: the idler pod must score lower", out)
	}
	Scores(&RoundRobin{}, &Request{}, cands, out)
	if !math.IsNaN(out[0]) || !math.IsNaN(out[1]) {
		t.Errorf("round_robin scores %v, want none (NaN)", out)
	}
}

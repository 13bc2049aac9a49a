package load

import (
	"cmp"
	"slices"
)

// A run may spread its requests over several targets, such as replicas of
// one gateway: round robin in the order they are sent, so consecutive
// turns of a conversation may go to different replicas. The report counts
// each target's requests, and how often a session's turn went to the pod
// of its turn before, whichever target it went through.

// all is Target followed by Targets.
func (c Config) all() []string { return append([]string{c.Target}, c.Targets...) }

// TargetReport is what one target's requests came to.
type TargetReport struct {
	Target   string `json:"target"`
	Requests int    `json:"requests"`
	OK       int    `json:"ok"`
	// Errors counts every failed request (any HTTP error, a stream's
	// error event, no connection); Lost as Report's.
	Errors int `json:"errors"`
	Lost   int `json:"lost"`
}

// byTarget counts results by target; nil for a run with one target.
func byTarget(targets []string, results []Result) []TargetReport {
	if len(targets) < 2 {
		return nil
	}
	out := make([]TargetReport, len(targets))
	for i, t := range targets {
		out[i].Target = t
	}
	for i := range results {
		t := &out[results[i].Target]
		t.Requests++
		switch results[i].Outcome {
		case OK:
			t.OK++
		case Lost:
			t.Lost++
		default:
			t.Errors++
		}
	}
	return out
}

// samePod is the share of sessions' turns, after their first, whose pod is
// that of the session's turn due before; turns without a pod are skipped.
// Nil when there is no such pair.
func samePod(results []Result) *float64 {
	turns := make([]*Result, 0, len(results))
	for i := range results {
		if r := &results[i]; r.Session != "" && r.Pod != "" {
			turns = append(turns, r)
		}
	}
	slices.SortStableFunc(turns, func(a, b *Result) int {
		return cmp.Or(cmp.Compare(a.Session, b.Session), cmp.Compare(a.Start, b.Start))
	})
	var pairs, same int
	for i := 1; i < len(turns); i++ {
		if turns[i].Session == turns[i-1].Session {
			pairs++
			if turns[i].Pod == turns[i-1].Pod {
				same++
			}
		}
	}
	if pairs == 0 {
		return nil
	}
	share := float64(same) / float64(pairs)
	return &share
}

package gateway

import (
	"testing"

	"pdlb/engines"
)

func TestRankBusy(t *testing.T) {
	for _, c := range []struct {
		ranks []engines.RankLoad
		rank  int
		busy  bool
	}{
		{nil, 0, false}, // no counts by rank
		{[]engines.RankLoad{{Running: 8}, {}}, 0, false},                          // no queue
		{[]engines.RankLoad{{Running: 8, Waiting: 1}, {}}, 0, true},               // a queue while another rank idles
		{[]engines.RankLoad{{Running: 8, Waiting: 1}, {Running: 5}}, 0, false},    // 9 ≤ 2 × 5
		{[]engines.RankLoad{{Running: 8, Waiting: 3}, {Running: 5}}, 0, true},     // 11 > 2 × 5
		{[]engines.RankLoad{{Running: 8, Waiting: 3}, {Running: 5}, {}}, 0, true}, // the least busy other rank counts
		{[]engines.RankLoad{{Running: 8, Waiting: 3}, {Running: 5}}, 1, false},
		{[]engines.RankLoad{{Running: 8, Waiting: 3}}, 1, false}, // beyond the scrape
	} {
		if got := rankBusy(c.ranks, c.rank); got != c.busy {
			t.Errorf("rankBusy(%+v, %d) = %v, want %v", c.ranks, c.rank, got, c.busy)
		}
	}
}

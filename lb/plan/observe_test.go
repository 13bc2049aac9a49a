package plan

import (
	"testing"
	"time"
)

func TestObserver(t *testing.T) {
	var o Observer
	t0 := time.Unix(1000, 0)
	f := func(sec float64, c Counts, want Demand, ok bool) {
		t.Helper()
		got, gotOK := o.Observe(t0.Add(time.Duration(sec*float64(time.Second))), c, 20000, 3000)
		if gotOK != ok || got != want {
			t.Fatalf("at %vs %+v: %+v, %v; want %+v, %v", sec, c, got, gotOK, want, ok)
		}
	}
	caps := func(d Demand) Demand { d.PrefillCap, d.DecodeCap = 20000, 3000; return d }
	f(0, Counts{Requests: 100, Finished: 90, PromptTokens: 1e5, CachedTokens: 5e4, OutputTokens: 1e4}, Demand{}, false) // the baseline
	// 60 requests in 60 s, 2,000 prompt tokens each, 60% cached; 500
	// tokens out for each of the 30 that finished: the output length is
	// per finished request.
	f(60, Counts{Requests: 160, Finished: 120, PromptTokens: 1e5 + 120000, CachedTokens: 5e4 + 72000, OutputTokens: 1e4 + 15000},
		caps(Demand{Rate: 1, PromptTokens: 2000, OutputTokens: 500, HitRate: 0.6}), true)
	f(60, Counts{Requests: 170}, Demand{}, false)      // no time passed (and counters went back)
	f(90, Counts{Requests: 170}, caps(Demand{}), true) // an idle window
	f(100, Counts{Requests: 180, PromptTokens: 10, CachedTokens: 20, OutputTokens: 5}, caps(Demand{Rate: 1, PromptTokens: 1, HitRate: 1}), true)
	f(110, Counts{Requests: 100}, Demand{}, false) // a restart: a new baseline
	f(120, Counts{Requests: 120}, caps(Demand{Rate: 2}), true)
}

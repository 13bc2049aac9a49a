package gateway

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/lb/pool"
	"pdlb/promtext"
)

// maxAdapterSeries bounds a model's pdlb_adapter_requests_total series:
// pods may list adapters without end, so past this many the requests of
// further adapters count under adapter="other".
const maxAdapterSeries = 64

// adapterOther is the adapter label of the requests past maxAdapterSeries.
const adapterOther = "other"

var adapterMetricsDoc = promtext.Doc{
	"pdlb_adapter_requests_total": {Help: "Requests naming a LoRA adapter of the model, directly or through an alias, by adapter (at most 64 adapters a model; the rest under adapter=\"other\")."},
}

// adapterRequests are one model's request counters by adapter: created
// once an adapter, the model's configured ones at start-up, the rest on
// their first request; read without a lock.
type adapterRequests struct {
	set   *metrics.Set
	model string
	// byName is copied on write, under mu; other is made under mu when
	// first needed.
	byName atomic.Pointer[map[string]*metrics.Counter]
	mu     sync.Mutex
	other  *metrics.Counter
}

func newAdapterRequests(set *metrics.Set, md *pool.Model) *adapterRequests {
	r := &adapterRequests{set: set, model: md.Name}
	byName := map[string]*metrics.Counter{}
	r.byName.Store(&byName)
	for _, a := range md.LoRA.Adapters {
		r.counter(a.Name)
	}
	return r
}

func (r *adapterRequests) newCounter(adapter string) *metrics.Counter {
	return r.set.NewCounter(fmt.Sprintf(`pdlb_adapter_requests_total{model=%s,adapter=%s}`, promtext.Label(r.model), promtext.Label(adapter)))
}

// counter is adapter's counter, made on its first use while the model has
// fewer than maxAdapterSeries.
func (r *adapterRequests) counter(adapter string) *metrics.Counter {
	if c := (*r.byName.Load())[adapter]; c != nil {
		return c
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := *r.byName.Load()
	if c := cur[adapter]; c != nil {
		return c
	}
	if len(cur) >= maxAdapterSeries || adapter == adapterOther {
		if r.other == nil {
			r.other = r.newCounter(adapterOther)
		}
		return r.other
	}
	next := maps.Clone(cur)
	next[adapter] = r.newCounter(adapter)
	r.byName.Store(&next)
	return next[adapter]
}

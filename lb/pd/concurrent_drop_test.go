package pd

import (
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"pdlb/engines/sglang"
	"pdlb/lb/pool"
)

// refusedAsDropped is a Fleet whose prefill pod refuses the dial just as
// the request gives the leg up (the decode leg's stream ended first).
type refusedAsDropped struct {
	scriptedLegs
	failed []error
}

func (f *refusedAsDropped) Send(_, drop <-chan struct{}, _ *pool.Pod, _ *fasthttp.Request, _ *fasthttp.Response, _ time.Time, _ []byte) (int, error) {
	<-drop
	return 0, errRefused
}

func (f *refusedAsDropped) CallFailed(_ *pool.Pod, err error) { f.failed = append(f.failed, err) }

// TestDroppedPrefillLegCountsItsRefusal: a concurrent prefill leg the
// request gave up still counts a failure of the pod's own, a refused dial,
// so the next pick does not go to a pod nothing listens on; the cut
// itself (upstream.ErrCut) is not the pod's failure.
func TestDroppedPrefillLegCountsItsRefusal(t *testing.T) {
	pods := pdPods(t)
	f := &refusedAsDropped{}
	l := AcquireLink()
	l.Hold()
	drop := make(chan struct{})
	close(drop)
	pods[3].Acquire(1)
	l.prefill(concurrentPrefill{fleet: f, pre: pods[3], up: fasthttp.AcquireRequest(), timeout: time.Second,
		proto: sglang.PD{}, metrics: NewMetrics(metrics.NewSet(), "m", []float64{1}), start: time.Now(), drop: drop})
	l.Release()
	if len(f.failed) != 1 || f.failed[0] != errRefused {
		t.Fatalf("the pod's failures counted: %v, want the refused dial", f.failed)
	}
}

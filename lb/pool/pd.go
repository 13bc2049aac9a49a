package pool

import (
	"math"
	"sync/atomic"
	"time"

	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/route"
)

// pdState is what a pod keeps for prefill/decode disaggregation, across
// snapshots like the rest of podState. Only decode pods use it.
type pdState struct {
	// pending counts decode legs routed to the pod whose response headers
	// have not arrived yet (route.PendingDecode).
	pending route.PendingDecode
	// line learns the pod's decode step time from the streams it serves.
	line *admit.DecodeLine
	// finished counts the decode legs and the whole (PDLocal) requests the
	// pod completed; the scrape turns it into drain, the requests finished
	// per second over the last scrape interval (float64 bits).
	finished     atomic.Int64
	drain        atomic.Uint64
	drainCount   atomic.Int64
	drainCountAt atomic.Int64 // unix nanoseconds of drainCount
}

// Pending is the pod's pending-decode counter.
func (p *Pod) Pending() *route.PendingDecode { return &p.pd.pending }

// AvailablePD is Available for a PD decision, which counts the request
// pending on its decode pod at once but in flight only once the decode
// leg is sent, after the prefill leg: a half-open pod with a pending pick
// has lent its one probe. A decision reads it and takes its pending pick
// under the ledger's selection lock, so no two decisions share the probe.
func (p *Pod) AvailablePD(now int64) bool {
	// Pending first: a leg counts in flight before its pick ends, so one
	// of the two loads sees it.
	return (!p.has(flagHalfOpen) || p.pd.pending.Load() == 0) && p.Available(now)
}

// DecodeLine is the pod's learned decode step-time line.
func (p *Pod) DecodeLine() *admit.DecodeLine { return p.pd.line }

// DecodeFinished records one decode leg, or whole request, the pod
// completed.
func (p *Pod) DecodeFinished() { p.pd.finished.Add(1) }

// DrainRate is the decode requests the pod finished per second over the
// last scrape interval; 0 before two scrapes or while it finishes none,
// which the cascade reads as unknown.
func (p *Pod) DrainRate() float64 { return math.Float64frombits(p.pd.drain.Load()) }

// updateDrain turns the finished count into a rate at now; the checker
// calls it once per scrape.
func (p *Pod) updateDrain(now time.Time) {
	n, at := p.pd.finished.Load(), now.UnixNano()
	prevN, prevAt := p.pd.drainCount.Swap(n), p.pd.drainCountAt.Swap(at)
	if prevAt == 0 || at <= prevAt {
		return
	}
	rate := float64(n-prevN) / (float64(at-prevAt) / float64(time.Second))
	p.pd.drain.Store(math.Float64bits(rate))
}

// newPDState seeds a pod's decode line with admission's default line.
func newPDState() pdState {
	return pdState{line: admit.NewDecodeLine(admit.DefaultDecodeBaseSec, admit.DefaultDecodePerSeqSec,
		admit.DefaultDecodeMaxBatch, admit.DefaultDecodeForget)}
}

// roleOf maps a configured role to the cascade's.
func roleOf(role string) route.PDRole {
	switch role {
	case config.RolePrefill:
		return route.RolePrefill
	case config.RoleDecode:
		return route.RoleDecode
	}
	return route.RoleCombined
}

// addPD files pod under its model's prefill or decode pods and numbers its
// roleset densely within the model (Pod.Roleset indexes Model.Rolesets).
func (m *Model) addPD(pod *Pod) {
	pod.Role = roleOf(pod.Config.Role)
	pod.Roleset = -1
	if pod.Role == route.RoleCombined {
		return
	}
	for i, name := range m.Rolesets {
		if name == pod.Config.Roleset {
			pod.Roleset = int32(i)
		}
	}
	if pod.Roleset < 0 {
		pod.Roleset = int32(len(m.Rolesets))
		m.Rolesets = append(m.Rolesets, pod.Config.Roleset)
	}
	if pod.Role == route.RolePrefill {
		m.Prefill = append(m.Prefill, pod)
	} else {
		m.Decode = append(m.Decode, pod)
	}
}

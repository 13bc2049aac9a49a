package gateway

import (
	"errors"
	"syscall"

	"github.com/valyala/fasthttp"

	"pdlb/lb/frontend"
	"pdlb/lb/limits"
	"pdlb/lb/pool"
)

// callFailed counts a call to p that failed with err against p, unless
// the gateway's own limits refused it (every connection to p busy, no
// file descriptor to open one, an answer over max_response_bytes) or the
// call was one p's API server answers without the engine (engine false:
// a tokenization), whose answers count neither way either.
func (g *Gateway) callFailed(p *pool.Pod, err error, engine bool) {
	// The gateway's own limits, and its shutdown, fail calls the pod has
	// no part in.
	if engine && !errors.Is(err, fasthttp.ErrNoFreeConns) && !errors.Is(err, limits.ErrOutOfFDs) && !errors.Is(err, fasthttp.ErrBodyTooLarge) &&
		!errors.Is(err, frontend.ErrAborted) {
		g.podFailed(p)
	}
	// Refused: nothing listens at the pod's address; the picks that follow
	// need not find out one by one, nor wait for the next check.
	if errors.Is(err, syscall.ECONNREFUSED) && p.Refused() {
		g.log.Warn("pod unhealthy", "pod", p.Config.Name, "err", err.Error())
	}
}

// podFailed counts a failure against p and ejects it when due, unless
// health.max_ejected_percent of its model's pods are ejected already.
func (g *Gateway) podFailed(p *pool.Pod) {
	h := g.cfg.Health
	if !p.ReportFailure(h.EjectAfterFailures) {
		return
	}
	// One decision at a time, so that two pods failing together cannot
	// both take the model's last ejection.
	g.ejectMu.Lock()
	defer g.ejectMu.Unlock()
	now := g.ledger.Now()
	if p.Ejected(now) {
		return
	}
	if m := g.pool.Load().Model([]byte(p.Config.Model)); m != nil && !m.MayEject(now, h.MaxEjectedPercent) {
		p.KeepIn()
		// When a whole model fails this comes with every few failures:
		// one line per ejection time says it, the metric counts it.
		if held, ok := g.keptLog.Allow(now, h.EjectionTime); ok {
			g.log.Warn("pod failing but kept in: health.max_ejected_percent of its model's pods are ejected (pdlb_pod_ejections_kept_total counts these)",
				"pod", p.Config.Name, "model", p.Config.Model, "max_ejected_percent", h.MaxEjectedPercent, "suppressed", held)
		}
		return
	}
	p.Eject(now, h.EjectionTime)
	g.log.Warn("pod ejected after consecutive failures", "pod", p.Config.Name, "for", h.EjectionTime)
}

package pool

import (
	"sync"

	"pdlb/internal/mono"
)

// downHooks are the calls to cut when health checks find the pod dead
// (Down): calls on goroutines waiting for its first answer byte. A set,
// not a slice: a pod may have hundreds of calls waiting, each leaving it
// as its answer begins.
type downHooks struct {
	mu    sync.Mutex
	hooks map[interface{ Cut() }]struct{}
}

// Down is the pod's death as an upstream.Cut: a watched call is cut when
// health checks next find the pod dead (it no longer answers at all), on
// the checker's goroutine. The event loops watch DownAt instead.
func (p *Pod) Down() DownCut { return DownCut{p} }

// DownCut is Pod.Down's Cut.
type DownCut struct{ p *Pod }

func (d DownCut) Watch(c interface{ Cut() }) {
	h := &d.p.down
	h.mu.Lock()
	if h.hooks == nil {
		h.hooks = make(map[interface{ Cut() }]struct{})
	}
	h.hooks[c] = struct{}{}
	h.mu.Unlock()
}

func (d DownCut) Unwatch(c interface{ Cut() }) {
	h := &d.p.down
	h.mu.Lock()
	delete(h.hooks, c)
	h.mu.Unlock()
}

// markDown stamps DownAt and cuts the calls watching Down.
func (p *Pod) markDown() {
	p.DownAt.Store(mono.Now())
	h := &p.down
	h.mu.Lock()
	hooks := h.hooks
	h.hooks = nil
	h.mu.Unlock()
	for c := range hooks {
		c.Cut()
	}
}

package pool

import (
	"sync"
	"time"
)

// downHooks are the functions to run when health checks find the pod
// dead (AfterDown): calls on goroutines waiting for its first answer byte.
// A map, not a slice: a pod may have hundreds of calls waiting, each
// removing its hook as its answer begins.
type downHooks struct {
	mu    sync.Mutex
	hooks map[*func()]struct{}
}

// AfterDown arranges for f to run when health checks next find the pod
// dead (it no longer answers at all), on the checker's goroutine, and
// returns stop, which undoes that; f may still run while stop does. It
// has the shape of upstream.Cut. The event loops watch DownAt instead.
func (p *Pod) AfterDown(f func()) (stop func()) {
	h := &p.down
	hook := &f
	h.mu.Lock()
	if h.hooks == nil {
		h.hooks = make(map[*func()]struct{})
	}
	h.hooks[hook] = struct{}{}
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.hooks, hook)
		h.mu.Unlock()
	}
}

// markDown stamps DownAt and runs the AfterDown hooks.
func (p *Pod) markDown() {
	p.DownAt.Store(time.Now().UnixNano())
	h := &p.down
	h.mu.Lock()
	hooks := h.hooks
	h.hooks = nil
	h.mu.Unlock()
	for f := range hooks {
		(*f)()
	}
}

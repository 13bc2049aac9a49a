package pool

import (
	"slices"
	"sync"
	"time"
)

// downHooks are the functions to run when health checks find the pod
// dead (AfterDown): calls on goroutines waiting for its first answer byte.
type downHooks struct {
	mu    sync.Mutex
	hooks []*func()
}

// AfterDown arranges for f to run when health checks next find the pod
// dead (it no longer answers at all), on the checker's goroutine, and
// returns stop, which undoes that; f may still run while stop does. It
// has the shape of upstream.Cut. The event loops watch DownAt instead.
func (p *Pod) AfterDown(f func()) (stop func()) {
	h := &p.down
	hook := &f
	h.mu.Lock()
	h.hooks = append(h.hooks, hook)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		h.hooks = slices.DeleteFunc(h.hooks, func(x *func()) bool { return x == hook })
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
	for _, f := range hooks {
		(*f)()
	}
}

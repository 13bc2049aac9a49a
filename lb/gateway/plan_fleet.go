package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/plan"
	"pdlb/lb/pool"
)

// planFleet is the gateway as plan.RoleSwitcher drives it. A pod is taken
// out of routing by leaving the fleet for the gateway's held pods
// (requests in flight finish on the snapshot they started with, and their
// decode legs still reach it; the reload's pool.Pod.Leave keeps the
// requests still to pick with that snapshot off it) and comes back with
// its new role and roleset, a new pod to the pool (its learned speeds
// start over, as they should for a new role). Pods whose roleset alone
// changes come back the same way.
type planFleet struct {
	g    *Gateway
	loop *planLoop
	// mu orders the planner's edits of the fleet between models: a
	// release's pick of its pods and its edit (whose reload makes them
	// Leave) come as one.
	mu sync.Mutex
	// released are the pods each model's switch holds, by model, under mu:
	// models switch at once, and one's Assign must not bring back another's
	// pods before they have changed role.
	released map[string][]string
}

// drainPoll is how often Release looks at the released pods' requests.
const drainPoll = 10 * time.Millisecond

// Instances returns model's prefill and decode pods.
func (f *planFleet) Instances(model string) []plan.Instance {
	m := f.g.pool.Load().Model([]byte(model))
	if m == nil {
		return nil
	}
	var out []plan.Instance
	for _, p := range slices.Concat(m.Prefill, m.Decode) {
		out = append(out, plan.Instance{Name: p.Config.Name, Address: p.Config.Address, Auth: string(p.Auth()), Role: p.Config.Role,
			Roleset: p.Config.Roleset, InFlight: p.InFlight()})
	}
	return out
}

// Release takes the named pods out of the fleet and waits until no request
// is in flight on them and no decode leg is on its way to them.
func (f *planFleet) Release(ctx context.Context, model string, names []string) error {
	start := time.Now()
	var leaving []*pool.Pod
	f.mu.Lock()
	for _, p := range f.g.pool.Load().Pods {
		if p.Config.Model == model && slices.Contains(names, p.Config.Name) {
			leaving = append(leaving, p)
		}
	}
	err := f.g.editPods(func(pods []config.Pod, held map[string]config.Pod) []config.Pod {
		return slices.DeleteFunc(pods, func(p config.Pod) bool {
			if p.Model == model && slices.Contains(names, p.Name) {
				held[p.Name] = p
				return true
			}
			return false
		})
	})
	if err == nil {
		if f.released == nil {
			f.released = map[string][]string{}
		}
		f.released[model] = append(f.released[model], names...)
	}
	f.mu.Unlock()
	inFlight := int64(0)
	for _, p := range leaving {
		inFlight += p.InFlight() + int64(p.Pending().Load())
	}
	f.noteRelease(model, names, inFlight, 0)
	if err != nil {
		return err
	}
	// A request that found a pod available just before it left counts
	// itself in flight there a few microseconds later: the first look
	// waits a poll for it.
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tick.C:
	}
	for busy(leaving) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	f.noteRelease(model, names, inFlight, time.Since(start).Seconds())
	return nil
}

// busy reports whether a request is in flight on, or on its way to, a pod.
func busy(pods []*pool.Pod) bool {
	for _, p := range pods {
		if p.InFlight() > 0 || p.Pending().Load() > 0 {
			return true
		}
	}
	return false
}

// noteRelease records a release in the model's running switch wave.
func (f *planFleet) noteRelease(model string, names []string, inFlight int64, drainSec float64) {
	f.loop.mu.Lock()
	defer f.loop.mu.Unlock()
	if st := f.loop.models[model]; st != nil && st.wave != nil {
		st.wave.Released, st.wave.InFlight, st.wave.DrainSec = names, inFlight, drainSec
	}
}

// Assign applies changes to model's pods and brings back the pods model's
// switch released (those a reload or discovery update has not dropped).
func (f *planFleet) Assign(model string, changes []plan.Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := slices.Sorted(slices.Values(f.released[model]))
	err := f.g.editPods(func(pods []config.Pod, held map[string]config.Pod) []config.Pod {
		for _, name := range names {
			if p, ok := held[name]; ok {
				pods = append(pods, p)
				delete(held, name)
			}
		}
		for i := range pods {
			p := &pods[i]
			if p.Model != model {
				continue
			}
			for _, c := range changes {
				if c.Name == p.Name {
					p.Role, p.Roleset = c.Role, c.Roleset
					if c.BootstrapPort > 0 {
						p.BootstrapPort = c.BootstrapPort
					}
				}
			}
		}
		return pods
	})
	if err == nil {
		delete(f.released, model)
	}
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

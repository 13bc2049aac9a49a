package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Role switching: POST /admin/role {"role":"decode","warmup_s":30} moves a
// running pod to another role, as an operator restarts an engine with other
// flags, at the cost the global-scheduling study counts for a switch:
//
//   - draining: new generation requests get 503 (a router sends them to
//     other pods), those in flight finish, and KV a prefill pod holds for
//     pickup is taken or expires (Config.KVTimeout);
//   - warming: still 503, for warmup_s simulated seconds (wall time divided
//     by Speedup, like every duration of the pod): loading the role's
//     weights and capturing its graphs;
//   - serving: the new role.
//
// Meanwhile /health answers 503 {"status":"draining"} or
// {"status":"warming"}, so a gateway's health check routes around the pod
// too. GET /admin/role shows the state. This endpoint is pdlb-sim's own:
// the engines it imitates have none. A pod's APIKey guards it, as the
// engines' keys guard their admin endpoints.

// States of a pod's role (RoleStatus.State).
const (
	StateServing  = "serving"
	StateDraining = "draining"
	StateWarming  = "warming"
)

// drainPoll is how often a draining pod looks at what it still serves
// (wall time).
const drainPoll = 5 * time.Millisecond

// roleView is the pod's role and switch state; it is replaced whole, never
// modified, so the request path reads it with one atomic load.
type roleView struct {
	// Role is the role served; while switching, the role being left.
	Role  string
	State string
	// Target is the role being switched to, "" while serving.
	Target string
	// WarmupSec is the switch's warm-up in simulated seconds.
	WarmupSec float64
	Switches  int
	// Err is why the last switch failed ("" if it did not).
	Err string
}

// RoleStatus is GET /admin/role's answer.
type RoleStatus struct {
	Role      string  `json:"role"`
	State     string  `json:"state"`
	Target    string  `json:"target,omitempty"`
	WarmupSec float64 `json:"warmup_s,omitempty"`
	// Switches counts the switches the pod completed.
	Switches int `json:"switches"`
	// InFlight is the generation requests being served, HeldKVBlocks the
	// KV held for pickup: what a drain waits for.
	InFlight     int64 `json:"in_flight"`
	HeldKVBlocks int   `json:"held_kv_blocks"`
	// BootstrapPort is the port of the KV transfer server while the pod
	// plays prefill (an SGLang router's bootstrap_port), else 0.
	BootstrapPort int    `json:"bootstrap_port,omitempty"`
	Error         string `json:"error,omitempty"`
}

// Errors of SwitchRole.
var (
	ErrSwitching = errors.New("sim: the pod is already switching role")
	ErrClosed    = errors.New("sim: the pod is closed")
)

// Role returns the role the pod serves; while it switches, the role it is
// leaving.
func (p *Pod) Role() string { return p.role.Load().Role }

// RoleStatus returns the pod's role and the state of a switch.
func (p *Pod) RoleStatus() RoleStatus {
	v := p.role.Load()
	s := RoleStatus{Role: v.Role, State: v.State, Target: v.Target, WarmupSec: v.WarmupSec, Switches: v.Switches,
		InFlight: p.active.Load(), HeldKVBlocks: int(p.m.pinnedBlocks.Load()), Error: v.Err}
	if v.Role == RolePrefill && v.State == StateServing {
		_, port, _ := net.SplitHostPort(p.KVXferAddr())
		s.BootstrapPort, _ = strconv.Atoi(port)
	}
	return s
}

// SwitchRole starts a switch to role with a warm-up of warmupSec simulated
// seconds and returns at once; RoleStatus follows it. It reports false,
// with no error, when the pod already serves role.
func (p *Pod) SwitchRole(role string, warmupSec float64) (bool, error) {
	if role != RoleCombined && role != RolePrefill && role != RoleDecode {
		return false, fmt.Errorf("%w: role = %q must be combined, prefill or decode", errConfig, role)
	}
	if !(warmupSec >= 0) || warmupSec > maxWarmupSec {
		return false, fmt.Errorf("%w: warmup_s = %v must be in [0, %d]", errConfig, warmupSec, maxWarmupSec)
	}
	p.switchMu.Lock()
	defer p.switchMu.Unlock()
	if isClosed(p.sched.done) {
		return false, ErrClosed
	}
	v := p.role.Load()
	switch {
	case v.State != StateServing:
		return false, fmt.Errorf("%w (%s, to %s)", ErrSwitching, v.State, v.Target)
	case v.Role == role:
		return false, nil
	}
	p.role.Store(&roleView{Role: v.Role, State: StateDraining, Target: role, WarmupSec: warmupSec, Switches: v.Switches})
	p.switching.Add(1)
	go p.runSwitch()
	return true, nil
}

// maxWarmupSec bounds a warm-up (simulated seconds): an hour is longer
// than any engine takes to load.
const maxWarmupSec = 3600

// runSwitch drains the pod, warms it up and makes it serve its new role;
// Close ends it early.
func (p *Pod) runSwitch() {
	defer p.switching.Done()
	v := *p.role.Load()
	poll := time.NewTicker(drainPoll)
	defer poll.Stop()
	for p.active.Load() > 0 || p.m.pinnedBlocks.Load() > 0 {
		select {
		case <-p.sched.done:
			return
		case <-poll.C:
		}
	}
	if v.Target == RolePrefill && p.xfer.Load() == nil {
		if err := p.listenKV(); err != nil {
			p.role.Store(&roleView{Role: v.Role, State: StateServing, Switches: v.Switches, Err: err.Error()})
			return
		}
	}
	v.State = StateWarming
	p.role.Store(&v)
	warm := time.NewTimer(time.Duration(v.WarmupSec / p.cfg.Speedup * float64(time.Second)))
	defer warm.Stop()
	select {
	case <-p.sched.done:
		return
	case <-warm.C:
	}
	p.role.Store(&roleView{Role: v.Target, State: StateServing, Switches: v.Switches + 1})
}

// enter admits a generation request unless the pod is switching role, when
// it answers 503; pair a true with leave. The count goes up before the
// state is read, so a drain that starts meanwhile either sees the request
// or the request sees the drain.
func (p *Pod) enter(ctx *fasthttp.RequestCtx) bool {
	p.active.Add(1)
	v := p.role.Load()
	if v.State == StateServing {
		return true
	}
	p.active.Add(-1)
	p.writeError(ctx, fasthttp.StatusServiceUnavailable, "ServiceUnavailableError", "",
		fmt.Sprintf("The pod is %s, switching from %s to %s; send the request to another pod.", v.State, v.Role, v.Target))
	return false
}

// leave ends a request enter admitted.
func (p *Pod) leave() { p.active.Add(-1) }

// health serves GET /health: 200 while serving, 503 with the state while
// switching role.
func (p *Pod) health(ctx *fasthttp.RequestCtx) {
	if v := p.role.Load(); v.State != StateServing {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		writeJSON(ctx, []byte(`{"status":"`+v.State+`"}`))
	}
}

// serveRole serves GET and POST /admin/role.
func (p *Pod) serveRole(ctx *fasthttp.RequestCtx) {
	if ctx.IsPost() {
		var req struct {
			Role      string  `json:"role"`
			WarmupSec float64 `json:"warmup_s"`
		}
		if !p.parseBody(ctx, &req) {
			return
		}
		started, err := p.SwitchRole(req.Role, req.WarmupSec)
		switch {
		case errors.Is(err, ErrSwitching):
			p.writeError(ctx, fasthttp.StatusConflict, "ConflictError", "role", err.Error())
			return
		case errors.Is(err, ErrClosed):
			p.writeError(ctx, fasthttp.StatusServiceUnavailable, "ServiceUnavailableError", "", err.Error())
			return
		case err != nil:
			p.writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "role", err.Error())
			return
		case started:
			ctx.SetStatusCode(fasthttp.StatusAccepted)
		}
	}
	body, _ := json.Marshal(p.RoleStatus())
	writeJSON(ctx, body)
}

package plan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Actuator carries out a decision to switch: it moves a model's pool to
// Decision.Target. The planning loop calls Apply from one goroutine per
// model, one call at a time, and plans nothing for the model until it
// returns; Apply may take as long as the switch does (drain, warm-up) and
// must return when ctx ends.
type Actuator interface {
	Apply(ctx context.Context, model string, d Decision) error
}

// ErrWebhook wraps the webhook's failures.
var ErrWebhook = errors.New("plan: webhook")

// Lease fences the actuators of gateway replicas that plan one fleet: only
// the replica that holds the plan lease acts, and it may lose the lease
// while its switch runs (cut off from Redis for the lease's term, it sees
// another replica take over). Hold renews the lease for a full term, or
// returns an error wrapping ErrLeaseLost when this replica no longer holds
// it or cannot tell. An actuator calls it right before each step that
// cannot be taken back, so a switch stops once another replica may start
// its own.
type Lease interface {
	Hold(ctx context.Context) error
}

// ErrLeaseLost says a replica no longer holds the plan lease.
var ErrLeaseLost = errors.New("plan: the plan lease is lost")

// hold is l.Hold; a nil l is a replica that plans alone.
func hold(ctx context.Context, l Lease) error {
	if l == nil {
		return nil
	}
	return l.Hold(ctx)
}

// Webhook tells a controller that owns the fleet (a Kubernetes operator)
// the split it should run: it POSTs
//
//	{"model": "llama", "prefill": 4, "decode": 17, "reason": "switch 12P12D → 4P17D (…)"}
//
// to URL and expects a 2xx answer. A transport error, 429 or 5xx is retried
// up to Retries times, waiting 100 ms, then twice as long each time; other
// answers are final.
type Webhook struct {
	URL string
	// Timeout bounds one attempt.
	Timeout time.Duration
	Retries int
	// Client sends the requests (nil: a client of its own).
	Client *http.Client
	// Lease is held before each attempt (nil: the replica plans alone).
	Lease Lease
}

// webhookBackoff is the wait before the first retry.
const webhookBackoff = 100 * time.Millisecond

// WebhookBody is what Webhook POSTs.
type WebhookBody struct {
	Model   string `json:"model"`
	Prefill int    `json:"prefill"`
	Decode  int    `json:"decode"`
	Reason  string `json:"reason"`
}

// Apply posts d's target for model.
func (w *Webhook) Apply(ctx context.Context, model string, d Decision) error {
	body, err := json.Marshal(WebhookBody{Model: model, Prefill: d.Target.Prefill, Decode: d.Target.Decode, Reason: d.Reason})
	if err != nil {
		return err
	}
	client := w.Client
	if client == nil {
		client = http.DefaultClient
	}
	wait := webhookBackoff
	for attempt := 0; ; attempt++ {
		if err := hold(ctx, w.Lease); err != nil {
			return fmt.Errorf("%w: %s: attempt %d not sent: %w", ErrWebhook, w.URL, attempt+1, err)
		}
		retry, err := w.post(ctx, client, body)
		if err == nil {
			return nil
		}
		if !retry || attempt >= w.Retries {
			return fmt.Errorf("%w: %s: %v (attempt %d of %d)", ErrWebhook, w.URL, err, attempt+1, w.Retries+1)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %v, then %v", ErrWebhook, w.URL, err, ctx.Err())
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// post makes one attempt and says whether a failure may be retried.
func (w *Webhook) post(ctx context.Context, client *http.Client, body []byte) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, w.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return true, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return false, nil
	}
	err = fmt.Errorf("status %d", resp.StatusCode)
	if msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512)); len(bytes.TrimSpace(msg)) > 0 {
		err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(msg))
	}
	return resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500, err
}

// Fleet is the gateway as RoleSwitcher drives it. Its methods are safe for
// concurrent use.
type Fleet interface {
	// Instances returns model's prefill and decode pods.
	Instances(model string) []Instance
	// Release takes the named pods of model out of routing and returns
	// once the gateway has no request in flight on them, or ctx ends (the
	// pods stay out either way until Assign).
	Release(ctx context.Context, model string, names []string) error
	// Assign applies changes to model's pods and puts each pod released for
	// model (not another model's) back into routing, in its new role if
	// changes give one, else in its old one.
	Assign(model string, changes []Change) error
}

// RoleSwitcher moves simulated pods (engines/sim) between roles: for a
// decision it picks the pods to move and their rolesets (Reassign), takes
// them out of the gateway's routing and waits for their requests to end
// (Fleet.Release), asks each pod to switch (POST /admin/role with the
// warm-up), waits until it serves its new role, and puts it back with its
// new role and roleset (Fleet.Assign). A pod that fails to switch goes back
// in the role it reports, or its old one; the rolesets are then regrouped
// for what really happened.
type RoleSwitcher struct {
	Fleet Fleet
	// WarmupSec is the warm-up each pod is asked for (the pod's simulated
	// seconds).
	WarmupSec float64
	// Timeout bounds one switch, release to assign.
	Timeout time.Duration
	// Client sends the admin calls (nil: a client of its own).
	Client *http.Client
	// Lease is held before the pods are told to switch (nil: the replica
	// plans alone).
	Lease Lease
}

// rolePoll is how often RoleSwitcher asks a switching pod how far it got.
const rolePoll = 20 * time.Millisecond

// podRole is the part of a sim pod's GET /admin/role answer the switcher
// reads.
type podRole struct {
	Role          string `json:"role"`
	State         string `json:"state"`
	Target        string `json:"target"`
	BootstrapPort int    `json:"bootstrap_port"`
	Error         string `json:"error"`
}

// Apply moves model's pods to d.Target.
func (s *RoleSwitcher) Apply(ctx context.Context, model string, d Decision) error {
	pool := s.Fleet.Instances(model)
	changes := Reassign(pool, d.Target)
	var moving []Change
	for _, c := range changes {
		if c.Switch {
			moving = append(moving, c)
		}
	}
	if len(moving) == 0 {
		return s.Fleet.Assign(model, changes)
	}
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	names := make([]string, len(moving))
	for i, c := range moving {
		names[i] = c.Name
	}
	if err := s.Fleet.Release(ctx, model, names); err != nil {
		return errors.Join(fmt.Errorf("plan: draining %v: %w", names, err), s.Fleet.Assign(model, nil))
	}
	// A replica that lost the lease while the pods drained puts them back
	// as they were: a pod told to switch cannot be stopped.
	if err := hold(ctx, s.Lease); err != nil {
		return errors.Join(fmt.Errorf("plan: switching %v: %w", names, err), s.Fleet.Assign(model, nil))
	}
	byName := map[string]Instance{}
	for _, in := range pool {
		byName[in.Name] = in
	}
	errs := make([]error, len(moving))
	ends := make([]podRole, len(moving))
	var wg sync.WaitGroup
	for i, c := range moving {
		wg.Go(func() { ends[i], errs[i] = s.switchPod(ctx, byName[c.Name], c.Role) })
	}
	wg.Wait()
	// What happened, regrouped: pods that did not switch (and will not)
	// keep their role and roleset.
	after := make([]Instance, len(pool))
	copy(after, pool)
	var done []Change
	for i, c := range moving {
		if errs[i] != nil {
			errs[i] = fmt.Errorf("plan: pod %s to %s: %w", c.Name, c.Role, errs[i])
		}
		for j := range after {
			if after[j].Name == c.Name && ends[i].Role == c.Role {
				after[j].Role, after[j].Roleset = c.Role, c.Roleset
				c.BootstrapPort = ends[i].BootstrapPort
				done = append(done, c)
			}
		}
	}
	errs = append(errs, s.Fleet.Assign(model, append(done, Regroup(after)...)))
	return errors.Join(errs...)
}

// switchPod asks pod in to serve role and waits until it does.
// It returns the pod's state then or, when the switch timed out before the
// pod finished, with Role set to the role it is switching to (the
// gateway's health check keeps a switching pod out until it serves); Role
// is "" when the pod never took the request.
func (s *RoleSwitcher) switchPod(ctx context.Context, in Instance, role string) (podRole, error) {
	body, _ := json.Marshal(map[string]any{"role": role, "warmup_s": s.WarmupSec})
	var st podRole
	if err := s.call(ctx, http.MethodPost, in, body, &st); err != nil {
		return podRole{}, err
	}
	tick := time.NewTicker(rolePoll)
	defer tick.Stop()
	for st.State != podServing {
		var err error
		select {
		case <-ctx.Done():
			err = fmt.Errorf("still %s after the switch timeout: %w", st.State, ctx.Err())
		case <-tick.C:
			err = s.call(ctx, http.MethodGet, in, nil, &st)
		}
		if err != nil {
			return podRole{Role: st.Target}, err
		}
	}
	if st.Role != role {
		return st, fmt.Errorf("the pod serves %s: %s", st.Role, st.Error)
	}
	return st, nil
}

// podServing is a sim pod's state when it is not switching.
const podServing = "serving"

// call sends method to pod in's /admin/role, with its API key.
func (s *RoleSwitcher) call(ctx context.Context, method string, in Instance, body []byte, out *podRole) error {
	url := "http://" + in.Address + "/admin/role"
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if in.Auth != "" {
		req.Header.Set("Authorization", in.Auth)
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("%s %s: status %d: %s", method, url, resp.StatusCode, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, out)
}

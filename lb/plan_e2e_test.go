package lb_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/redistest"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/plan"
)

// planStatus is the part of GET /admin/plan the test reads.
type planStatus struct {
	Enabled   bool     `json:"enabled"`
	Actuators []string `json:"actuators"`
	Models    []struct {
		Model      string       `json:"model"`
		ObservedAt time.Time    `json:"observed_at"`
		Window     *plan.Demand `json:"window"`
		NeedP      float64      `json:"need_prefill"`
		NeedD      float64      `json:"need_decode"`
		Current    string       `json:"current"`
		Target     string       `json:"target"`
		Reason     string       `json:"reason"`
		Switching  bool         `json:"switching"`
		Switches   int          `json:"switches"`
		Failures   int          `json:"failures"`
		LastError  string       `json:"last_error"`
		History    []struct {
			From, To string
			Moves    int
			Released []string
			InFlight int64   `json:"in_flight_at_release"`
			DrainSec float64 `json:"drain_sec"`
			TookSec  float64 `json:"took_sec"`
			Error    string
		} `json:"history"`
	} `json:"models"`
}

func readPlan(t *testing.T, s *lb.Server) planStatus {
	t.Helper()
	var st planStatus
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/plan")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Models) != 1 {
		t.Fatalf("/admin/plan: %+v, want one model", st)
	}
	return st
}

// planLoad sends requests at steady rates and sorts every answer: a
// complete 200, a clean OpenAI error, or lost (a transport error, a body
// that is neither, a stream cut short).
type planLoad struct {
	s    *lb.Server
	wg   sync.WaitGroup
	mu   sync.Mutex
	seq  int
	ok   int
	errs []string // clean errors
	lost []string
}

// every sends body(i) every interval until stop is closed.
func (l *planLoad) every(interval time.Duration, stop <-chan struct{}, body func(i int) string) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			l.mu.Lock()
			l.seq++
			i := l.seq
			l.mu.Unlock()
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.send(body(i))
			}()
		}
	}()
}

func (l *planLoad) send(body string) {
	var verdict func()
	resp, err := client.Post("http://"+l.s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		verdict = func() { l.lost = append(l.lost, err.Error()) }
	} else {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error *struct{ Message string } `json:"error"`
		}
		stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		switch {
		case rerr != nil:
			verdict = func() { l.lost = append(l.lost, rerr.Error()) }
		case resp.StatusCode == http.StatusOK && stream && strings.HasSuffix(string(b), "data: [DONE]\n\n") && !strings.Contains(string(b), `"error"`),
			resp.StatusCode == http.StatusOK && !stream && strings.Contains(string(b), `"choices"`):
			verdict = func() { l.ok++ }
		case resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil && e.Error != nil:
			verdict = func() { l.errs = append(l.errs, fmt.Sprintf("%d %s", resp.StatusCode, e.Error.Message)) }
		default:
			verdict = func() { l.lost = append(l.lost, fmt.Sprintf("%d %.200q", resp.StatusCode, b)) }
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	verdict()
}

// completion is a completions request with a prompt of about words×6
// tokens that shares no prefix block with another request's.
func completion(i, words, maxTokens int, stream bool) string {
	prompt := fmt.Sprintf("request %d: %s", i, strings.Repeat("lorem ipsum dolor sit amet ", words))
	return fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d,"stream":%v}`, prompt, maxTokens, stream)
}

// The planner follows a load that shifts from long prompts to long answers
// by moving sim pods between roles while the load runs: the pods it moves
// finish the requests they have, nothing is lost, and the webhook hears
// every split the planner decides.
func TestPlannerSwitchesRolesUnderLoad(t *testing.T) {
	e := pdEngines[0] // vLLM
	// Prefill at 4,000 tokens/s and vLLM-like decode steps, in real time,
	// so a modest load keeps the roles busy.
	slow := func(c *sim.Config) {
		c.Speedup = 1
		c.Physics = sim.DefaultPhysics()
		c.Physics.PrefillTokensPerSec = 4000
	}
	var pods []config.Pod
	for _, p := range []struct{ name, role, set string }{{"p0", sim.RolePrefill, "A"}, {"d0", sim.RoleDecode, "A"}, {"p1", sim.RolePrefill, "B"}, {"d1", sim.RoleDecode, "B"}} {
		sp := startSim(t, e, p.name, p.role, slow)
		pc := pdPod(sp, sp.Addr(), p.set)
		pc.PrefillTokensPerSec = 4000
		pods = append(pods, pc)
	}
	var hookMu sync.Mutex
	var hooked []plan.WebhookBody
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b plan.WebhookBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		hookMu.Lock()
		hooked = append(hooked, b)
		hookMu.Unlock()
	}))
	defer hook.Close()
	s := pdGateway(t, e, pods, func(c *config.Config) {
		c.Plan.Enabled = true
		c.Plan.WindowSec, c.Plan.MinDwellSec = 1, 0
		c.Plan.DrainSec, c.Plan.WarmupSec = 0.1, 0.1
		// A decode pod counted at 8 sequences (about 690 tokens/s), so a
		// few dozen streams need more than one.
		c.Plan.DecodeMaxBatch = 8
		c.Plan.SwitchRoles = true
		c.Plan.SwitchTimeout = 20 * time.Second
		c.Plan.Webhook.URL = hook.URL
	})
	if st := readPlan(t, s); !st.Enabled || strings.Join(st.Actuators, ",") != "webhook,switch_roles" || st.Models[0].Current != "2P2D" {
		t.Fatalf("/admin/plan at start: %+v", st)
	}
	load := &planLoad{s: s}
	// waveTo waits for a finished switch to a target ok accepts; the bound
	// only keeps a broken planner from hanging the test.
	waveTo := func(what string, ok func(to plan.Ratio) bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			st := readPlan(t, s).Models[0]
			for _, w := range st.History {
				if to, _ := plan.ParseRatio(w.To); ok(to) && !st.Switching {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, st)
			}
		}
	}

	// Long prompts with one-token answers, about 2.5 prefill pods of
	// work; and four long streams, on both decode pods, in flight when
	// one of them is moved.
	phaseA := make(chan struct{})
	load.every(200*time.Millisecond, phaseA, func(i int) string { return completion(i, 300, 1, false) })
	for i := range 4 {
		load.wg.Add(1)
		go func() {
			defer load.wg.Done()
			load.send(completion(-1-i, 2, 500, true))
		}()
	}
	waveTo("a switch to more prefill pods", func(to plan.Ratio) bool { return to.Prefill > to.Decode })
	close(phaseA)

	// Short prompts with 200-token streamed answers: about 1.7 decode pods.
	phaseB := make(chan struct{})
	load.every(166*time.Millisecond, phaseB, func(i int) string { return completion(i, 2, 200, true) })
	waveTo("a switch to more decode pods", func(to plan.Ratio) bool { return to.Decode > to.Prefill })
	close(phaseB)
	load.wg.Wait()

	st := readPlan(t, s).Models[0]
	t.Logf("%d requests answered 200, %d clean errors, %d lost; %d instances switched; last window %+v; %s",
		load.ok, len(load.errs), len(load.lost), st.Switches, st.Window, st.Reason)
	inFlight := int64(0)
	for _, w := range st.History {
		t.Logf("wave %s → %s: %d moves, released %v with %d requests in flight, drained in %.2fs, took %.2fs %s",
			w.From, w.To, w.Moves, w.Released, w.InFlight, w.DrainSec, w.TookSec, w.Error)
		inFlight += w.InFlight
	}
	if len(load.lost) > 0 || len(load.errs) > 0 || load.ok == 0 {
		t.Errorf("lost %d: %.5q; errors %d: %.5q", len(load.lost), load.lost, len(load.errs), load.errs)
	}
	if st.Failures > 0 || st.Switches < 2 {
		t.Errorf("switches %d, failures %d (%s)", st.Switches, st.Failures, st.LastError)
	}
	if inFlight == 0 {
		t.Errorf("no request was in flight on a pod when it was released")
	}

	// The gateway's roles are the pods' own, and the webhook heard every
	// wave's target.
	var view struct {
		Pods []struct{ Name, Role, Roleset string }
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/pods")), &view); err != nil {
		t.Fatal(err)
	}
	var now plan.Ratio
	for _, p := range view.Pods {
		status := struct{ Role, State string }{}
		for _, c := range pods {
			if c.Name == p.Name {
				if err := json.Unmarshal([]byte(get(t, "http://"+c.Address+"/admin/role")), &status); err != nil {
					t.Fatal(err)
				}
			}
		}
		if status.Role != p.Role || status.State != sim.StateServing {
			t.Errorf("pod %s: the gateway routes it as %s, it serves %s (%s)", p.Name, p.Role, status.Role, status.State)
		}
		if p.Role == config.RolePrefill {
			now.Prefill++
		} else {
			now.Decode++
		}
	}
	if now.String() != st.Current || now.Total() != 4 {
		t.Errorf("the pool runs %v, /admin/plan says %s", now, st.Current)
	}
	hookMu.Lock()
	defer hookMu.Unlock()
	if len(hooked) != len(st.History) {
		t.Errorf("webhook heard %+v for %d waves", hooked, len(st.History))
	}
	for i, b := range hooked {
		if i < len(st.History) && (b.Model != "m" || plan.Ratio{Prefill: b.Prefill, Decode: b.Decode}.String() != st.History[i].To || b.Reason == "") {
			t.Errorf("webhook call %d: %+v, want model m and %s", i, b, st.History[i].To)
		}
	}
	if n := metricValue(t, s, `pdlb_plan_role_switches_total{model="m"}`); n != float64(st.Switches) {
		t.Errorf("pdlb_plan_role_switches_total = %v, want %d", n, st.Switches)
	}
	if p, d := metricValue(t, s, `pdlb_plan_current_instances{model="m",role="prefill"}`), metricValue(t, s, `pdlb_plan_current_instances{model="m",role="decode"}`); p != float64(now.Prefill) || d != float64(now.Decode) {
		t.Errorf("pdlb_plan_current_instances %v prefill, %v decode; want %v", p, d, now)
	}
}

// With the planner off, /admin/plan says so and no plan series exist; with
// it on, a model without prefill/decode pods is not planned.
func TestPlanAdminWithoutPlannedModels(t *testing.T) {
	pods := podsOf("m", testFleet(t, "m", 1, 100)...)
	for _, enabled := range []bool{false, true} {
		s := testGateway(t, pods, func(c *config.Config) { c.Plan.Enabled = enabled })
		var st planStatus
		if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/plan")), &st); err != nil {
			t.Fatal(err)
		}
		if st.Enabled != enabled || len(st.Models) != 0 || len(st.Actuators) != 0 {
			t.Errorf("enabled %v: /admin/plan %+v", enabled, st)
		}
		if m := get(t, "http://"+s.AdminAddr()+"/metrics"); strings.Contains(m, "pdlb_plan_current_instances{") {
			t.Errorf("enabled %v: plan series without a planned model", enabled)
		}
	}
}

// TestPlanReplicasMeasureTheFleet: two gateway replicas share one Redis
// and a 1P1D fleet, each planning it. A burst through replica a alone and
// the same burst split between a and b make the same window in a's
// planner: a planner splits the whole fleet, so it must measure the
// whole fleet's demand, whichever replica the requests came through.
func TestPlanReplicasMeasureTheFleet(t *testing.T) {
	const (
		burst     = 8
		maxTokens = 32
		windowSec = 2
	)
	redis := redistest.Start(t, 0)
	e := pdEngines[0] // vLLM
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	pods := []config.Pod{pdPod(pre, pre.Addr(), "A"), pdPod(dec, dec.Addr(), "A")}
	replica := func(id string) *lb.Server {
		return pdGateway(t, e, pods, func(c *config.Config) {
			c.Redis.Address, c.Redis.ReplicaID = redis.Addr(), id
			c.TokenLoad.SharedSyncIntervalMs = 20
			c.Plan.Enabled, c.Plan.WindowSec = true, windowSec
		})
	}
	a, b := replica("a"), replica("b")

	// window sends a burst through the replicas of via in turn right after
	// a's planner closed a window, and returns the next window a observes
	// (which holds the whole burst, done long before it closes) and the
	// requests a counted in it. Prompts never repeat: no prefix is cached.
	seq := 0
	window := func(via ...*lb.Server) (plan.Demand, float64) {
		t.Helper()
		closed := func() time.Time { return readPlan(t, a).Models[0].ObservedAt }
		last := closed()
		testwait.For(t, "a's planner to close a window", func() bool { return closed().After(last) })
		opened := closed()
		var wg sync.WaitGroup
		for i := range burst {
			seq++
			wg.Add(1)
			go func(s *lb.Server, body string) {
				defer wg.Done()
				resp, err := client.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%d %s", resp.StatusCode, b)
				}
			}(via[i%len(via)], completion(seq, 20, maxTokens, false))
		}
		wg.Wait()
		testwait.For(t, "a's planner to close the burst's window", func() bool { return closed().After(opened) })
		st := readPlan(t, a).Models[0]
		dt := st.ObservedAt.Sub(opened).Seconds()
		if st.Window == nil || dt > 1.5*windowSec {
			t.Fatalf("the burst's window: %+v over %.2fs, want one of %ds", st.Window, dt, windowSec)
		}
		t.Logf("via %d replicas: %.1f requests, %+v, needs %.3fP %.3fD", len(via), st.Window.Rate*dt, *st.Window, st.NeedP, st.NeedD)
		return *st.Window, st.Window.Rate * dt
	}
	alone, n := window(a)
	if math.Round(n) != burst || alone.OutputTokens != maxTokens {
		t.Fatalf("through a alone: %.1f requests of %.1f output tokens, want %d of %d", n, alone.OutputTokens, burst, maxTokens)
	}
	split, n := window(a, b)
	if math.Round(n) != burst || split.OutputTokens != maxTokens || split.PromptTokens != alone.PromptTokens {
		t.Errorf("through a and b: %.1f requests of %.1f prompt and %.1f output tokens; through a alone, %d of %.1f and %.1f",
			n, split.PromptTokens, split.OutputTokens, burst, alone.PromptTokens, alone.OutputTokens)
	}
}

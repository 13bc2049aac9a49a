package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

// roleStatus GETs /admin/role.
func roleStatus(t *testing.T, c *http.Client, p *Pod) RoleStatus {
	t.Helper()
	status, b := get(t, c, "http://"+p.Addr()+"/admin/role")
	var s RoleStatus
	if err := json.Unmarshal(b, &s); status != http.StatusOK || err != nil {
		t.Fatalf("GET /admin/role: %d %s (%v)", status, b, err)
	}
	return s
}

// A decode pod switched to prefill finishes the stream it serves, refuses
// new requests and fails its health check while it drains and warms up,
// then serves prefill legs a decode pod can pull from.
func TestRoleSwitchDrainsWarmsAndServes(t *testing.T) {
	c := testClient(t)
	pod := func(role string) *Pod {
		return testPod(t, Config{Engine: engines.VLLM, Model: "m", Seed: 11, Speedup: 1, Role: role})
	}
	trio := pdTrio{pre: pod(RoleDecode), dec: pod(RoleDecode), comb: pod(RoleCombined)}
	switched := trio.pre
	url := "http://" + switched.Addr() + "/v1/chat/completions"

	type result struct {
		status int
		chunks int
		finish string
	}
	done := make(chan result, 1)
	go func() {
		resp, events := stream(t, c, context.Background(), url, chatBody("a long answer", map[string]any{"stream": true, "max_tokens": 100}))
		text, finish := streamedText(parseChunks(t, events))
		done <- result{resp.StatusCode, len(text), finish}
	}()
	testwait.For(t, "the stream to start", func() bool { return switched.RoleStatus().InFlight == 1 })

	status, b := post(t, c, "http://"+switched.Addr()+"/admin/role", map[string]any{"role": "prefill", "warmup_s": 0.2})
	if status != http.StatusAccepted {
		t.Fatalf("POST /admin/role: %d %s", status, b)
	}
	if s := roleStatus(t, c, switched); s.State != StateDraining || s.Role != RoleDecode || s.Target != RolePrefill || s.InFlight != 1 {
		t.Fatalf("while the stream runs: %+v, want draining decode → prefill with 1 in flight", s)
	}
	if status, b := post(t, c, url, chatBody("hi", nil)); status != http.StatusServiceUnavailable {
		t.Errorf("a new request while draining: %d %s, want 503", status, b)
	}
	if status, b := get(t, c, "http://"+switched.Addr()+"/health"); status != http.StatusServiceUnavailable || string(b) != `{"status":"draining"}` {
		t.Errorf("/health while draining: %d %s", status, b)
	}
	if status, b := post(t, c, "http://"+switched.Addr()+"/admin/role", map[string]any{"role": "decode"}); status != http.StatusConflict {
		t.Errorf("a second switch while switching: %d %s, want 409", status, b)
	}

	r := <-done
	if r.status != http.StatusOK || r.finish != "length" || r.chunks == 0 {
		t.Fatalf("the stream in flight: %+v, want 200 ending with length", r)
	}
	testwait.For(t, "the switch to end", func() bool { return switched.RoleStatus().State == StateServing })
	s := roleStatus(t, c, switched)
	if s.Role != RolePrefill || s.Switches != 1 || s.BootstrapPort == 0 || s.Error != "" {
		t.Fatalf("after the switch: %+v, want serving prefill with a bootstrap port", s)
	}
	if status, _ := get(t, c, "http://"+switched.Addr()+"/health"); status != http.StatusOK {
		t.Errorf("/health after the switch: %d", status)
	}
	body := chatBody("the prefill pod computes this prompt", map[string]any{"max_tokens": 8})
	if got, want := vllmPD(t, c, trio, "/v1/chat/completions", body), finalAnswer(t, c, "http://"+trio.comb.Addr()+"/v1/chat/completions", body); got != want {
		t.Errorf("PD answer through the switched pod %+v, want the combined pod's %+v", got, want)
	}
}

func TestRoleSwitchRequests(t *testing.T) {
	c := testClient(t)
	p := testPod(t, Config{Engine: engines.SGLang, Speedup: fast, Role: RolePrefill})
	f := func(body map[string]any, wantStatus int, wantState string) {
		t.Helper()
		status, b := post(t, c, "http://"+p.Addr()+"/admin/role", body)
		if status != wantStatus {
			t.Errorf("POST /admin/role %v: %d %s, want %d", body, status, b, wantStatus)
		}
		if s := roleStatus(t, c, p); wantState != "" && s.State != wantState {
			t.Errorf("after %v: state %q, want %q", body, s.State, wantState)
		}
	}
	f(map[string]any{"role": "both"}, http.StatusBadRequest, StateServing)
	f(map[string]any{"role": "decode", "warmup_s": -1}, http.StatusBadRequest, StateServing)
	f(map[string]any{"role": "decode", "warmup_s": 1e9}, http.StatusBadRequest, StateServing)
	f(map[string]any{"role": "prefill"}, http.StatusOK, StateServing) // already: nothing to do
	if s := roleStatus(t, c, p); s.BootstrapPort == 0 || s.Switches != 0 {
		t.Errorf("a prefill pod: %+v, want its bootstrap port and no switches", s)
	}
	// A switch still warming when the pod closes ends with it.
	f(map[string]any{"role": "decode", "warmup_s": 3600}, http.StatusAccepted, "")
	testwait.For(t, "the warm-up", func() bool { return p.RoleStatus().State == StateWarming })
}

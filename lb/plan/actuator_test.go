package plan

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/engines/sim"
)

func TestWebhook(t *testing.T) {
	var mu sync.Mutex
	var got []WebhookBody
	answers := []int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b WebhookBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("webhook request: %s %v %v", r.Method, r.Header, err)
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, b)
		status := http.StatusOK
		if len(answers) > 0 {
			status, answers = answers[0], answers[1:]
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	d := Decision{Target: Ratio{4, 17}, Reason: "switch 12P12D → 4P17D"}
	f := func(retries int, statuses []int, wantCalls int, wantErr string) {
		t.Helper()
		mu.Lock()
		got, answers = nil, statuses
		mu.Unlock()
		w := &Webhook{URL: srv.URL, Timeout: 5 * time.Second, Retries: retries, Client: srv.Client()}
		err := w.Apply(context.Background(), "llama", d)
		if (err == nil) != (wantErr == "") || err != nil && (!strings.Contains(err.Error(), wantErr) || !errors.Is(err, ErrWebhook)) {
			t.Errorf("answers %v: error %v, want %q", statuses, err, wantErr)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != wantCalls {
			t.Fatalf("answers %v: %d calls, want %d", statuses, len(got), wantCalls)
		}
		if want := (WebhookBody{Model: "llama", Prefill: 4, Decode: 17, Reason: d.Reason}); got[0] != want {
			t.Errorf("body %+v, want %+v", got[0], want)
		}
	}
	f(3, nil, 1, "")
	f(3, []int{503, 429}, 3, "")
	f(1, []int{500, 502}, 2, "status 502 (attempt 2 of 2)")
	f(3, []int{400}, 1, "status 400 (attempt 1 of 4)")
}

// fakeFleet is a gateway's pool as the role switcher sees it.
type fakeFleet struct {
	mu       sync.Mutex
	pods     []Instance
	released []string
	assigned [][]Change
}

func (f *fakeFleet) Instances(string) []Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pods)
}

func (f *fakeFleet) Release(_ context.Context, _ string, names []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, names...)
	return nil
}

func (f *fakeFleet) Assign(_ string, changes []Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.assigned = append(f.assigned, changes)
	for _, c := range changes {
		for i := range f.pods {
			if f.pods[i].Name == c.Name {
				f.pods[i].Role, f.pods[i].Roleset = c.Role, c.Roleset
			}
		}
	}
	return nil
}

// The role switcher drains the pods it moves, has them switch through
// their admin endpoint (with its key, on pods started with one) and
// assigns their new roles once they serve them.
func TestRoleSwitcherOnSimPods(t *testing.T) {
	t.Run("open", func(t *testing.T) { testRoleSwitcherOnSimPods(t, "") })
	t.Run("keyed", func(t *testing.T) { testRoleSwitcherOnSimPods(t, "sk-pod") })
}

func testRoleSwitcherOnSimPods(t *testing.T, key string) {
	fleet := &fakeFleet{}
	pods := map[string]*sim.Pod{}
	for _, s := range []struct{ name, role, set string }{{"p0", RolePrefill, "A"}, {"d0", RoleDecode, "A"}, {"p1", RolePrefill, "B"}, {"d1", RoleDecode, "B"}} {
		p, err := sim.Start(sim.Config{Name: s.name, Role: s.role, Speedup: 100, APIKey: key})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pods[s.name] = p
		in := Instance{Name: s.name, Address: p.Addr(), Role: s.role, Roleset: s.set}
		if key != "" {
			in.Auth = "Bearer " + key
		}
		fleet.pods = append(fleet.pods, in)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	rs := &RoleSwitcher{Fleet: fleet, WarmupSec: 5, Timeout: 20 * time.Second, Client: client}
	if err := rs.Apply(context.Background(), "m", Decision{Target: Ratio{1, 3}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fleet.released, []string{"p0"}) {
		t.Errorf("released %v, want [p0]", fleet.released)
	}
	if s := pods["p0"].RoleStatus(); s.Role != sim.RoleDecode || s.State != sim.StateServing || s.Switches != 1 {
		t.Errorf("p0 after the switch: %+v", s)
	}
	want := []Change{{Name: "p0", Role: RoleDecode, Roleset: "B", Switch: true}, {Name: "d0", Role: RoleDecode, Roleset: "B"}}
	if len(fleet.assigned) != 1 || !slices.Equal(fleet.assigned[0], want) {
		t.Errorf("assigned %+v, want %+v", fleet.assigned, want)
	}
	// A pod that cannot be reached stays in its role; the error says which.
	fleet.pods[1].Address = "127.0.0.1:1" // d0, the pod that moves next
	err := rs.Apply(context.Background(), "m", Decision{Target: Ratio{2, 2}})
	if err == nil || !strings.Contains(err.Error(), "pod d0 to prefill") {
		t.Fatalf("switch to an unreachable pod: %v", err)
	}
	if got := fleet.assigned[1]; len(got) != 0 {
		t.Errorf("after a failed switch assigned %+v, want nothing", got)
	}
}

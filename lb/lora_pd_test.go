package lb_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"pdlb/engines/sim"
	"pdlb/internal/testnet"
	"pdlb/lb/config"
)

// TestPDAdapters: on a model served only by prefill and decode pods, an
// adapter's request goes through the PD cascade to a prefill and a decode
// pod that both serve the adapter (declared by one pod of each role); a burst for an adapter no pod holds
// loads it once on one prefill pod and once on one decode pod, and every
// request lands on those two; the requests are counted by adapter.
func TestPDAdapters(t *testing.T) {
	e := pdEngines[0] // vLLM: both legs name the adapter in "model"
	var pods []config.Pod
	sims := map[string]*sim.Pod{}
	for _, role := range []string{sim.RolePrefill, sim.RoleDecode} {
		for i := range 2 {
			name := fmt.Sprintf("%s-%d", role, i)
			p := startSim(t, e, name, role, func(c *sim.Config) {
				c.MaxLoras = 2
				if i == 0 {
					c.LoRAModules = []sim.LoRAModule{{Name: "sql", Path: "/loras/sql"}}
				} else {
					c.EnableLoRA = true
				}
			})
			sims[name] = p
			pod := pdPod(p, p.Addr(), "rs0")
			if i == 0 {
				pod.Adapters = "sql" // as discovery's pdlb/lora-adapters says it
			}
			pods = append(pods, pod)
		}
	}
	s := pdGateway(t, e, pods, func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "fin", Path: "/loras/fin"}},
			LoadAdapters: true, MaxLoras: 2}}}
	})
	served := func(model string) (pre, dec string) {
		t.Helper()
		body := strings.Replace(pdBody("/v1/completions", false, 4), `"model":"m"`, `"model":"`+model+`"`, 1)
		resp, b := post(t, s, "/v1/completions", body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-model") != model || !strings.Contains(b, `"model":"`+model+`"`) {
			t.Fatalf("%s: %d x-pdlb-model %q: %s", model, resp.StatusCode, resp.Header.Get("x-pdlb-model"), b)
		}
		return resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod")
	}
	for range 4 {
		if pre, dec := served("sql"); pre != "prefill-0" || dec != "decode-0" {
			t.Fatalf("sql served by %s and %s, the pods without it", pre, dec)
		}
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		used []string
	)
	for range 8 {
		wg.Go(func() {
			pre, dec := served("fin")
			mu.Lock()
			used = append(used, pre, dec)
			mu.Unlock()
		})
	}
	wg.Wait()
	if got := metricValue(t, s, `pdlb_adapter_loads_total{model="m"}`); got != 2 {
		t.Errorf("pdlb_adapter_loads_total = %v after a burst, want 2 (a prefill and a decode pod)", got)
	}
	for adapter, want := range map[string]float64{"sql": 4, "fin": 8} {
		if got := metricValue(t, s, `pdlb_adapter_requests_total{model="m",adapter="`+adapter+`"}`); got != want {
			t.Errorf("pdlb_adapter_requests_total %s = %v, want %v", adapter, got, want)
		}
	}
	slices.Sort(used)
	used = slices.Compact(used)
	var loaded []string
	for name, p := range sims {
		if strings.Contains(get(t, "http://"+p.Addr()+"/v1/models"), `"fin"`) {
			loaded = append(loaded, name)
		}
	}
	slices.Sort(loaded)
	if len(loaded) != 2 || !slices.Equal(used, loaded) {
		t.Errorf("fin served by %v, loaded on %v; want the same prefill and decode pod", used, loaded)
	}
}

// TestFallbackToPDModel: a model with no live pod falls back to one served
// only by prefill and decode pods, whose cascade serves the request.
func TestFallbackToPDModel(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	dead := testnet.Refusing(t)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0"), {Name: "a-0", Model: "a", Address: dead}},
		func(c *config.Config) {
			c.Models = []config.Model{{Name: "a", LoRA: config.LoRA{Fallback: []string{"m"}}}}
		})
	body := strings.Replace(pdBody("/v1/completions", false, 4), `"model":"m"`, `"model":"a"`, 1)
	resp, b := post(t, s, "/v1/completions", body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-model") != "m" || resp.Header.Get("x-pdlb-prefill-pod") != "pre" || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
		t.Fatalf("%d x-pdlb-model %q, prefill %q, decode %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-model"),
			resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), b)
	}
}

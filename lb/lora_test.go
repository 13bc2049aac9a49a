package lb_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

// TestModelsAdaptersAliasesFallbacks: over real sockets, a model with no
// live pod and one whose pod answers 503 are served by their fallback,
// and the answer, the metrics and /v1/models say so; an adapter is served
// by name and through an alias by its base model's pods; a burst for an
// adapter no pod has loads it once.
func TestModelsAdaptersAliasesFallbacks(t *testing.T) {
	var sims []*sim.Pod
	for i := range 2 {
		p, err := sim.Start(sim.Config{Name: fmt.Sprint("n-", i), Model: "n", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4,
			LoRAModules: []sim.LoRAModule{{Name: "sql", Path: "/loras/sql"}}, MaxLoras: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		sims = append(sims, p)
	}
	dead := testnet.Refusing(t)
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(busy.Close)
	pods := append(podsOf("n", sims...),
		config.Pod{Name: "m-0", Model: "m", Address: dead},
		config.Pod{Name: "u-0", Model: "u", Address: strings.TrimPrefix(busy.URL, "http://")})
	logPath := filepath.Join(t.TempDir(), "access.log")
	s := testGateway(t, pods, func(c *config.Config) {
		c.AccessLog = logPath
		c.Models = []config.Model{
			{Name: "m", LoRA: config.LoRA{Fallback: []string{"u", "n"}}},
			{Name: "u", LoRA: config.LoRA{Fallback: []string{"n"}}},
			{Name: "n", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "sql"}, {Name: "fin", Path: "/loras/fin"}}, LoadAdapters: true, MaxLoras: 2}},
		}
		c.Aliases = []config.Alias{{Name: "chat", Targets: []config.AliasTarget{{Model: "sql"}}}}
	})
	f := func(model, want string) {
		t.Helper()
		resp, b := post(t, s, "/v1/completions", `{"model":"`+model+`","prompt":"hello","max_tokens":2}`)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-model") != want {
			t.Errorf("%s: %d x-pdlb-model %q, want 200 %q: %s", model, resp.StatusCode, resp.Header.Get("x-pdlb-model"), want, b)
		}
	}
	f("m", "n")
	f("u", "n")
	f("n", "n")
	f("sql", "sql")
	f("chat", "sql")
	if got := metricValue(t, s, `pdlb_fallback_requests_total{model="n"}`); got != 2 {
		t.Errorf("pdlb_fallback_requests_total{model=\"n\"} = %v, want 2", got)
	}
	var list struct {
		Data []struct{ ID, Parent string }
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+s.Addr()+"/v1/models")), &list); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(list.Data); !strings.Contains(got, "{sql n}") || !strings.Contains(got, "{fin n}") || !strings.Contains(got, "{chat }") {
		t.Errorf("/v1/models: %s", got)
	}

	// A burst for fin, which no pod has: one load, every request served.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { f("fin", "fin") })
	}
	wg.Wait()
	if got := metricValue(t, s, `pdlb_adapter_loads_total{model="n"}`); got != 1 {
		t.Errorf("pdlb_adapter_loads_total = %v after a burst, want 1", got)
	}

	// The access log names the model asked for and, when a fallback or
	// an alias chose another, the one that served; and lists each attempt
	// a request moved on from, the 503 that moved u's to n included.
	served := map[string]string{}
	for _, l := range readAccessLog(t, s, logPath) {
		if l.str("model") == "" { // GET /v1/models
			continue
		}
		served[l.str("model")] = l.str("served_model")
		r, _ := l["retried"].([]any)
		if len(r) != int(l.num("attempts"))-1 {
			t.Errorf("%s: %v attempts, retried %v", l.str("model"), l["attempts"], l["retried"])
		}
		if l.str("model") == "u" && (len(r) != 1 || r[0].(map[string]any)["pod"] != "u-0" || r[0].(map[string]any)["reason"] != "503") {
			t.Errorf("u: retried %v, want u-0's 503", l["retried"])
		}
	}
	if want := map[string]string{"m": "n", "u": "n", "n": "", "sql": "", "chat": "sql", "fin": ""}; fmt.Sprint(served) != fmt.Sprint(want) {
		t.Errorf("access log model → served_model %v, want %v", served, want)
	}
}

// TestAdapterBlocksFromKVEvents: blocks a pod stores for an adapter
// (lora_name in its KV events) match that adapter's prompts in the
// gateway's index and not the base model's, until the pod stores the
// base model's own.
func TestAdapterBlocksFromKVEvents(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	pod, err := sim.Start(sim.Config{Name: "kv-0", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, KVEvents: pub,
		LoRAModules: []sim.LoRAModule{{Name: "sql", Path: "/l/sql"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	s := testGateway(t, []config.Pod{{Name: "kv-0", Model: "m", Address: pod.Addr(), KVEvents: pub.Endpoint(), KVReplay: pub.ReplayEndpoint()}},
		func(c *config.Config) {
			c.Models = []config.Model{{Name: "m", Policy: "prefix_cache", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "sql"}}}}}
		})
	ids := make([]int, 256)
	for i := range ids {
		ids[i] = 1000 + i
	}
	prompt, _ := json.Marshal(ids)
	// Straight to the pod: the index learns of the blocks from its events
	// only.
	direct := func(model string) {
		t.Helper()
		resp, err := client.Post("http://"+pod.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":`+string(prompt)+`,"max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", model, resp.StatusCode)
		}
	}
	cached := func(model string) int {
		t.Helper()
		return indexMatch(t, s, model, ids)["kv-0"]
	}
	direct("sql")
	testwait.For(t, "the adapter's blocks", func() bool { return cached("sql") == len(ids) })
	if n := cached("m"); n != 0 {
		t.Errorf("the base model matches %d tokens of the adapter's blocks", n)
	}
	direct("m")
	testwait.For(t, "the base model's blocks", func() bool { return cached("m") == len(ids) })
	if n := cached("sql"); n != len(ids) {
		t.Errorf("the adapter matches %d tokens, want %d", n, len(ids))
	}
}

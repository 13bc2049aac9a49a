package sim

import (
	"fmt"
	"strings"
	"testing"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

func TestLoRASlots(t *testing.T) {
	s := LoRASlots{Max: 2}
	f := func(adapter string, want bool) {
		t.Helper()
		if got := s.Use(adapter); got != want {
			t.Errorf("Use(%s) = %v, want %v (held %v)", adapter, got, want, s.held)
		}
	}
	f("a", true)
	f("b", true)
	f("a", false)
	f("c", true) // evicts b, the least recently used
	f("a", false)
	f("b", true)
	f("c", true)
}

// TestPodAdapters: a pod serves its --lora-modules adapters by name and
// lists them with their parent, loads and unloads more at run time with
// vLLM's answers, reports them in vllm:lora_requests_info, and swaps them
// through max_loras slots.
func TestPodAdapters(t *testing.T) {
	p := testPod(t, Config{Model: "m", LoRAModules: []LoRAModule{{Name: "sql", Path: "/loras/sql"}}, MaxLoras: 1, Speedup: 100})
	c := testClient(t)
	base := "http://" + p.Addr()
	complete := func(model string) int {
		t.Helper()
		code, b := post(t, c, base+"/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2})
		if code == 200 && !strings.Contains(string(b), `"model":"`+model+`"`) {
			t.Errorf("%s answered as another model: %s", model, b)
		}
		return code
	}
	f := func(path string, body map[string]any, wantCode int, want string) {
		t.Helper()
		code, b := post(t, c, base+path, body)
		if code != wantCode || !strings.Contains(string(b), want) {
			t.Errorf("%s %v: %d %s, want %d %q", path, body, code, b, wantCode, want)
		}
	}
	if code := complete("chat"); code != 404 {
		t.Errorf("unknown adapter: %d", code)
	}
	f("/v1/load_lora_adapter", map[string]any{"lora_name": "chat"}, 400, "Both 'lora_name' and 'lora_path' must be provided.")
	f("/v1/load_lora_adapter", map[string]any{"lora_name": "chat", "lora_path": "/loras/chat"}, 200, "Success: LoRA adapter 'chat' added successfully.")
	f("/v1/load_lora_adapter", map[string]any{"lora_name": "chat", "lora_path": "/loras/chat"}, 400, "The lora adapter 'chat' has already been loaded.")
	for _, m := range []string{"sql", "chat", "sql", "sql", "m"} {
		if code := complete(m); code != 200 {
			t.Errorf("%s: %d", m, code)
		}
	}
	if n := p.Stats().AdapterLoads; n != 3 {
		t.Errorf("adapter loads = %d, want 3 (sql, chat, sql again: one slot)", n)
	}
	_, body := get(t, c, base+"/v1/models")
	cards, err := engines.ParseModelList(body)
	if err != nil || fmt.Sprint(cards) != "[{m m } {sql /loras/sql m} {chat /loras/chat m}]" {
		t.Errorf("/v1/models: %v %v", cards, err)
	}
	_, metrics := get(t, c, base+"/metrics")
	if info, ok := engines.ParseLoRAInfo(metrics); !ok || info.MaxLoras != 1 {
		t.Errorf("lora_requests_info: %+v %v", info, ok)
	}
	f("/v1/unload_lora_adapter", map[string]any{"lora_name": "chat"}, 200, "Success: LoRA adapter 'chat' removed successfully.")
	f("/v1/unload_lora_adapter", map[string]any{"lora_name": "chat"}, 404, "The lora adapter 'chat' cannot be found.")
	if code := complete("chat"); code != 404 {
		t.Errorf("unloaded adapter: %d", code)
	}
}

// TestSGLangAdapterCalls: an SGLang pod answers its load and unload calls
// with {"success", "error_message"}, as the gateway reads them.
func TestSGLangAdapterCalls(t *testing.T) {
	p := testPod(t, Config{Model: "m", Engine: engines.SGLang, EnableLoRA: true})
	c := testClient(t)
	f := func(path string, body map[string]any, ok bool) {
		t.Helper()
		code, b := post(t, c, "http://"+p.Addr()+path, body)
		if err := engines.AdapterLoaded(engines.SGLang, code, b); (err == nil) != ok {
			t.Errorf("%s %v: %d %s", path, body, code, b)
		}
	}
	f("/load_lora_adapter", map[string]any{"lora_name": "sql", "lora_path": "/l/sql"}, true)
	f("/load_lora_adapter", map[string]any{"lora_name": "sql"}, false)
	f("/unload_lora_adapter", map[string]any{"lora_name": "sql"}, true)
	f("/unload_lora_adapter", map[string]any{"lora_name": "sql"}, false)
}

// TestPDAdapter: an adapter's request through a vLLM prefill/decode pair
// (model names the adapter on both legs) answers as a combined pod does;
// both pods bring the adapter into a slot, name it in their answers and
// tag the blocks they store with it, as vLLM keys an adapter's blocks on
// either side of a KV handoff. A decode pod without the adapter refuses.
func TestPDAdapter(t *testing.T) {
	sinks := map[string]*recordingSink{RolePrefill: {}, RoleDecode: {}, RoleCombined: {}}
	p := startTrio(t, engines.VLLM, func(c *Config) {
		c.LoRAModules, c.MaxLoras, c.KVEvents = []LoRAModule{{Name: "sql", Path: "/l/sql"}}, 2, sinks[c.Role]
	})
	c := testClient(t)
	body := map[string]any{"model": "sql", "prompt": strings.Repeat("an adapter's prompt ", 20), "max_tokens": 6}
	want := finalAnswer(t, c, "http://"+p.comb.Addr()+"/v1/completions", body)
	if got := vllmPD(t, c, p, "/v1/completions", body); got != want {
		t.Fatalf("PD answer %+v, combined %+v", got, want)
	}
	for role, pod := range map[string]*Pod{RolePrefill: p.pre, RoleDecode: p.dec} {
		if n := pod.Stats().AdapterLoads; n != 1 {
			t.Errorf("%s pod: %d adapter loads, want 1", role, n)
		}
		var events []kvEvent
		testwait.For(t, role+" KV events", func() bool { events = append(events, sinks[role].take()...); return len(events) > 0 })
		for _, e := range events {
			if e.kind == "stored" && e.lora != "sql" {
				t.Errorf("%s pod stored blocks for adapter %q, want sql", role, e.lora)
			}
		}
	}
	pre := clone(t, body)
	pre["kv_transfer_params"] = map[string]any{"do_remote_decode": true}
	pre["max_tokens"] = 1
	if m := postJSON(t, c, "http://"+p.pre.Addr()+"/v1/completions", pre)["model"]; m != "sql" {
		t.Errorf("prefill answer's model %v, want sql", m)
	}

	bare := testPod(t, Config{Model: "m", Seed: 11, Speedup: fast, Role: RoleDecode})
	if code, b := post(t, c, "http://"+bare.Addr()+"/v1/completions", body); code != 404 || !strings.Contains(string(b), "`sql` does not exist") {
		t.Errorf("decode pod without the adapter: %d %s", code, b)
	}
}

package sim

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines"
	chatpkg "pdlb/engines/chat"
	"pdlb/engines/vllm"
	"pdlb/internal/tokfiles"
)

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).withDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	f := func(mutate func(*Config), want string) {
		t.Helper()
		c := Config{}.withDefaults()
		mutate(&c)
		err := c.Validate()
		if err == nil || !errors.Is(err, errConfig) || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want one containing %q", err, want)
		}
	}
	f(func(c *Config) { c.Model = `a"b` }, `model = "a\"b"`)
	f(func(c *Config) { c.Engine = "tgi" }, `engine = "tgi"`)
	f(func(c *Config) { c.Listen = "8000" }, `listen = "8000"`)
	f(func(c *Config) { c.Speedup = -1 }, `speedup = -1`)
	f(func(c *Config) { c.DefaultMaxTokens = -5 }, `default_max_tokens = -5`)
	f(func(c *Config) { c.MaxModelLen = 1 << 30 }, `max_model_len = 1073741824 needs 16777216 KV blocks`)
	f(func(c *Config) { c.Tick = -time.Second }, `tick = "-1s"`)
	f(func(c *Config) { c.Role = "both" }, `role = "both"`)
	f(func(c *Config) { c.BootstrapPort = 70000 }, `bootstrap_port = 70000`)
	f(func(c *Config) { c.KVXferListen = "9000" }, `kvxfer_listen = "9000"`)
	f(func(c *Config) { c.KVScale = 2 }, `kv_scale = 2`)
	f(func(c *Config) { c.KVTimeout = -time.Second }, `kv_timeout = "-1s"`)
	for _, role := range []string{RoleCombined, RolePrefill, RoleDecode} {
		c := Config{Role: role}.withDefaults()
		if err := c.Validate(); err != nil {
			t.Fatalf("role %s: %v", role, err)
		}
	}
	// The transfer server listens on the pod's host, at BootstrapPort.
	if c := (Config{Listen: "127.0.0.2:8000", BootstrapPort: 8998}).withDefaults(); c.KVXferListen != "127.0.0.2:8998" {
		t.Fatalf("KVXferListen = %q", c.KVXferListen)
	}
	f(func(c *Config) { c.Physics.MaxBatch = 0 }, "max_batch = 0")

	// Start refuses what Validate refuses.
	if _, err := Start(Config{Engine: "tgi"}); err == nil {
		t.Fatal("Start accepted an unknown engine")
	}
}

func TestParseFleet(t *testing.T) {
	fc, err := LoadFleet("testdata/fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(fc.Pods) != 4 {
		t.Fatalf("%d pods", len(fc.Pods))
	}
	wantEngine := []engines.Kind{engines.VLLM, engines.VLLM, engines.SGLang, engines.TRTLLM}
	for i, c := range fc.Pods {
		if c.Engine != wantEngine[i] || c.Speedup != 10 || c.Model != "meta-llama/Llama-3.1-8B-Instruct" ||
			c.Tick != 2*time.Millisecond || c.Physics.LinkBytesPerSec != 25e9 {
			t.Fatalf("pod %d: %+v", i, c)
		}
	}
	if fc.Pods[3].Physics.PrefillTokensPerSec != 30000 || fc.Pods[3].Physics.MaxBatch != 64 || fc.Pods[0].Physics.PrefillTokensPerSec != 20000 {
		t.Fatalf("physics overlay: %+v / %+v", fc.Pods[3].Physics, fc.Pods[0].Physics)
	}
	// A pod of a minimal file takes every default.
	fc, err = ParseFleet([]byte("pods:\n  - listen: 127.0.0.1:0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Config{Name: "pod-0", Listen: "127.0.0.1:0"}).withDefaults(); !reflect.DeepEqual(fc.Pods[0], want) {
		t.Fatalf("got %+v, want %+v", fc.Pods[0], want)
	}

	f := func(yaml, want string) {
		t.Helper()
		_, err := ParseFleet([]byte(yaml))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: error %v, want one containing %q", yaml, err, want)
		}
	}
	f("pods: []\n", "pods is empty")
	f("pods:\n  - name: a\n    engine: tgi\n", `pods[0].engine = "tgi"`)
	f("pods:\n  - name: a\n    physics:\n      block_size: -1\n", "block_size = -1")
	f("pods:\n  - name: a\n  - name: a\n", `pods[1].name = "a" repeats pods[0].name`)
	f("pods:\n  - listen: 127.0.0.1:8000\n  - listen: 127.0.0.1:8000\n", `pods[1].listen = "127.0.0.1:8000" repeats`)
	f("pods:\n  - speedup: fast\n", "cannot unmarshal")
	f("pods: [", "yaml")
	if _, err := LoadFleet("testdata/missing.yaml"); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestParseFleetNamesPaths: a fleet file's unknown key or wrong type is
// named by its path in the file, as the gateway's config names them,
// not by the Go type it missed ("sim.podFile").
func TestParseFleetNamesPaths(t *testing.T) {
	f := func(yml, want string) {
		t.Helper()
		if _, err := ParseFleet([]byte(yml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q in it", yml, err, want)
		}
	}
	f("pods:\n  - name: a\n    modl: x\n", "pods[0].modl: unknown field (line 3); did you mean model?")
	f("defaults:\n  physics:\n    max_batsh: 3\npods:\n  - name: a\n", "defaults.physics.max_batsh: unknown field (line 3); did you mean max_batch?")
	f("pods:\n  - name: a\n  - speedup: fast\n", "pods[1].speedup: cannot unmarshal !!str `fast` into float64 (line 3)")
	f("defaults: {tick: 5}\npods: [{name: a}]\n", "defaults.tick: cannot unmarshal !!int `5` into time.Duration (line 1); a duration has a unit")
}

// TestParseFleetNamesValues: a value a pod cannot run with is named by
// its path in the fleet file, the pod's own entry or the defaults it
// inherits, as the gateway's config names it.
func TestParseFleetNamesValues(t *testing.T) {
	f := func(yml, want string) {
		t.Helper()
		if _, err := ParseFleet([]byte(yml)); err == nil || !errors.Is(err, errFleet) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q in it", yml, err, want)
		}
	}
	f("pods:\n  - name: a\n  - name: b\n    engine: tgi\n", `sim: invalid fleet: pods[1].engine = "tgi" must be vllm, sglang or trtllm`)
	f("defaults: {engine: tgi}\npods: [{name: a}]\n", `sim: invalid fleet: defaults.engine = "tgi" must be vllm, sglang or trtllm`)
	f("defaults: {speedup: 2}\npods: [{name: a, speedup: -1}]\n", `sim: invalid fleet: pods[0].speedup = -1 must be in (0, 1e6]`)
	f("pods: [{name: a, tick: -1s}]\n", "sim: invalid fleet: pods[0].tick = \"-1s\" must be positive")
	f("pods: [{name: a, kv_scale: 2}]\n", "sim: invalid fleet: pods[0].kv_scale = 2 must be in (0, 1]")
	f("pods: [{name: a, physics: {block_size: -1}}]\n", "sim: invalid fleet: pods[0].physics.block_size = -1 must be positive")
	f("defaults: {physics: {max_batch: -4}}\npods: [{name: a}]\n", "sim: invalid fleet: defaults.physics.max_batch = -4 must be positive")
	// The KV-event publisher's settings and the tokenizer's alike.
	f("pods: [{name: a, kv_events: 'tcp://h'}]\n", `sim: invalid fleet: pods[0].kv_events = "tcp://h" must be tcp://host:port`)
	f("defaults: {kv_events: 'tcp://h:70000'}\npods: [{name: a}]\n", `sim: invalid fleet: defaults.kv_events = "tcp://h:70000" must be tcp://host:port`)
	f("pods: [{name: a, kv_events: 'tcp://h:1', kv_replay: 'h:2'}]\n", `sim: invalid fleet: pods[0].kv_replay = "h:2" must be tcp://host:port`)
	f("defaults: {kv_replay: 'tcp://h:1'}\npods: [{name: a}]\n", `sim: invalid fleet: defaults.kv_replay = "tcp://h:1" needs kv_events`)
	f("defaults: {kv_events: 'tcp://h:65000'}\npods: [{name: a, data_parallel_size: 600}]\n",
		"sim: invalid fleet: pods[0].data_parallel_size = 600 puts the replay socket on port 65600 (kv_events' port + 600), past 65535: set kv_replay")
	f("pods: [{name: a, tokenizer: /nonexistent}]\n", `sim: invalid fleet: pods[0].tokenizer = "/nonexistent" cannot be loaded: hf: open /nonexistent/tokenizer.json`)
	f("defaults: {chat_template: '{{ x }}'}\npods: [{name: a}]\n", `sim: invalid fleet: defaults.chat_template = "{{ x }}" cannot be loaded: prompt: chat_template and chat_template_kwargs need a tokenizer`)
	f("pods: [{name: a, chat_template_kwargs: {enable_thinking: false}}]\n", `sim: invalid fleet: pods[0].chat_template_kwargs = map[enable_thinking:false] cannot be loaded`)
	dir := tokfiles.Dir(t, "qwen3")
	f("defaults: {tokenizer: "+dir+"}\npods: [{name: a, chat_template: /nonexistent.jinja}]\n", `sim: invalid fleet: pods[0].chat_template = "/nonexistent.jinja" cannot be loaded: prompt: chat_template: open /nonexistent.jinja`)
	f("pods: [{name: a, tokenizer: "+dir+", chat_template: '{% for %}'}]\n", `sim: invalid fleet: pods[0].chat_template = "{% for %}" cannot be loaded: prompt: chat template of`)
}

// TestFleetZeroIsNotSilentlyDefault: a pod setting whose 0 the pod takes
// for unset, written 0, is refused rather than silently run at its
// default, as the gateway's config refuses one.
func TestFleetZeroIsNotSilentlyDefault(t *testing.T) {
	f := func(yml, want string) {
		t.Helper()
		if _, err := ParseFleet([]byte(yml)); err == nil || !errors.Is(err, errFleet) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q in it", yml, err, want)
		}
	}
	f("pods: [{name: a, speedup: 0}]\n", "sim: invalid fleet: pods[0].speedup = 0 must be positive (leave it out for 1)")
	f("defaults: {speedup: 0}\npods: [{name: a}]\n", "sim: invalid fleet: defaults.speedup = 0 must be positive (leave it out for 1)")
	f("pods: [{name: a, default_max_tokens: 0}]\n", "pods[0].default_max_tokens = 0 must be at least 1 (leave it out for 128)")
	f("pods: [{name: a, max_model_len: 0}]\n", "pods[0].max_model_len = 0 must be at least 2 (leave it out for 32768)")
	f("pods: [{name: a}, {name: b, tick: 0s}]\n", `pods[1].tick = "0s" must be positive (leave it out for 2ms)`)
	f("pods: [{name: a, kv_scale: 0}]\n", "pods[0].kv_scale = 0 must be in (0, 1] (leave it out for 0.0009765625)")
	f("pods: [{name: a, kv_timeout: 0s}]\n", `pods[0].kv_timeout = "0s" must be positive (leave it out for 8m0s)`)
	f("pods: [{name: a, data_parallel_size: 0}]\n", "pods[0].data_parallel_size = 0 must be at least 1 (leave it out for 1)")
	f("pods: [{name: a, max_loras: 0}]\n", "pods[0].max_loras = 0 must be positive (leave it out for 1)")
	// So is a written "" that takes a default.
	f("pods: [{name: a, model: ''}]\n", `sim: invalid fleet: pods[0].model = "" must name a model (leave it out for "sim-model")`)
	f("defaults: {engine: ''}\npods: [{name: a}]\n", `sim: invalid fleet: defaults.engine = "" must be vllm, sglang or trtllm (leave it out for vllm)`)
	f("pods: [{name: a, role: ''}]\n", `sim: invalid fleet: pods[0].role = "" must be combined, prefill or decode (leave it out for combined)`)
	f("pods: [{name: a, listen: ''}]\n", `sim: invalid fleet: pods[0].listen = "" must be host:port (leave it out for "127.0.0.1:0")`)
	f("pods: [{name: a}, {name: ''}]\n", `sim: invalid fleet: pods[1].name = "" must name the pod (leave it out for "pod-" and its index)`)
	// 0 means something for these: it is kept.
	fc, err := ParseFleet([]byte("pods: [{name: a, seed: 0, hash_seed: 0, bootstrap_port: 0}]\n"))
	if err != nil || fc.Pods[0].BootstrapPort != 0 {
		t.Fatalf("%v, %+v", err, fc.Pods)
	}
}

func TestStartFleet(t *testing.T) {
	fc, err := LoadFleet("testdata/fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fl, err := StartFleet(fc)
	if err != nil {
		t.Fatal(err)
	}
	c := testClient(t)
	for _, p := range fl.Pods() {
		if status, _ := get(t, c, "http://"+p.Addr()+"/health"); status != 200 {
			t.Fatalf("%s: /health %d", p.Config().Name, status)
		}
	}
	if err := fl.Close(); err != nil {
		t.Fatal(err)
	}
	// A pod that cannot listen stops the fleet and closes the others.
	fc.Pods[1].Listen = "256.0.0.1:1"
	if _, err := StartFleet(fc); err == nil {
		t.Fatal("StartFleet with a bad address succeeded")
	}
}

func FuzzParseFleet(f *testing.F) {
	data, err := os.ReadFile("testdata/fleet.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("pods:\n  - listen: 127.0.0.1:0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fc, err := ParseFleet(data)
		if err != nil {
			return
		}
		for _, c := range fc.Pods {
			if err := c.Validate(); err != nil {
				t.Fatalf("ParseFleet returned an invalid pod: %v", err)
			}
		}
	})
}

func FuzzRequestTokens(f *testing.F) {
	f.Add([]byte(`{"prompt":"hello"}`), false)
	f.Add([]byte(`{"prompt":[1,2,3]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`), true)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		var req genRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		tokens, err := (&Pod{}).requestTokens(body, &req, chat)
		var refused *chatpkg.RequestError
		switch {
		case err != nil && !errors.Is(err, errBadRequest) && !errors.As(err, &refused):
			t.Fatalf("error %v is not a bad request", err)
		case err == nil && chat && len(tokens[0]) == 0:
			t.Fatal("a rendered chat has no tokens")
		}
	})
}

func TestParseFleetPD(t *testing.T) {
	fc, err := LoadFleet("testdata/fleet-pd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	roles := map[engines.Kind]map[string]int{}
	for _, c := range fc.Pods {
		if roles[c.Engine] == nil {
			roles[c.Engine] = map[string]int{}
		}
		roles[c.Engine][c.Role]++
		if c.KVScale != DefaultKVScale || c.KVTimeout != DefaultKVTimeout || c.KVXferListen != "127.0.0.1:0" {
			t.Fatalf("pod %s: %+v", c.Name, c)
		}
	}
	for _, k := range engines.Kinds {
		if r := roles[k]; r[RolePrefill] != 1 || r[RoleDecode] != 1 || r[RoleCombined] != 1 {
			t.Fatalf("engine %s roles %v", k, r)
		}
	}
	fc, err = ParseFleet([]byte("pods:\n  - role: prefill\n    listen: 127.0.0.1:0\n    bootstrap_port: 8998\n    kv_scale: 0.5\n    kv_timeout: 2s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := fc.Pods[0]; c.Role != RolePrefill || c.KVXferListen != "127.0.0.1:8998" || c.KVScale != 0.5 || c.KVTimeout != 2*time.Second {
		t.Fatalf("%+v", c)
	}
	if _, err := ParseFleet([]byte("pods:\n  - role: decoder\n")); err == nil || !strings.Contains(err.Error(), `role = "decoder"`) {
		t.Fatalf("bad role: %v", err)
	}
}

// storedBlocks counts the blocks a subscriber was told were stored.
type storedBlocks struct{ n atomic.Int64 }

func (s *storedBlocks) BlockStored(_ uint64, _ bool, hashes []uint64, _ []uint32, _ int, _ engines.ExtraKeys) {
	s.n.Add(int64(len(hashes)))
}
func (s *storedBlocks) BlockRemoved([]uint64) {}
func (s *storedBlocks) AllBlocksCleared()     {}

func TestFleetPublishesKVEvents(t *testing.T) {
	fc, err := ParseFleet([]byte("defaults:\n  physics: {block_size: 16}\npods:\n  - listen: 127.0.0.1:0\n    kv_events: tcp://127.0.0.1:0\n  - listen: 127.0.0.1:0\n" +
		"  - listen: 127.0.0.1:0\n    engine: sglang\n    kv_events: tcp://127.0.0.1:0\n"))
	if err != nil {
		t.Fatal(err)
	}
	// Each publishes as its engine does (vllm.PublisherConfig.Engine).
	if fc.Events[0].ReplayEndpoint != "tcp://127.0.0.1:0" || fc.Events[1].Endpoint != "" ||
		fc.Events[0].Engine != engines.VLLM || fc.Events[2].Engine != engines.SGLang {
		t.Fatalf("publishers: %+v", fc.Events)
	}
	fl, err := StartFleet(fc)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if fl.Publisher(1) != nil || !strings.HasPrefix(fl.Publisher(0).Endpoint(), "tcp://127.0.0.1:") {
		t.Fatalf("publishers %v %v", fl.Publisher(0), fl.Publisher(1))
	}
	var got storedBlocks
	sub, err := vllm.NewSubscriber(vllm.SubscriberConfig{Endpoint: fl.Publisher(0).Endpoint()}, &got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := testClient(t)
	// ZMQ drops what is published before the subscription is in place, so
	// send until the blocks of one request arrive.
	deadline := time.Now().Add(10 * time.Second)
	for got.n.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no BlockStored from the pod's publisher")
		}
		body := chatBody(strings.Repeat("a long enough prompt to fill blocks ", 8)+time.Now().String(), map[string]any{"max_tokens": 1})
		if status, b := post(t, c, "http://"+fl.Pods()[0].Addr()+"/v1/chat/completions", body); status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f := func(yaml, want string) {
		t.Helper()
		_, err := ParseFleet([]byte(yaml))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: error %v, want %q", yaml, err, want)
		}
	}
	f("pods:\n  - kv_replay: tcp://127.0.0.1:5558\n", `kv_replay = "tcp://127.0.0.1:5558" needs kv_events`)
	f("pods:\n  - kv_events: 127.0.0.1:5557\n", `kv_events = "127.0.0.1:5557" must be tcp://host:port`)
	f("pods:\n  - data_parallel_size: -1\n", "data_parallel_size = -1 must be at least 1")
}

// TestParseFleetAPIKey: a fleet's pods may require an API key (vLLM's and
// SGLang's --api-key), from the defaults or their own entry, "" for
// none; a trtllm pod's is refused by its path, the key not printed.
func TestParseFleetAPIKey(t *testing.T) {
	fc, err := ParseFleet([]byte("defaults: {api_key: sk-pods}\npods: [{name: a}, {name: b, engine: sglang, api_key: sk-b}, {name: c, api_key: ''}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{fc.Pods[0].APIKey, fc.Pods[1].APIKey, fc.Pods[2].APIKey}; !slices.Equal(got, []string{"sk-pods", "sk-b", ""}) {
		t.Errorf("keys %q, want [sk-pods sk-b \"\"]", got)
	}
	f := func(yml, want string) {
		t.Helper()
		if _, err := ParseFleet([]byte(yml)); err == nil || !errors.Is(err, errFleet) || err.Error() != want {
			t.Errorf("%q: %v; want %q", yml, err, want)
		}
	}
	f("pods: [{name: a, engine: trtllm, api_key: sk-t}]\n", `sim: invalid fleet: pods[0].api_key = "(set)" must be empty for trtllm: trtllm-serve has no API key`)
	f("defaults: {api_key: sk-t}\npods: [{name: a, engine: trtllm}]\n", `sim: invalid fleet: defaults.api_key = "(set)" must be empty for trtllm: trtllm-serve has no API key`)
}

package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pdlb/lb/discovery/spec"
)

func TestValidateRejects(t *testing.T) {
	f := func(yml, wantInMsg string) {
		t.Helper()
		c := Default()
		err := c.UnmarshalYAML([]byte(yml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil {
			t.Fatalf("accepted:\n%s", yml)
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Fatalf("error %q does not mention %q", err, wantInMsg)
		}
	}
	pod := "pods: [{model: m, address: '127.0.0.1:8001'}]\n"
	f("listen: nope\n"+pod, `listen = "nope"`)
	f("max_body_bytes: -1\n"+pod, "max_body_bytes = -1")
	f("max_in_flight: -1\n"+pod, "max_in_flight = -1")
	f("max_stored_responses: -1\n"+pod, "max_stored_responses = -1")
	f("frontend: nginx\n"+pod, `frontend = "nginx"`)
	f("max_header_bytes: 10\n"+pod, "max_header_bytes = 10")
	f("client_read_timeout: 0s\n"+pod, `client_read_timeout = "0s"`)
	f("upstream: {response_timeout: 0s}\n"+pod, `upstream.response_timeout = "0s"`)
	f("upstream: {keepalive_timeout: -1s}\n"+pod, `upstream.keepalive_timeout = "-1s"`)
	f("health: {eject_after_failures: 0}\n"+pod, "health.eject_after_failures = 0")
	f("health: {max_ejected_percent: 101}\n"+pod, "health.max_ejected_percent = 101")
	f("health: {unhealthy_after: 0}\n"+pod, "health.unhealthy_after = 0")
	f("models: [{name: m, policy: fastest}]\n"+pod, `models[0].policy = "fastest"`)
	f("models: [{name: m, policy: decode_token_load}]\n"+pod, `models[0].policy = "decode_token_load"`)
	f("models: [{name: m}, {name: m}]\n"+pod, `models[1].name = "m" is listed twice`)
	f("pods: []\n", "no pods")
	f("pods: [{address: '127.0.0.1:1'}]\n", `pods[0].model = ""`)
	f("pods: [{model: m, address: 'x'}]\n", `pods[0].address = "x"`)
	f("pods: [{model: m, address: 'h:1', engine: tgi}]\n", `pods[0].engine = "tgi"`)
	f("pods: [{model: m, address: 'h:1', role: both}]\n", `pods[0].role = "both"`)
	f("pods: [{model: m, address: 'h:1', role: prefill}]\n", `pods[0].roleset = ""`)
	f("pods: [{model: m, address: 'h:1', bucket_min: 10, bucket_max: 5}]\n", "pods[0].bucket_max = 5")
	f("pods: [{model: m, address: 'h:1', weight: -2}]\n", "pods[0].weight = -2")
	f("pods: [{name: \"p\\x01\", model: m, address: 'h:1'}]\n", `pods[0].name = "p\x01"`)
	f("pods: [{model: m, address: 'h:1'}, {model: m, address: 'h:1'}]\n", `pods[1].name = "h:1"`)
	f("pods: [{model: m, adress: 'h:1'}]\n", "adress")
	f("pods: [{name: a, model: m, address: 'h:1'}, {name: b, model: m, address: 'h:1'}]\n",
		`pods[1].address = "h:1" is also the address of pods[0] ("a", model "m"): one engine is one entry`)
	f("pods: [{name: a, model: m, address: 'h:1'}, {name: b, model: m, address: 'H:1', role: decode, roleset: r}]\n",
		`pods[1].address = "H:1" is also the address of pods[0] ("a", model "m")`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'h:5557'}]\n", `pods[0].kv_events = "h:5557"`)
	f("pods: [{model: m, address: 'h:1', cache_blocks: -1}]\n", "pods[0].cache_blocks = -1")
	f("pods: [{model: m, address: 'h:1', data_parallel_size: -1}]\n", "pods[0].data_parallel_size = -1 must be at least 1")
	f("pods: [{model: m, address: 'h:1', data_parallel_routing: rank}]\n", `pods[0].data_parallel_routing = "rank" must be "prefix" (default) or "engine"`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://h:65534', kv_replay: 'tcp://h:5558', data_parallel_size: 4}]\n",
		"pods[0].data_parallel_size = 4 puts rank 3's KV events on port 65537 (kv_events' port + 3), past 65535")
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://h:5557', kv_replay: 'tcp://h:65535', data_parallel_size: 2}]\n",
		"pods[0].data_parallel_size = 2 puts rank 1's replay socket on port 65536 (kv_replay's port + 1), past 65535")
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://h:5557', data_parallel_size: 2}]\n",
		`pods[0].kv_replay = "" puts the replay sockets of ranks 0 to 1 on ports 5558 to 5559 (the default port 5558 + rank), where their KV events are (5557 to 5558)`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://h:6000', kv_replay: 'tcp://h:5990', data_parallel_size: 16}]\n",
		`pods[0].kv_replay = "tcp://h:5990" puts the replay sockets of ranks 0 to 15 on ports 5990 to 6005`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://h:5558'}]\n", `pods[0].kv_replay = "" puts the replay sockets of ranks 0 to 0 on ports 5558 to 5558`)
	f("pods: [{model: m, address: 'h:1', prefill_tokens_per_sec: -5}]\n", "pods[0].prefill_tokens_per_sec = -5")
	f("discovery: {dns: [{name: llama.test, port: 8000, model: m, kv_events_port: 5557, data_parallel_size: 2}]}\n",
		`discovery.dns[0].kv_replay_port = "" puts the replay sockets of ranks 0 to 1 on ports 5558 to 5559 (the default port 5558 + rank), where their KV events are (5557 to 5558); set kv_replay_port apart`)
	f("discovery: {dns: [{name: llama.test, port: 8000, model: m, kv_events_port: 65535, kv_replay_port: 5600, data_parallel_size: 2}]}\n",
		"discovery.dns[0].data_parallel_size = 2 puts rank 1's KV events on port 65536")
	f("discovery: {dns: [{name: llama.test, port: 8000, model: m, data_parallel_routing: none}]}\n",
		`discovery.dns[0].data_parallel_routing = "none" must be "prefix" (default) or "engine"`)
	f("discovery: {dns: [{name: llama.test, port: 8000, model: m, family: ipv4}]}\n",
		`discovery.dns[0].family = "ipv4" is not an address family (known: v4_preferred, v6_preferred, v4_only, v6_only, all)`)
	f("models: [{name: m, block_size: -16}]\n"+pod, "models[0].block_size = -16")
	f("models: [{name: m, tokenizer: /nonexistent/qwen3}]\n"+pod, `models[0].tokenizer = "/nonexistent/qwen3" must be a directory holding tokenizer.json`)
	f("models: [{name: m, chat_template: t.jinja}]\n"+pod, `models[0].chat_template = "t.jinja" needs tokenizer`)
	f("models: [{name: m, chat_template_kwargs: {enable_thinking: false}}]\n"+pod, `models[0].chat_template_kwargs = map[enable_thinking:false] needs tokenizer`)
	f("models: [{name: m, messages_inline_system: preserve}]\n"+pod, `models[0].messages_inline_system = "preserve" needs tokenizer`)
	f("models: [{name: m, tokenizer: /nonexistent/qwen3, messages_inline_system: fold}]\n"+pod, `models[0].messages_inline_system = "fold" must be "", "hoist" or "preserve"`)
	f("admission: {interactive: {ttft_slo: -1}}\n"+pod, "admission")
	f("token_load: {kv_weight: -1}\n"+pod, "kv_weight")
	f("redis: {address: nowhere}\n"+pod, `redis.address = "nowhere"`)
	f("redis: {address: '127.0.0.1:6379', key_prefix: ''}\n"+pod, `redis.key_prefix = "" must not be empty`)
}

// TestDataParallelPods: a pod's ranks' KV-event ports may run anywhere
// they neither pass 65535 nor meet on one host.
func TestDataParallelPods(t *testing.T) {
	for _, pod := range []string{
		"{model: m, address: 'h:1', data_parallel_size: 8}",
		"{model: m, address: 'h:1', kv_events: 'tcp://h:5557', kv_replay: 'tcp://h:5657', data_parallel_size: 100}",
		"{model: m, address: 'h:1', kv_events: 'tcp://h:5557', kv_replay: 'tcp://g:5557', data_parallel_size: 2}",
		"{model: m, address: 'h:1', kv_events: 'tcp://h:65528', kv_replay: 'tcp://h:65520', data_parallel_size: 8}",
	} {
		c := Default()
		if err := c.UnmarshalYAML([]byte("pods: [" + pod + "]\n")); err != nil {
			t.Fatal(err)
		}
		c.Provision()
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", pod, err)
		}
	}
	var p Pod
	p.Provision()
	if p.DataParallelSize != DefaultDataParallelSize || DefaultDataParallelSize != 1 {
		t.Fatalf("data_parallel_size provisioned as %d", p.DataParallelSize)
	}
}

func TestLoadFillsDefaults(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "pdlb.yaml")
	if err := os.WriteFile(path, []byte(`
listen: "127.0.0.1:18080"
upstream: {stream_idle_timeout: 5s}
models: [{name: m, policy: round_robin}]
pods:
  - {model: m, address: "127.0.0.1:8001", engine: sglang}
  - {name: p1, model: m, address: "127.0.0.1:8002", role: prefill, roleset: g0}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p := c.Pods[0]
	if p.Name != "127.0.0.1:8001" || p.Engine != "sglang" || p.Role != RoleCombined || p.Weight != 1 {
		t.Fatalf("pod defaults not filled: %+v", p)
	}
	if c.Admin != DefaultAdmin || c.Upstream.StreamIdleTimeout.String() != "5s" || c.Upstream.ResponseTimeout != DefaultResponseTimeout || c.Upstream.KeepaliveTimeout != DefaultKeepaliveTimeout {
		t.Fatalf("defaults lost: %+v", c)
	}
	if c.ModelFor("m").Policy != "round_robin" || c.ModelFor("m").BlockSize != DefaultBlockSize || c.ModelFor("other").Policy != DefaultPolicy {
		t.Fatal("ModelFor")
	}
}

func TestRedisKeyPrefix(t *testing.T) {
	f := func(yml, want string) {
		t.Helper()
		c := Default()
		if err := c.UnmarshalYAML([]byte(yml + "pods: [{model: m, address: '127.0.0.1:8001'}]\n")); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if c.Redis.KeyPrefix != want {
			t.Fatalf("%q: key prefix %q, want %q", yml, c.Redis.KeyPrefix, want)
		}
	}
	f("", DefaultRedisKeyPrefix)
	f("redis: {address: '127.0.0.1:6379'}\n", "pdlb")
	f("redis: {address: '127.0.0.1:6379', replica_id: a, key_prefix: staging}\n", "staging")
}

// TestValidateNeverCorrects: a field whose empty value means a default is
// valid empty, Validate leaves it empty, and Provision alone fills it.
func TestValidateNeverCorrects(t *testing.T) {
	c := Default()
	c.Models = []Model{{Name: "m"}}
	c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001", Engine: "sglang"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if p, m := c.Pods[0], c.Models[0]; p != (Pod{Model: "m", Address: "127.0.0.1:8001", Engine: "sglang"}) || m.Policy != "" || m.BlockSize != 0 {
		t.Fatalf("Validate changed the configuration: %+v, %+v", p, m)
	}
	c.Provision()
	p, m := c.Pods[0], c.Models[0]
	if p.Name != p.Address || p.Role != RoleCombined || p.Weight != 1 || p.PrefillTokensPerSec != DefaultPrefillSpeed || p.BootstrapPort != 8998 ||
		m.Policy != DefaultPolicy || m.BlockSize != DefaultBlockSize {
		t.Fatalf("Provision left defaults out: %+v, %+v", p, m)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Two pods without names are named by their addresses, so two at one
	// address collide before Provision as after it.
	c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001"}, {Model: "m", Address: "127.0.0.1:8001"}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `pods[1].name = "127.0.0.1:8001" is also the name of pods[0]`) {
		t.Fatalf("Validate = %v, want the duplicate named", err)
	}
}

// TestCopiesLeaveTheOriginal: Validate and Provision of a Config copied
// by value (lb.Start's, a reload's from Gateway.Config) leave the
// original's lists as they were: a reload compares the two.
func TestCopiesLeaveTheOriginal(t *testing.T) {
	const yml = `
models: [{name: m}]
aliases: [{name: a, targets: [{model: m}]}]
pods: [{model: m, address: 'h:1', engine: sglang}]
discovery:
  kubernetes: {namespace: inference}
  dns: [{name: x, port: 1, model: m, engine: sglang}]
`
	load := func() Config {
		c := Default()
		if err := c.UnmarshalYAML([]byte(yml)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	orig, want := load(), load()
	if err := orig.Validate(); err != nil {
		t.Fatal(err)
	}
	if d := Diff(want, orig); d != "" {
		t.Fatalf("Validate changed %s", d)
	}
	cp := orig
	cp.Provision()
	if d := Diff(want, orig); d != "" {
		t.Fatalf("a copy's Provision changed the original's %s", d)
	}
	if d := Diff(want, cp); d == "" {
		t.Fatal("Provision filled nothing")
	}
}

func TestParsePodFlag(t *testing.T) {
	p, err := ParsePodFlag("model=m,address=127.0.0.1:9,engine=sglang,weight=2,bucket_max=100")
	if err != nil || p.Model != "m" || p.Address != "127.0.0.1:9" || p.Engine != "sglang" || p.Weight != 2 || p.BucketMax != 100 {
		t.Fatalf("got %+v, %v", p, err)
	}
	for _, bad := range []string{"model", "colour=red", "weight=heavy"} {
		if _, err := ParsePodFlag(bad); err == nil {
			t.Fatalf("--pod %q accepted", bad)
		}
	}
}

// TestParsePodFlagTwice: a key given twice in one --pod (a pasted spec
// edited at its end) is refused, as the file refuses a key twice, rather
// than the last one silently winning.
func TestParsePodFlagTwice(t *testing.T) {
	for _, spec := range []string{
		"model=a,address=127.0.0.1:9,model=b",
		"model=m,address=127.0.0.1:9,addr=127.0.0.1:10",
	} {
		if p, err := ParsePodFlag(spec); err == nil || !strings.Contains(err.Error(), "twice") {
			t.Errorf("--pod %q: %+v, %v; want an error naming the key given twice", spec, p, err)
		}
	}
}

// TestParsePodFlagSpaces: spaces around a value go as those around its
// key do: "model=llama ,address=..." served a model named "llama ".
func TestParsePodFlagSpaces(t *testing.T) {
	p, err := ParsePodFlag(" model = llama , address= 127.0.0.1:9 ,engine=vllm ")
	if err != nil || p.Model != "llama" || p.Address != "127.0.0.1:9" || p.Engine != "vllm" {
		t.Fatalf("%+v, %v; want model llama at 127.0.0.1:9 on vllm", p, err)
	}
}

// TestWrongTypeNamesField: a value of the wrong type is refused naming its
// field by its path in the file, as every other bad value is; a duration
// given as a bare number says how to write one.
func TestWrongTypeNamesField(t *testing.T) {
	f := func(doc, want string) {
		t.Helper()
		c := Default()
		if err := c.UnmarshalYAML([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q in it", doc, err, want)
		}
	}
	f("max_body_bytes: lots\n", "max_body_bytes: cannot unmarshal !!str `lots` into int (line 1)")
	f("upstream:\n  retries: many\n", "upstream.retries: cannot unmarshal !!str `many` into int (line 2)")
	f("client_read_timeout: 30\n", "client_read_timeout: cannot unmarshal !!int `30` into time.Duration (line 1); a duration has a unit")
	f("pods:\n  - {model: m, address: \"a:1\", weight: x}\n", "pods[0].weight: cannot unmarshal !!str `x` into float64 (line 2)")
	// yaml cuts a long value; the field is found by its start.
	f("upstream:\n  retries: lots-and-lots\n", "upstream.retries: cannot unmarshal")
	// An alias's error is reported at its anchor: no guess either.
	f("pods:\n  - model: &m x\n    address: \"a:1\"\n    weight: *m\n", "line 2: cannot unmarshal !!str `x` into float64")
	// The same value twice on the line: no guess.
	f("pods:\n  - {name: x, model: m, address: \"a:1\", weight: x}\n", "line 2: cannot unmarshal !!str `x` into float64")
}

// TestDialAddressNeedsHost: an address the gateway dials names its host
// and a port of digits. Without a host Go dials this machine: ":8000" is
// a listen address, never a pod's.
func TestDialAddressNeedsHost(t *testing.T) {
	f := func(yml, want string) { t.Helper(); loadRefuses(t, yml, want) }
	pod := func(addr string) string { return "pods: [{model: m, address: '" + addr + "'}]\n" }
	f(pod(":8000"), `pods[0].address = ":8000" has no host (a pod's or server's, e.g. 10.0.0.5:8000)`)
	// The scheme is gone by then: the value is what the gateway would dial.
	f(pod("http://:8000"), `pods[0].address = ":8000" has no host`)
	f(pod("https://:8443"), `pods[0].address = ":8443" has no host`)
	f(pod("h:"), `pods[0].address = "h:" must be host:port`)
	// Go dials an unspecified IP as it dials no host: this machine.
	f(pod("0.0.0.0:8000"), `pods[0].address = "0.0.0.0:8000" is every interface, which is dialed as this machine (a pod's or server's host, e.g. 10.0.0.5:8000)`)
	f(pod("[::]:8000"), `pods[0].address = "[::]:8000" is every interface`)
	f("redis: {address: '0.0.0.0:6379'}\n"+pod("h:1"), `redis.address = "0.0.0.0:6379" is every interface`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://0.0.0.0:5557'}]\n", `pods[0].kv_events = "tcp://0.0.0.0:5557" is every interface, which is dialed as this machine (a pod's or server's host, e.g. tcp://10.0.0.5:5557)`)
	// "*" is ZeroMQ's bind wildcard, as in vLLM's kv-events-config
	// endpoint: never a host to dial.
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://*:5557'}]\n", `pods[0].kv_events = "tcp://*:5557" is every interface, a listen address, not one to dial (a pod's or server's host, e.g. tcp://10.0.0.5:5557)`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://h:5557', kv_replay: 'tcp://*:5558'}]\n", `pods[0].kv_replay = "tcp://*:5558" is every interface, a listen address, not one to dial (a pod's or server's host, e.g. tcp://10.0.0.5:5558)`)
	f(pod("*:8000"), `pods[0].address = "*:8000" is every interface, a listen address, not one to dial (a pod's or server's host, e.g. 10.0.0.5:8000)`)
	f(pod("http://*:8000"), `pods[0].address = "*:8000" is every interface, a listen address`)
	f("redis: {address: '*:6379'}\n"+pod("h:1"), `redis.address = "*:6379" is every interface, a listen address, not one to dial`)
	f(pod("h:0"), `pods[0].address = "h:0" needs a port`)
	f(pod("h:65536"), `pods[0].address = "h:65536" has no valid port`)
	f(pod("h:+80"), `pods[0].address = "h:+80" has no valid port`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'tcp://:5557'}]\n", `pods[0].kv_events = "tcp://:5557" has no host (a pod's or server's, e.g. tcp://10.0.0.5:5557)`)
	f("pods: [{model: m, address: 'h:1', kv_events: 'h:5557'}]\n", `pods[0].kv_events = "h:5557" must be tcp://host:port`)
	f("pods: [{model: m, address: 'h:1', kv_replay: 'tcp://h:5558'}]\n", `pods[0].kv_replay = "tcp://h:5558" needs kv_events`)
	f("redis: {address: ':6379'}\n"+pod("h:1"), `redis.address = ":6379" has no host`)
	// A listen address may leave its host out: every interface.
	c := Default()
	if err := c.UnmarshalYAML([]byte("listen: ':8080'\n" + pod("h:1"))); err != nil {
		t.Fatal(err)
	}
	c.Provision()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// loadRefuses checks that yml, read as Load reads a file (then
// provisioned), is refused with want in the error.
func loadRefuses(t *testing.T, yml, want string) {
	t.Helper()
	c := Default()
	err := c.UnmarshalYAML([]byte(yml))
	if err == nil {
		c.Provision()
		err = c.Validate()
	}
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v; want %q in it", yml, err, want)
	}
}

// TestOneEnginePerEntry: two pods at one address are one engine counted
// twice (two ledgers, two health states, twice its share), whatever
// their names, models or the address's scheme; a LoRA adapter is not a
// model of its own but an adapter of its pod.
func TestOneEnginePerEntry(t *testing.T) {
	loadRefuses(t, "pods: [{name: a, model: m, address: 'h:1'}, {name: b, model: n, address: 'http://h:1'}]\n",
		`pods[1].address = "h:1" is also the address of pods[0] ("a", model "m"): one engine is one entry; list its LoRA adapters in adapters and its other model names in aliases`)
	// One IP and port, however written, is one engine: leading zeros of
	// the port, IPv6's spellings, an IPv4 address mapped into IPv6.
	two := func(a, b string) string {
		return "pods: [{name: a, model: m, address: '" + a + "'}, {name: b, model: m, address: '" + b + "'}]\n"
	}
	loadRefuses(t, two("10.0.0.5:8000", "10.0.0.5:08000"), `pods[1].address = "10.0.0.5:08000" is also the address of pods[0]`)
	loadRefuses(t, two("[::1]:8000", "[0:0:0:0:0:0:0:1]:8000"), `pods[1].address = "[0:0:0:0:0:0:0:1]:8000" is also the address of pods[0]`)
	loadRefuses(t, two("[FD00::5]:8000", "[fd00:0::5]:8000"), `pods[1].address = "[fd00:0::5]:8000" is also the address of pods[0]`)
	loadRefuses(t, two("127.0.0.1:8000", "[::ffff:127.0.0.1]:8000"), `pods[1].address = "[::ffff:127.0.0.1]:8000" is also the address of pods[0]`)
	// A name is not resolved: localhost may be ::1, where another engine
	// may listen, and a DNS name may be a balanced service.
	for _, yml := range []string{
		"pods: [{name: a, model: m, address: 'h:1', adapters: sql}, {name: b, model: m, address: 'h:2'}]\n",
		two("localhost:8000", "127.0.0.1:8000"),
		two("[::1]:8000", "127.0.0.1:8000"),
	} {
		c := Default()
		if err := c.UnmarshalYAML([]byte(yml)); err != nil {
			t.Fatal(err)
		}
		c.Provision()
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", yml, err)
		}
	}
}

// TestUnknownFieldNamesPath: a key the file may not hold is refused by its
// path in the file, not by the Go type yaml decodes it into, with the
// closest key its section knows when it looks like a typo of one.
func TestUnknownFieldNamesPath(t *testing.T) {
	f := func(doc, want string) {
		t.Helper()
		c := Default()
		if err := c.UnmarshalYAML([]byte(doc)); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q in it", doc, err, want)
		}
	}
	f("upstream:\n  keepalive_timout: 3s\n", "upstream.keepalive_timout: unknown field (line 2); did you mean keepalive_timeout?")
	f("helth: {interval: 1s}\n", "helth: unknown field (line 1); did you mean health?")
	f("pods:\n  - {model: m, address: 'h:1'}\n  - {model: m, adress: 'h:2'}\n", "pods[1].adress: unknown field (line 3); did you mean address?")
	// Inline sections' keys are their parent's: retry_on is upstream's.
	f("upstream: {retry_onn: [reset]}\n", "upstream.retry_onn: unknown field (line 1); did you mean retry_on?")
	f("models: [{name: m, adapter_load: 1}]\n", "models[0].adapter_load: unknown field (line 1)")
	f("discovery:\n  dns: [{name: x, port: 1, model: m, intervall: 5s}]\n", "discovery.dns[0].intervall: unknown field (line 2); did you mean interval?")
	// Nothing close: no guess.
	f("colour: red\n", "colour: unknown field (line 1)")
	c := Default()
	if err := c.UnmarshalYAML([]byte("colour: red\n")); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("colour: %v; want no guess", err)
	}
	// Every unknown key of the file is named.
	f("upstream: {retriez: 2}\nhealth: {timout: 1s}\n", "upstream.retriez: unknown field (line 1); did you mean retries?; health.timout: unknown field (line 2); did you mean timeout?")
}

// TestZeroIsNotSilentlyDefault: a setting of a list entry whose 0 means
// "unset" to Provision, written 0, is refused rather than silently
// changed to its default: adapter_load_sec 0 became 0.2, and a weight of
// 0, meant to send a pod or alias target nothing, became 1.
func TestZeroIsNotSilentlyDefault(t *testing.T) {
	pod := "pods: [{model: m, address: 'h:1'}]\n"
	f := func(yml, want string) { t.Helper(); loadRefuses(t, yml, want) }
	f("models: [{name: m, adapter_load_sec: 0}]\n"+pod,
		"models[0].adapter_load_sec = 0 must be positive: a load takes time, and a pod that holds the adapter is charged nothing already (leave it out for 0.2)")
	f("models: [{name: m}, {name: n, adapter_load_sec: 0.0}]\n"+pod, "models[1].adapter_load_sec = 0 must be positive")
	f("models: [{name: m, max_loras: 0}]\n"+pod, "models[0].max_loras = 0 must be a positive number of adapters (leave it out for 1)")
	f("models: [{name: m, block_size: 0}]\n"+pod, "models[0].block_size = 0 must be a positive number of tokens (leave it out for 16)")
	f("models: [{name: m, adapter_load_timeout: 0s}]\n"+pod, `models[0].adapter_load_timeout = "0s" must be positive (leave it out for 30s)`)
	f("pods: [{model: m, address: 'h:1', weight: 0}]\n", "pods[0].weight = 0 must be positive; to send a pod nothing, remove it (leave weight out for 1)")
	f("aliases: [{name: a, targets: [{model: m, weight: 9}, {model: m, weight: 0}]}]\n"+pod,
		"aliases[0].targets[1].weight = 0 must be positive; to send a target nothing, remove it")
	if _, err := ParsePodFlag("model=m,address=h:1,weight=0"); err == nil || !strings.Contains(err.Error(), "weight = 0 must be positive") {
		t.Errorf("--pod weight=0: %v; want it refused", err)
	}
	// A pod's prefill speed and ranks, and a DNS source's ranks and
	// interval, are filled the same way.
	f("pods: [{model: m, address: 'h:1', prefill_tokens_per_sec: 0}]\n", "pods[0].prefill_tokens_per_sec = 0 must be positive (leave it out for 20000 until measured)")
	f("pods: [{model: m, address: 'h:1', data_parallel_size: 0}]\n", "pods[0].data_parallel_size = 0 must be at least 1 (leave it out for 1)")
	f("discovery: {dns: [{name: x, port: 1, model: m, interval: 0s}]}\n", `discovery.dns[0].interval = "0s" must be positive (leave it out for 10s)`)
	f("discovery: {dns: [{name: x, port: 1, model: m, data_parallel_size: 0}]}\n", "discovery.dns[0].data_parallel_size = 0 must be at least 1 (leave it out for 1)")
	// SGLang's bootstrap port 0 is no port a decode pod can reach.
	f("pods: [{model: m, address: 'h:1', engine: sglang, bootstrap_port: 0}]\n",
		"pods[0].bootstrap_port = 0 must be a port, 1 to 65535 (leave it out for SGLang's default, 8998; other engines have none)")
	f("discovery: {dns: [{name: x, port: 1, model: m, engine: sglang, bootstrap_port: 0}]}\n", "discovery.dns[0].bootstrap_port = 0 must be a port, 1 to 65535")
	if _, err := ParsePodFlag("model=m,address=h:1,engine=sglang,bootstrap_port=0"); err == nil || !strings.Contains(err.Error(), "bootstrap_port = 0 must be a port") {
		t.Errorf("--pod bootstrap_port=0: %v; want it refused", err)
	}
	// Left out, each gets its default.
	c := Default()
	if err := c.UnmarshalYAML([]byte("models: [{name: m, adapters: [{name: sql}]}]\naliases: [{name: a, targets: [{model: m}]}]\n" + pod)); err != nil {
		t.Fatal(err)
	}
	c.Provision()
	if m := c.Models[0]; m.AdapterLoadSec != DefaultAdapterLoadSec || m.MaxLoras != DefaultMaxLoras || c.Pods[0].Weight != 1 || c.Aliases[0].Targets[0].Weight != 1 {
		t.Fatalf("defaults not filled: %+v, %+v, %+v", m.LoRA, c.Pods[0], c.Aliases[0])
	}
}

// TestEmptySelectorRefused: in Kubernetes an empty label selector selects
// every pod; pdlb took a written one for unset and watched AIBrix's label
// instead. It is refused; left out, the selector is AIBrix's.
func TestEmptySelectorRefused(t *testing.T) {
	loadRefuses(t, "discovery: {kubernetes: {namespace: inference, selector: ''}}\n",
		`discovery.kubernetes.selector = "" is empty, which in Kubernetes selects every pod, but only pods labelled model.aibrix.ai/name are routed to (leave it out for "model.aibrix.ai/name")`)
	c := Default()
	if err := c.UnmarshalYAML([]byte("discovery: {kubernetes: {namespace: inference}}\n")); err != nil {
		t.Fatal(err)
	}
	c.Provision()
	if err := c.Validate(); err != nil || c.Discovery.Kubernetes.Selector != spec.DefaultSelector {
		t.Fatalf("selector left out: %v, %q", err, c.Discovery.Kubernetes.Selector)
	}
}

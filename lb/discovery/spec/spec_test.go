package spec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

func decode(t *testing.T, yml string) Discovery {
	t.Helper()
	var d Discovery
	dec := yaml.NewDecoder(strings.NewReader(yml))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", yml, err)
	}
	return d
}

func TestDiscoveryValidateRejects(t *testing.T) {
	f := func(yml, wantInMsg string) {
		t.Helper()
		d := decode(t, yml)
		err := d.Validate()
		if err == nil {
			t.Fatalf("accepted:\n%s", yml)
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantInMsg) {
			t.Fatalf("error %q does not mention %q", err, wantInMsg)
		}
	}
	f("dns: [{port: 8000, model: m}]", `discovery.dns[0].name = ""`)
	f("dns: [{name: a, model: m}]", "discovery.dns[0].port = 0")
	f("dns: [{name: a, port: 70000, model: m}]", "discovery.dns[0].port = 70000")
	f("dns: [{name: a, type: srv, port: 80, model: m}]", "discovery.dns[0].port = 80 must be 0 with type srv")
	f("dns: [{name: a, type: mx, model: m}]", `discovery.dns[0].type = "mx"`)
	f("dns: [{name: a, port: 1, model: m, family: ipv6}]", `discovery.dns[0].family = "ipv6" is not an address family (known: v4_preferred, v6_preferred, v4_only, v6_only, all)`)
	f("dns: [{name: a, type: srv, model: m, family: v6_only}]", `discovery.dns[0].family = "v6_only" must be empty with type srv`)
	f("dns: [{name: a, port: 1}]", `discovery.dns[0].model = ""`)
	f("dns: [{name: a, port: 1, model: m, engine: tgi}]", `discovery.dns[0].engine = "tgi"`)
	f("dns: [{name: a, port: 1, model: m, role: both}]", `discovery.dns[0].role = "both"`)
	f("dns: [{name: a, port: 1, model: m, role: decode}]", `discovery.dns[0].roleset = ""`)
	f("dns: [{name: a, port: 1, model: m, kv_events_port: -1}]", "discovery.dns[0].kv_events_port = -1")
	f("dns: [{name: a, port: 1, model: m, kv_replay_port: 5600}]", "discovery.dns[0].kv_replay_port = 5600 needs kv_events_port beside it")
	f("dns: [{name: a, port: 1, model: m, kv_events_port: 5557, kv_replay_port: 70000}]", "discovery.dns[0].kv_replay_port = 70000")
	f("dns: [{name: a, port: 1, model: m, data_parallel_size: -1}]", "discovery.dns[0].data_parallel_size = -1")
	f("dns: [{name: a, port: 1, model: m, data_parallel_routing: rank}]", `discovery.dns[0].data_parallel_routing = "rank" must be "prefix" (default) or "engine"`)
	f("dns: [{name: a, port: 1, model: m, bootstrap_port: 9000}]", "discovery.dns[0].bootstrap_port = 9000 is for sglang pods only")
	f("dns: [{name: a, port: 1, model: m, engine: sglang, bootstrap_port: -3}]", "discovery.dns[0].bootstrap_port = -3")
	f("dns: [{name: a, port: 1, model: m}, {name: b, port: 1, model: m, interval: -1s}]", `discovery.dns[1].interval = "-1s"`)
}

func TestDiscoveryProvisionFillsDefaults(t *testing.T) {
	d := decode(t, `
kubernetes: {namespace: inference}
dns:
  - {name: llama.inference.svc, port: 8000, model: llama}
  - {name: _http._tcp.sgl, type: srv, model: qwen, engine: sglang, role: prefill, roleset: g0, interval: 2s, data_parallel_routing: engine}
`)
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	d.Provision()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if !d.Enabled() || d.Kubernetes.Selector != DefaultSelector || d.Kubernetes.Namespace != "inference" {
		t.Fatalf("kubernetes: %+v", d.Kubernetes)
	}
	a, srv := d.DNS[0], d.DNS[1]
	if a.Type != DNSTypeA || a.Family != DefaultDNSFamily || a.Engine != "vllm" || a.Role != RoleCombined || a.Interval != DefaultDNSInterval || a.BootstrapPort != 0 ||
		a.DataParallelRouting != DataParallelByPrefix {
		t.Fatalf("a: %+v", a)
	}
	if srv.Type != DNSTypeSRV || srv.Family != "" || srv.BootstrapPort != DefaultBootstrapPort || srv.Interval != 2*time.Second ||
		srv.DataParallelRouting != DataParallelByEngine {
		t.Fatalf("srv: %+v", srv)
	}
	var none Discovery
	if none.Enabled() || none.Validate() != nil {
		t.Fatal("the zero Discovery must be valid and off")
	}
}

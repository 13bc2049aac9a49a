// Package spec holds the declarative inputs of pod discovery: the settings
// the gateway's YAML gives it (Discovery) and the model.aibrix.ai/config
// annotation that pods carry (ModelConfig). It imports nothing of the
// gateway, so lb/config can embed Discovery while lb/discovery, which
// reports config.Pod values, imports both.
package spec

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"pdlb/engines"
)

// Defaults, as named constants so the docs and the code cannot disagree.
const (
	// DefaultDNSInterval is how often a DNS name is resolved again.
	DefaultDNSInterval = 10 * time.Second
	// DefaultDNSFamily is Envoy's default dns_lookup_family: a dual-stack
	// name's pods are found once, at their IPv4 addresses.
	DefaultDNSFamily = DNSFamilyV4Preferred
	// DefaultSelector picks every pod that names its model, the label
	// AIBrix's gateway plugin keys on, so an existing deployment is found
	// unchanged.
	DefaultSelector = LabelModel
	// DefaultBootstrapPort is SGLang's PD bootstrap port when a pod does not
	// name one (AIBrix).
	DefaultBootstrapPort = 8998
)

// DNS record types a DNS entry resolves.
const (
	DNSTypeA   = "a"   // A and AAAA records of the name, with a fixed port
	DNSTypeSRV = "srv" // SRV records: target and port from each record
)

// Address families a type "a" entry resolves, named after Envoy's
// dns_lookup_family values.
const (
	DNSFamilyV4Preferred = "v4_preferred" // A records; AAAA where there are none
	DNSFamilyV6Preferred = "v6_preferred" // AAAA records; A where there are none
	DNSFamilyV4Only      = "v4_only"
	DNSFamilyV6Only      = "v6_only"
	DNSFamilyAll         = "all" // both: a pod with both is found twice
)

// dnsFamilies gives each family the networks, as net.Resolver.LookupIP
// names them, to resolve in turn: the first that has addresses gives the
// pods. One family per name, since a pod listed under an A and an AAAA
// record is one engine, and two pods would split its load and KV events.
var dnsFamilies = []struct {
	name     string
	networks []string
}{
	{DNSFamilyV4Preferred, []string{"ip4", "ip6"}},
	{DNSFamilyV6Preferred, []string{"ip6", "ip4"}},
	{DNSFamilyV4Only, []string{"ip4"}},
	{DNSFamilyV6Only, []string{"ip6"}},
	{DNSFamilyAll, []string{"ip"}},
}

// The values of a pod's data_parallel_routing (config.Pod's, DNS's, and
// AnnotationDataParallelRouting).
const (
	DataParallelByPrefix = "prefix" // name the rank holding the longest prefix (default)
	DataParallelByEngine = "engine" // name none: the engine's balancer picks
)

// DataParallelRoutingProblem says why v is no data_parallel_routing, ""
// when it is one or empty (the default, prefix).
func DataParallelRoutingProblem(v string) string {
	switch v {
	case "", DataParallelByPrefix, DataParallelByEngine:
		return ""
	}
	return fmt.Sprintf("must be %q (default) or %q", DataParallelByPrefix, DataParallelByEngine)
}

// ErrInvalid wraps every validation error of this package.
var ErrInvalid = errors.New("discovery: invalid")

func invalid(field string, value any, why string) error {
	if s, ok := value.(string); ok {
		value = strconv.Quote(s)
	}
	return fmt.Errorf("%w: %s = %v %s", ErrInvalid, field, value, why)
}

// Discovery lists the sources of pods besides the static pods of the config
// file. The zero value discovers nothing.
//
//	discovery:
//	  kubernetes: {namespace: inference, selector: "model.aibrix.ai/name"}
//	  dns:
//	    - {name: llama.inference.svc.cluster.local, port: 8000, model: llama}
//	    - {name: _http._tcp.sgl.example.com, type: srv, model: qwen, engine: sglang}
type Discovery struct {
	// Kubernetes watches pods through the API server; absent: off.
	Kubernetes *Kubernetes `yaml:"kubernetes"`
	// DNS lists names resolved periodically, each a set of pods.
	DNS []DNS `yaml:"dns"`
}

// Kubernetes selects the pods watched through the API server. Every other
// pod attribute comes from the pods' labels and annotations (see Label*).
type Kubernetes struct {
	// Namespace whose pods are watched (default "": every namespace, which
	// needs a ClusterRole rather than a Role).
	Namespace string `yaml:"namespace"`
	// Selector is a Kubernetes label selector of the pods (default
	// "model.aibrix.ai/name": every pod that names its model). It is parsed
	// when the source is made, which reports a bad one. A pod it selects
	// without that label is left out; written empty in the config file,
	// which in Kubernetes selects every pod, it is refused.
	Selector string `yaml:"selector"`
	// Kubeconfig is the path of a kubeconfig file, for a gateway running
	// outside the cluster (default "": the pod's service account).
	Kubeconfig string `yaml:"kubeconfig"`
}

// DNS is one name whose records are a set of pods that share a model,
// engine and role.
type DNS struct {
	// Name to resolve, e.g. "llama.inference.svc.cluster.local" (a headless
	// Service) or "_http._tcp.llama.example.com" for SRV.
	Name string `yaml:"name"`
	// Type is "a" (default: A or AAAA records, as Family says, every
	// address with Port) or "srv" (each record's target and port).
	Type string `yaml:"type"`
	// Family is the address family of a type "a" name (default
	// v4_preferred: its A records, or its AAAA records where it has no A
	// record; v6_preferred the other way round; v4_only; v6_only; all:
	// both, for a name whose pods have one family each, since a pod with
	// both becomes two pods). With "srv" it must be empty: a target is
	// dialed by its name.
	Family string `yaml:"family"`
	// Port of the OpenAI API on every address; required with type "a",
	// must be 0 with "srv".
	Port int `yaml:"port"`
	// Model the pods serve.
	Model string `yaml:"model"`
	// Engine is vllm (default), sglang or trtllm.
	Engine string `yaml:"engine"`
	// Role is combined (default), prefill or decode.
	Role string `yaml:"role"`
	// Roleset pairs prefill and decode pods; required with those roles.
	Roleset string `yaml:"roleset"`
	// KVEventsPort is the port of each pod's KV-event publisher on the same
	// host (default 0: none; vLLM's default is 5557).
	KVEventsPort int `yaml:"kv_events_port"`
	// KVReplayPort is the port of each pod's KV-event replay socket on the
	// same host (default 0: 5558), beside KVEventsPort.
	KVReplayPort int `yaml:"kv_replay_port"`
	// DataParallelSize is the engine ranks behind each pod's API server
	// (vLLM's --data-parallel-size, default 1): rank r publishes on both
	// ports + r.
	DataParallelSize int `yaml:"data_parallel_size"`
	// DataParallelRouting is each pod's choice of rank, as a configured
	// pod's data_parallel_routing: "prefix" (default) names the rank
	// holding a prompt's longest prefix, "engine" leaves it to the engine.
	DataParallelRouting string `yaml:"data_parallel_routing"`
	// BootstrapPort is each SGLang pod's PD bootstrap port (default 8998 for
	// sglang). Other engines have none: leave it out (a written 0 is
	// refused, so their 0 is not written back either).
	BootstrapPort int `yaml:"bootstrap_port,omitempty"`
	// Interval between resolutions (default 10s).
	Interval time.Duration `yaml:"interval"`
}

// Provision fills the settings whose empty value means a default, on
// copies of d's lists, so that a Discovery copied by value keeps its own.
// Validate accepts them empty.
func (d *Discovery) Provision() {
	if d.Kubernetes != nil && d.Kubernetes.Selector == "" {
		k := *d.Kubernetes
		k.Selector = DefaultSelector
		d.Kubernetes = &k
	}
	d.DNS = slices.Clone(d.DNS)
	for i := range d.DNS {
		d.DNS[i].provision()
	}
}

// provision fills the entry's empty type (a), family of type a
// (v4_preferred), engine (vllm), role (combined), ranks (1), their
// routing (prefix), interval and,
// for SGLang, bootstrap port.
func (d *DNS) provision() {
	if d.Type == "" {
		d.Type = DNSTypeA
	}
	if d.Type == DNSTypeA && d.Family == "" {
		d.Family = DefaultDNSFamily
	}
	k, err := engines.ParseKind(d.Engine)
	if err == nil {
		d.Engine = string(k)
	}
	if d.Role == "" {
		d.Role = RoleCombined
	}
	if d.DataParallelSize == 0 {
		d.DataParallelSize = 1
	}
	if d.DataParallelRouting == "" {
		d.DataParallelRouting = DataParallelByPrefix
	}
	if err == nil && k == engines.SGLang && d.BootstrapPort == 0 {
		d.BootstrapPort = DefaultBootstrapPort
	}
	if d.Interval == 0 {
		d.Interval = DefaultDNSInterval
	}
}

// Validate checks every field; one whose empty value means a default
// (Provision) is valid empty. Errors name the field under "discovery."
// and quote the value.
func (d Discovery) Validate() error {
	for i := range d.DNS {
		if err := d.DNS[i].validate(fmt.Sprintf("discovery.dns[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// Networks lists the networks of net.Resolver.LookupIP that the entry's
// Family resolves, in turn: the first that has addresses gives the pods.
// It is nil for a family Validate refuses.
func (d DNS) Networks() []string {
	for _, f := range dnsFamilies {
		if f.name == d.Family {
			return f.networks
		}
	}
	return nil
}

// Enabled reports whether any source is configured.
func (d *Discovery) Enabled() bool { return d.Kubernetes != nil || len(d.DNS) > 0 }

func (d DNS) validate(field string) error {
	if d.Name == "" {
		return invalid(field+".name", d.Name, "must not be empty")
	}
	switch d.Type {
	case "", DNSTypeA:
		if d.Port < 1 || d.Port > 65535 {
			return invalid(field+".port", d.Port, "must be 1..65535 with type a")
		}
		if d.Family != "" && d.Networks() == nil {
			known := make([]string, len(dnsFamilies))
			for i, f := range dnsFamilies {
				known[i] = f.name
			}
			return invalid(field+".family", d.Family, "is not an address family (known: "+strings.Join(known, ", ")+")")
		}
	case DNSTypeSRV:
		if d.Port != 0 {
			return invalid(field+".port", d.Port, "must be 0 with type srv (each record names its port)")
		}
		if d.Family != "" {
			return invalid(field+".family", d.Family, "must be empty with type srv (each target is dialed by its name)")
		}
	default:
		return invalid(field+".type", d.Type, "is not a record type (known: a, srv)")
	}
	if d.Model == "" {
		return invalid(field+".model", d.Model, "must not be empty")
	}
	k, err := engines.ParseKind(d.Engine)
	if err != nil {
		return invalid(field+".engine", d.Engine, "is not an engine (known: vllm, sglang, trtllm)")
	}
	switch d.Role {
	case "", RoleCombined:
	case RolePrefill, RoleDecode:
		if d.Roleset == "" {
			return invalid(field+".roleset", d.Roleset, "must name the roleset of a "+d.Role+" pod")
		}
	default:
		return invalid(field+".role", d.Role, "is not a role (known: combined, prefill, decode)")
	}
	if d.KVEventsPort < 0 || d.KVEventsPort > 65535 {
		return invalid(field+".kv_events_port", d.KVEventsPort, "must be 0 (none) or 1..65535")
	}
	switch {
	case d.KVReplayPort < 0 || d.KVReplayPort > 65535:
		return invalid(field+".kv_replay_port", d.KVReplayPort, "must be 0 (5558) or 1..65535")
	case d.KVReplayPort != 0 && d.KVEventsPort == 0:
		return invalid(field+".kv_replay_port", d.KVReplayPort, "needs kv_events_port beside it")
	case d.DataParallelSize < 0:
		return invalid(field+".data_parallel_size", d.DataParallelSize, "must be at least 1 (default 1)")
	}
	if why := DataParallelRoutingProblem(d.DataParallelRouting); why != "" {
		return invalid(field+".data_parallel_routing", d.DataParallelRouting, why)
	}
	switch {
	case k == engines.SGLang && (d.BootstrapPort < 0 || d.BootstrapPort > 65535):
		return invalid(field+".bootstrap_port", d.BootstrapPort, "must be 1..65535")
	case k != engines.SGLang && d.BootstrapPort != 0:
		return invalid(field+".bootstrap_port", d.BootstrapPort, "is for sglang pods only")
	}
	if d.Interval < 0 {
		return invalid(field+".interval", d.Interval.String(), "must be positive")
	}
	return nil
}

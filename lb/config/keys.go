package config

import (
	"fmt"
	"reflect"

	"gopkg.in/yaml.v3"

	"pdlb/engines"
	"pdlb/internal/yamlkeys"
	"pdlb/lb/discovery/spec"
)

// zeroIsUnset are the settings of list entries and of discovery.kubernetes,
// which have no Default to start from, whose 0 or "" Provision takes for
// unset and replaces with their default, by path with [] for any index. Written in the file, the value would
// silently change: it is refused, saying why.
var zeroIsUnset = map[string]string{
	"models[].block_size":                fmt.Sprintf("must be a positive number of tokens (leave it out for %d)", DefaultBlockSize),
	"models[].max_loras":                 fmt.Sprintf("must be a positive number of adapters (leave it out for %d)", DefaultMaxLoras),
	"models[].adapter_load_sec":          fmt.Sprintf("must be positive: a load takes time, and a pod that holds the adapter is charged nothing already (leave it out for %g)", DefaultAdapterLoadSec),
	"models[].adapter_load_timeout":      fmt.Sprintf("must be positive (leave it out for %v)", DefaultAdapterLoadTimeout),
	"pods[].weight":                      "must be positive; to send a pod nothing, remove it (leave weight out for 1)",
	"pods[].prefill_tokens_per_sec":      fmt.Sprintf("must be positive (leave it out for %d until measured)", DefaultPrefillSpeed),
	"pods[].data_parallel_size":          dataParallelUnset,
	"pods[].bootstrap_port":              bootstrapPortUnset,
	"aliases[].targets[].weight":         "must be positive; to send a target nothing, remove it (leave weight out for 1)",
	"discovery.dns[].interval":           fmt.Sprintf("must be positive (leave it out for %v)", spec.DefaultDNSInterval),
	"discovery.dns[].data_parallel_size": dataParallelUnset,
	"discovery.dns[].bootstrap_port":     bootstrapPortUnset,
	// Honoured, "" would watch every pod of the namespace, or of the
	// cluster, to leave out all but those with the model label.
	"discovery.kubernetes.selector": fmt.Sprintf("is empty, which in Kubernetes selects every pod, but only pods labelled %s are routed to (leave it out for %q)", spec.LabelModel, spec.DefaultSelector),
}

var dataParallelUnset = fmt.Sprintf("must be at least 1 (leave it out for %d)", DefaultDataParallelSize)

// SGLang's decode pods dial the bootstrap port: 0 is none they can reach.
var bootstrapPortUnset = fmt.Sprintf("must be a port, 1 to 65535 (leave it out for SGLang's default, %d; other engines have none)", engines.DefaultBootstrapPort)

// refuseUnsetZeros refuses the first setting of zeroIsUnset that doc
// writes 0.
func refuseUnsetZeros(doc *yaml.Node) error {
	path, written, why := yamlkeys.WrittenZero(doc, reflect.TypeFor[Config](), func(path string) string { return zeroIsUnset[path] })
	if why != "" {
		return invalid(path, written, why)
	}
	return nil
}

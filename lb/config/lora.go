package config

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// LoRA adapters, aliases and fallbacks: the names a client may send besides
// a model's own, and what serves them.

// Defaults of a model's LoRA settings.
const (
	// DefaultMaxLoras is vLLM's --max-loras default: the adapters a pod
	// holds in its GPU slots at once, until its scrape says otherwise.
	DefaultMaxLoras = 1
	// DefaultAdapterLoadSec is the time a pod takes to bring an adapter
	// into a slot (seconds): reading a rank-16 adapter of an 8B model from
	// local disk to the GPU.
	DefaultAdapterLoadSec = 0.2
	// DefaultAdapterLoadTimeout bounds one dynamic load through the
	// engine's API.
	DefaultAdapterLoadTimeout = 30 * time.Second
)

// Adapter is a LoRA adapter of a model, served by the model's pods under
// its own name (vLLM's --lora-modules name=path).
type Adapter struct {
	// Name is the name clients send in "model".
	Name string `yaml:"name"`
	// Path is where a pod loads it from (vLLM's and SGLang's lora_path);
	// "" when the pods load it themselves at start, and the gateway never
	// loads it.
	Path string `yaml:"path"`
}

// LoRA is a model's adapter settings, inline in its Model entry.
type LoRA struct {
	// Adapters are the model's adapters (default none; the gateway also
	// learns those its pods list in /v1/models and report running).
	Adapters []Adapter `yaml:"adapters"`
	// MaxLoras is how many adapters one pod holds at once, as its
	// --max-loras (default 1); a pod's vllm:lora_requests_info overrides it.
	MaxLoras int `yaml:"max_loras"`
	// AdapterLoadSec is what placement charges a pod that must load the
	// request's adapter into a slot first (seconds, default 0.2), beside
	// its queue's time.
	AdapterLoadSec float64 `yaml:"adapter_load_sec"`
	// LoadAdapters lets the gateway load an adapter with a path on the
	// chosen pod through the engine's API when no pod lists it
	// (default false).
	LoadAdapters bool `yaml:"load_adapters"`
	// AdapterLoadTimeout bounds one such load (default 30s).
	AdapterLoadTimeout time.Duration `yaml:"adapter_load_timeout"`
	// Fallback names the models to try, in order, when this one has no
	// available pod, sheds the request, or its pod answers 503 before
	// the first byte (default none).
	Fallback []string `yaml:"fallback"`
}

// Alias is a public model name that routes to models or adapters.
type Alias struct {
	// Name is the name clients send.
	Name string `yaml:"name"`
	// Targets are what it routes to: one, or several drawn by weight
	// (A/B splits).
	Targets []AliasTarget `yaml:"targets"`
}

// AliasTarget is one of an alias's destinations.
type AliasTarget struct {
	// Model names a model or an adapter.
	Model string `yaml:"model"`
	// Weight is its share of the alias's requests (default 1).
	Weight float64 `yaml:"weight"`
}

// provision fills the empty LoRA settings with their defaults.
func (l *LoRA) provision() {
	l.MaxLoras = cmp.Or(l.MaxLoras, DefaultMaxLoras)
	l.AdapterLoadSec = cmp.Or(l.AdapterLoadSec, DefaultAdapterLoadSec)
	l.AdapterLoadTimeout = cmp.Or(l.AdapterLoadTimeout, DefaultAdapterLoadTimeout)
}

// provisionAliases fills the targets' empty weights, in copies.
func (c *Config) provisionAliases() {
	c.Aliases = slices.Clone(c.Aliases)
	for i := range c.Aliases {
		c.Aliases[i].Targets = slices.Clone(c.Aliases[i].Targets)
		for j := range c.Aliases[i].Targets {
			if c.Aliases[i].Targets[j].Weight == 0 {
				c.Aliases[i].Targets[j].Weight = 1
			}
		}
	}
}

// ValidateNames checks adapters, aliases and fallbacks: every public name
// is one model's, adapter's or alias's; every alias target and fallback
// names a model (listed, or served by a pod) or an adapter. Validate
// calls it; so does the server for each pod discovery adds, whose model
// or adapters may take a name.
func (c *Config) ValidateNames() error {
	owner := map[string]string{} // public name → the field that declares it
	models := map[string]bool{}
	for i := range c.Models {
		owner[c.Models[i].Name] = fmt.Sprintf("models[%d].name", i)
		models[c.Models[i].Name] = true
	}
	for i := range c.Pods {
		if _, ok := owner[c.Pods[i].Model]; !ok {
			owner[c.Pods[i].Model] = fmt.Sprintf("pods[%d].model", i)
		}
		models[c.Pods[i].Model] = true
	}
	if err := c.validatePodAdapters(models); err != nil {
		return err
	}
	claim := func(field, name string) error {
		if name == "" {
			return invalid(field, name, "must not be empty")
		}
		if prev, ok := owner[name]; ok {
			return invalid(field, name, "is already the name in "+prev)
		}
		owner[name] = field
		return nil
	}
	for i := range c.Models {
		m := &c.Models[i]
		field := fmt.Sprintf("models[%d]", i)
		for j, a := range m.Adapters {
			if err := claim(fmt.Sprintf("%s.adapters[%d].name", field, j), a.Name); err != nil {
				return err
			}
		}
		switch {
		case m.MaxLoras < 0:
			return invalid(field+".max_loras", m.MaxLoras, "must be a positive number of adapters")
		case m.AdapterLoadSec < 0:
			return invalid(field+".adapter_load_sec", m.AdapterLoadSec, "must not be negative")
		case m.AdapterLoadTimeout < 0:
			return invalid(field+".adapter_load_timeout", m.AdapterLoadTimeout, "must not be negative")
		}
	}
	for i, a := range c.Aliases {
		field := fmt.Sprintf("aliases[%d]", i)
		if err := claim(field+".name", a.Name); err != nil {
			return err
		}
		if len(a.Targets) == 0 {
			return invalid(field+".targets", a.Targets, "must name at least one model or adapter")
		}
	}
	// Targets and fallbacks may name any model or adapter, not an alias:
	// an alias resolves in one step.
	for i, a := range c.Aliases {
		for j, t := range a.Targets {
			field := fmt.Sprintf("aliases[%d].targets[%d]", i, j)
			if f, ok := owner[t.Model]; !ok || strings.HasPrefix(f, "aliases") {
				return invalid(field+".model", t.Model, "is not a model or adapter")
			}
			if !(t.Weight >= 0) || math.IsInf(t.Weight, 1) {
				return invalid(field+".weight", t.Weight, "must be a finite number, not negative")
			}
		}
	}
	for i := range c.Models {
		for j, f := range c.Models[i].Fallback {
			if !models[f] || f == c.Models[i].Name {
				return invalid(fmt.Sprintf("models[%d].fallback[%d]", i, j), f, "is not another model")
			}
		}
	}
	return nil
}

// ParseAdapters reads a pod's adapters (Pod.Adapters, the Kubernetes
// annotation pdlb/lora-adapters): "name" or "name=path", comma-separated,
// as vLLM's --lora-modules pairs; spaces around each are ignored, and ""
// is none. A name is unique and holds no '=', quote or whitespace.
func ParseAdapters(s string) ([]Adapter, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []Adapter
	for item := range strings.SplitSeq(s, ",") {
		name, path, _ := strings.Cut(strings.TrimSpace(item), "=")
		switch {
		case name == "":
			return nil, fmt.Errorf("adapter %q has no name", item)
		case strings.ContainsAny(name, "\"'\\ \t\n"):
			return nil, fmt.Errorf("adapter name %q has a quote, backslash or space", name)
		case strings.Contains(path, "="):
			return nil, fmt.Errorf("adapter %q has two '='", item)
		}
		for _, a := range out {
			if a.Name == name {
				return nil, fmt.Errorf("adapter %q is listed twice", name)
			}
		}
		out = append(out, Adapter{Name: name, Path: path})
	}
	return out, nil
}

// validatePodAdapters checks each pod's adapters: they parse, and none
// takes a model's name.
func (c *Config) validatePodAdapters(models map[string]bool) error {
	for i := range c.Pods {
		field := fmt.Sprintf("pods[%d].adapters", i)
		as, err := ParseAdapters(c.Pods[i].Adapters)
		if err != nil {
			return invalid(field, c.Pods[i].Adapters, err.Error())
		}
		for _, a := range as {
			if models[a.Name] {
				return invalid(field, c.Pods[i].Adapters, "names "+a.Name+", a model")
			}
		}
	}
	return nil
}

package sim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
)

// LoRA adapters as vLLM serves them: modules registered at start
// (--lora-modules) or at run time (/v1/load_lora_adapter, SGLang's
// /load_lora_adapter), requested by name in "model", at most MaxLoras of
// them in GPU slots at once, the least recently used evicted for a new
// one, whose load delays its prefill by Physics.AdapterLoadSec.

// DefaultAdapterLoadSec is the time a pod takes to bring an adapter into a
// GPU slot (seconds): a rank-16 adapter of an 8B model from local disk.
const DefaultAdapterLoadSec = 0.2

// DefaultMaxLoras is vLLM's --max-loras default.
const DefaultMaxLoras = 1

// LoRAModule is an adapter a pod serves from its start: vLLM's
// --lora-modules name=path.
type LoRAModule struct {
	Name string `yaml:"name"`
	Path string `yaml:"path"`
}

// LoRASlots is a pod's GPU adapter slots: at most Max adapters, evicted
// least recently used first. Pure data, so the live pod and bench/cluster
// swap adapters alike.
type LoRASlots struct {
	Max int
	// held are the adapters in slots, least recently used first.
	held []string
}

// Use brings adapter into a slot for a prefill, evicting the least
// recently used one when all are taken; load reports that it was not in
// one (the prefill then waits Physics.AdapterLoadSec).
func (s *LoRASlots) Use(adapter string) (load bool) {
	if i := slices.Index(s.held, adapter); i >= 0 {
		s.held = append(slices.Delete(s.held, i, i+1), adapter)
		return false
	}
	if len(s.held) >= s.Max {
		s.held = slices.Delete(s.held, 0, len(s.held)-s.Max+1)
	}
	s.held = append(s.held, adapter)
	return true
}

// Holds reports whether adapter is in a slot.
func (s *LoRASlots) Holds(adapter string) bool { return slices.Contains(s.held, adapter) }

// Len is the number of slots taken.
func (s *LoRASlots) Len() int { return len(s.held) }

// loraEnabled reports whether the pod serves adapters, as vLLM with
// --enable-lora.
func (c Config) loraEnabled() bool { return c.EnableLoRA || len(c.LoRAModules) > 0 }

// loraDefaults fills MaxLoras of a pod that serves adapters.
func (c *Config) loraDefaults() {
	if c.loraEnabled() && c.MaxLoras == 0 {
		c.MaxLoras = DefaultMaxLoras
	}
}

// validateLoRA checks the adapter settings.
func (c Config) validateLoRA(bad func(field string, v any, why string) error) error {
	if c.MaxLoras < 0 {
		return bad("max_loras", c.MaxLoras, "must not be negative")
	}
	seen := map[string]bool{c.Model: true}
	for i, m := range c.LoRAModules {
		if m.Name == "" || seen[m.Name] || strings.ContainsAny(m.Name, "\",\\\n") {
			return bad(fmt.Sprintf("lora_modules[%d].name", i), m.Name, "must be a new name without quotes, commas, backslashes or newlines")
		}
		seen[m.Name] = true
	}
	return nil
}

// adapters are a pod's registered adapters, by name: their paths.
type adapters struct {
	mu    sync.Mutex
	paths map[string]string
	order []string // registration order, for /v1/models
}

func newAdapters(c Config) *adapters {
	a := &adapters{paths: map[string]string{}}
	for _, m := range c.LoRAModules {
		a.add(m.Name, m.Path)
	}
	return a
}

func (a *adapters) add(name, path string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.paths[name]; ok {
		return false
	}
	a.paths[name] = path
	a.order = append(a.order, name)
	return true
}

func (a *adapters) remove(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.paths[name]; !ok {
		return false
	}
	delete(a.paths, name)
	a.order = slices.DeleteFunc(a.order, func(n string) bool { return n == name })
	return true
}

func (a *adapters) has(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.paths[name]
	return ok
}

// list returns the registered adapters' names and paths, in order.
func (a *adapters) list() (names, paths []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.order {
		names, paths = append(names, n), append(paths, a.paths[n])
	}
	return names, paths
}

// loadAdapter serves vLLM's /v1/load_lora_adapter and SGLang's
// /load_lora_adapter; unloadAdapter their unload endpoints.
func (p *Pod) loadAdapter(ctx *fasthttp.RequestCtx)   { p.adapterCall(ctx, true) }
func (p *Pod) unloadAdapter(ctx *fasthttp.RequestCtx) { p.adapterCall(ctx, false) }

// adapterCall registers (load) or forgets an adapter, answering with
// vLLM's messages: its ErrorResponse or its plain-text success, or
// SGLang's {"success", "error_message"} (400 when refused).
func (p *Pod) adapterCall(ctx *fasthttp.RequestCtx, load bool) {
	var q engines.AdapterRequest
	if !p.parseBody(ctx, &q) {
		return
	}
	status, typ, msg := fasthttp.StatusOK, "", ""
	switch {
	case load && (q.Name == "" || q.Path == ""):
		status, typ, msg = fasthttp.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."
	case !load && q.Name == "":
		status, typ, msg = fasthttp.StatusBadRequest, "InvalidUserInput", "either 'lora_name' and 'lora_int_id' needs to be provided."
	case load && (q.Name == p.cfg.Model || !p.lora.add(q.Name, q.Path)):
		status, typ, msg = fasthttp.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", q.Name)
	case !load && !p.lora.remove(q.Name):
		status, typ, msg = fasthttp.StatusNotFound, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", q.Name)
	}
	switch {
	case p.cfg.Engine == engines.SGLang:
		body, _ := json.Marshal(struct {
			Success bool   `json:"success"`
			Message string `json:"error_message"`
		}{status == fasthttp.StatusOK, msg})
		ctx.SetStatusCode(min(status, fasthttp.StatusBadRequest))
		writeJSON(ctx, body)
	case status != fasthttp.StatusOK:
		p.writeError(ctx, status, typ, "", msg)
	case load:
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString(fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", q.Name))
	default:
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString(fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", q.Name))
	}
}

// loraActive is what vllm:lora_requests_info reports: the adapters of
// running and of waiting requests, comma-joined. Immutable.
type loraActive struct{ running, waiting string }

// activeAdapters joins the distinct adapters of reqs.
func activeAdapters(reqs ...[]*request) string {
	var names []string
	for _, q := range reqs {
		for _, r := range q {
			if r.lora != "" && !slices.Contains(names, r.lora) {
				names = append(names, r.lora)
			}
		}
	}
	return strings.Join(names, ",")
}

// writeLoRAInfo appends vllm:lora_requests_info to a /metrics answer, as
// vLLM writes it: one sample whose labels are the state and whose value
// is the time it was taken.
func (p *Pod) writeLoRAInfo(ctx *fasthttp.RequestCtx) {
	if !p.cfg.loraEnabled() || p.cfg.Engine != engines.VLLM {
		return
	}
	a := p.sched.lora.Load()
	if a == nil {
		a = &loraActive{}
	}
	b := ctx.Response.Body()
	b = append(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"...)
	b = append(b, `vllm:lora_requests_info{max_lora="`...)
	b = strconv.AppendInt(b, int64(p.cfg.MaxLoras), 10)
	b = append(b, `",running_lora_adapters="`...)
	b = append(b, a.running...)
	b = append(b, `",waiting_lora_adapters="`...)
	b = append(b, a.waiting...)
	b = append(b, `"} `...)
	b = strconv.AppendFloat(b, float64(time.Now().UnixNano())/1e9, 'f', 6, 64)
	ctx.Response.SetBody(append(b, '\n'))
}

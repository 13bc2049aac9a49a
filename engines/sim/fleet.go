package sim

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"pdlb/engines"
	"pdlb/engines/prompt"
	"pdlb/engines/vllm"
	"pdlb/internal/yamlkeys"
)

// A fleet file lists simulated pods. Every pod starts from the defaults
// section and overrides what it sets; what neither sets takes Config's
// defaults. Unknown fields are errors, and so is a 0 or "" that would
// take a default (fleetZeros); errors name the setting by its path in the
// file.
// Example (testdata/fleet.yaml):
//
//	defaults:
//	  model: meta-llama/Llama-3.1-8B-Instruct
//	  engine: vllm            # vllm | sglang | trtllm
//	  speedup: 10             # simulated seconds per wall second
//	  seed: 0                 # output text seed
//	  hash_seed: 0            # KV block hash seed (PYTHONHASHSEED)
//	  default_max_tokens: 128
//	  max_model_len: 32768
//	  tick: 2ms
//	  role: combined          # combined | prefill | decode
//	  bootstrap_port: 0       # prefill pods' KV transfer (SGLang bootstrap) port; 0 = free
//	  kvxfer_listen: ""       # or its whole host:port (default listen's host, bootstrap_port)
//	  kv_scale: 0.0009765625  # fraction of the KV bytes a transfer really moves
//	  kv_timeout: 480s        # how long KV waits for pickup
//	  kv_events: ""           # tcp://host:port: publish KV events there as the engine does (replay on kv_replay)
//	  kv_replay: ""           # the replay socket (default: the port after kv_events' ranks)
//	  data_parallel_size: 1   # engine ranks behind the API server (vLLM's --data-parallel-size): rank r publishes on both ports + r
//	  tokenizer: ""           # a Hugging Face tokenizer directory: count and cache the model's real ids
//	  chat_template: ""       # a template file (or text) replacing the tokenizer's, as vLLM's --chat-template
//	  chat_template_kwargs: {} # defaults under each request's, as vLLM's --default-chat-template-kwargs
//	  responses_store: false  # keep the Responses API's stored responses (VLLM_ENABLE_RESPONSES_API_STORE=1)
//	  api_key: ""             # require this key as Authorization: Bearer, as vLLM's and SGLang's --api-key ("" none; not trtllm)
//	  physics:                # the global-scheduling study's timing model
//	    prefill_tokens_per_sec: 20000
//	    decode_base_sec: 0.010
//	    decode_per_seq_sec: 0.0002
//	    max_batch: 64
//	    block_size: 64
//	    cache_blocks: 3000
//	    kv_bytes_per_token: 131072
//	    link_bytes_per_sec: 25e9
//	    link_latency_sec: 0.0005
//	pods:
//	  - name: vllm-0
//	    listen: 127.0.0.1:8100
//	  - name: sglang-0
//	    engine: sglang
//	    listen: 127.0.0.1:8101
type fleetFile struct {
	Defaults podFile   `yaml:"defaults"`
	Pods     []podFile `yaml:"pods"`
}

type podFile struct {
	Name             string         `yaml:"name"`
	Model            string         `yaml:"model"`
	Engine           string         `yaml:"engine"`
	Listen           string         `yaml:"listen"`
	Speedup          float64        `yaml:"speedup"`
	Seed             uint64         `yaml:"seed"`
	HashSeed         uint64         `yaml:"hash_seed"`
	DefaultMaxTokens int            `yaml:"default_max_tokens"`
	MaxModelLen      int            `yaml:"max_model_len"`
	Tick             time.Duration  `yaml:"tick"`
	Role             string         `yaml:"role"`
	BootstrapPort    int            `yaml:"bootstrap_port"`
	KVXferListen     string         `yaml:"kvxfer_listen"`
	KVScale          float64        `yaml:"kv_scale"`
	KVTimeout        time.Duration  `yaml:"kv_timeout"`
	KVEvents         string         `yaml:"kv_events"`
	KVReplay         string         `yaml:"kv_replay"`
	DataParallelSize int            `yaml:"data_parallel_size"`
	Tokenizer        string         `yaml:"tokenizer"`
	ChatTemplate     string         `yaml:"chat_template"`
	ChatTemplateArgs map[string]any `yaml:"chat_template_kwargs"`
	Physics          physicsFile    `yaml:"physics"`
	EnableLoRA       bool           `yaml:"enable_lora"`
	LoRAModules      []LoRAModule   `yaml:"lora_modules"`
	MaxLoras         int            `yaml:"max_loras"`
	ResponsesStore   bool           `yaml:"responses_store"`
	APIKey           string         `yaml:"api_key"`
}

// physicsFile is Physics with the snake_case names Physics.Validate uses.
type physicsFile struct {
	PrefillTokensPerSec float64 `yaml:"prefill_tokens_per_sec"`
	DecodeBaseSec       float64 `yaml:"decode_base_sec"`
	DecodePerSeqSec     float64 `yaml:"decode_per_seq_sec"`
	MaxBatch            int     `yaml:"max_batch"`
	BlockSize           int     `yaml:"block_size"`
	CacheBlocks         int     `yaml:"cache_blocks"`
	KVBytesPerToken     float64 `yaml:"kv_bytes_per_token"`
	LinkBytesPerSec     float64 `yaml:"link_bytes_per_sec"`
	LinkLatencySec      float64 `yaml:"link_latency_sec"`
	AdapterLoadSec      float64 `yaml:"adapter_load_sec"`
}

func physicsFileOf(p Physics) physicsFile {
	return physicsFile{
		PrefillTokensPerSec: p.PrefillTokensPerSec, DecodeBaseSec: p.DecodeBaseSec,
		DecodePerSeqSec: p.DecodePerSeqSec, MaxBatch: p.MaxBatch, BlockSize: p.BlockSize,
		CacheBlocks: p.CacheBlocks, KVBytesPerToken: p.KVBytesPerToken,
		LinkBytesPerSec: p.LinkBytesPerSec, LinkLatencySec: p.LinkLatencySec,
		AdapterLoadSec: p.AdapterLoadSec,
	}
}

func (p podFile) config() Config {
	f := p.Physics
	return Config{
		Name: p.Name, Model: p.Model, Engine: engines.Kind(p.Engine), Listen: p.Listen,
		Speedup: p.Speedup, Seed: p.Seed, HashSeed: p.HashSeed,
		DefaultMaxTokens: p.DefaultMaxTokens, MaxModelLen: p.MaxModelLen, Tick: p.Tick, Role: p.Role,
		BootstrapPort: p.BootstrapPort, KVXferListen: p.KVXferListen, KVScale: p.KVScale, KVTimeout: p.KVTimeout,
		DataParallelSize: p.DataParallelSize,
		Physics: Physics{
			PrefillTokensPerSec: f.PrefillTokensPerSec, DecodeBaseSec: f.DecodeBaseSec,
			DecodePerSeqSec: f.DecodePerSeqSec, MaxBatch: f.MaxBatch, BlockSize: f.BlockSize,
			CacheBlocks: f.CacheBlocks, KVBytesPerToken: f.KVBytesPerToken,
			LinkBytesPerSec: f.LinkBytesPerSec, LinkLatencySec: f.LinkLatencySec,
			AdapterLoadSec: f.AdapterLoadSec,
		},
		EnableLoRA: p.EnableLoRA, LoRAModules: p.LoRAModules, MaxLoras: p.MaxLoras,
		ResponsesStore: p.ResponsesStore, APIKey: p.APIKey,
	}
}

// FleetConfig is a parsed fleet: one Config per pod, defaults applied and
// validated, and beside each the KV-event publisher it feeds (Endpoint ""
// for none), shared by its ranks (vllm.StartRanks).
type FleetConfig struct {
	Pods   []Config
	Events []vllm.PublisherConfig
}

var errFleet = errors.New("sim: invalid fleet")

// fleetZeros are the pod settings whose 0 or "" ParseFleet and
// withDefaults take for unset, by key: written in a fleet file, the pod
// would silently run at the default, so it is refused, saying why.
var fleetZeros = map[string]string{
	"name":               `must name the pod (leave it out for "pod-" and its index)`,
	"model":              fmt.Sprintf("must name a model (leave it out for %q)", DefaultModel),
	"engine":             fmt.Sprintf("must be vllm, sglang or trtllm (leave it out for %s)", engines.VLLM),
	"role":               fmt.Sprintf("must be combined, prefill or decode (leave it out for %s)", DefaultRole),
	"listen":             fmt.Sprintf("must be host:port (leave it out for %q)", DefaultListen),
	"speedup":            fmt.Sprintf("must be positive (leave it out for %g)", DefaultSpeedup),
	"default_max_tokens": fmt.Sprintf("must be at least 1 (leave it out for %d)", DefaultMaxTokens),
	"max_model_len":      fmt.Sprintf("must be at least 2 (leave it out for %d)", DefaultMaxModelLen),
	"tick":               fmt.Sprintf("must be positive (leave it out for %v)", DefaultTick),
	"kv_scale":           fmt.Sprintf("must be in (0, 1] (leave it out for %g)", DefaultKVScale),
	"kv_timeout":         fmt.Sprintf("must be positive (leave it out for %v)", DefaultKVTimeout),
	"data_parallel_size": fmt.Sprintf("must be at least 1 (leave it out for %d)", DefaultDataParallelSize),
	"max_loras":          fmt.Sprintf("must be positive (leave it out for %d)", DefaultMaxLoras),
}

// unsetZero says why a 0 at path (indices as []) is refused: the path is
// a key of fleetZeros in the defaults or in a pod.
func unsetZero(path string) string {
	for _, section := range []string{"defaults.", "pods[]."} {
		if key, ok := strings.CutPrefix(path, section); ok {
			return fleetZeros[key]
		}
	}
	return ""
}

// podError is err, which refuses pod i, with the setting it names by its
// path in the file: in the pod's own entry, else in the defaults section
// the pod took it from.
func podError(defaults, pod *yaml.Node, i int, name string, err error) error {
	var fe *fieldError
	if !errors.As(err, &fe) {
		return fmt.Errorf("%w: pods[%d] (name %q): %w", errFleet, i, name, err)
	}
	key := fe.field
	if fe.kind == errPhysics {
		key = "physics." + key
	}
	path := fmt.Sprintf("pods[%d].%s", i, key)
	if !sets(pod, key) && sets(defaults, key) {
		path = "defaults." + key
	}
	return fmt.Errorf("%w: %s = %s %s", errFleet, path, fe.value, fe.why)
}

// sets reports whether the pod entry or defaults section n writes key.
func sets(n *yaml.Node, key string) bool {
	found := false
	yamlkeys.Walk(n, reflect.TypeFor[podFile](), "", func(path string, _, _ *yaml.Node, _ reflect.Type, _ map[string]reflect.Type) {
		found = found || path == key
	})
	return found
}

// LoadFleet reads and parses a fleet file.
func LoadFleet(path string) (FleetConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return FleetConfig{}, fmt.Errorf("sim: fleet: %w", err)
	}
	fc, err := ParseFleet(data)
	if err != nil {
		return FleetConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return fc, nil
}

// ParseFleet parses a fleet file's contents (format above).
func ParseFleet(data []byte) (FleetConfig, error) {
	// Pass one, strict: unknown fields and wrong types, with line numbers.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var strict fleetFile
	if err := dec.Decode(&strict); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return FleetConfig{}, fmt.Errorf("%w: %s", errFleet, yamlkeys.NameErrors(data, reflect.TypeFor[fleetFile](), te))
		}
		return FleetConfig{}, fmt.Errorf("%w: %w", errFleet, err)
	}
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc)
	if path, written, why := yamlkeys.WrittenZero(&doc, reflect.TypeFor[fleetFile](), unsetZero); why != "" {
		return FleetConfig{}, fmt.Errorf("%w: %s = %s %s", errFleet, path, yamlkeys.Quote(written), why)
	}
	// Pass two: each pod overlays the defaults, which overlay Physics'.
	var nodes struct {
		Defaults yaml.Node   `yaml:"defaults"`
		Pods     []yaml.Node `yaml:"pods"`
	}
	if err := yaml.Unmarshal(data, &nodes); err != nil {
		return FleetConfig{}, fmt.Errorf("%w: %w", errFleet, err)
	}
	if len(nodes.Pods) == 0 {
		return FleetConfig{}, fmt.Errorf("%w: pods is empty", errFleet)
	}
	base := podFile{Physics: physicsFileOf(DefaultPhysics())}
	if !nodes.Defaults.IsZero() {
		if err := nodes.Defaults.Decode(&base); err != nil {
			return FleetConfig{}, fmt.Errorf("%w: defaults: %w", errFleet, err)
		}
	}
	var fc FleetConfig
	prompts := prompt.Loaded{} // pods with one tokenizer share it
	names := map[string]int{}
	listens := map[string]int{}
	for i := range nodes.Pods {
		pf := base
		if err := nodes.Pods[i].Decode(&pf); err != nil {
			return FleetConfig{}, fmt.Errorf("%w: pods[%d]: %w", errFleet, i, err)
		}
		if pf.Name == "" {
			pf.Name = fmt.Sprintf("pod-%d", i)
		}
		c := pf.config().withDefaults()
		var err error
		if c.Prompt, err = prompts.Load(prompt.Config{Tokenizer: pf.Tokenizer, ChatTemplate: pf.ChatTemplate, ChatTemplateKwargs: pf.ChatTemplateArgs}); err != nil {
			return FleetConfig{}, podError(&nodes.Defaults, &nodes.Pods[i], i, c.Name, promptError(err))
		}
		if err := c.Validate(); err != nil {
			return FleetConfig{}, podError(&nodes.Defaults, &nodes.Pods[i], i, c.Name, err)
		}
		if j, dup := names[c.Name]; dup {
			return FleetConfig{}, fmt.Errorf("%w: pods[%d].name = %q repeats pods[%d].name", errFleet, i, c.Name, j)
		}
		names[c.Name] = i
		if j, dup := listens[c.Listen]; dup && !hasZeroPort(c.Listen) {
			return FleetConfig{}, fmt.Errorf("%w: pods[%d].listen = %q repeats pods[%d].listen", errFleet, i, c.Listen, j)
		}
		listens[c.Listen] = i
		ev, err := publisherOf(pf, c.Engine, c.DataParallelSize)
		if err != nil {
			return FleetConfig{}, podError(&nodes.Defaults, &nodes.Pods[i], i, c.Name, err)
		}
		fc.Pods = append(fc.Pods, c)
		fc.Events = append(fc.Events, ev)
	}
	return fc, nil
}

// promptError is err, from loading a pod's tokenizer and chat template,
// as a fieldError of the setting at fault.
func promptError(err error) error {
	var se *prompt.SettingError
	if !errors.As(err, &se) {
		return err
	}
	return &fieldError{errConfig, se.Setting, yamlkeys.Quote(se.Value), "cannot be loaded: " + se.Err.Error()}
}

// publisherOf is the KV-event publisher a pod of engine and ranks asks for
// with kv_events and kv_replay, publishing as that engine does; the replay
// socket defaults to the port after the ranks' PUB ports, as vLLM's 5557
// and 5558 for one rank. Its errors are fieldErrors.
func publisherOf(p podFile, engine engines.Kind, ranks int) (vllm.PublisherConfig, error) {
	bad := func(key string, v any, why string) error {
		return &fieldError{errConfig, key, yamlkeys.Quote(v), why}
	}
	if p.KVEvents == "" {
		if p.KVReplay != "" {
			return vllm.PublisherConfig{}, bad("kv_replay", p.KVReplay, "needs kv_events")
		}
		return vllm.PublisherConfig{}, nil
	}
	c := vllm.PublisherConfig{Endpoint: p.KVEvents, ReplayEndpoint: p.KVReplay, Engine: engine}
	host, port, ok := splitEndpoint(p.KVEvents)
	switch {
	case !ok:
		return c, bad("kv_events", p.KVEvents, "must be tcp://host:port")
	case p.KVReplay != "":
		rpHost, rpPort, ok := splitEndpoint(p.KVReplay)
		if !ok {
			return c, bad("kv_replay", p.KVReplay, "must be tcp://host:port")
		}
		if port == 0 || rpPort == 0 { // free ports meet nothing
			break
		}
		r := engines.RankPorts{Ranks: ranks, EventsHost: host, EventsPort: port, ReplayHost: rpHost, ReplayPort: rpPort,
			Replay: "kv_replay's port", ReplaySetting: "kv_replay"}
		switch setting, why := r.Problem(); setting {
		case "data_parallel_size":
			return c, bad(setting, ranks, why)
		case "kv_replay":
			return c, bad(setting, p.KVReplay, why)
		}
	case port != 0 && port+ranks > 65535:
		return c, bad("data_parallel_size", ranks, fmt.Sprintf("puts the replay socket on port %d (kv_events' port + %d), past 65535: set kv_replay", port+ranks, ranks))
	default:
		if port != 0 { // else both pick a free port
			port += ranks
		}
		c.ReplayEndpoint = "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
	}
	return c, nil
}

// splitEndpoint splits tcp://host:port, whose port is 0 (a free one) to
// 65535.
func splitEndpoint(ep string) (host string, port int, ok bool) {
	hostPort, ok := strings.CutPrefix(ep, "tcp://")
	host, p, err := net.SplitHostPort(hostPort)
	port, perr := strconv.Atoi(p)
	return host, port, ok && err == nil && perr == nil && port >= 0 && port <= 65535
}

// hasZeroPort reports a listen address that picks a free port, which any
// number of pods may share.
func hasZeroPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}

// Fleet is a set of running pods and their KV-event publishers.
type Fleet struct {
	pods []*Pod
	pubs [][]*vllm.Publisher // pubs[i] are pods[i]'s, one per rank, or none
}

// StartFleet starts every pod of fc, in order, each after its KV-event
// publisher; if one fails, it closes those already started and returns the
// error.
func StartFleet(fc FleetConfig) (*Fleet, error) {
	f := &Fleet{}
	for i, c := range fc.Pods {
		var pubs []*vllm.Publisher
		if i < len(fc.Events) && fc.Events[i].Endpoint != "" {
			var err error
			if pubs, err = vllm.StartRanks(fc.Events[i], max(c.DataParallelSize, 1)); err != nil {
				return nil, errors.Join(fmt.Errorf("sim: pod %s: kv_events: %w", c.Name, err), f.Close())
			}
			c.KVEvents = pubs[0]
			for _, pub := range pubs[1:] {
				c.RankKVEvents = append(c.RankKVEvents, pub)
			}
		}
		p, err := Start(c)
		if err != nil {
			return nil, errors.Join(err, closePublishers(pubs), f.Close())
		}
		f.pods = append(f.pods, p)
		f.pubs = append(f.pubs, pubs)
	}
	return f, nil
}

// Publisher is pod i's KV-event publisher (its rank 0's), nil if it has
// none.
func (f *Fleet) Publisher(i int) *vllm.Publisher {
	if len(f.pubs[i]) == 0 {
		return nil
	}
	return f.pubs[i][0]
}

func closePublishers(pubs []*vllm.Publisher) error {
	var err error
	for _, p := range pubs {
		err = errors.Join(err, p.Close())
	}
	return err
}

// Pods returns the running pods in fleet-file order. The slice is the
// fleet's own; do not modify it.
func (f *Fleet) Pods() []*Pod { return f.pods }

// Close closes every pod, concurrently (each waits for its streams to end),
// and returns their errors joined.
func (f *Fleet) Close() error {
	errs := make([]error, len(f.pods))
	var wg sync.WaitGroup
	for i, p := range f.pods {
		wg.Go(func() {
			errs[i] = p.Close()
			// After the pod: its scheduler no longer publishes.
			errs[i] = errors.Join(errs[i], closePublishers(f.pubs[i]))
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

package sim

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"pdlb/engines"
	"pdlb/engines/prompt"
	"pdlb/internal/yamlkeys"
)

// Defaults of a pod's Config.
const (
	DefaultModel            = "sim-model"
	DefaultListen           = "127.0.0.1:0"
	DefaultSpeedup          = 1.0
	DefaultMaxTokens        = 128
	DefaultMaxModelLen      = 32768
	DefaultTick             = 2 * time.Millisecond
	DefaultRole             = RoleCombined
	DefaultKVScale          = 1.0 / 1024
	DefaultKVTimeout        = 480 * time.Second // vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT
	DefaultDataParallelSize = 1
	defaultNamePrefix       = "sim-"
	maxSpeedup              = 1e6
	maxModelNameLen         = 256
)

// Roles a pod plays in prefill/decode disaggregation.
const (
	// RoleCombined prefills and decodes its own requests and ignores PD
	// fields, as an engine started without a KV connector does.
	RoleCombined = "combined"
	// RolePrefill serves prefill legs: it computes the prompt's KV and
	// holds it for a decode pod to pull. Plain requests it serves as a
	// combined pod would, as vLLM does.
	RolePrefill = "prefill"
	// RoleDecode serves decode legs, pulling the KV before decoding, and
	// plain requests.
	RoleDecode = "decode"
)

// Config describes one simulated pod. Zero fields take their defaults in
// Start; Validate checks a config after defaults.
type Config struct {
	// Name identifies the pod in logs and fleet listings (default "sim-" and
	// the listen address).
	Name string
	// Model is the one model name the pod serves (default "sim-model");
	// requests naming another get vLLM's 404.
	Model string
	// Engine is the engine the pod plays: its metric names, extra endpoints
	// and /metrics format (default vllm).
	Engine engines.Kind
	// Listen is the host:port to listen on; port 0 picks a free port
	// (default "127.0.0.1:0").
	Listen string
	// Physics is the timing model (default DefaultPhysics() when every
	// field is zero).
	Physics Physics
	// Speedup divides every simulated duration: at 10 a 1 s prefill takes
	// 100 ms of wall time (default 1). Metrics and usage report simulated
	// seconds, as the engine being imitated would.
	Speedup float64
	// Seed selects the output text: pods with equal seeds answer equal
	// prompts with equal text (default 0).
	Seed uint64
	// HashSeed salts the engine's KV block hashes, as PYTHONHASHSEED does
	// vLLM's (default 0): pods with equal HashSeed and model report equal
	// hashes for equal blocks. See engineSeed.
	HashSeed uint64
	// DefaultMaxTokens is the output length of a request that sets neither
	// max_tokens nor max_completion_tokens: the simulated model's natural
	// answer length, ending with finish_reason "stop" (default 128).
	DefaultMaxTokens int
	// MaxModelLen is the context window in tokens, prompt plus output
	// (default 32,768); it must fit in the KV cache.
	MaxModelLen int
	// Tick is the least wall time between two scheduler wake-ups for
	// decode steps (default 2 ms); a prefill's end, which produces a first
	// token, wakes it exactly. Tokens decoded within one tick reach a
	// stream together in one chunk, as vLLM merges the deltas of a consumer
	// that lags; simulated timings stay exact whatever the tick.
	Tick time.Duration
	// Role is "combined", "prefill" or "decode" (default "combined"); see
	// the Role constants and pd.go for what each does with PD legs.
	Role string
	// BootstrapPort is the port of a prefill pod's KV transfer server: for
	// SGLang its bootstrap server, which decode pods reach at the
	// bootstrap_host and bootstrap_port of a request. 0 picks a free port
	// (the default; real SGLang uses 8998, and the pod reports its port as
	// disaggregation_bootstrap_port in /get_server_info).
	BootstrapPort int
	// KVXferListen is the host:port of a prefill pod's KV transfer server
	// (default Listen's host and BootstrapPort). Only prefill pods listen.
	KVXferListen string
	// KVScale is the fraction of the KV cache's bytes (tokens ×
	// Physics.KVBytesPerToken) a transfer really moves, so tests and demos
	// stay light (default 1/1024). Transfers are paced to take the time
	// Physics' link gives the full size.
	KVScale float64
	// KVTimeout is how long a prefill pod holds KV for pickup, and how long
	// a decode pod of a push-style protocol (SGLang, TensorRT-LLM
	// generation_first) waits for it (default 480 s).
	KVTimeout time.Duration
	// DataParallelSize is the number of engine ranks behind the pod's one
	// API server, as vLLM's --data-parallel-size with its internal load
	// balancer (default 1). A request goes to the rank its
	// X-Data-Parallel-Rank header names, else to the one the engine's API
	// server picks: the least loaded on vLLM, the next in turn on SGLang
	// (a prefill pod: its bootstrap room's, modulo the ranks) and
	// TensorRT-LLM. Each rank is an engine core of its own: it has
	// Physics.MaxBatch slots and a KV cache of Physics.CacheBlocks,
	// prefills one request at a time and decodes its own batch, at
	// Physics' speeds, reports its own load and publishes its own KV
	// events.
	DataParallelSize int
	// KVEvents receives the prefix cache's stored, removed and cleared
	// blocks (default nil: no events); on a pod of several ranks, rank
	// 0's.
	KVEvents KVEventSink
	// RankKVEvents receive the events of ranks 1, 2 and on, in order
	// (default none: those ranks publish nothing).
	RankKVEvents []KVEventSink
	// Prompt is the model's tokenizer and chat template, so the pod counts
	// and caches the ids the real engine would (default nil: the stand-in
	// tokenizer the gateway also defaults to).
	Prompt *prompt.Model
	// EnableLoRA serves LoRA adapters, as vLLM's --enable-lora (default
	// false; true when LoRAModules lists any): requests name them in
	// "model", and the load and unload endpoints register more (lora.go).
	EnableLoRA bool
	// LoRAModules are the adapters served from the start, as vLLM's
	// --lora-modules (default none).
	LoRAModules []LoRAModule
	// MaxLoras is how many adapters the pod holds in GPU slots at once,
	// as vLLM's --max-loras (default 1 when it serves adapters).
	MaxLoras int
	// Tracer, when set, traces every generation request, continuing the
	// caller's traceparent (default nil: no spans; see trace.go).
	Tracer trace.Tracer
	// ResponsesStore keeps the Responses API's stored responses in the
	// pod's memory, as VLLM_ENABLE_RESPONSES_API_STORE=1 does vLLM's
	// (default false: nothing kept, follow-ups and retrievals get 404).
	ResponsesStore bool
	// APIKey, when set, must come as Authorization: Bearer on every path
	// the engine guards with its --api-key (vLLM: all but /health, /ping,
	// /load, /version, /metrics; SGLang: all but /health* and /metrics*),
	// else 401 (default "": none). trtllm-serve has no such option.
	APIKey string
}

var errConfig = errors.New("sim: invalid config")

// fieldError refuses one setting, by its key in a fleet file
// ("physics.max_batch"), so that ParseFleet can name where the file
// wrote it.
type fieldError struct {
	kind  error // errConfig or errPhysics
	field string
	value string // as printed
	why   string
}

func (e *fieldError) Error() string {
	return fmt.Sprintf("%v: %s = %s %s", e.kind, e.field, e.value, e.why)
}

func (e *fieldError) Unwrap() error { return e.kind }

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Engine == "" {
		c.Engine = engines.VLLM
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Physics == (Physics{}) {
		c.Physics = DefaultPhysics()
	}
	if c.Speedup == 0 {
		c.Speedup = DefaultSpeedup
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = DefaultMaxModelLen
	}
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.Role == "" {
		c.Role = DefaultRole
	}
	if c.Name == "" {
		c.Name = defaultNamePrefix + c.Listen
	}
	if c.KVXferListen == "" {
		if host, _, err := net.SplitHostPort(c.Listen); err == nil {
			c.KVXferListen = net.JoinHostPort(host, strconv.Itoa(c.BootstrapPort))
		}
	}
	if c.KVScale == 0 {
		c.KVScale = DefaultKVScale
	}
	if c.KVTimeout == 0 {
		c.KVTimeout = DefaultKVTimeout
	}
	if c.DataParallelSize == 0 {
		c.DataParallelSize = DefaultDataParallelSize
	}
	c.loraDefaults()
	return c
}

// Validate rejects a config the pod cannot run with, naming the field and
// quoting its value. It does not apply defaults: call it on a config whose
// zero fields were filled (Start does both).
func (c Config) Validate() error {
	bad := func(field string, v any, why string) error {
		return &fieldError{errConfig, field, yamlkeys.Quote(v), why}
	}
	if c.Model == "" || len(c.Model) > maxModelNameLen || strings.ContainsAny(c.Model, "\"\\\n") {
		return bad("model", c.Model, "must be 1 to 256 characters without quotes, backslashes or newlines")
	}
	if _, err := engines.ParseKind(string(c.Engine)); err != nil || c.Engine == "" {
		return bad("engine", c.Engine, "must be vllm, sglang or trtllm")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return bad("listen", c.Listen, "must be host:port")
	}
	if err := c.Physics.Validate(); err != nil {
		return fmt.Errorf("%w: physics: %w", errConfig, err)
	}
	if !(c.Speedup > 0) || c.Speedup > maxSpeedup {
		return bad("speedup", c.Speedup, "must be in (0, 1e6]")
	}
	if c.DefaultMaxTokens < 1 {
		return bad("default_max_tokens", c.DefaultMaxTokens, "must be at least 1")
	}
	if c.MaxModelLen < 2 {
		return bad("max_model_len", c.MaxModelLen, "must be at least 2")
	}
	if blocks := c.Physics.Blocks(c.MaxModelLen); blocks > c.Physics.CacheBlocks {
		return bad("max_model_len", c.MaxModelLen, fmt.Sprintf("needs %d KV blocks, more than cache_blocks = %d", blocks, c.Physics.CacheBlocks))
	}
	if c.Tick <= 0 {
		return bad("tick", c.Tick, "must be positive")
	}
	if c.Role != RoleCombined && c.Role != RolePrefill && c.Role != RoleDecode {
		return bad("role", c.Role, "must be combined, prefill or decode")
	}
	if c.BootstrapPort < 0 || c.BootstrapPort > 65535 {
		return bad("bootstrap_port", c.BootstrapPort, "must be 0 (a free port) to 65535")
	}
	if _, _, err := net.SplitHostPort(c.KVXferListen); err != nil {
		return bad("kvxfer_listen", c.KVXferListen, "must be host:port")
	}
	if !(c.KVScale > 0) || c.KVScale > 1 {
		return bad("kv_scale", c.KVScale, "must be in (0, 1]")
	}
	if c.KVTimeout <= 0 {
		return bad("kv_timeout", c.KVTimeout, "must be positive")
	}
	if c.DataParallelSize < 1 {
		return bad("data_parallel_size", c.DataParallelSize, "must be at least 1")
	}
	if len(c.RankKVEvents) >= c.DataParallelSize {
		return bad("data_parallel_size", c.DataParallelSize, fmt.Sprintf("leaves no rank for RankKVEvents[%d]", c.DataParallelSize-1))
	}
	if c.APIKey != "" && c.Engine == engines.TRTLLM {
		// The key itself is not printed.
		return bad("api_key", "(set)", "must be empty for trtllm: trtllm-serve has no API key")
	}
	return c.validateLoRA(bad)
}

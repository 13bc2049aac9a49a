// Package config is the gateway's configuration: Default, then the
// environment, the YAML file and flags, then Provision (the defaults of
// fields whose empty value means one), then Validate, then frozen. Validate
// only checks: it names the field and quotes the value it rejects and never
// corrects one.
//
// A new field gets its default as a named constant, set in Default when
// the default is a value the user may also write, or in the Provision of
// its type when "empty means X" (a pod's name is its address); its rule in
// the Validate of its type; and "(default X)" in its doc comment.
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"pdlb/engines"
	"pdlb/engines/chat"
	"pdlb/engines/prompt"
	"pdlb/internal/yamlkeys"
	"pdlb/lb/admit"
	"pdlb/lb/discovery/spec"
	"pdlb/lb/limits"
	"pdlb/lb/route"
	"pdlb/ledger"
	"pdlb/radix"
)

// Defaults, as named constants so the docs and the code cannot disagree.
const (
	DefaultListen             = ":8080"
	DefaultAdmin              = "127.0.0.1:9090"
	DefaultFrontend           = "gnet"
	DefaultMaxBodyBytes       = 8 << 20
	DefaultMaxHeaderBytes     = 8 << 10
	DefaultMaxHeaders         = 100
	DefaultClientReadTimeout  = 30 * time.Second
	DefaultClientIdleTimeout  = 90 * time.Second
	DefaultMaxStoredResponses = 100000
	DefaultPolicy             = route.DefaultPolicy
	DefaultBlockSize          = radix.DefaultBlockSize
	DefaultPrefillSpeed       = 20000
	DefaultDataParallelSize   = 1
	// The values of Pod.DataParallelRouting.
	DataParallelByPrefix      = spec.DataParallelByPrefix
	DataParallelByEngine      = spec.DataParallelByEngine
	DefaultConnectTimeout     = 2 * time.Second
	DefaultResponseTimeout    = 60 * time.Second
	DefaultWholeTimeout       = 10 * time.Minute
	DefaultStreamIdleTimeout  = 120 * time.Second
	DefaultKeepaliveTimeout   = 4 * time.Second
	DefaultRetries            = 1
	DefaultHealthInterval     = 2 * time.Second
	DefaultHealthTimeout      = time.Second
	DefaultMetricsInterval    = time.Second
	DefaultEjectAfterFailures = 3
	DefaultUnhealthyAfter     = 3
	DefaultEjectionTime       = 10 * time.Second
	DefaultMaxEjectedPercent  = 50
	DefaultMaxConnsPerPod     = 1024
	DefaultMaxResponseBytes   = 64 << 20
	DefaultRedisKeyPrefix     = ledger.DefaultKeyPrefix
)

// Roles a pod can play (AIBrix's role-name label; "combined" runs both
// phases).
const (
	RoleCombined = "combined"
	RolePrefill  = "prefill"
	RoleDecode   = "decode"
)

// Config is the whole gateway configuration.
type Config struct {
	// Listen is the address of the OpenAI API (default ":8080").
	Listen string `yaml:"listen"`
	// Admin is the address of /metrics, /debug/pprof and /admin (default
	// "127.0.0.1:9090"); empty disables it.
	Admin string `yaml:"admin"`
	// Metrics is the address of a listener that serves only GET /metrics,
	// to anyone (default "": off), for scrapers that cannot send
	// admin_token, such as Prometheus' pod annotations, while the admin
	// listener, with pprof and /admin, stays on loopback.
	Metrics string `yaml:"metrics"`
	// Frontend is the server that accepts clients: gnet (default: an
	// event loop per core, completions served on the loops) or
	// fasthttp (a goroutine per connection).
	Frontend string `yaml:"frontend"`
	// IOURing (default true) has gnet's loops batch their sends and
	// receives with io_uring where the kernel allows (Linux 5.18 or
	// later, not turned off by kernel.io_uring_disabled or a seccomp
	// profile; else they make a system call each, and say so at the
	// start); false makes a system call each always.
	IOURing bool `yaml:"io_uring"`
	// AccessLog is where one JSON line per request goes: a file path
	// (appended to; reopened on SIGUSR1 for rotation), "-" for standard
	// output, or "" (default) for none.
	AccessLog string `yaml:"access_log"`
	// MaxBodyBytes is the largest request body accepted (default 8 MiB);
	// larger ones get 413.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// MaxHeaderBytes is the largest request line and header block accepted
	// (default 8 KiB); larger ones get 431. A pod's answer head is held to
	// it too: a larger one fails the attempt (502).
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxHeaders is the most header fields a request may carry (default
	// 100); more get 431.
	MaxHeaders int `yaml:"max_headers"`
	// ClientReadTimeout bounds reading one request's headers and body
	// (default 30s), so a slow client cannot hold a connection; ClientIdleTimeout
	// closes keep-alive connections idle this long (default 90s).
	ClientReadTimeout time.Duration `yaml:"client_read_timeout"`
	ClientIdleTimeout time.Duration `yaml:"client_idle_timeout"`
	// MaxInFlight caps the requests the gateway works on at once (default 0,
	// no cap); past it requests are shed at once with 429 and Retry-After
	// rather than queued until they time out.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxStoredResponses is how many stored responses (the Responses API's
	// store, on by default) the gateway remembers the pod of, so that a
	// follow-up naming one (previous_response_id) and a retrieval or
	// cancel by its id reach that pod, the only one holding it; past it
	// the oldest is forgotten (default 100000, about 15 MB). 0 remembers
	// none.
	MaxStoredResponses int `yaml:"max_stored_responses"`
	// Upstream bounds the calls to pods.
	Upstream Upstream `yaml:"upstream"`
	// Health configures active checks, scrapes and passive ejection.
	Health Health `yaml:"health"`
	// Admission rejects early what cannot meet its latency target.
	Admission Admission `yaml:"admission"`
	// TokenLoad holds the token ledgers' knobs (AIBrix's AIBRIX_TOKEN_LOAD_*
	// and friends; see ledger.Config for each default).
	TokenLoad ledger.Config `yaml:"token_load"`
	// Redis, when Address is set, shares the decode ledger between gateway
	// replicas.
	Redis Redis `yaml:"redis"`
	// PD holds the prefill/decode cascade's knobs (AIBrix's AIBRIX_*
	// variables, with their defaults and names in lower case without the
	// prefix; see route.PDOptions), the defaults of every model's profiles.
	PD route.PDOptions `yaml:"pd"`
	// Models lists per-model settings; a model served by some pod but not
	// listed gets every default.
	Models []Model `yaml:"models"`
	// Aliases are public names of models and adapters (default none).
	Aliases []Alias `yaml:"aliases"`
	// Pods is the static fleet; discovery adds to it.
	Pods []Pod `yaml:"pods"`
	// Access holds client API keys with their rate limits (api_keys), the
	// per-IP connection limits (limits) and the admin listener's bearer
	// token (admin_token), inline at the top level.
	Access limits.Config `yaml:",inline"`
	// Discovery finds pods in Kubernetes (AIBrix's labels and
	// annotations) or DNS, and follows them as they come and go.
	Discovery spec.Discovery `yaml:"discovery"`
	// Plan is the xPyD planner acting on the running fleet (plan.go).
	Plan Plan `yaml:"plan"`
	// Tracing configures OpenTelemetry spans and decision explanations.
	Tracing Tracing `yaml:"tracing"`
	// TLS and HTTP2 are the listeners' TLS and HTTP/2 (tls.go).
	TLS   TLS   `yaml:"tls"`
	HTTP2 HTTP2 `yaml:"http2"`
	// CORS answers browsers' cross-origin calls (cors.go).
	CORS CORS `yaml:"cors"`
}

// Upstream bounds the gateway's calls to pods.
type Upstream struct {
	// ConnectTimeout bounds dialing a pod (default 2s).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// ResponseTimeout bounds the wait for a stream's first event, its
	// time to first token (default 60s): engines send its headers at
	// once, before the prefill. Past it the client gets 504. It bounds
	// the whole answer of a call about a stored response (retrieve,
	// cancel, delete, input_items), a look-up engines answer at once.
	ResponseTimeout time.Duration `yaml:"response_timeout"`
	// WholeResponseTimeout bounds the wait for a non-streaming answer
	// (default 10m), but a stored response's (ResponseTimeout). Engines
	// send it only when the whole generation is done, so it must cover
	// the longest max_tokens at the slowest decode: 4,000 tokens at 20
	// per second take 200 s.
	WholeResponseTimeout time.Duration `yaml:"whole_response_timeout"`
	// MaxResponseBytes caps a non-streaming answer, which the gateway reads
	// whole before it answers (default 64 MiB; a streamed one is relayed as
	// it comes and has no cap). Past it the client gets 502: a pod must not
	// be able to make the gateway's memory grow without bound.
	MaxResponseBytes int `yaml:"max_response_bytes"`
	// StreamIdleTimeout is the longest gap allowed between two chunks of a
	// stream (default 120s); past it the stream is cut with an error event.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// Retries is how many other pods a request may be retried on after a
	// failure retry_on lists (default 1). The search for a stored
	// response asks each pod once whatever it says: no retry.
	Retries int `yaml:"retries"`
	// MaxConnsPerPod caps the keep-alive pool to one pod (default 1024).
	MaxConnsPerPod int `yaml:"max_conns_per_pod"`
	// KeepaliveTimeout closes a connection to a pod idle this long (default
	// 4s). It must be shorter than the pod's own: uvicorn, the HTTP server
	// of vLLM, SGLang and trtllm-serve, closes one idle for 5 s, and a
	// request sent on a connection the pod already closed fails with 502.
	KeepaliveTimeout time.Duration `yaml:"keepalive_timeout"`
	// XForwardedFor appends the client's address to the X-Forwarded-For
	// header the pods get (default true), as Envoy at the edge and nginx's
	// $proxy_add_x_forwarded_for do, so the engines' own logs name the
	// client; false passes the client's header, if any, unchanged.
	XForwardedFor bool `yaml:"x_forwarded_for"`
	// Retry: retry_on, retry_budget and first_byte (retry.go).
	Retry `yaml:",inline"`
	// TLS is how pods with an https:// address are dialed (tls.go).
	TLS UpstreamTLS `yaml:"tls"`
}

// Health configures how pods are checked.
type Health struct {
	// Interval between active GET /health checks of each pod (default 2s).
	Interval time.Duration `yaml:"interval"`
	// Timeout of one check, and of one scrape of /metrics (default 1s). It
	// may exceed Interval, as Envoy's and HAProxy's may: the next check
	// starts Interval after one ends (pool.Checker), so checks never
	// overlap, and a busy engine's late /health is waited for longer.
	Timeout time.Duration `yaml:"timeout"`
	// UnhealthyAfter is how many checks in a row must fail (time out,
	// break, answer other than 200) before a pod is marked unhealthy
	// (default 3, as HAProxy's fall); a refused connection marks it at
	// once. An engine's API server answers /health late when it is busy
	// (Python serving thousands of streams): one slow check taking a loaded
	// pod out would move its load onto the others, whose checks then slow
	// down in turn; three in a row do as well under sustained load, so a
	// check that times out while the pod answers requests is not counted
	// at all. One passing check marks a pod healthy again.
	UnhealthyAfter int `yaml:"unhealthy_after"`
	// MetricsInterval between scrapes of each pod's /metrics (default 1s);
	// 0 turns scraping off.
	MetricsInterval time.Duration `yaml:"metrics_interval"`
	// EjectAfterFailures is how many consecutive failed requests or checks
	// eject a pod (default 3). A 503 answer is load shed, not a failure.
	EjectAfterFailures int `yaml:"eject_after_failures"`
	// EjectionTime is how long an ejected pod receives no traffic before it
	// is tried again (default 10s).
	EjectionTime time.Duration `yaml:"ejection_time"`
	// MaxEjectedPercent caps the share of a model's pods ejected at once
	// (default 50); one pod may always be. Past it a failing pod stays in:
	// when most pods fail together the cause is rarely the pods (an
	// overload, the network), and ejecting them would pile their load on
	// the rest, which then fail in turn. Envoy's outlier detection caps at
	// 10%, but a model has a handful of pods, where 10% ejects one and
	// keeps a second dead or hung pod in.
	MaxEjectedPercent int `yaml:"max_ejected_percent"`
	// PanicRouting (default true): a model left no pod available still
	// serves, as Envoy's panic threshold routes across every host once
	// too few are healthy: a first attempt (a prefill/decode pair's too)
	// goes to the pods whose checks pass, whatever their breaker; a retry
	// to the pods it has not tried, whatever their state. false answers
	// 503 then, as Envoy's healthy_panic_threshold of 0 does: an engine
	// that fails every request while its /health passes gets no traffic
	// for its ejection time.
	PanicRouting bool `yaml:"panic_routing"`
}

// Admission configures early rejection: a request whose best pod's
// predicted time to first token misses its class's target is answered 429
// at once (or, for classes with a max_wait, waits in a bounded queue for the
// prediction to clear). The class comes from the x-priority header
// (interactive, the default, or batch).
type Admission struct {
	// Enabled turns admission on (default false: every request is sent).
	Enabled bool `yaml:"enabled"`
	// Interactive and Batch are the classes' targets (defaults: interactive
	// TTFT 2 s, TPOT 0.1 s, no waiting; batch TTFT 60 s, waits up to 30 s).
	Interactive admit.ClassConfig `yaml:"interactive"`
	Batch       admit.ClassConfig `yaml:"batch"`
	// DeferQueue bounds the requests waiting for admission (default 1,024).
	DeferQueue int `yaml:"defer_queue"`
}

// AdmitConfig is the admission controller's configuration.
func (a Admission) AdmitConfig() admit.Config {
	c := admit.Config{DeferQueue: a.DeferQueue}
	c.Classes[admit.Interactive] = a.Interactive
	c.Classes[admit.Batch] = a.Batch
	return c
}

// Redis locates the Redis server shared by gateway replicas.
type Redis struct {
	// Address is host:port; empty keeps every ledger, and the api_keys'
	// rate limits, local to the replica.
	Address string `yaml:"address"`
	// ReplicaID names this replica in Redis (default: 16 random hex
	// digits, new at each start). Replicas must not share one: each
	// replaces the entry under its id and ignores the load published
	// under it as its own.
	ReplicaID string `yaml:"replica_id"`
	// KeyPrefix namespaces the keys in Redis (default "pdlb"). Replicas of
	// one gateway share it; gateways that share a Redis server but not
	// their load need distinct ones, or each adds the other's load on pods
	// of the same name to its own.
	KeyPrefix string `yaml:"key_prefix"`
}

// Model holds per-model routing settings.
type Model struct {
	// Name is the model name clients send.
	Name string `yaml:"name"`
	// Policy picks combined pods (default slo_cache; see route.Names).
	Policy string `yaml:"policy"`
	// BlockSize is the number of tokens one prefix-index block covers
	// (default 16, vLLM's default block size). Pods' KV events may use any
	// multiple of it.
	BlockSize int `yaml:"block_size"`
	// RoutingStrategy is "pd" (the prefill/decode cascade, with combined
	// pods as fallback and overflow) or a policy name over the combined
	// pods (default: "pd" when the model has prefill or decode pods, else
	// the policy above). The routing-strategy request header overrides it.
	RoutingStrategy string `yaml:"routing_strategy"`
	// LockedRoutingStrategy, when set, is used whatever the
	// routing-strategy header says (AIBrix's lockedRoutingStrategy).
	LockedRoutingStrategy string `yaml:"locked_routing_strategy"`
	// DefaultProfile names the profile of requests without a known
	// config-profile header (default "default", else the first).
	DefaultProfile string `yaml:"default_profile"`
	// Profiles are the model's routing profiles (default: one, "default",
	// with the pd section's knobs).
	Profiles []Profile `yaml:"profiles"`
	// Tokenizer is a directory in the Hugging Face layout
	// (tokenizer.json, tokenizer_config.json, chat_template.jinja), as
	// vLLM's --tokenizer: the gateway then renders and tokenizes prompts
	// exactly as the engine does, so block keys match the pods' KV events
	// (default "": the stand-in, 4 bytes a token, which no engine
	// matches; routing then learns only from the gateway's own picks).
	Tokenizer string `yaml:"tokenizer"`
	// ChatTemplate replaces the tokenizer's chat template: a file, or the
	// template itself, as vLLM's --chat-template (default "").
	ChatTemplate string `yaml:"chat_template"`
	// ChatTemplateKwargs are defaults under each request's
	// chat_template_kwargs, as vLLM's --default-chat-template-kwargs
	// (default none).
	ChatTemplateKwargs map[string]any `yaml:"chat_template_kwargs"`
	// MessagesInlineSystem is where the model's vLLM puts the system-role
	// messages inside an Anthropic Messages request's messages, which
	// newer Claude Code sends most turns: "hoist" (earlier releases, into
	// the leading system message) or "preserve" (newer releases that log
	// "Anthropic inline system messages will be kept in place"). Default
	// "": not known, and such a request is routed without the KV-event
	// index.
	MessagesInlineSystem string `yaml:"messages_inline_system"`
	// LoRA: the model's adapters, their slots and its fallbacks.
	LoRA `yaml:",inline"`
	// PodKey is the API key of the model's pods, discovered ones
	// included, but those with their own.
	PodKey `yaml:",inline"`
}

// Pod is one inference pod.
type Pod struct {
	// Name identifies the pod in metrics and headers (default: its address).
	Name string `yaml:"name"`
	// Model is the model the pod serves.
	Model string `yaml:"model"`
	// Address is host:port of its OpenAI API; https://host:port sets TLS.
	Address string `yaml:"address"`
	// TLS dials the pod with TLS (default false; see Upstream.TLS).
	TLS bool `yaml:"tls"`
	// Engine is vllm (default), sglang or trtllm.
	Engine string `yaml:"engine"`
	// Role is combined (default), prefill or decode.
	Role string `yaml:"role"`
	// Roleset pairs prefill and decode pods.
	Roleset string `yaml:"roleset"`
	// BucketMin and BucketMax bound the prompt lengths (tokens, inclusive)
	// the pod serves when bucketing is on; BucketMax 0 means unlimited.
	BucketMin int `yaml:"bucket_min"`
	BucketMax int `yaml:"bucket_max"`
	// Weight scales the pod's share of traffic (default 1).
	Weight float64 `yaml:"weight"`
	// KVEvents is the pod's KV-event publisher, tcp://host:port (vLLM's
	// default port is 5557; the replay socket is assumed on 5558 of the
	// same host). Empty: the gateway learns the pod's cache only from its
	// own routing decisions.
	KVEvents string `yaml:"kv_events"`
	// KVReplay is the pod's KV-event replay socket, tcp://host:port
	// (default: the kv_events host, port 5558).
	KVReplay string `yaml:"kv_replay"`
	// DataParallelSize is the number of engine ranks behind the pod's one
	// API server, as vLLM's --data-parallel-size with its internal load
	// balancer (default 1). Each rank caches on its own and publishes its
	// KV events on kv_events' and kv_replay's ports + its rank; the
	// gateway follows every rank, and a block any rank holds is the pod's.
	DataParallelSize int `yaml:"data_parallel_size"`
	// DataParallelRouting says how a request picks among the ranks of a
	// vLLM or SGLang pod of several, when the pod publishes KV events:
	// "prefix" (default) sends it to the rank holding strictly the
	// longest prefix of its prompt (X-Data-Parallel-Rank; an SGLang
	// pair: its bootstrap room), else leaves it to the engine's
	// balancer; "engine" always leaves it to the engine.
	DataParallelRouting string `yaml:"data_parallel_routing"`
	// CacheBlocks bounds what the gateway assumes the pod caches, in
	// blocks of the model's block_size (default 0: unlimited). Set it to
	// the engine's KV capacity when the pod publishes no KV events, so the
	// index forgets what the pod must have evicted.
	CacheBlocks int `yaml:"cache_blocks"`
	// PrefillTokensPerSec is the pod's prefill speed on uncached tokens the
	// gateway assumes until it has measured it (default 20,000).
	PrefillTokensPerSec float64 `yaml:"prefill_tokens_per_sec"`
	// UID is the pod's Kubernetes UID, set by discovery: with its name
	// and address it is the pod's identity across reloads (pool.Build).
	UID string `yaml:"uid"`
	// BootstrapPort is an SGLang prefill pod's KV bootstrap port, where its
	// decode pods fetch the KV (AIBrix's model.aibrix.ai/sglang-bootstrap-port,
	// default 8998). Other engines have none: a written 0 is refused
	// (zeroIsUnset), so their 0 is not written back either.
	BootstrapPort int `yaml:"bootstrap_port,omitempty"`
	// Adapters are the LoRA adapters the pod serves from its start, as
	// ParseAdapters reads them: "name" or "name=path", comma-separated
	// (default none). Only this pod, and pods that list them, serve them.
	Adapters string `yaml:"adapters"`
	// PodKey is the API key of the pod's engine (default: its model's).
	PodKey `yaml:",inline"`
}

// Default returns a configuration with every default and no pods.
func Default() Config {
	return Config{
		Listen:             DefaultListen,
		Admin:              DefaultAdmin,
		Frontend:           DefaultFrontend,
		IOURing:            true,
		MaxBodyBytes:       DefaultMaxBodyBytes,
		MaxHeaderBytes:     DefaultMaxHeaderBytes,
		MaxHeaders:         DefaultMaxHeaders,
		ClientReadTimeout:  DefaultClientReadTimeout,
		ClientIdleTimeout:  DefaultClientIdleTimeout,
		MaxStoredResponses: DefaultMaxStoredResponses,
		Upstream: Upstream{
			ConnectTimeout:       DefaultConnectTimeout,
			ResponseTimeout:      DefaultResponseTimeout,
			WholeResponseTimeout: DefaultWholeTimeout,
			StreamIdleTimeout:    DefaultStreamIdleTimeout,
			Retries:              DefaultRetries,
			MaxConnsPerPod:       DefaultMaxConnsPerPod,
			MaxResponseBytes:     DefaultMaxResponseBytes,
			KeepaliveTimeout:     DefaultKeepaliveTimeout,
			XForwardedFor:        true,
			Retry:                DefaultRetry(),
		},
		Admission: Admission{
			Interactive: admit.DefaultConfig().Classes[admit.Interactive],
			Batch:       admit.DefaultConfig().Classes[admit.Batch],
			DeferQueue:  admit.DefaultDeferQueue,
		},
		TokenLoad: ledger.DefaultConfig(),
		Access:    limits.DefaultConfig(),
		PD:        route.DefaultPDOptions(),
		Plan:      DefaultPlan(),
		Tracing:   DefaultTracing(),
		CORS:      DefaultCORS(),
		Redis:     Redis{KeyPrefix: DefaultRedisKeyPrefix},
		TLS:       TLS{MinVersion: DefaultTLSMinVersion, TicketRotation: DefaultTicketRotation},
		HTTP2: HTTP2{
			MaxConcurrentStreams: DefaultMaxConcurrentStreams,
			MaxFrameBytes:        DefaultMaxFrameBytes,
			MaxResetsPerSecond:   DefaultMaxResetsPerSecond,
		},
		Health: Health{
			Interval:           DefaultHealthInterval,
			Timeout:            DefaultHealthTimeout,
			UnhealthyAfter:     DefaultUnhealthyAfter,
			MetricsInterval:    DefaultMetricsInterval,
			EjectAfterFailures: DefaultEjectAfterFailures,
			EjectionTime:       DefaultEjectionTime,
			MaxEjectedPercent:  DefaultMaxEjectedPercent,
			PanicRouting:       true,
		},
	}
}

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("config: invalid")

func invalid(field string, value any, why string) error {
	return fmt.Errorf("%w: %s = %s %s", ErrInvalid, field, yamlkeys.Quote(value), why)
}

// Load reads a YAML file over the defaults. Unknown fields are errors, so a
// typo never leaves a setting silently at its default.
func Load(path string) (Config, error) {
	cfg := Default()
	if err := cfg.ApplyEnv(os.LookupEnv); err != nil {
		return cfg, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	if err := cfg.UnmarshalYAML(data); err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	cfg.Provision()
	return cfg, nil
}

// UnmarshalYAML decodes data over c strictly: an unknown key is refused,
// and so is a 0 that Provision would replace with a default (zeroIsUnset).
func (c *Config) UnmarshalYAML(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%w: %s", ErrInvalid, yamlkeys.NameErrors(data, reflect.TypeFor[Config](), te))
		}
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc)
	return refuseUnsetZeros(&doc)
}

// Provision fills the fields whose empty value means a default: each
// model's, alias target's, pod's and discovery source's (Model.provision,
// Pod.Provision, spec.Discovery.Provision). It leaves every other value as
// it is, for Validate to judge, and may be called again. It fills copies
// of the lists, so that the Config it was copied from by value (a caller
// of lb.Start, the gateway's running one) keeps its own. Load calls it; a
// caller that builds a Config in code calls it before Validate.
func (c *Config) Provision() {
	c.Models = slices.Clone(c.Models)
	for i := range c.Models {
		c.Models[i].provision()
	}
	c.provisionAliases()
	c.Pods = slices.Clone(c.Pods)
	for i := range c.Pods {
		c.Pods[i].Provision()
	}
	c.Discovery.Provision()
}

// provision fills the model's empty policy and block size.
func (m *Model) provision() {
	if m.Policy == "" {
		m.Policy = DefaultPolicy
	}
	if m.BlockSize == 0 {
		m.BlockSize = DefaultBlockSize
	}
	m.LoRA.provision()
}

// Provision fills the pod's empty name (its address), role (combined),
// weight (1), prefill speed, data-parallel size (1) and, for SGLang,
// bootstrap port, and spells its engine as engines.ParseKind does (empty:
// vLLM).
func (p *Pod) Provision() {
	p.provisionScheme()
	if p.Name == "" {
		p.Name = p.Address
	}
	k, err := engines.ParseKind(p.Engine)
	if err == nil {
		p.Engine = string(k)
	}
	if p.Role == "" {
		p.Role = RoleCombined
	}
	if p.Weight == 0 {
		p.Weight = 1
	}
	if p.PrefillTokensPerSec == 0 {
		p.PrefillTokensPerSec = DefaultPrefillSpeed
	}
	if p.DataParallelSize == 0 {
		p.DataParallelSize = DefaultDataParallelSize
	}
	if p.DataParallelRouting == "" {
		p.DataParallelRouting = DataParallelByPrefix
	}
	if p.BootstrapPort == 0 && err == nil && k == engines.SGLang {
		p.BootstrapPort = engines.DefaultBootstrapPort
	}
}

// Validate checks every field. A field whose empty value means a default
// (Provision) is valid empty.
func (c Config) Validate() error {
	if err := checkAddr("listen", c.Listen, false); err != nil {
		return err
	}
	if err := checkAddr("admin", c.Admin, true); err != nil {
		return err
	}
	if c.Admin != "" && overlap(c.Listen, c.Admin) {
		return invalid("admin", c.Admin, "shares its port with listen ("+yamlkeys.Quote(c.Listen)+"): the listeners bind with SO_REUSEPORT, so the API's connections would go to the admin listener")
	}
	if err := checkAddr("metrics", c.Metrics, true); err != nil {
		return err
	}
	for _, other := range []struct{ name, addr string }{{"listen", c.Listen}, {"admin", c.Admin}} {
		if c.Metrics != "" && other.addr != "" && overlap(other.addr, c.Metrics) {
			return invalid("metrics", c.Metrics, "shares its port with "+other.name+" ("+yamlkeys.Quote(other.addr)+"): the listeners bind with SO_REUSEPORT, so one would get the other's connections")
		}
	}
	if c.Frontend != "fasthttp" && c.Frontend != "gnet" {
		return invalid("frontend", c.Frontend, "is not a front end (known: fasthttp, gnet)")
	}
	if c.MaxBodyBytes <= 0 {
		return invalid("max_body_bytes", c.MaxBodyBytes, "must be positive")
	}
	if c.MaxHeaderBytes < 1024 {
		return invalid("max_header_bytes", c.MaxHeaderBytes, "must be at least 1024")
	}
	if c.MaxHeaders <= 0 {
		return invalid("max_headers", c.MaxHeaders, "must be positive")
	}
	if c.MaxStoredResponses < 0 {
		return invalid("max_stored_responses", c.MaxStoredResponses, "must not be negative (0 remembers none)")
	}
	if c.MaxInFlight < 0 {
		return invalid("max_in_flight", c.MaxInFlight, "must not be negative (0 means no cap)")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"client_read_timeout", c.ClientReadTimeout},
		{"client_idle_timeout", c.ClientIdleTimeout},
		{"upstream.connect_timeout", c.Upstream.ConnectTimeout},
		{"upstream.response_timeout", c.Upstream.ResponseTimeout},
		{"upstream.whole_response_timeout", c.Upstream.WholeResponseTimeout},
		{"upstream.stream_idle_timeout", c.Upstream.StreamIdleTimeout},
		{"upstream.keepalive_timeout", c.Upstream.KeepaliveTimeout},
		{"health.interval", c.Health.Interval},
		{"health.timeout", c.Health.Timeout},
		{"health.ejection_time", c.Health.EjectionTime},
	} {
		if d.v <= 0 {
			return invalid(d.field, d.v, "must be positive")
		}
	}
	if c.Health.MetricsInterval < 0 {
		return invalid("health.metrics_interval", c.Health.MetricsInterval, "must not be negative (0 turns scraping off)")
	}
	if c.Upstream.Retries < 0 {
		return invalid("upstream.retries", c.Upstream.Retries, "must not be negative")
	}
	if err := c.Upstream.Retry.Validate(); err != nil {
		return err
	}
	if c.Upstream.MaxConnsPerPod <= 0 {
		return invalid("upstream.max_conns_per_pod", c.Upstream.MaxConnsPerPod, "must be positive")
	}
	if c.Upstream.MaxResponseBytes <= 0 {
		return invalid("upstream.max_response_bytes", c.Upstream.MaxResponseBytes, "must be positive")
	}
	if c.Health.UnhealthyAfter <= 0 {
		return invalid("health.unhealthy_after", c.Health.UnhealthyAfter, "must be positive")
	}
	if c.Health.EjectAfterFailures <= 0 {
		return invalid("health.eject_after_failures", c.Health.EjectAfterFailures, "must be positive")
	}
	if c.Health.MaxEjectedPercent < 0 || c.Health.MaxEjectedPercent > 100 {
		return invalid("health.max_ejected_percent", c.Health.MaxEjectedPercent, "must be between 0 and 100")
	}
	if err := c.Admission.AdmitConfig().Validate(); err != nil {
		// admit names its fields as its own Config does (classes.batch.
		// max_wait); the file spells them admission.batch.max_wait.
		field, _ := strings.CutPrefix(err.Error(), "admit: invalid config: ")
		field, _ = strings.CutPrefix(field, "classes.")
		return fmt.Errorf("%w: admission.%s", ErrInvalid, field)
	}
	if err := c.TokenLoad.Validate(); err != nil {
		return fmt.Errorf("%w: token_load: %v", ErrInvalid, err)
	}
	if c.Redis.Address != "" {
		if err := checkDialAddr("redis.address", c.Redis.Address); err != nil {
			return err
		}
		if c.Redis.KeyPrefix == "" {
			return invalid("redis.key_prefix", c.Redis.KeyPrefix, "must not be empty")
		}
	}
	if err := c.CORS.Validate(); err != nil {
		return err
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	if err := c.Plan.Validate(); err != nil {
		return err
	}
	if err := c.PD.Validate(); err != nil {
		return fmt.Errorf("%w: pd: %s", ErrInvalid, withAlias(err))
	}
	models := map[string]bool{}
	for i := range c.Models {
		m := &c.Models[i]
		field := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			return invalid(field+".name", m.Name, "must not be empty")
		}
		if models[m.Name] {
			return invalid(field+".name", m.Name, "is listed twice")
		}
		models[m.Name] = true
		if _, err := route.New(cmp.Or(m.Policy, DefaultPolicy), route.DefaultOptions()); err != nil {
			return invalid(field+".policy", m.Policy, "is not a policy (known: "+strings.Join(route.Names(), ", ")+")")
		}
		if m.BlockSize < 0 {
			return invalid(field+".block_size", m.BlockSize, "must be a positive number of tokens")
		}
		if m.Tokenizer == "" {
			if m.ChatTemplate != "" {
				return invalid(field+".chat_template", m.ChatTemplate, "needs tokenizer (the stand-in has no template)")
			}
			if len(m.ChatTemplateKwargs) > 0 {
				return invalid(field+".chat_template_kwargs", m.ChatTemplateKwargs, "needs tokenizer (the stand-in has no template)")
			}
			if m.MessagesInlineSystem != "" {
				return invalid(field+".messages_inline_system", m.MessagesInlineSystem, "needs tokenizer (the stand-in has no template)")
			}
		} else if _, ok := chat.ParseInlineSystem(m.MessagesInlineSystem); !ok {
			return invalid(field+".messages_inline_system", m.MessagesInlineSystem, `must be "", "hoist" or "preserve"`)
		} else if _, err := os.Stat(filepath.Join(m.Tokenizer, "tokenizer.json")); err != nil {
			return invalid(field+".tokenizer", m.Tokenizer, "must be a directory holding tokenizer.json ("+err.Error()+")")
		}
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if err := c.HTTP2.Validate(); err != nil {
		return err
	}
	if n := c.HTTP2.MaxBodyBytesPerConnection; n != 0 && n < int64(c.MaxBodyBytes) {
		return invalid("http2.max_body_bytes_per_connection", n, fmt.Sprintf("must be at least max_body_bytes (%d): a body that large could never be held", c.MaxBodyBytes))
	}
	if err := c.Upstream.TLS.Validate(); err != nil {
		return err
	}
	if err := c.Access.Validate(c.Admin); err != nil {
		// Its keys are the file's top level: not "limits: invalid".
		return fmt.Errorf("%w: %s", ErrInvalid, strings.TrimPrefix(err.Error(), limits.ErrInvalid.Error()+": "))
	}
	if err := c.Discovery.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for i, d := range c.Discovery.DNS {
		if err := dnsRankPorts(fmt.Sprintf("discovery.dns[%d]", i), d); err != nil {
			return err
		}
	}
	if len(c.Pods) == 0 && !c.Discovery.Enabled() {
		return fmt.Errorf("%w: pods: no pods configured (give a config file with pods or discovery, or --pod)", ErrInvalid)
	}
	for i := range c.Models {
		if _, err := c.Models[i].PodKey.read(fmt.Sprintf("models[%d]", i), os.LookupEnv); err != nil {
			return err
		}
	}
	names := map[string]int{}
	endpoints := map[string]int{}
	pd := PDEngines{}
	for i := range c.Pods {
		p := &c.Pods[i]
		field := fmt.Sprintf("pods[%d]", i)
		if err := p.Validate(field); err != nil {
			return err
		}
		if err := pd.Check(field, *p); err != nil {
			return err
		}
		if _, err := p.PodKey.read(field, os.LookupEnv); err != nil {
			return err
		}
		name := cmp.Or(p.Name, p.Address)
		if j, dup := names[name]; dup {
			return invalid(fmt.Sprintf("pods[%d].name", i), name, fmt.Sprintf("is also the name of pods[%d]", j))
		}
		names[name] = i
		// One engine, one entry: a vLLM pod's LoRA adapters are its
		// adapters, and its other served names are aliases.
		if j, dup := endpoints[p.Endpoint()]; dup {
			q := c.Pods[j]
			return invalid(field+".address", p.Address, fmt.Sprintf("is also the address of pods[%d] (%s, model %s): one engine is one entry; list its LoRA adapters in adapters and its other model names in aliases",
				j, yamlkeys.Quote(cmp.Or(q.Name, q.Address)), yamlkeys.Quote(q.Model)))
		}
		endpoints[p.Endpoint()] = i
	}
	if err := c.ValidateNames(); err != nil {
		return err
	}
	// Every listed model's profiles build, so a bad knob stops the start
	// rather than the first request.
	for i := range c.Models {
		if _, err := c.Profiles(c.Models[i].Name); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a pod, naming it field in errors. A field whose empty
// value means a default (Provision) is valid empty.
func (p Pod) Validate(field string) error {
	if p.Model == "" {
		return invalid(field+".model", p.Model, "must not be empty")
	}
	if strings.ContainsFunc(p.Name, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		// It is sent as it is in answers' x-pdlb-pod header, whose
		// value may hold tabs but no other control byte.
		return invalid(field+".name", p.Name, "must not hold control characters but tab")
	}
	if err := checkDialAddr(field+".address", p.Address); err != nil {
		return err
	}
	if _, err := engines.ParseKind(p.Engine); err != nil {
		return invalid(field+".engine", p.Engine, "is not an engine (known: vllm, sglang, trtllm)")
	}
	switch p.Role {
	case "", RoleCombined, RolePrefill, RoleDecode:
	default:
		return invalid(field+".role", p.Role, "is not a role (known: combined, prefill, decode)")
	}
	if (p.Role == RolePrefill || p.Role == RoleDecode) && p.Roleset == "" {
		return invalid(field+".roleset", p.Roleset, "must name the roleset of a "+p.Role+" pod")
	}
	if p.BucketMin < 0 {
		return invalid(field+".bucket_min", p.BucketMin, "must not be negative")
	}
	if p.BucketMax < 0 || (p.BucketMax > 0 && p.BucketMax < p.BucketMin) {
		return invalid(field+".bucket_max", p.BucketMax, fmt.Sprintf("must be 0 (unlimited) or at least bucket_min (%d)", p.BucketMin))
	}
	if !(p.Weight >= 0) || math.IsInf(p.Weight, 1) {
		return invalid(field+".weight", p.Weight, "must be positive")
	}
	if p.KVEvents != "" {
		if err := checkDialEndpoint(field+".kv_events", p.KVEvents); err != nil {
			return err
		}
	}
	if p.KVReplay != "" {
		if err := checkDialEndpoint(field+".kv_replay", p.KVReplay); err != nil {
			return err
		}
		if p.KVEvents == "" {
			return invalid(field+".kv_replay", p.KVReplay, "needs kv_events")
		}
	}
	if p.DataParallelSize < 0 {
		return invalid(field+".data_parallel_size", p.DataParallelSize, "must be at least 1 (default 1)")
	}
	if why := spec.DataParallelRoutingProblem(p.DataParallelRouting); why != "" {
		return invalid(field+".data_parallel_routing", p.DataParallelRouting, why)
	}
	if p.KVEvents != "" {
		if err := p.validateRankPorts(field, "kv_replay"); err != nil {
			return err
		}
	}
	if p.CacheBlocks < 0 {
		return invalid(field+".cache_blocks", p.CacheBlocks, "must not be negative (0 means unlimited)")
	}
	if !(p.PrefillTokensPerSec >= 0) || math.IsInf(p.PrefillTokensPerSec, 1) {
		return invalid(field+".prefill_tokens_per_sec", p.PrefillTokensPerSec, "must be positive (default 20,000)")
	}
	if p.BootstrapPort < 0 || p.BootstrapPort > 65535 {
		return invalid(field+".bootstrap_port", p.BootstrapPort, "must be a port, 1 to 65535 (0 means 8998)")
	}
	return nil
}

// validateRankPorts checks the ports of the pod's ranks' KV events, valid
// endpoints: rank r publishes on kv_events' port + r and replays on
// kv_replay's + r, so both runs must end by port 65535 and must not meet
// on one host. replayField names the replay port's setting in errors.
func (p Pod) validateRankPorts(field, replayField string) error {
	r := engines.RankPorts{Ranks: max(p.DataParallelSize, 1), ReplayPort: engines.DefaultKVReplayPort,
		Replay: fmt.Sprintf("the default port %d", engines.DefaultKVReplayPort), ReplaySetting: replayField}
	r.EventsHost, r.EventsPort = splitTCP(p.KVEvents)
	r.ReplayHost = r.EventsHost
	if p.KVReplay != "" {
		r.ReplayHost, r.ReplayPort = splitTCP(p.KVReplay)
		r.Replay = replayField + "'s port"
	}
	switch setting, why := r.Problem(); setting {
	case "":
		return nil
	case "data_parallel_size":
		return invalid(field+".data_parallel_size", p.DataParallelSize, why)
	default:
		return invalid(field+"."+setting, p.KVReplay, why)
	}
}

// dnsRankPorts checks the ports of the KV events of the ranks of the pods
// DNS source d finds, as validateRankPorts checks a configured pod's.
func dnsRankPorts(field string, d spec.DNS) error {
	if d.KVEventsPort == 0 {
		return nil
	}
	p := Pod{KVEvents: "tcp://" + net.JoinHostPort(d.Name, strconv.Itoa(d.KVEventsPort)), DataParallelSize: d.DataParallelSize}
	if d.KVReplayPort != 0 {
		p.KVReplay = "tcp://" + net.JoinHostPort(d.Name, strconv.Itoa(d.KVReplayPort))
	}
	return p.validateRankPorts(field, "kv_replay_port")
}

// splitTCP splits a valid tcp://host:port.
func splitTCP(ep string) (host string, port int) {
	host, p, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	port, _ = strconv.Atoi(p)
	return host, port
}

// overlap reports whether two valid listen addresses bind one port on a
// common address: the same host, or either on every interface. Port 0
// picks a free port each, so it never overlaps.
func overlap(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	if na, _ := strconv.Atoi(pa); na == 0 || pa != pb {
		return false
	}
	wild := func(h string) bool { ip := net.ParseIP(h); return h == "" || ip != nil && ip.IsUnspecified() }
	return ha == hb || wild(ha) || wild(hb)
}

func checkAddr(field, addr string, emptyOK bool) error {
	if addr == "" && emptyOK {
		return nil
	}
	if why := addrProblem(addr); why != "" {
		return invalid(field, addr, why)
	}
	return nil
}

// addrProblem says why addr is no host:port with a port of digits, or "".
func addrProblem(addr string) string {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return "must be host:port"
	} else if n, err := strconv.Atoi(port); err != nil || strings.Trim(port, "0123456789") != "" || n > 65535 {
		// Digits only: Atoi takes "+80", which a Host header must not carry.
		return "has no valid port"
	}
	return ""
}

// checkDialAddr checks an address the gateway dials: host:port with both.
func checkDialAddr(field, addr string) error {
	if why := dialAddrProblem("", addr); why != "" {
		return invalid(field, addr, why)
	}
	return nil
}

// checkDialEndpoint checks a tcp://host:port endpoint the gateway dials.
func checkDialEndpoint(field, ep string) error {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return invalid(field, ep, "must be tcp://host:port")
	}
	if why := dialAddrProblem("tcp://", addr); why != "" {
		return invalid(field, ep, why)
	}
	return nil
}

// dialAddrProblem says why addr, written after scheme, is no address to
// dial, or "". Without a host, or with an unspecified IP (0.0.0.0, ::),
// Go dials this machine, which a listen address means but a pod's or a
// server's never does (nginx refuses such an upstream too); "*" is
// ZeroMQ's listen wildcard (vLLM's kv-events endpoint tcp://*:5557),
// which zmq4 dials as 0.0.0.0 and Go's resolver does not know.
func dialAddrProblem(scheme, addr string) string {
	if why := addrProblem(addr); why != "" {
		return why
	}
	host, port, _ := net.SplitHostPort(addr)
	example := scheme + "10.0.0.5:" + port
	switch {
	case host == "":
		return "has no host (a pod's or server's, e.g. " + example + ")"
	case net.ParseIP(host).IsUnspecified():
		return "is every interface, which is dialed as this machine (a pod's or server's host, e.g. " + example + ")"
	case host == "*":
		return "is every interface, a listen address, not one to dial (a pod's or server's host, e.g. " + example + ")"
	case port == "0":
		return "needs a port"
	}
	return ""
}

// ParsePodFlag parses one --pod flag: comma-separated key=value pairs with
// the keys of a pod in YAML (model, address, engine, role, roleset, name,
// bucket_min, bucket_max, weight, bootstrap_port), e.g.
// "model=llama,address=10.0.0.5:8000,engine=sglang".
func ParsePodFlag(s string) (Pod, error) {
	var p Pod
	// A key given twice is refused, as the file refuses one: the last
	// must not silently win.
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, fmt.Errorf("%w: --pod %q: %q is not key=value", ErrInvalid, s, kv)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "addr" {
			k = "address"
		}
		if seen[k] {
			return p, fmt.Errorf("%w: --pod %q: %s is given twice", ErrInvalid, s, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "model":
			p.Model = v
		case "address":
			p.Address = v
		case "engine":
			p.Engine = v
		case "role":
			p.Role = v
		case "roleset":
			p.Roleset = v
		case "name":
			p.Name = v
		case "bucket_min":
			p.BucketMin, err = strconv.Atoi(v)
		case "bucket_max":
			p.BucketMax, err = strconv.Atoi(v)
		case "weight":
			p.Weight, err = strconv.ParseFloat(v, 64)
		case "bootstrap_port":
			p.BootstrapPort, err = strconv.Atoi(v)
		default:
			return p, fmt.Errorf("%w: --pod %q: unknown key %q (known: model, address, engine, role, roleset, name, bucket_min, bucket_max, weight, bootstrap_port)", ErrInvalid, s, k)
		}
		if err != nil {
			return p, fmt.Errorf("%w: --pod %q: %s = %q is not a number", ErrInvalid, s, k, v)
		}
		// A 0 that Provision would replace is refused, as in the file.
		if why := zeroIsUnset["pods[]."+k]; why != "" {
			if n, _ := strconv.ParseFloat(v, 64); n == 0 {
				return p, fmt.Errorf("%w: --pod %q: %s = 0 %s", ErrInvalid, s, k, why)
			}
		}
	}
	return p, nil
}

// ModelFor returns the settings of model, provisioned: its entry in
// Models, or every default.
func (c *Config) ModelFor(model string) Model {
	m := Model{Name: model}
	for i := range c.Models {
		if c.Models[i].Name == model {
			m = c.Models[i]
			break
		}
	}
	m.provision()
	return m
}

// PromptError is err, from loading the tokenizer and chat template of
// model, naming where the setting at fault is written (a
// *prompt.SettingError's).
func (c *Config) PromptError(model string, err error) error {
	var se *prompt.SettingError
	i := slices.IndexFunc(c.Models, func(m Model) bool { return m.Name == model })
	if !errors.As(err, &se) || i < 0 {
		return fmt.Errorf("model %q: %w", model, err)
	}
	return invalid(fmt.Sprintf("models[%d].%s", i, se.Setting), se.Value, "cannot be loaded: "+se.Err.Error())
}

// RouteOptions are the policies' knobs as this configuration sets them.
func (c *Config) RouteOptions() route.Options {
	o := route.DefaultOptions()
	o.MinMatchPct = c.TokenLoad.MinMatchPct
	o.TokenLoadKVWeight = c.TokenLoad.KVWeight
	o.HybridCacheLoadFactor = c.TokenLoad.HybridCacheLoadFactor
	o.DecodeOutputGrowth = c.TokenLoad.DecodeOutputGrowth
	o.TTFTSLO = c.Admission.Interactive.TTFTSLO
	return o
}

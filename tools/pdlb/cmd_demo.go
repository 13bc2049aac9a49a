package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"pdlb/engines"
	"pdlb/engines/prompt"
	"pdlb/engines/sim"
	"pdlb/engines/vllm"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/route"
)

// demoFleet is the simulated fleet of `pdlb demo`: one model per engine so
// a person can try each wire format through the same gateway. Each model
// has its combined pods and one prefill/decode roleset, so its requests
// run the engine's disaggregated exchange (x-pdlb-prefill-pod and
// x-pdlb-decode-pod name the pair) and overflow to the combined pods. The
// vLLM model serves two LoRA adapters on all its pods: one every pod
// loads at start, one the gateway loads where it is first asked for.
var demoFleet = []struct {
	model  string
	engine engines.Kind
	pods   int
}{
	{"demo-vllm", engines.VLLM, 3},
	{"demo-sglang", engines.SGLang, 2},
	{"demo-trtllm", engines.TRTLLM, 1},
}

// The demo's LoRA adapters of demo-vllm.
const (
	demoAdapterStatic  = "demo-vllm-sql"
	demoAdapterDynamic = "demo-vllm-chat"
)

func cmdDemo(args []string, stdout io.Writer) error {
	fs := newFlagSet("demo", "[--listen ADDR] [--admin ADDR] [--speedup X] [--tokenizer DIR] [--tls]",
		`Starts simulated engine pods on loopback and the gateway in front of them,
in one process, and prints how to use it. Stop it with Ctrl-C.`, stdout)
	var (
		gf        gatewayFlags
		speedup   float64
		policy    string
		tokenizer string
		withTLS   bool
	)
	gf.register(fs.FlagSet, false)
	fs.Float64Var(&speedup, "speedup", 1, "how much faster than real time the simulated pods run")
	fs.StringVar(&policy, "policy", "", "routing policy of every demo model: "+strings.Join(route.Names(), ", ")+" (default "+config.DefaultPolicy+")")
	fs.StringVar(&tokenizer, "tokenizer", "", "a Hugging Face tokenizer directory every demo model uses, pods and gateway alike, the vLLM pods publishing KV events in its ids (default: the stand-in)")
	fs.BoolVar(&withTLS, "tls", false, "serve the API over TLS (and HTTP/2) with a certificate for localhost from a CA made for the run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " ")))
	}
	if err := gf.check(); err != nil {
		return err
	}
	if !(speedup > 0) {
		// A sim pod takes 0 for unset and would run at 1.
		return fs.usageError(fmt.Errorf("--speedup %g: must be positive (default 1)", speedup))
	}
	var model *prompt.Model
	if tokenizer != "" {
		var err error
		if model, err = prompt.Load(prompt.Config{Tokenizer: tokenizer}); err != nil {
			return fmt.Errorf("--tokenizer %q: %w", tokenizer, err)
		}
	}
	var fc sim.FleetConfig
	cfg := config.Default()
	cfg.Upstream.Retry.FirstByte = config.FirstByte{Factor: demoFirstByteFactor, Floor: config.DefaultFirstByteFloor}
	for _, m := range demoFleet {
		pod := func(name, role string) {
			// One seed per model: a PD answer equals a combined pod's.
			sc := sim.Config{Name: name, Model: m.model, Engine: m.engine, Listen: "127.0.0.1:0", Speedup: speedup, Role: role, Prompt: model}
			if m.engine == engines.VLLM {
				sc.LoRAModules, sc.MaxLoras = []sim.LoRAModule{{Name: demoAdapterStatic, Path: "/loras/sql"}}, 2
				// As VLLM_ENABLE_RESPONSES_API_STORE=1: follow-ups work.
				sc.ResponsesStore = true
			}
			fc.Pods = append(fc.Pods, sc)
			var ev vllm.PublisherConfig
			if model != nil && m.engine == engines.VLLM {
				ev = vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}
			}
			fc.Events = append(fc.Events, ev)
		}
		for i := 0; i < m.pods; i++ {
			pod(fmt.Sprintf("%s-%d", m.model, i), sim.RoleCombined)
		}
		pod(m.model+"-prefill-0", sim.RolePrefill)
		pod(m.model+"-decode-0", sim.RoleDecode)
		mc := config.Model{Name: m.model, Policy: policy, Tokenizer: tokenizer}
		if m.engine == engines.VLLM {
			mc.Adapters = []config.Adapter{{Name: demoAdapterStatic}, {Name: demoAdapterDynamic, Path: "/loras/chat"}}
			mc.LoadAdapters, mc.MaxLoras = true, 2
		}
		if policy != "" || tokenizer != "" || len(mc.Adapters) > 0 {
			cfg.Models = append(cfg.Models, mc)
		}
	}
	stopTracing, err := traceSims(cfg.Tracing, fc.Pods)
	if err != nil {
		return err
	}
	defer stopTracing()
	fleet, err := sim.StartFleet(fc)
	if err != nil {
		return err
	}
	defer fleet.Close()
	for i, p := range fleet.Pods() {
		c := demoPod(p)
		if pub := fleet.Publisher(i); pub != nil {
			c.KVEvents, c.KVReplay = pub.Endpoint(), pub.ReplayEndpoint()
		}
		cfg.Pods = append(cfg.Pods, c)
	}
	gf.apply(&cfg)
	// A demo explains its decisions to anyone who asks.
	cfg.Tracing.Explain = true
	var ca string
	if withTLS {
		dir, err := os.MkdirTemp("", "pdlb-demo-tls-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if ca, err = demoCertificate(dir, &cfg); err != nil {
			return err
		}
	}
	return serveUntilSignal(cfg, gf.stopping(), stdout, func(s *lb.Server) {
		printDemo(stdout, s, fleet, ca)
	}, nil, "")
}

// demoFirstByteFactor turns hedging on in the demo: a request whose pod
// sends nothing for 3 × its predicted time to first byte (plus the floor)
// goes to another pod.
const demoFirstByteFactor = 3

// demoPod is p's entry in the gateway's configuration: prefill and decode
// pods pair up in roleset "rs0" of their model, and an SGLang prefill pod
// announces the bootstrap port its sim picked.
func demoPod(p *sim.Pod) config.Pod {
	pc := p.Config()
	c := config.Pod{Name: pc.Name, Model: pc.Model, Address: p.Addr(), Engine: string(pc.Engine), Role: pc.Role}
	if pc.Role != sim.RoleCombined {
		c.Roleset = "rs0"
	}
	if pc.Role == sim.RolePrefill && pc.Engine == engines.SGLang {
		_, port, _ := net.SplitHostPort(p.KVXferAddr())
		c.BootstrapPort, _ = strconv.Atoi(port)
	}
	return c
}

// printDemo says how to try the gateway s; with ca set, it serves TLS
// with a certificate that CA signed.
func printDemo(w io.Writer, s *lb.Server, fleet *sim.Fleet, ca string) {
	host := s.Addr()
	if strings.HasPrefix(host, "[::]:") {
		host = "localhost:" + strings.TrimPrefix(host, "[::]:")
	}
	if ca != "" {
		host = demoTLSBase(ca, host)
	}
	admin := s.AdminAddr()
	if admin == "" {
		fmt.Fprintf(w, "pdlb demo: gateway on %s, no admin listener\n\nSimulated pods:\n", s.Addr())
	} else {
		fmt.Fprintf(w, "pdlb demo: gateway on %s, admin on %s\n\nSimulated pods:\n", s.Addr(), admin)
	}
	for _, p := range fleet.Pods() {
		pc := p.Config()
		fmt.Fprintf(w, "  %-22s %-12s %-7s %-9s %s\n", pc.Name, pc.Model, pc.Engine, pc.Role, p.Addr())
	}
	fmt.Fprintf(w, `
Try:
  curl -N %[1]s/v1/chat/completions -d '{"model":"demo-vllm","messages":[{"role":"user","content":"hi"}],"stream":true}'
  curl -i %[1]s/v1/chat/completions -d '{"model":"demo-trtllm","messages":[{"role":"user","content":"hi"}]}'   # x-pdlb-prefill-pod, x-pdlb-decode-pod
  curl %[1]s/v1/chat/completions -H 'routing-strategy: least_request' -d '{"model":"demo-sglang","messages":[{"role":"user","content":"hi"}]}'   # combined pods only
  curl %[1]s/v1/completions -d '{"model":"demo-sglang","prompt":"Once upon a time","max_tokens":16}'
  curl -i %[1]s/v1/completions -d '{"model":"%[2]s","prompt":"SELECT","max_tokens":8}'   # a LoRA adapter: x-pdlb-model
  curl -i %[1]s/v1/completions -d '{"model":"%[3]s","prompt":"hi","max_tokens":8}'   # loaded on a pod at the first request
  curl %[1]s/v1/models   # adapters with their parent
  curl %[1]s/tokenize -d '{"model":"demo-vllm","prompt":"hi"}'   # the engines' other APIs (embeddings, rerank...) go to a pod of the model
  curl %[1]s/v1/responses -d '{"model":"demo-vllm","input":"hi","max_output_tokens":16}'   # OpenAI's Responses API; a follow-up naming its id (previous_response_id) reaches the pod that stored it
  curl -si %[1]s/v1/chat/completions -H 'x-pdlb-debug: explain' -d '{"model":"demo-vllm","messages":[{"role":"user","content":"hi"}]}' | grep -i x-pdlb-explain
`, host, demoAdapterStatic, demoAdapterDynamic)
	if admin != "" {
		fmt.Fprintf(w, `  curl '%[1]s/admin/explain?model=demo-vllm'   # arms recording; the next requests' decisions show on the next read
  curl %[1]s/metrics
  curl %[1]s/admin/pods
`, admin)
	}
	fmt.Fprint(w, `
Traces: start with OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 (Jaeger, a collector).
Press Ctrl-C to stop.
`)
}

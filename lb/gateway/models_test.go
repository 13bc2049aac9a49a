package gateway

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines/sim"
	"pdlb/engines/tokenize"
	"pdlb/internal/tokfiles"
	"pdlb/lb/admit"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/radix"
)

// loraGateway is a gateway over two pods of model m with adapter sql.
func loraGateway(t *testing.T) *Gateway {
	t.Helper()
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "slo_cache", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "sql"}}}}}
	cfg.Aliases = []config.Alias{{Name: "chat", Targets: []config.AliasTarget{{Model: "sql"}}}}
	for i := range 2 {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	return g
}

// resolved parses a completion for model with prompt and resolves it as
// serveCompletion does, into x.m; the caller releases x.
func resolved(t *testing.T, g *Gateway, model, prompt string) *completion {
	t.Helper()
	req := new(fasthttp.Request)
	body := `{"model":"` + model + `","prompt":"` + prompt + `"}`
	req.SetBodyString(body)
	x := acquireCompletion(time.Now())
	x.ctx = new(fasthttp.RequestCtx)
	x.ctx.Init(req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
	if err := x.req.Parse(openai.KindCompletion, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if x.m = g.resolveModel(x.ctx, x); x.m == nil {
		t.Fatalf("%s: no model", model)
	}
	return x
}

// resolvedKeys is a resolved request's block keys and x-pdlb-model header.
func resolvedKeys(t *testing.T, g *Gateway, model, prompt string) ([]uint64, string) {
	t.Helper()
	x := resolved(t, g, model, prompt)
	defer releaseCompletion(x)
	return keysOf(x), string(x.ctx.Response.Header.Peek(headerModel))
}

// TestAdapterKeys: an adapter's request has keys of its own, as the
// engine keys its blocks: it matches none of the base model's blocks and
// all of its own, whether named directly or through an alias.
func TestAdapterKeys(t *testing.T) {
	g := loraGateway(t)
	m := g.pool.Load().Models[0]
	prompt := strings.Repeat("a prompt long enough for several blocks of keys ", 8)
	base, _ := resolvedKeys(t, g, "m", prompt)
	m.Prefix.Insert(0, base)
	sql, served := resolvedKeys(t, g, "sql", prompt)
	if served != "sql" {
		t.Errorf("x-pdlb-model = %q, want sql", served)
	}
	m.Prefix.Insert(1, sql)
	f := func(model string, want []int32) {
		t.Helper()
		keys, _ := resolvedKeys(t, g, model, prompt)
		depth := make([]int32, 2)
		m.Prefix.Match(keys, depth)
		if fmt.Sprint(depth) != fmt.Sprint(want) {
			t.Errorf("%s: matched blocks by pod = %v, want %v", model, depth, want)
		}
	}
	n := int32(len(base))
	if n < 2 {
		t.Fatalf("only %d blocks", n)
	}
	f("m", []int32{n, 0})
	f("sql", []int32{0, n})
	f("chat", []int32{0, n})
}

// TestAdapterLoadedOncePerBurst: two requests for an adapter no pod has,
// picked before either one's load began (on two event loops at once),
// load it once on one pod of each role the request needs, and both go to
// those pods: the second pick sees the loads the first began.
func TestAdapterLoadedOncePerBurst(t *testing.T) {
	f := func(roles ...string) {
		t.Helper()
		cfg := config.Default()
		// Left to their policies, round_robin sends the second combined
		// pick to the other pod, and the PD cascade the second decode leg
		// to the decode pod the first left idle.
		cfg.Models = []config.Model{{Name: "n", Policy: "round_robin",
			LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "fin", Path: "/loras/fin"}}, LoadAdapters: true, MaxLoras: 2}}}
		var sims []*sim.Pod
		for i, role := range roles {
			p, err := sim.Start(sim.Config{Name: fmt.Sprint(role, "-", i), Model: "n", Role: role, Listen: "127.0.0.1:0", Speedup: 100, EnableLoRA: true, MaxLoras: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			sims = append(sims, p)
			pod := config.Pod{Name: p.Config().Name, Model: "n", Address: p.Addr(), Role: role}
			if role != config.RoleCombined {
				pod.Roleset = "a"
			}
			cfg.Pods = append(cfg.Pods, pod)
		}
		cfg.Provision()
		g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
		var xs [2]*completion
		var picks [2]string
		for i := range xs {
			x := resolved(t, g, "fin", "hello")
			defer releaseCompletion(x)
			x.g, x.via = g, &scripted{blocks: true}
			res, err := strategyFor(x, m)
			if err != nil {
				t.Fatal(err)
			}
			var pre, dec *pool.Pod
			if x.cascade = res.PD; x.cascade != nil {
				if err := g.pickPD(x); err != nil {
					t.Fatal(err)
				}
				pre, dec = placedPD(x)
			} else {
				x.pod = g.pick(m, x, "")
				pre, dec = x.pod, x.pod
			}
			xs[i], picks[i] = x, pre.Config.Name+","+dec.Config.Name
		}
		for _, x := range xs {
			if !g.adapterReady(x) || x.last != nil {
				t.Fatalf("%v: fin not ready: %v", roles, x.last)
			}
		}
		var loadedOn []string
		for _, p := range sims {
			_, body, err := fasthttp.Get(nil, "http://"+p.Addr()+"/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(body), `"fin"`) {
				loadedOn = append(loadedOn, p.Config().Name)
			}
		}
		want := len(slices.Compact(slices.Clone(roles)))
		loads := g.metrics.model(m).adapterLoads.Get()
		if int(loads) != want || len(loadedOn) != want || picks[0] != picks[1] {
			t.Errorf("%v: %d loads, fin loaded on %v; picks %v; want %d, both picks on its pods", roles, loads, loadedOn, picks, want)
		}
	}
	f(config.RoleCombined, config.RoleCombined)
	f(config.RolePrefill, config.RolePrefill, config.RoleDecode, config.RoleDecode)
}

// TestFallbackOnShed: a request admission would shed on its model's pods
// (their queues are far over the TTFT target) goes to the model's
// fallback, whose pod is idle, and is answered there.
func TestFallbackOnShed(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n", Policy: "least_request"}}
	cfg.Pods = []config.Pod{{Name: "busy", Model: "m", Address: "127.0.0.1:10000"}, {Name: "idle", Model: "n", Address: "127.0.0.1:10001"}}
	cfg.Provision()
	g, m := testGateway(t, cfg, upstream.Dialer(nil), &admit.ClassConfig{TTFTSLO: 1})
	m.Pods[0].AddQueuedPrefill(1e9)
	s := &scripted{errs: []error{nil}, blocks: true}
	x, ctx := startCompletion(t, g, m, s, admit.Interactive)
	ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
	x.fallbacks = m.LoRA.Fallback
	g.advance(x)
	n := g.pool.Load().Model([]byte("n"))
	if fmt.Sprint(s.sent) != "[idle]" || counted(g, n) != 200 || string(ctx.Response.Header.Peek(headerModel)) != "n" {
		t.Errorf("sent to %v, n counted %d, x-pdlb-model %q", s.sent, counted(g, n), ctx.Response.Header.Peek(headerModel))
	}
	if !strings.Contains(string(ctx.Request.Body()), `"model":"n"`) {
		t.Errorf("the body sent names another model: %s", ctx.Request.Body())
	}
	m.Pods[0].AddQueuedPrefill(-1e9)
}

// TestFallbackToPDOnLoop: a request shed on the event loop (before any
// attempt) whose fallback model is served by prefill and decode pods
// moves to a worker before its PD pick, as begin moves a PD request: the
// exchange blocks.
func TestFallbackToPDOnLoop(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n"}}
	cfg.Pods = []config.Pod{{Name: "busy", Model: "m", Address: "127.0.0.1:10000"},
		{Name: "pre", Model: "n", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
		{Name: "dec", Model: "n", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"}}
	cfg.Provision()
	g, m := testGateway(t, cfg, upstream.Dialer(nil), &admit.ClassConfig{TTFTSLO: 1})
	m.Pods[0].AddQueuedPrefill(1e9)
	defer m.Pods[0].AddQueuedPrefill(-1e9)
	loop := &scripted{}
	x, ctx := startCompletion(t, g, m, loop, admit.Interactive)
	ctx.Request.SetBodyString(`{"model":"m","prompt":"say something long enough to count"}`)
	x.fallbacks = m.LoRA.Fallback
	g.advance(x)
	if loop.detached != 1 || x.m.Name != "n" || x.stage != stagePick || x.pd != nil {
		t.Fatalf("moved to a worker %d times, on model %s at stage %d, PD call %v; want one move to a worker, before n's PD pick", loop.detached, x.m.Name, x.stage, x.pd != nil)
	}
	x.via = workerTransport{}
	g.leave(x)
}

// TestFallbackRetokenizes: a request moved to a fallback model whose
// tokenizer is another gets that model's ids (and keys made of them), and
// the stand-in's count on a model without one.
func TestFallbackRetokenizes(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{
		{Name: "m", Tokenizer: tokfiles.Dir(t, "qwen3"), LoRA: config.LoRA{Fallback: []string{"n", "o"}}},
		{Name: "n", Tokenizer: tokfiles.Dir(t, "llama3.1")},
		{Name: "o"},
	}
	for i, model := range []string{"m", "n", "o"} {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: model + "-0", Model: model, Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	cfg.Provision()
	g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
	prompt := "Fallbacks re-tokenize: déjà vu, naïve façades, and 12345 tokens."
	x := resolved(t, g, "m", prompt)
	defer releaseCompletion(x)
	if f, _ := g.tokenize(x, m, x.ctx.PostBody(), false); x.m != m || f != nil {
		t.Fatal("m does not resolve and tokenize")
	}
	f := func(want string, ids []uint32, tokens int) {
		t.Helper()
		if !g.fallBack(x) || x.m.Name != want {
			t.Fatalf("no fallback to %s", want)
		}
		if fmt.Sprint(x.ids) != fmt.Sprint(ids) || x.req.PromptTokens() != tokens {
			t.Errorf("%s: ids %v (%d tokens), want %v (%d)", want, x.ids, x.req.PromptTokens(), ids, tokens)
		}
		if keys := keysOf(x); len(ids) > 0 && fmt.Sprint(keys) != fmt.Sprint(radix.AppendBlockKeys(nil, x.m.Seed, ids, x.m.BlockSize)) {
			t.Errorf("%s: keys not made of its ids", want)
		}
	}
	qwen := slices.Clone(x.ids)
	snap := g.pool.Load()
	llama := snap.Model([]byte("n")).Prompt.Completion(nil, []byte(prompt), true)
	if slices.Equal(qwen, llama) {
		t.Fatal("the two tokenizers agree on the prompt")
	}
	f("n", llama, len(llama))
	f("o", nil, tokenize.Count([]byte(prompt)))
}

// TestRetokenizeRefused: a request moved to a fallback model on an event
// loop, its prompt tokenized later on a worker (retokenize), moves on to
// the next fallback when that model's engine refuses it (vLLM a cache
// salt with a '/', SGLang takes it), and fails as a model without a pod
// when none is left.
func TestRetokenizeRefused(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m"}, {Name: "n", Tokenizer: tokfiles.Dir(t, "qwen3")}, {Name: "o"}}
	for i, model := range []string{"m", "n", "o"} {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: model + "-0", Model: model, Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	cfg.Pods[2].Engine = "sglang"
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	snap := g.pool.Load()
	for _, next := range [][]string{{"o"}, nil} {
		x := resolved(t, g, "m", `salted","cache_salt":"a/b`)
		x.m, x.fallbacks, x.stage = snap.Model([]byte("n")), next, stageRetokenize
		g.retokenize(x)
		switch {
		case next != nil && (x.stage != stagePick || x.m.Name != "o"):
			t.Errorf("refused by n's engine: stage %d on %s, want a pick on o", x.stage, x.m.Name)
		case next == nil && (x.stage != stageFail || x.last == nil || x.last.E.Status != 503):
			t.Errorf("refused, no fallback left: stage %d, failure %+v, want a 503", x.stage, x.last)
		}
		releaseCompletion(x)
	}
}

// TestUnavailableNoFallbackLeft: a pod's 503 whose model's fallbacks have
// no pod now is relayed, and the pod's in-flight count goes back once.
func TestUnavailableNoFallbackLeft(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n", Policy: "least_request"}}
	cfg.Pods = []config.Pod{{Name: "p0", Model: "m", Address: "127.0.0.1:10000"}}
	cfg.Provision()
	g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
	s := &scripted{errs: []error{errAnswered503}, blocks: true}
	x, ctx := startCompletion(t, g, m, s, admit.Interactive)
	x.fallbacks = m.LoRA.Fallback
	g.advance(x)
	if ctx.Response.StatusCode() != 503 || len(s.sent) != 1 {
		t.Fatalf("status %d after %d sends", ctx.Response.StatusCode(), len(s.sent))
	}
	if n := m.Pods[0].InFlight(); n != 0 {
		t.Fatalf("pod p0 counts %d in flight after the end", n)
	}
}

// TestRequestWithoutModel: a request naming no model (absent, null or "")
// is served by the gateway's one model, as vLLM and SGLang serve it with
// the pod's; TensorRT-LLM requires the field, and a gateway of several
// models cannot choose: both answer a 400 naming it, the latter listing
// the models served.
func TestRequestWithoutModel(t *testing.T) {
	gateway := func(pods ...config.Pod) *Gateway {
		cfg := config.Default()
		cfg.Pods = pods
		cfg.Provision()
		g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
		return g
	}
	f := func(g *Gateway, model, want, wantErr string) {
		t.Helper()
		body := `{` + model + `"messages":[{"role":"user","content":"x"}]}`
		x := acquireCompletion(time.Now())
		defer releaseCompletion(x)
		ctx := new(fasthttp.RequestCtx)
		ctx.Request.SetBodyString(body)
		if err := x.req.Parse(openai.KindChat, []byte(body)); err != nil {
			t.Errorf("%s: %v; want it served", body, err)
			return
		}
		m := g.resolveModel(ctx, x)
		switch {
		case m == nil && wantErr == "":
			t.Errorf("%s: %v; want it served by %s", body, g.unresolved(x).Message, want)
		case m == nil:
			if e := g.unresolved(x); e.Status != 400 || e.Param != "model" || e.Message != wantErr {
				t.Errorf("%s: %+v; want a 400: %s", body, e, wantErr)
			}
		case wantErr != "":
			t.Errorf("%s: served by %s; want a 400: %s", body, m.Name, wantErr)
		case m.Name != want || string(x.req.Model) != want || string(ctx.Response.Header.Peek(headerModel)) != want:
			t.Errorf("%s: served by %s, as %q, header %q; want %s", body, m.Name, x.req.Model, ctx.Response.Header.Peek(headerModel), want)
		}
	}
	one := gateway(config.Pod{Name: "v0", Model: "m", Address: "127.0.0.1:10000"}, config.Pod{Name: "v1", Model: "m", Address: "127.0.0.1:10001"})
	sgl := gateway(config.Pod{Name: "s0", Model: "s", Address: "127.0.0.1:10002", Engine: "sglang"})
	trt := gateway(config.Pod{Name: "t0", Model: "t", Address: "127.0.0.1:10003", Engine: "trtllm"})
	two := gateway(config.Pod{Name: "v0", Model: "m", Address: "127.0.0.1:10000"}, config.Pod{Name: "w0", Model: "n", Address: "127.0.0.1:10004"})
	for _, model := range []string{``, `"model":null,`, `"model":"",`} {
		f(one, model, "m", "")
		f(sgl, model, "s", "")
		f(trt, model, "", `"model" is required`)
		f(two, model, "", `"model" is required: this gateway serves m, n`)
	}
	f(two, `"model":"n",`, "n", "")
}

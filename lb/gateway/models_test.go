package gateway

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/upstream"
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

// resolvedKeys parses a completion for model with prompt, resolves it as
// serveCompletion does, and returns its block keys and the x-pdlb-model
// header.
func resolvedKeys(t *testing.T, g *Gateway, model, prompt string) ([]uint64, string) {
	t.Helper()
	var req fasthttp.Request
	body := `{"model":"` + model + `","prompt":"` + prompt + `"}`
	req.SetBodyString(body)
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
	x := acquireCompletion()
	defer releaseCompletion(x)
	if err := x.req.Parse(openai.KindCompletion, []byte(body)); err != nil {
		t.Fatal(err)
	}
	m := g.resolveModel(ctx, x)
	if m == nil {
		t.Fatalf("%s: no model", model)
	}
	return appendKeys(nil, m, x), string(ctx.Response.Header.Peek(headerModel))
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

package gateway

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/internal/tokfiles"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
	"pdlb/ledger"
	"pdlb/radix"
)

// decideGateway is a gateway over 64 pods of one model whose prefix index
// already holds many conversations, without health checks or sockets: the
// routing decision alone. tokenizer names the model's tokenizer files
// ("": the stand-in).
func decideGateway(b *testing.B, policy, tokenizer string) (*Gateway, *pool.Model) {
	b.Helper()
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: policy, Tokenizer: tokenizer}}
	for i := 0; i < 64; i++ {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	g, snap := bareGateway(b, cfg, upstream.Dialer(nil))
	m := snap.Models[0]
	// Fill the index: 8,000 chains of 128 blocks over 20 shared system
	// prompts, about 1,000,000 blocks in all, spread over the pods.
	rng := rand.New(rand.NewPCG(1, 2))
	toks := make([]uint32, 2048)
	var keys []uint64
	for c := 0; c < 8000; c++ {
		sys := uint32(c % 20)
		for i := range toks {
			if i < 512 {
				toks[i] = sys<<16 | uint32(i)
			} else {
				toks[i] = rng.Uint32()
			}
		}
		keys = radix.AppendBlockKeys(keys[:0], m.Seed, toks, m.BlockSize)
		m.Prefix.Insert(int32(c%64), keys)
	}
	return g, m
}

// chatBody is a 2,048-token chat request (in the stand-in's tokens; about
// 1,700 of Qwen3's): a system prompt shared with the indexed
// conversations, then a question of its own.
func chatBody() []byte {
	sys := strings.Repeat("You are a helpful assistant. ", 200)[:4096]
	user := strings.TrimSpace(strings.Repeat("Tell me about routing. ", 200)[:4096-len(`<|user|>`)-40])
	return []byte(fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, user))
}

// decide is what the gateway does for one request before its first byte
// goes upstream: extract, tokenize, hash blocks, match the index over every
// pod, score, charge the ledger, the pick's tracing hooks (off); then release the charge as the request's
// end would.
func decide(g *Gateway, m *pool.Model, x *completion, body []byte, id uint64) {
	if err := x.req.Parse(openai.KindChat, body); err != nil {
		panic(err)
	}
	if f, _ := g.tokenize(x, m, body, false); f != nil {
		panic(f.E)
	}
	x.ticket = ledger.Ticket{ID: id}
	start := x.tr.mark()
	pod := g.pick(m, x, "")
	g.observePick(x, start)
	g.ledger.PrefillDone(x.ticket)
	g.ledger.Finish(x.ticket)
	_ = pod
	x.req.Reset()
	x.looked, x.tried = false, x.tried[:0]
}

func BenchmarkDecide(b *testing.B) {
	for _, policy := range []string{"slo_cache", "cache_aware", "least_request"} {
		b.Run(policy, func(b *testing.B) { benchDecide(b, policy, "") })
	}
}

// BenchmarkDecideQwen3 is BenchmarkDecide/slo_cache with the model's own
// tokenizer and chat template (Qwen3's) instead of the stand-in: render,
// encode (the request seen before, as a retry or a resent conversation
// is), keys, match, pick.
func BenchmarkDecideQwen3(b *testing.B) {
	benchDecide(b, "slo_cache", tokfiles.Dir(b, "qwen3"))
}

func benchDecide(b *testing.B, policy, tokenizer string) {
	g, m := decideGateway(b, policy, tokenizer)
	body := chatBody()
	x := acquireCompletion(time.Now())
	defer releaseCompletion(x)
	decide(g, m, x, body, 1)
	if n := x.routeReq.PromptTokens; n < 1600 || (m.UsesCache && len(x.keys) < 100) {
		b.Fatalf("prompt of %d tokens, want about 2,048", n)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		decide(g, m, x, body, uint64(i+2))
	}
}

// BenchmarkPick is the pick alone, over the 64 pods of decideGateway with
// the prompt already parsed and matched: candidate filling, ledger
// counters, scoring and the charge. Steadier than BenchmarkDecide for work
// on those.
func BenchmarkPick(b *testing.B) {
	g, m := decideGateway(b, "slo_cache", "")
	x := acquireCompletion(time.Now())
	defer releaseCompletion(x)
	if err := x.req.Parse(openai.KindChat, chatBody()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x.ticket = ledger.Ticket{ID: uint64(i + 1)}
		g.pick(m, x, "")
		g.ledger.PrefillDone(x.ticket)
		g.ledger.Finish(x.ticket)
	}
}

// BenchmarkDecideParallel is decisions per second with every core deciding
// at once; the ledger's selection lock is what they share.
func BenchmarkDecideParallel(b *testing.B) {
	g, m := decideGateway(b, "slo_cache", "")
	body := chatBody()
	var next uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		x := acquireCompletion(time.Now())
		defer releaseCompletion(x)
		base := (atomicAdd(&next) + 1) << 40
		for i := uint64(0); pb.Next(); i++ {
			decide(g, m, x, body, base+i)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

func atomicAdd(p *uint64) uint64 { return atomic.AddUint64(p, 1) }

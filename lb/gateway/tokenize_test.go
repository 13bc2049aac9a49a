package gateway

import (
	"fmt"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"pdlb/internal/tokfiles"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/upstream"
)

// tokenizedChat parses and tokenizes a chat body as serveCompletion does,
// giving the parse's error or tokenize's failure; the caller releases x.
func tokenizedChat(t *testing.T, g *Gateway, body string) (*completion, error) {
	t.Helper()
	req := new(fasthttp.Request)
	req.SetBodyString(body)
	x := acquireCompletion()
	x.ctx = new(fasthttp.RequestCtx)
	x.ctx.Init(req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
	if err := x.req.Parse(openai.KindChat, []byte(body)); err != nil {
		return x, err
	}
	if x.m = g.resolveModel(x.ctx, x); x.m == nil {
		t.Fatal("no model")
	}
	if f := g.tokenize(x, x.m, x.ctx.PostBody()); f != nil {
		return x, f.E
	}
	return x, nil
}

// TestChatTextPartsTokenizeExactly: content parts vLLM renders as text
// (input_text, output_text, refusal, thinking, bare strings, a null text
// it skips) give the ids the engine computes, as the same text given as a
// string does, not a route without the index.
func TestChatTextPartsTokenizeExactly(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Tokenizer: tokfiles.Dir(t, "qwen3")}}
	cfg.Pods = []config.Pod{{Name: "p0", Model: "m", Address: "127.0.0.1:10000"}}
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	msgs := func(user, assistant string) string {
		return `{"model":"m","messages":[{"role":"user","content":` + user + `},{"role":"assistant","content":` + assistant + `},{"role":"user","content":"Go on."}]}`
	}
	plain, err := tokenizedChat(t, g, msgs(`"First part.\nSecond part."`, `"I cannot.\nReally."`))
	defer releaseCompletion(plain)
	if err != nil || len(plain.ids) == 0 {
		t.Fatalf("plain chat: %v, %d ids", err, len(plain.ids))
	}
	for _, body := range []string{
		msgs(`[{"type":"input_text","text":"First part."},{"type":"text","text":"Second part."}]`,
			`[{"type":"refusal","refusal":"I cannot."},{"type":"output_text","text":"Really."}]`),
		msgs(`["First part.","Second part."]`, `[{"type":"thinking","thinking":"I cannot."},"Really."]`),
		msgs(`[{"type":"text","text":"First part."},{"type":"text","text":null},{"type":"text","text":"Second part."}]`,
			`[{"type":"text","text":"I cannot."},{"type":"text"},{"type":"text","text":"Really."}]`),
	} {
		x, err := tokenizedChat(t, g, body)
		if err != nil || fmt.Sprint(x.ids) != fmt.Sprint(plain.ids) || x.req.Unindexed() {
			t.Errorf("%s: error %v, unindexed %v, %d ids equal to the plain chat's: %v",
				body, err, x.req.Unindexed(), len(x.ids), fmt.Sprint(x.ids) == fmt.Sprint(plain.ids))
		}
		releaseCompletion(x)
	}
}

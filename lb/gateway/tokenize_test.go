package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/internal/tokfiles"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/upstream"
	"pdlb/radix"
)

// tokenizedChat parses and tokenizes a chat body as serveCompletion does,
// giving the parse's error or tokenize's failure; the caller releases x.
func tokenizedChat(t *testing.T, g *Gateway, body string) (*completion, error) {
	t.Helper()
	return tokenizedAs(t, g, openai.KindChat, body)
}

// keysOf is x's block keys on its model, a batch's chains one after
// another.
func keysOf(x *completion) []uint64 {
	keys, _ := appendKeys(nil, nil, x.m, x)
	return keys
}

// tokenizedAs is tokenizedChat for a body of either kind.
func tokenizedAs(t *testing.T, g *Gateway, kind openai.Kind, body string) (*completion, error) {
	t.Helper()
	req := new(fasthttp.Request)
	req.SetBodyString(body)
	x := acquireCompletion(time.Now())
	x.ctx = new(fasthttp.RequestCtx)
	x.ctx.Init(req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
	if err := x.req.Parse(kind, []byte(body)); err != nil {
		return x, err
	}
	if x.m = g.resolveModel(x.ctx, x); x.m == nil {
		t.Fatal("no model")
	}
	if f, _ := g.tokenize(x, x.m, x.ctx.PostBody(), false); f != nil {
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

// TestTruncatedPromptKeys: a request with truncate_prompt_tokens k is
// keyed and counted by the k tokens the engine keeps (the last k, or the
// first with truncation_side "right"; a tokenizer's BOS spared, as HF
// spares it), so requests differing only in what the engine cuts get
// the blocks the engine cached, and keys are those of the kept tokens
// sent alone.
func TestTruncatedPromptKeys(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{
		{Name: "stand-in", BlockSize: 16},
		{Name: "llama", BlockSize: 16, Tokenizer: tokfiles.Dir(t, "llama3.1")},
		{Name: "qwen", BlockSize: 16, Tokenizer: tokfiles.Dir(t, "qwen3")},
	}
	cfg.Pods = []config.Pod{
		{Name: "s0", Model: "stand-in", Address: "127.0.0.1:10000"},
		{Name: "l0", Model: "llama", Address: "127.0.0.1:10001"},
		{Name: "q0", Model: "qwen", Address: "127.0.0.1:10002"},
	}
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	type keyed struct {
		ids    string
		keys   string
		tokens int
	}
	key := func(kind openai.Kind, body string) keyed {
		t.Helper()
		x, err := tokenizedAs(t, g, kind, body)
		defer releaseCompletion(x)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return keyed{fmt.Sprint(x.ids), fmt.Sprint(keysOf(x)), x.req.PromptTokens()}
	}
	same := func(what string, got, want keyed) {
		t.Helper()
		if got != want {
			t.Errorf("%s:\n got %d tokens, ids %.40s, keys %.40s\nwant %d tokens, ids %.40s, keys %.40s",
				what, got.tokens, got.ids, got.keys, want.tokens, want.ids, want.keys)
		}
	}
	completion := func(model, prompt, extra string) string {
		return `{"model":"` + model + `","prompt":` + prompt + extra + `}`
	}
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }

	// The stand-in: 4 bytes a token, so the kept tail is the prompt's last
	// 4k bytes.
	tail := strings.Repeat("the kept part of the prompt. ", 9)[:256] // 64 tokens
	alone := key(openai.KindCompletion, completion("stand-in", quote(tail), ""))
	same("stand-in, last 64", key(openai.KindCompletion, completion("stand-in", quote(strings.Repeat("a", 400)+tail), `,"truncate_prompt_tokens":64`)), alone)
	same("stand-in, other head", key(openai.KindCompletion, completion("stand-in", quote(strings.Repeat("b", 804)+tail), `,"truncate_prompt_tokens":64,"truncation_side":"left"`)), alone)
	same("stand-in, first 64", key(openai.KindCompletion, completion("stand-in", quote(tail+strings.Repeat("c", 99)), `,"truncate_prompt_tokens":64,"truncation_side":"right"`)), alone)
	same("stand-in, -1", key(openai.KindCompletion, completion("stand-in", quote(tail), `,"truncate_prompt_tokens":-1`)), alone)

	// Token ids are cut as they are.
	ids := func(from, to int) string {
		var b strings.Builder
		for i := from; i < to; i++ {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, 1000+i)
		}
		return "[" + b.String() + "]"
	}
	same("ids, last 40", key(openai.KindCompletion, completion("stand-in", ids(0, 100), `,"truncate_prompt_tokens":40`)),
		key(openai.KindCompletion, completion("stand-in", ids(60, 100), "")))
	same("ids, first 40", key(openai.KindCompletion, completion("stand-in", ids(0, 100), `,"truncate_prompt_tokens":40,"truncation_side":"right"`)),
		key(openai.KindCompletion, completion("stand-in", ids(0, 40), "")))

	// Llama 3.1 adds a BOS to completion prompts, which HF's truncation
	// keeps: the kept ids are the BOS and the text's last k-1.
	text := strings.Repeat("alpha beta ", 60) + "\n" + strings.Repeat("The river runs north past the mill. ", 8)
	tok := g.pool.Load().Model([]byte("llama")).Prompt.Tokenizer()
	want := append([]uint32{128000}, tok.Append(nil, []byte(text), false)...)
	want = append(want[:1], want[len(want)-47:]...)
	got := key(openai.KindCompletion, completion("llama", quote(text), `,"truncate_prompt_tokens":48`))
	if got.ids != fmt.Sprint(want) || got.tokens != 48 {
		t.Errorf("llama, last 48: %d tokens, ids %.60s\nwant the BOS and the text's last 47: %.60s", got.tokens, got.ids, fmt.Sprint(want))
	}
	same("llama, other head", key(openai.KindCompletion, completion("llama", quote(strings.Repeat("gamma ", 90)+"\n"+strings.Repeat("The river runs north past the mill. ", 8)), `,"truncate_prompt_tokens":48`)), got)

	// A batch's prompts are the engine's separate requests, each cut on
	// its own: the keys start with the first one's kept blocks, and the
	// count is every prompt's kept tokens (64 + 20 here, not 64).
	batch := key(openai.KindCompletion, completion("stand-in", "["+quote(strings.Repeat("a", 544)+tail)+","+quote(strings.Repeat("q", 80))+"]", `,"truncate_prompt_tokens":64`))
	if !strings.HasPrefix(batch.keys, strings.TrimSuffix(alone.keys, "]")) || batch.tokens != 84 {
		t.Errorf("stand-in batch, last 64 of each: %d tokens, keys %.60s\nwant 84, keys from %.60s", batch.tokens, batch.keys, alone.keys)
	}
	short := "The river runs north past the mill."
	wantBatch := fmt.Sprint(append(append(want, 128000), tok.Append(nil, []byte(short), false)...))
	got = key(openai.KindCompletion, completion("llama", "["+quote(text)+","+quote(short)+"]", `,"truncate_prompt_tokens":48`))
	if got.ids != wantBatch {
		t.Errorf("llama batch, last 48 of each: %d tokens, ids %.60s\nwant %.60s", got.tokens, got.ids, wantBatch)
	}

	// A chat's ids carry no tokenizer specials (the template writes them):
	// the last k of the rendered conversation are kept.
	chat := func(system, extra string) string {
		return `{"model":"qwen","messages":[{"role":"system","content":` + quote(system) + `},{"role":"user","content":"Where does the river run?"}]` + extra + `}`
	}
	whole, err := tokenizedChat(t, g, chat(strings.Repeat("Answer briefly. ", 40), ""))
	defer releaseCompletion(whole)
	if err != nil {
		t.Fatal(err)
	}
	got = key(openai.KindChat, chat(strings.Repeat("Answer briefly. ", 40), `,"truncate_prompt_tokens":32`))
	if wantIDs := fmt.Sprint(whole.ids[len(whole.ids)-32:]); got.ids != wantIDs || got.tokens != 32 {
		t.Errorf("qwen chat, last 32: %d tokens, ids %.60s\nwant %.60s", got.tokens, got.ids, wantIDs)
	}
	same("qwen chat, other system prompt", key(openai.KindChat, chat(strings.Repeat("Be brief. ", 50)+strings.Repeat("Answer briefly. ", 10), `,"truncate_prompt_tokens":32`)), got)
}

// mixedPods are a model's pods of two engines at port and the next, the
// first's first, as in a migration from one engine to the other.
func mixedPods(model string, port int, first, then engines.Kind) []config.Pod {
	return []config.Pod{
		{Name: model + "-0", Model: model, Address: fmt.Sprintf("127.0.0.1:%d", port), Engine: string(first)},
		{Name: model + "-1", Model: model, Address: fmt.Sprintf("127.0.0.1:%d", port+1), Engine: string(then)},
	}
}

// enginePods are one pod of each engine, each of a model named after it.
func enginePods() []config.Pod {
	return []config.Pod{
		{Name: "v0", Model: "vllm", Address: "127.0.0.1:10000"},
		{Name: "s0", Model: "sglang", Address: "127.0.0.1:10001", Engine: "sglang"},
		{Name: "t0", Model: "trtllm", Address: "127.0.0.1:10002", Engine: "trtllm"},
	}
}

// enginesGateway is a gateway of a model for each engine and two whose
// pods mix engines (vllm+sglang, vllm+trtllm), all with Llama 3.1's
// tokenizer and no pods listening.
func enginesGateway(t *testing.T) *Gateway {
	t.Helper()
	cfg := config.Default()
	dir := tokfiles.Dir(t, "llama3.1")
	cfg.Models = []config.Model{
		{Name: "vllm", BlockSize: 16, Tokenizer: dir},
		{Name: "sglang", BlockSize: 16, Tokenizer: dir},
		{Name: "trtllm", BlockSize: 16, Tokenizer: dir},
		{Name: "vllm+sglang", BlockSize: 16, Tokenizer: dir},
		{Name: "vllm+trtllm", BlockSize: 16, Tokenizer: dir},
	}
	cfg.Pods = enginePods()
	cfg.Pods = append(cfg.Pods, mixedPods("vllm+sglang", 10010, engines.VLLM, engines.SGLang)...)
	cfg.Pods = append(cfg.Pods, mixedPods("vllm+trtllm", 10020, engines.VLLM, engines.TRTLLM)...)
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	return g
}

// TestTruncationFollowsTheEngine: only the engines that cut a prompt to
// truncate_prompt_tokens have it keyed cut. SGLang has no such field and
// caches the whole prompt; TensorRT-LLM cuts the text it tokenizes (on
// the left) but not a client's token ids; vLLM cuts both. A model whose
// pods mix engines keys as the one of them that cuts the fewest prompts,
// whichever pod comes first.
func TestTruncationFollowsTheEngine(t *testing.T) {
	g := enginesGateway(t)
	key := func(body string) (string, int) {
		t.Helper()
		x, err := tokenizedAs(t, g, openai.KindCompletion, body)
		defer releaseCompletion(x)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return fmt.Sprint(keysOf(x)), x.req.PromptTokens()
	}
	text := `"` + strings.Repeat("alpha beta ", 60) + `"`
	ids := "[" + strings.Repeat("1000,", 99) + "1001]"
	f := func(model, prompt string, cut bool) {
		t.Helper()
		whole, n := key(`{"model":"` + model + `","prompt":` + prompt + `}`)
		got, m := key(`{"model":"` + model + `","prompt":` + prompt + `,"truncate_prompt_tokens":32}`)
		if (got != whole || m != n) != cut || cut && m != 32 {
			t.Errorf("%s, prompt %.10s: keyed %d tokens of %d, want them cut: %v", model, prompt, m, n, cut)
		}
	}
	f("vllm", text, true)
	f("vllm", ids, true)
	f("sglang", text, false)
	f("sglang", ids, false)
	f("trtllm", text, true)
	f("trtllm", ids, false)
	f("vllm+sglang", text, false)
	f("vllm+sglang", ids, false)
	f("vllm+trtllm", text, true)
	f("vllm+trtllm", ids, false)
}

// TestTruncationRefusedWhereTheEngineReadsIt: a truncate_prompt_tokens or
// truncation_side value vLLM and TensorRT-LLM refuse gets their 400, the
// field named, on their models; SGLang has neither field and its protocol
// ignores fields it does not know, so its models serve the request, and
// so do those with an SGLang pod among others: the gateway refuses
// nothing a pod of the model would serve.
func TestTruncationRefusedWhereTheEngineReadsIt(t *testing.T) {
	cfg := config.Default()
	cfg.Pods = enginePods()
	cfg.Pods = append(cfg.Pods, mixedPods("vllm+sglang", 10010, engines.VLLM, engines.SGLang)...)
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	f := func(model, fields, wantParam string) {
		t.Helper()
		x, err := tokenizedAs(t, g, openai.KindCompletion, `{"model":"`+model+`","prompt":"say it",`+fields+`}`)
		defer releaseCompletion(x)
		var e *openai.Error
		if refused := errors.As(err, &e); refused != (wantParam != "") || refused && (e.Status != 400 || e.Param != wantParam) {
			want := "served"
			if wantParam != "" {
				want = "a 400 naming " + wantParam
			}
			t.Errorf("%s, %s: %v; want it %s", model, fields, err, want)
		}
	}
	for _, c := range []struct{ fields, param string }{
		{`"truncate_prompt_tokens":-2`, "truncate_prompt_tokens"},
		{`"truncate_prompt_tokens":"8.5"`, "truncate_prompt_tokens"},
		{`"truncation_side":"middle"`, "truncation_side"},
	} {
		f("vllm", c.fields, c.param)
		f("trtllm", c.fields, c.param)
		f("sglang", c.fields, "")
		f("vllm+sglang", c.fields, "")
	}
	// The last of a repeated key counts, as in the engines' JSON.
	f("vllm", `"truncate_prompt_tokens":"8.5","truncate_prompt_tokens":8`, "")
}

// TestCacheSaltRefusedAsTheEngineDoes: a cache_salt gets the 400 of the
// model's engine only: vLLM refuses an empty one, one over 128 characters
// or one holding '@', '/', '\' or NUL; TensorRT-LLM a blank one in a chat,
// and any in a completion, whose request has no such field; SGLang takes
// any string and an empty list, and fails a list of salts. Every engine
// refuses a number. What an engine takes keys the prompt's blocks with
// the salt it hashes.
func TestCacheSaltRefusedAsTheEngineDoes(t *testing.T) {
	cfg := config.Default()
	cfg.Pods = enginePods()
	cfg.Provision()
	g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
	f := func(kind openai.Kind, model, salt string, refused bool, keyedAs string) {
		t.Helper()
		body := `{"model":"` + model + `","prompt":["say it","again"],"cache_salt":` + salt + `}`
		if kind == openai.KindChat {
			body = `{"model":"` + model + `","messages":[{"role":"user","content":"say it"}],"cache_salt":` + salt + `}`
		}
		x, err := tokenizedAs(t, g, kind, body)
		defer releaseCompletion(x)
		var e *openai.Error
		switch {
		case errors.As(err, &e) != refused || refused && (e.Status != 400 || e.Param != "cache_salt"):
			want := "served"
			if refused {
				want = "a 400 naming cache_salt"
			}
			t.Errorf("%s %s, cache_salt %s: %v; want it %s", model, kind, salt, err, want)
		case !refused && x.req.KeySeed(radix.Seed(model)) != radix.SeedWith(radix.Seed(model), "", keyedAs):
			t.Errorf("%s %s, cache_salt %s: keyed apart from salt %q", model, kind, salt, keyedAs)
		}
	}
	long := `"` + strings.Repeat("a", 129) + `"`
	for _, c := range []struct {
		salt                 string
		vllm, trtllm, sglang bool // refused (TensorRT-LLM: in a chat)
		keyedAs              string
	}{
		{`"tenant-1"`, false, false, false, "tenant-1"},
		{`""`, true, true, false, ""},
		{`" "`, false, true, false, " "},
		{long, true, false, false, long[1 : len(long)-1]},
		{`"a/b"`, true, false, false, "a/b"},
		{`"a@b"`, true, false, false, "a@b"},
		{`"a\u0000"`, true, false, false, "a\x00"},
		{`null`, false, false, false, ""},
		{`[]`, true, true, false, ""},
		{`["s1","s2"]`, true, true, true, ""},
		{`5`, true, true, true, ""},
		{`["s1",5]`, true, true, true, ""},
	} {
		for _, kind := range []openai.Kind{openai.KindChat, openai.KindCompletion} {
			f(kind, "vllm", c.salt, c.vllm, c.keyedAs)
			f(kind, "trtllm", c.salt, c.trtllm || kind == openai.KindCompletion, c.keyedAs)
			f(kind, "sglang", c.salt, c.sglang, c.keyedAs)
		}
	}
}

// TestChatRefusedOnlyByVLLM: a chat vLLM refuses before rendering gets
// vLLM's 400 on a model whose pods are all vLLM; on an SGLang or
// TensorRT-LLM model, or one with such a pod among vLLM's, the engine
// answers it: SGLang takes a reasoning_effort from 0 to 0.99 and a tool
// of any type, TensorRT-LLM a message of any role with a null content.
// Such a request is routed without the index, as one the gateway cannot
// render.
func TestChatRefusedOnlyByVLLM(t *testing.T) {
	g := enginesGateway(t)
	f := func(model, fields, wantParam string) {
		t.Helper()
		x, err := tokenizedChat(t, g, `{"model":"`+model+`",`+fields+`}`)
		defer releaseCompletion(x)
		var e *openai.Error
		refused := errors.As(err, &e)
		switch {
		case wantParam != "" && (!refused || e.Status != 400 || e.Param != wantParam):
			t.Errorf("%s, %s: %v; want a 400 naming %s", model, fields, err, wantParam)
		case wantParam == "" && (err != nil || len(x.ids) > 0):
			t.Errorf("%s, %s: %v, %d ids; want it routed without the index", model, fields, err, len(x.ids))
		}
	}
	for _, c := range []struct{ fields, param string }{
		{`"messages":[{"role":"user","content":"hi"}],"reasoning_effort":0.5`, "reasoning_effort"},
		{`"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"custom","function":{"name":"f"}}]`, "tools[0].type"},
		{`"messages":[{"role":"user","content":null}]`, "messages[0].content"},
	} {
		f("vllm", c.fields, c.param)
		for _, model := range []string{"sglang", "trtllm", "vllm+sglang", "vllm+trtllm"} {
			f(model, c.fields, "")
		}
	}
}

// TestMessagesTokenizeByEngine: a Messages request is keyed by the ids of
// the chat vLLM makes of it on a vLLM model; SGLang converts it otherwise
// (system blocks joined by "\n", the billing header kept, thinking
// dropped), so on an SGLang model it is routed without the index.
func TestMessagesTokenizeByEngine(t *testing.T) {
	body := `{"model":"m","max_tokens":4,"system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":"Hi"}]}`
	for _, c := range []struct {
		engine engines.Kind
		exact  bool
	}{{engines.VLLM, true}, {"", true}, {engines.SGLang, false}} {
		cfg := config.Default()
		cfg.Models = []config.Model{{Name: "m", Tokenizer: tokfiles.Dir(t, "qwen3")}}
		cfg.Pods = []config.Pod{{Name: "p0", Model: "m", Address: "127.0.0.1:10000", Engine: string(c.engine)}}
		cfg.Provision()
		g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
		x, err := tokenizedAs(t, g, openai.KindMessages, body)
		if err != nil || (len(x.ids) > 0) != c.exact {
			t.Errorf("engine %q: %d ids (%v), want exact %v", c.engine, len(x.ids), err, c.exact)
		}
		releaseCompletion(x)
	}
}

// TestMessagesInlineSystem: a Messages request with system-role messages
// inside messages is keyed by the engine's ids when the model says where
// its vLLM puts them (messages_inline_system), and routed without the
// index when it does not.
func TestMessagesInlineSystem(t *testing.T) {
	body := `{"model":"m","max_tokens":4,"system":"S","messages":[{"role":"user","content":"Hi"},{"role":"system","content":"note"},{"role":"user","content":"Go on."}]}`
	ids := map[string]string{}
	for _, inline := range []string{"", "hoist", "preserve"} {
		cfg := config.Default()
		cfg.Models = []config.Model{{Name: "m", Tokenizer: tokfiles.Dir(t, "qwen3"), MessagesInlineSystem: inline}}
		cfg.Pods = []config.Pod{{Name: "p0", Model: "m", Address: "127.0.0.1:10000"}}
		cfg.Provision()
		g, _ := testGateway(t, cfg, upstream.Dialer(nil), nil)
		x, err := tokenizedAs(t, g, openai.KindMessages, body)
		if err != nil || (len(x.ids) > 0) != (inline != "") {
			t.Errorf("messages_inline_system %q: %d ids (%v)", inline, len(x.ids), err)
		}
		ids[inline] = fmt.Sprint(x.ids)
		releaseCompletion(x)
	}
	if ids["hoist"] == ids["preserve"] {
		t.Error("hoist and preserve gave the same ids")
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/internal/tokfiles"
	"pdlb/lb/config"
)

// tokenizeRun runs pdlb tokenize with body on standard input.
func tokenizeRun(t *testing.T, body string, args ...string) (string, error) {
	t.Helper()
	old := stdin
	stdin = strings.NewReader(body)
	defer func() { stdin = old }()
	var out bytes.Buffer
	err := cmdTokenize(args, &out)
	return out.String(), err
}

func TestCmdTokenize(t *testing.T) {
	dir := tokfiles.Dir(t, "qwen3")
	chat := `{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Where is the capital of China?"}]}`
	out, err := tokenizeRun(t, chat, "--tokenizer", dir, "--json", "--block-size", "4")
	if err != nil {
		t.Fatal(err)
	}
	var got tokenized
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json printed %q: %v", out, err)
	}
	truth := []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198}
	if !got.Exact || !slices.Equal(got.IDs, truth) || len(got.Tokens) != len(truth) || got.Tokens[0] != "<|im_start|>" ||
		len(got.Keys) != 3 || !strings.HasSuffix(got.Prompt, "<|im_start|>assistant\n") {
		t.Fatalf("got %+v", got)
	}
	// The stand-in says it is one.
	out, err = tokenizeRun(t, chat)
	if err != nil || !strings.Contains(out, "estimate: pdlb's stand-in") || !strings.Contains(out, "<|user|>") {
		t.Fatalf("stand-in: %v\n%s", err, out)
	}
	// Token ids given by the client are used as they are.
	out, err = tokenizeRun(t, `{"model":"m","prompt":[1,2,3]}`, "--tokenizer", dir, "--json")
	if err != nil || !strings.Contains(out, `"ids":[1,2,3]`) {
		t.Fatalf("token ids: %v %s", err, out)
	}

	f := func(body, want string, args ...string) {
		t.Helper()
		if _, err := tokenizeRun(t, body, args...); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v %q: error %v, want %q", args, body, err, want)
		}
	}
	f(chat, "--block-size 0: must be at least 1", "--block-size", "0")
	f(chat, `--chat-template-kwargs "x": not a JSON object`, "--chat-template-kwargs", "x")
	f(chat, `unexpected argument "extra"`, "extra")
	f("nope", "not a JSON object")
	f(`{"model":"m","messages":[{"role":"user","content":null}]}`, "messages[0].content", "--tokenizer", dir)
	f(`{"model":"m"}`, `"prompt" is required`)
}

func TestCmdTokenizeAsksTheGateway(t *testing.T) {
	var asked map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/admin/index/match" || r.Header.Get("Authorization") != "Bearer s3cret" || json.Unmarshal(b, &asked) != nil {
			http.Error(w, "bad request", 400)
			return
		}
		io.WriteString(w, `{"pods":[{"pod":"pod-0","cached_tokens":16},{"pod":"pod-1","cached_tokens":0}]}`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	out, err := tokenizeRun(t, `{"model":"m","prompt":"hello there"}`, "--admin", addr, "--admin-token", "s3cret")
	if err != nil || !strings.Contains(out, "pod-0") || !strings.Contains(out, "16") || asked["model"] != "m" {
		t.Fatalf("%v\n%s\nasked %v", err, out, asked)
	}
	if _, err := tokenizeRun(t, `{"model":"m","prompt":"hello"}`, "--admin", addr); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a refused query: %v", err)
	}
}

// TestCmdTokenizeTruncates: a request with truncate_prompt_tokens shows
// the ids the engine keeps, which the gateway keys, and SGLang, which has
// no such field, keeps them all.
func TestCmdTokenizeTruncates(t *testing.T) {
	dir := tokfiles.Dir(t, "llama3.1")
	ids := func(body string, args ...string) []uint32 {
		t.Helper()
		out, err := tokenizeRun(t, body, append(args, "--json")...)
		if err != nil {
			t.Fatal(err)
		}
		var got tokenized
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("--json printed %q: %v", out, err)
		}
		return got.IDs
	}
	text := `"` + strings.Repeat("alpha beta ", 20) + `"`
	whole := ids(`{"model":"m","prompt":`+text+`}`, "--tokenizer", dir)
	want := append(whole[:1:1], whole[len(whole)-7:]...) // the BOS and the text's last 7
	cut := `{"model":"m","prompt":` + text + `,"truncate_prompt_tokens":8}`
	if got := ids(cut, "--tokenizer", dir); !slices.Equal(got, want) {
		t.Errorf("text, last 8: %v, want %v", got, want)
	}
	if got := ids(cut, "--tokenizer", dir, "--engine", "sglang"); !slices.Equal(got, whole) {
		t.Errorf("sglang: %v, want them all: %v", got, whole)
	}
	// A value vLLM refuses, SGLang ignores.
	bad := `{"model":"m","prompt":` + text + `,"truncate_prompt_tokens":-2}`
	if got := ids(bad, "--tokenizer", dir, "--engine", "sglang"); !slices.Equal(got, whole) {
		t.Errorf("sglang, truncate_prompt_tokens -2: %v, want them all: %v", got, whole)
	}
	if _, err := tokenizeRun(t, bad, "--tokenizer", dir); err == nil || !strings.Contains(err.Error(), `"truncate_prompt_tokens" must be`) {
		t.Errorf("vllm, truncate_prompt_tokens -2: %v", err)
	}
	// A batch's prompts are the engine's separate requests, each cut on
	// its own: the ids are those of each prompt sent alone, one after the
	// other.
	other := `"` + strings.Repeat("gamma delta ", 15) + `"`
	alone := append(ids(cut, "--tokenizer", dir), ids(`{"model":"m","prompt":`+other+`,"truncate_prompt_tokens":8}`, "--tokenizer", dir)...)
	if got := ids(`{"model":"m","prompt":[`+text+`,`+other+`],"truncate_prompt_tokens":8}`, "--tokenizer", dir); !slices.Equal(got, alone) {
		t.Errorf("batch, last 8 of each: %v, want %v", got, alone)
	}
	if got := ids(`{"model":"m","prompt":[1,2,3,4,5,6],"truncate_prompt_tokens":4,"truncation_side":"right"}`); !slices.Equal(got, []uint32{1, 2, 3, 4}) {
		t.Errorf("ids, first 4: %v", got)
	}
	if got, whole := ids(cut), ids(`{"model":"m","prompt":`+text+`}`); len(got) != 8 || !slices.Equal(got, whole[len(whole)-8:]) {
		t.Errorf("stand-in, last 8: %v of %v", got, whole)
	}
	if _, err := tokenizeRun(t, cut, "--engine", "tgi"); err == nil || !strings.Contains(err.Error(), `--engine "tgi"`) {
		t.Errorf("--engine tgi: %v", err)
	}
}

// TestCmdTokenizeUnknownModel: when the gateway serves no model by the
// body's name, the ids and blocks computed here still show, and the
// error names the models it serves.
func TestCmdTokenizeUnknownModel(t *testing.T) {
	pod, err := sim.Start(sim.Config{Name: "m-0", Model: "m", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	s := lbtest.StartGateway(t, []config.Pod{{Name: "m-0", Model: "m", Address: pod.Addr()}}, nil)
	out, err := tokenizeRun(t, `{"model":"Qwen/Qwen3-8B","prompt":"hello there, all of you"}`, "--admin", s.AdminAddr())
	if err == nil || !strings.Contains(err.Error(), "no model Qwen/Qwen3-8B in the fleet; it serves: m") || !strings.Contains(err.Error(), `"model"`) {
		t.Errorf("error %v, want the model unknown, the served one named", err)
	}
	for _, want := range []string{"prompt:     23 bytes", "ids:        6", "blocks:     0 of 16 tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("printed %q, want %q in it", out, want)
		}
	}
}

// TestCmdTokenizeBatchAsTheGateway: a completion batch's prompts are the
// engine's requests of their own, which the gateway keys each from the
// root; pdlb tokenize keys them so, and the index's answer for them is a
// pod's cached tokens of every prompt, summed: after the gateway served
// the batch, its pod holds each prompt's full blocks.
func TestCmdTokenizeBatchAsTheGateway(t *testing.T) {
	s := lbtest.StartGateway(t, []config.Pod{{Name: "m-0", Model: "m", Address: modelPods(t, "m")["m"]}}, nil)
	// 50 stand-in tokens each (4 bytes a token): 3 full blocks of 16.
	a, b := strings.Repeat("alpha beta ", 20)[:200], strings.Repeat("gamma delta ", 20)[:200]
	batch := `{"model":"m","prompt":["` + a + `","` + b + `"],"max_tokens":1}`
	resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(batch))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the batch: %s", resp.Status)
	}
	out, err := tokenizeRun(t, batch, "--admin", s.AdminAddr(), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got tokenized
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json printed %q: %v", out, err)
	}
	if len(got.Keys) != 6 || len(got.Pods) != 1 || got.Pods[0].CachedTokens != 2*3*16 {
		t.Errorf("keys %v, pods %+v; want 6 keys (3 a prompt) and m-0 holding 96 tokens", got.Keys, got.Pods)
	}
	// Ends that do not cut the ids into prompts are refused.
	if resp, err = http.Post("http://"+s.AdminAddr()+"/admin/index/match", "application/json", strings.NewReader(`{"model":"m","ids":[1,2,3],"ends":[2]}`)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("ends [2] of 3 ids: %s, want 400", resp.Status)
	}
	if out, err = tokenizeRun(t, batch, "--admin", s.AdminAddr()); err != nil || !strings.Contains(out, "prompt 1, from the root") || !strings.Contains(out, "m-0                      96") {
		t.Errorf("%v\n%s", err, out)
	}
}

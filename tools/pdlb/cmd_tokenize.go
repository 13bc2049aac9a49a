package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"pdlb/engines"
	"pdlb/engines/chat"
	"pdlb/engines/prompt"
	"pdlb/engines/tokenize"
	"pdlb/lb/openai"
	"pdlb/radix"
)

// stdin is what pdlb tokenize reads; tests replace it.
var stdin io.Reader = os.Stdin

// tokenized is what pdlb tokenize found for one request body; --json
// prints it as is.
type tokenized struct {
	Model     string   `json:"model"`
	Tokenizer string   `json:"tokenizer"` // a directory, or "stand-in"
	Exact     bool     `json:"exact"`     // ids as the engine computes them
	Prompt    string   `json:"prompt"`    // the text encoded; "" for token-id prompts
	IDs       []uint32 `json:"ids"`
	// Ends, for a completion batch, is where each prompt's ids end: the
	// engine serves each prompt as a request of its own.
	Ends      []int    `json:"ends,omitempty"`
	Tokens    []string `json:"tokens"`
	BlockSize int      `json:"block_size"`
	Keys      []string `json:"keys"` // the index's block keys, hex
	// Chains, for a batch, is where each prompt's keys end in Keys: each
	// chained from the root, as the gateway keys them.
	Chains []int `json:"chains,omitempty"`
	// Unindexed: the request has non-text content, whose blocks the
	// engine keys by media hashes the gateway cannot compute; the gateway
	// routes it without the index.
	Unindexed bool   `json:"unindexed,omitempty"`
	seed      uint64 // the first block's chain state (model, cache_salt)
	salt      string
	Pods      []podHit `json:"pods,omitempty"`
}

// podHit is one pod's cached prefix of the request, as the gateway's index
// holds it (GET /admin/index/match).
type podHit struct {
	Pod          string `json:"pod"`
	CachedTokens int    `json:"cached_tokens"`
}

func cmdTokenize(args []string, stdout io.Writer) error {
	fs := newFlagSet("tokenize", "[--tokenizer DIR] [--json] [--admin ADDR] < request.json",
		`Reads one OpenAI request body (chat: "messages"; completion: "prompt") on
standard input and shows what the engine computes for it: the prompt its
chat template renders, the token ids its tokenizer gives, and the block
keys pdlb's prefix index files them under. With --admin it also asks a
running gateway which pods hold those blocks. Run it first when cache hits
look low: the gateway, configured with the same files, computes the same.`, stdout)
	var (
		dir, tmpl, kwargs, admin, token, eng string
		blockSize                            int
		asJSON                               bool
	)
	fs.StringVar(&dir, "tokenizer", "", "Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json); default: pdlb's stand-in, which no engine matches")
	fs.StringVar(&tmpl, "chat-template", "", "chat template file (or text) replacing the tokenizer's, as vLLM's --chat-template")
	fs.StringVar(&kwargs, "chat-template-kwargs", "", `default chat_template_kwargs as JSON, e.g. '{"enable_thinking":false}'`)
	fs.StringVar(&eng, "engine", "vllm", "the model's engine (vllm, sglang, trtllm): whether truncate_prompt_tokens cuts the prompt")
	fs.IntVar(&blockSize, "block-size", 16, "tokens per index block (the model's block_size)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object (model, tokenizer, exact, prompt, ids, tokens, block_size, keys, pods)")
	fs.StringVar(&admin, "admin", "", "a gateway's admin address (host:port) to ask which pods hold the blocks")
	fs.StringVar(&token, "admin-token", "", "bearer token for --admin (the gateway's admin_token)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("unexpected argument %q (the request body is read from standard input)", fs.Arg(0)))
	}
	if blockSize < 1 {
		return fs.usageError(fmt.Errorf("--block-size %d: must be at least 1", blockSize))
	}
	kind, err := engines.ParseKind(eng)
	if err != nil {
		return fs.usageError(fmt.Errorf("--engine %q: %v", eng, err))
	}
	cfg := prompt.Config{Tokenizer: dir, ChatTemplate: tmpl}
	if kwargs != "" {
		if err := json.Unmarshal([]byte(kwargs), &cfg.ChatTemplateKwargs); err != nil {
			return fmt.Errorf("--chat-template-kwargs %q: not a JSON object: %v", kwargs, err)
		}
	}
	model, err := prompt.Load(cfg)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(stdin, 64<<20))
	if err != nil {
		return err
	}
	t, err := tokenizeBody(model, body, kind)
	if err != nil {
		return err
	}
	t.Tokenizer = "stand-in"
	if dir != "" {
		t.Tokenizer = dir
	}
	t.BlockSize = blockSize
	keys, chains := radix.AppendBatchKeys(nil, nil, t.seed, t.IDs, t.Ends, blockSize)
	for _, k := range keys {
		t.Keys = append(t.Keys, strconv.FormatUint(k, 16))
	}
	t.Chains = chains
	// What was computed here is shown even when the gateway's lookup
	// fails: the ids and blocks are what one compares with the gateway.
	var asked error
	if admin != "" {
		t.Pods, asked = indexMatch(admin, token, t)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(t); err != nil {
			return err
		}
		return asked
	}
	printTokenized(stdout, t, admin != "" && asked == nil)
	return asked
}

// tokenizeBody renders and encodes body as the engine would (m non-nil)
// or as the gateway's stand-in does, and keeps the ids engine keeps of
// them under truncate_prompt_tokens, as the gateway does.
func tokenizeBody(m *prompt.Model, body []byte, engine engines.Kind) (tokenized, error) {
	var req struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return tokenized{}, fmt.Errorf("the request body on standard input is not a JSON object: %v", err)
	}
	t := tokenized{Model: req.Model, Exact: m != nil}
	kind := openai.KindCompletion
	if len(req.Messages) > 0 {
		kind = openai.KindChat
	}
	r := openai.NewRequest()
	if err := r.Parse(kind, body); err != nil {
		return t, err
	}
	r.Engine = engine
	if e := r.EngineRefusal(); e != nil {
		return t, e
	}
	t.seed, t.Unindexed, t.salt = r.KeySeed(radix.Seed(t.Model)), r.Unindexed(), string(r.CacheSalt)
	switch {
	case r.TokenIDs || m == nil:
		// The client's own ids, or the stand-in's, cut as the engine cuts
		// them, each prompt of a batch on its own.
		for i := range r.Batch() {
			if r.TokenIDs {
				t.IDs = append(t.IDs, r.BatchIDsKept(i)...)
			} else {
				t.IDs = tokenize.Append(t.IDs, r.BatchPromptKept(i))
			}
			t.Ends = append(t.Ends, len(t.IDs))
		}
		t.Exact = t.Exact || r.TokenIDs
		if !r.TokenIDs {
			t.Prompt = string(r.Prompt)
		}
	case kind == openai.KindChat:
		c := chat.AcquireConversation()
		defer chat.ReleaseConversation(c)
		if err := c.ParseRequest(body); err != nil {
			return t, err
		}
		text, err := m.Render(nil, c)
		if err != nil {
			return t, err
		}
		t.Prompt = string(text)
		special := r.SpecialTokensSet && r.SpecialTokens
		t.IDs = m.Tokenizer().Append(nil, text, special)
		if k, right := r.Truncation(); k > 0 {
			t.IDs = m.Tokenizer().Truncate(t.IDs, k, right, special)
		}
	default:
		// As the gateway keys it: each prompt of a batch on its own.
		t.Prompt = string(r.Prompt)
		k, right := r.Truncation()
		t.IDs, t.Ends = m.Batch(nil, nil, r.Batch(), r.BatchPrompt, !r.SpecialTokensSet || r.SpecialTokens, k, right)
	}
	if len(t.Ends) < 2 {
		t.Ends = nil // one prompt
	}
	for _, id := range t.IDs {
		t.Tokens = append(t.Tokens, tokenText(m, id))
	}
	return t, nil
}

// tokenText is id's vocabulary entry, or its stand-in bytes.
func tokenText(m *prompt.Model, id uint32) string {
	if m == nil {
		b := []byte{byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24)}
		return string(bytes.TrimRight(b, "\x00"))
	}
	if s, ok := m.Tokenizer().Token(id); ok {
		return s
	}
	return "<" + strconv.FormatUint(uint64(id), 10) + "?>"
}

// indexMatch asks the gateway at admin which pods hold t's blocks.
func indexMatch(admin, token string, t tokenized) ([]podHit, error) {
	q, _ := json.Marshal(map[string]any{"model": t.Model, "ids": t.IDs, "ends": t.Ends, "cache_salt": t.salt})
	req, err := http.NewRequest(http.MethodPost, "http://"+admin+"/admin/index/match", bytes.NewReader(q))
	if err != nil {
		return nil, fmt.Errorf("--admin %q: %v", admin, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("--admin %q: %v", admin, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		// The gateway knows no model by the body's name (its answer
		// lists those it serves): the index is keyed by the served name.
		return nil, fmt.Errorf("--admin %q: %s: %s; set the request body's \"model\" (%q) to the name the gateway serves it by", admin, resp.Status, strings.TrimSpace(string(b)), t.Model)
	default:
		return nil, fmt.Errorf("--admin %q: %s: %s", admin, resp.Status, strings.TrimSpace(string(b)))
	}
	var out struct {
		Pods []podHit `json:"pods"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("--admin %q: the answer is not the index's: %v", admin, err)
	}
	return out.Pods, nil
}

func printTokenized(w io.Writer, t tokenized, asked bool) {
	how := "exact: the engine's tokenizer and chat template"
	if !t.Exact {
		how = "estimate: pdlb's stand-in (4 bytes a token); no engine computes these ids"
	}
	fmt.Fprintf(w, "model:      %s\ntokenizer:  %s (%s)\n", t.Model, t.Tokenizer, how)
	fmt.Fprintf(w, "prompt:     %d bytes\n%s\n", len(t.Prompt), t.Prompt)
	fmt.Fprintf(w, "ids:        %d\n%v\n", len(t.IDs), t.IDs)
	if len(t.Ends) > 0 {
		fmt.Fprintf(w, "            %d prompts, each the engine's request of its own, ending at %v\n", len(t.Ends), t.Ends)
	}
	quoted := make([]string, len(t.Tokens))
	for i, s := range t.Tokens {
		quoted[i] = strconv.Quote(s)
	}
	fmt.Fprintf(w, "tokens:     %s\n", strings.Join(quoted, " "))
	fmt.Fprintf(w, "blocks:     %d of %d tokens (%d tokens left over, not indexed)\n", len(t.Keys), t.BlockSize, len(t.IDs)-len(t.Keys)*t.BlockSize)
	if t.Unindexed {
		fmt.Fprintln(w, "            the request has non-text content: the engine keys its blocks by media hashes, so the gateway routes it without the index")
	}
	chains, from := t.Chains, 0
	if len(chains) == 0 {
		chains = []int{len(t.Keys)}
	}
	for p, end := range chains {
		if len(t.Chains) > 0 {
			fmt.Fprintf(w, "  prompt %d, from the root:\n", p)
		}
		for i := from; i < end; i++ {
			fmt.Fprintf(w, "  %3d  %s\n", i, t.Keys[i])
		}
		from = end
	}
	if asked {
		of := "this prompt"
		if len(t.Ends) > 0 {
			of = "the prompts, summed"
		}
		fmt.Fprintf(w, "gateway index (cached tokens of %s, pod by pod):\n", of)
		if len(t.Pods) == 0 {
			fmt.Fprintln(w, "  no pod of this model")
		}
		for _, p := range t.Pods {
			fmt.Fprintf(w, "  %-24s %d\n", p.Pod, p.CachedTokens)
		}
	}
}

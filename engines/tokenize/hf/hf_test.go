package hf

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"pdlb/internal/racebuild"
	"pdlb/internal/tokfiles"
)

// readGz returns the lines of a gzipped testdata file.
func readGz(t testing.TB, name string) [][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 64<<20)
	var lines [][]byte
	for sc.Scan() {
		lines = append(lines, slices.Clone(sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// corpus is the differential-test corpus gen.mjs wrote.
func corpus(t testing.TB) []string {
	t.Helper()
	var out []string
	for i, line := range readGz(t, "corpus.jsonl.gz") {
		var s string
		if err := json.Unmarshal(line, &s); err != nil {
			t.Fatalf("corpus line %d: %v", i+1, err)
		}
		out = append(out, s)
	}
	return out
}

// golden is the reference ids of each corpus string for model: [without
// special tokens, with them].
func golden(t testing.TB, model string) [][2][]uint32 {
	t.Helper()
	var out [][2][]uint32
	for i, line := range readGz(t, "golden-"+model+".jsonl.gz") {
		var ids [2][]uint32
		if err := json.Unmarshal(line, &ids); err != nil {
			t.Fatalf("golden-%s line %d: %v", model, i+1, err)
		}
		out = append(out, ids)
	}
	return out
}

var loaded sync.Map // model -> *Tokenizer, shared by the tests

func load(t testing.TB, model string) *Tokenizer {
	t.Helper()
	if tok, ok := loaded.Load(model); ok {
		return tok.(*Tokenizer)
	}
	tok, err := Load(tokfiles.Dir(t, model))
	if err != nil {
		t.Fatal(err)
	}
	loaded.Store(model, tok)
	return tok
}

// diff describes the first difference between got and want.
func diff(s string, got, want []uint32) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("text %q\n  got  %v\n  want %v\n  first difference at index %d", s, got, want, i)
}

// checkCorpus encodes every corpus string both ways and reports the first
// mismatches.
func checkCorpus(t *testing.T, tok *Tokenizer, texts []string, want [][2][]uint32) {
	t.Helper()
	if len(texts) != len(want) {
		t.Fatalf("%d corpus strings, %d golden lines", len(texts), len(want))
	}
	bad := 0
	for i, s := range texts {
		for mode, special := range []bool{false, true} {
			got := tok.Append(nil, []byte(s), special)
			if !slices.Equal(got, want[i][mode]) {
				if bad++; bad <= 5 {
					t.Errorf("string %d, addSpecial %v: %s", i, special, diff(s, got, want[i][mode]))
				}
			}
			if n := tok.Count([]byte(s), special); n != len(want[i][mode]) {
				t.Errorf("string %d: Count %d, want %d", i, n, len(want[i][mode]))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d encodings differ from HF", bad, 2*len(texts))
	}
}

func TestGolden(t *testing.T) {
	texts := corpus(t)
	for _, model := range []string{"qwen3", "llama3.1", "llama2"} {
		t.Run(model, func(t *testing.T) {
			tok := load(t, model)
			want := golden(t, model)
			checkCorpus(t, withCaches(tok, 0), texts, want)
			// With fresh caches: filling them, then hitting them.
			cached := withCaches(tok, segmentCacheBytes)
			checkCorpus(t, cached, texts, want)
			checkCorpus(t, cached, texts, want)
		})
	}
}

// TestVLLMGroundTruth checks ids vLLM produced for a chat prompt.
func TestVLLMGroundTruth(t *testing.T) {
	const prompt = "<|im_start|>user\nWhere is the capital of China?<|im_end|>\n<|im_start|>assistant\n"
	f := func(model string, special bool, want []uint32) {
		t.Helper()
		got := load(t, model).Append(nil, []byte(prompt), special)
		if !slices.Equal(got, want) {
			t.Errorf("%s addSpecial %v: %s", model, special, diff(prompt, got, want))
		}
	}
	qwen := []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198}
	f("qwen3", false, qwen)
	f("qwen3", true, qwen)
	tok := load(t, "llama3.1")
	plain := tok.Append(nil, []byte("Hello, world"), false)
	if got := tok.Append(nil, []byte("Hello, world"), true); !slices.Equal(got, append([]uint32{128000}, plain...)) {
		t.Errorf("llama3.1 with addSpecial: %v, want 128000 then %v", got, plain)
	}
}

func TestConfig(t *testing.T) {
	f := func(model, bos, eos string, template bool) {
		t.Helper()
		tok := load(t, model)
		if tok.BOS() != bos || tok.EOS() != eos {
			t.Errorf("%s: BOS %q EOS %q, want %q %q", model, tok.BOS(), tok.EOS(), bos, eos)
		}
		if (tok.ChatTemplate() != "") != template {
			t.Errorf("%s: chat template %.40q, want one: %v", model, tok.ChatTemplate(), template)
		}
		sp := tok.SpecialTokens()
		if sp["eos_token"] != eos {
			t.Errorf("%s: SpecialTokens %v", model, sp)
		}
		if id, ok := tok.ID(eos); !ok {
			t.Errorf("%s: no id for %q", model, eos)
		} else if s, _ := tok.Token(id); s != eos {
			t.Errorf("%s: Token(%d) = %q, want %q", model, id, s, eos)
		}
	}
	f("qwen3", "", "<|im_end|>", true)
	f("llama3.1", "<|begin_of_text|>", "<|eot_id|>", true)
	f("llama2", "<s>", "</s>", false)
	tok := load(t, "qwen3")
	if id, ok := tok.ID("Ġthe"); !ok || id != 279 {
		t.Errorf(`ID("Ġthe") = %d %v, want 279`, id, ok)
	}
	if id, ok := load(t, "llama2").ID("\u2581"); !ok || id != 28705 {
		t.Errorf(`llama2 ID("\u2581") = %d %v, want 28705`, id, ok)
	}
	if _, ok := tok.Token(1 << 30); ok {
		t.Error("Token of an unknown id found")
	}
}

// tiny returns testdata/refuse/ok.json changed by edit.
func tiny(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "refuse", "ok.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestConfigForms(t *testing.T) {
	tj := tiny(t, func(map[string]any) {})
	f := func(cfg, bos, template string, specials map[string]string) {
		t.Helper()
		tok, err := Parse(tj, []byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v", cfg, err)
		}
		if tok.BOS() != bos || tok.ChatTemplate() != template {
			t.Errorf("%s: BOS %q template %q, want %q %q", cfg, tok.BOS(), tok.ChatTemplate(), bos, template)
		}
		if got := tok.SpecialTokens(); fmt.Sprint(got) != fmt.Sprint(specials) {
			t.Errorf("%s: SpecialTokens %v, want %v", cfg, got, specials)
		}
	}
	f(`{"bos_token": {"content": "<s>", "lstrip": false}, "pad_token": null, "unk_token": "<s>", "image_token": "b"}`, "<s>", "",
		map[string]string{"bos_token": "<s>", "unk_token": "<s>", "image_token": "b"})
	f(`{"additional_special_tokens": ["<s>"], "added_tokens_decoder": {"3": {"content": "<s>", "special": true}}}`, "", "", map[string]string{})
	f(`{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}`, "", "D", map[string]string{})
	f(`{"chat_template": "{{ bos_token }}", "eos_token": "<s>"}`, "", "{{ bos_token }}", map[string]string{"eos_token": "<s>"})

	dir := t.TempDir()
	for name, body := range map[string]string{"tokenizer.json": string(tj), "tokenizer_config.json": `{"chat_template": "old"}`, "chat_template.jinja": "new"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if tok, err := Load(dir); err != nil || tok.ChatTemplate() != "new" {
		t.Errorf("Load with chat_template.jinja: %v, template %q", err, tok.ChatTemplate())
	}
}

func TestRefuse(t *testing.T) {
	f := func(file, want string) {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("testdata", "refuse", file+".json"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = Parse(data, nil)
		if err == nil || err.Error() != want {
			t.Errorf("%s: error %v, want %q", file, err, want)
		}
	}
	f("unigram", `hf: tokenizer.json model: model "Unigram" not supported`)
	f("nfkc", `hf: tokenizer.json normalizer: normalizer "NFKC" not supported`)
	f("replace_regex", `hf: tokenizer.json normalizer.normalizers[1]: Replace pattern {"Regex":" +"} not supported (only a non-empty String)`)
	f("split_regex", `hf: tokenizer.json pre_tokenizer.pretokenizers[0]: Split regex "\\p{N}{1,2}" not supported`)
	f("split_invert", `hf: tokenizer.json pre_tokenizer: Split invert true not supported`)
	f("whitespace", `hf: tokenizer.json pre_tokenizer: pre-tokenizer "Whitespace" not supported`)
	f("bytelevel_field", `hf: tokenizer.json pre_tokenizer: field "legacy" not supported`)
	f("metaspace_legacy", `hf: tokenizer.json pre_tokenizer: field "add_prefix_space" not supported`)
	f("dropout", `hf: tokenizer.json model.dropout: 0.1 not supported`)
	f("merge_oov", `hf: tokenizer.json model.merges[1]: "a" "c" not in vocab`)
	f("roberta", `hf: tokenizer.json post_processor: post-processor "RobertaProcessing" not supported`)
	f("template_pair_only", `hf: tokenizer.json post_processor.single[1]: Sequence "B" not supported`)

	if _, err := Parse([]byte(`{"model": null}`), nil); err == nil {
		t.Error("no model: accepted")
	}
	g := func(edit func(m map[string]any), cfg, want string) {
		t.Helper()
		var c []byte
		if cfg != "" {
			c = []byte(cfg)
		}
		_, err := Parse(tiny(t, edit), c)
		if err == nil || err.Error() != want {
			t.Errorf("error %v, want %q", err, want)
		}
	}
	g(func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
			map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated"}}}
	}, "", "hf: tokenizer.json pre_tokenizer: ByteLevel followed by another pre-tokenizer not supported")
	g(func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
	}, "", "hf: tokenizer.json model.vocab: byte-level vocabulary lacks byte 0x00")
	g(func(m map[string]any) { m["extra"] = 1 }, "", `hf: tokenizer.json: field "extra" not supported`)
	g(func(m map[string]any) { m["model"].(map[string]any)["unk_token"] = "<unk>" }, "", `hf: tokenizer.json model.unk_token: "<unk>" not in vocab`)
	byteLevel := func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}
		vocab := map[string]any{}
		for r, b := range runeByte {
			if b >= 0 {
				vocab[string(rune(r))] = b
			}
		}
		m["model"] = map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{}}
		m["added_tokens"] = nil
	}
	g(func(m map[string]any) {}, `{"split_special_tokens": true}`,
		"hf: tokenizer_config.json split_special_tokens: true not supported (special tokens in the text are always recognised)")
	g(func(m map[string]any) {}, `{"unk_token": "b"}`,
		`hf: tokenizer_config.json unk_token: "b" is not an added token of tokenizer.json (transformers would add it)`)
	g(func(m map[string]any) {}, `{"additional_special_tokens": [{"content": "ab"}]}`,
		`hf: tokenizer_config.json additional_special_tokens: {"content": "ab"} is not an added token of tokenizer.json (transformers would add it)`)
	g(func(m map[string]any) {}, `{"added_tokens_decoder": {"3": {"content": "<s>", "special": true, "lstrip": true}}}`,
		"hf: tokenizer_config.json added_tokens_decoder[3]: {ID:3 Content:<s> SingleWord:false LStrip:true RStrip:false Normalized:false Special:true} differs from tokenizer.json's {ID:3 Content:<s> SingleWord:false LStrip:false RStrip:false Normalized:false Special:true}")
	g(func(m map[string]any) {}, `{"added_tokens_decoder": {"3": {"content": "<s>", "special": false}}}`,
		"hf: tokenizer_config.json added_tokens_decoder[3]: {ID:3 Content:<s> SingleWord:false LStrip:false RStrip:false Normalized:true Special:false} differs from tokenizer.json's {ID:3 Content:<s> SingleWord:false LStrip:false RStrip:false Normalized:false Special:true}")
	g(byteLevel, `{}`, "hf: tokenizer_config.json add_prefix_space: false (absent is false) differs from tokenizer.json pre_tokenizer ByteLevel add_prefix_space true")
	g(func(m map[string]any) {}, `{"tokenizer_class": "LlamaTokenizerFast", "add_prefix_space": true}`,
		"hf: tokenizer_config.json add_prefix_space: true with LlamaTokenizerFast not supported (transformers rebuilds the tokenizer from the slow one)")
	g(func(m map[string]any) {}, `{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>"}`,
		`hf: tokenizer_config.json add_bos_token: true (bos_token "<s>") disagrees with tokenizer.json post_processor [] for LlamaTokenizer`)
}

// withCaches returns a copy of tok with fresh caches, or none when size is 0.
func withCaches(tok *Tokenizer, size int) *Tokenizer {
	c := *tok
	c.segments, c.words = nil, nil
	if size > 0 {
		c.segments, c.words = newCache(size), newCache(size)
	}
	return &c
}

// TestConcurrent encodes the corpus from several goroutines sharing fresh
// caches small enough to be emptied often.
func TestConcurrent(t *testing.T) {
	texts := corpus(t)
	want := golden(t, "qwen3")
	tok := withCaches(load(t, "qwen3"), 256<<10)
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Go(func() {
			var dst []uint32
			for i := g; i < len(texts); i += 2 {
				dst = tok.Append(dst[:0], []byte(texts[i]), i%3 == 0)
				if w := want[i][b2i(i%3 == 0)]; !slices.Equal(dst, w) {
					errs <- diff(texts[i], dst, w)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestAppendAllocs: with warm caches and room in dst, encoding allocates
// nothing.
func TestAppendAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	text, err := os.ReadFile(filepath.Join("testdata", "bench.txt"))
	if err != nil {
		t.Fatal(err)
	}
	text = append([]byte("<|im_start|>user\n<s>"), text...)
	for _, model := range []string{"qwen3", "llama3.1", "llama2"} {
		tok := load(t, model)
		dst := tok.Append(nil, text, true)
		dst = tok.Append(dst, text, true)
		if n := testing.AllocsPerRun(50, func() { dst = tok.Append(dst[:0], text, true) }); n != 0 {
			t.Errorf("%s: Append allocates %v times a run", model, n)
		}
		if n := testing.AllocsPerRun(50, func() { tok.Count(text, false) }); n != 0 {
			t.Errorf("%s: Count allocates %v times a run", model, n)
		}
	}
}

// TestTruncate: ids cut as vLLM cuts a prompt under truncate_prompt_tokens.
// The llama3.1 ids are what HF's Rust tokenizers give for the text with
// truncation on (max_length 5, direction left, then right).
func TestTruncate(t *testing.T) {
	f := func(tok *Tokenizer, ids []uint32, keep int, right, special bool, want []uint32) {
		t.Helper()
		in := slices.Clone(ids)
		if got := tok.Truncate(in, keep, right, special); !slices.Equal(got, want) {
			t.Errorf("Truncate(%v, %d, right %v, special %v) = %v, want %v", ids, keep, right, special, got, want)
		}
	}
	bos := &Tokenizer{prefix: []uint32{1}}
	both := &Tokenizer{prefix: []uint32{1, 2}, suffix: []uint32{9}}
	ids := []uint32{1, 10, 11, 12, 13}
	f(bos, ids, 3, false, true, []uint32{1, 12, 13})
	f(bos, ids, 3, true, true, []uint32{1, 10, 11})
	f(bos, ids, 1, false, true, []uint32{1})
	f(bos, ids, 5, false, true, ids)
	f(bos, ids, 9, false, true, ids)
	f(bos, ids, 0, false, true, ids)
	// Without special tokens added, or with none to add, the ids are cut
	// as they are.
	f(bos, ids, 3, false, false, []uint32{11, 12, 13})
	f(&Tokenizer{}, ids, 2, true, true, []uint32{1, 10})
	ids = []uint32{1, 2, 10, 11, 12, 13, 9}
	f(both, ids, 5, false, true, []uint32{1, 2, 12, 13, 9})
	f(both, ids, 5, true, true, []uint32{1, 2, 10, 11, 9})
	f(both, ids, 3, false, true, []uint32{1, 2, 9})
	// Too short to hold the special tokens: HF leaves the ids whole and
	// vLLM keeps their last (first) keep.
	f(both, ids, 2, false, true, []uint32{13, 9})
	f(both, ids, 2, true, true, []uint32{1, 2})

	tok := load(t, "llama3.1")
	full := tok.Append(nil, []byte("The quick brown fox jumps over the lazy dog. It was a sunny day."), true)
	f(tok, full, 5, false, true, []uint32{128000, 264, 40798, 1938, 13})
	f(tok, full, 5, true, true, []uint32{128000, 791, 4062, 14198, 39935})
	f(tok, full, 1, false, true, []uint32{128000})
}

func FuzzEncode(f *testing.F) {
	var toks, plain []*Tokenizer
	for _, model := range []string{"qwen3", "llama3.1", "llama2"} {
		tok := load(f, model)
		toks = append(toks, tok)
		// The reference for the fuzzer: no caches, no "▁" chunks.
		p := withCaches(tok, 0)
		p.bpe.metaChunks = false
		plain = append(plain, p)
	}
	for _, s := range []string{"", " ", "<|im_start|>user\nhi<|im_end|>", "<s> a</s>b", "'S 'll 123456 \r\n\n  x", "é\u0301 👍🏽 中文", "\xff\xfe<|im_", "\u2581\u2581 a", "x\u2581\xe2\x96 \u2581"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, text []byte, special bool) {
		for i, tok := range toks {
			got := tok.Append(nil, text, special)
			if n := tok.Count(text, special); n != len(got) {
				t.Errorf("tokenizer %d: Count %d, len(Append) %d", i, n, len(got))
			}
			if again := tok.Append(nil, text, special); !slices.Equal(again, got) {
				t.Errorf("tokenizer %d, cached: %s", i, diff(string(text), again, got))
			}
			if want := plain[i].Append(nil, text, special); !slices.Equal(got, want) {
				t.Errorf("tokenizer %d, caches and chunks on vs off: %s", i, diff(string(text), got, want))
			}
		}
	})
}

// TestGoldenVariants checks the variants of testdata/variants.json against
// their goldens (every 8th corpus string).
func TestGoldenVariants(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "variants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var variants map[string]json.RawMessage
	if err := json.Unmarshal(data, &variants); err != nil {
		t.Fatal(err)
	}
	delete(variants, "comment")
	var texts []string
	for i, s := range corpus(t) {
		if i%8 == 0 {
			texts = append(texts, s)
		}
	}
	for name, raw := range variants {
		t.Run(name, func(t *testing.T) {
			var v struct {
				Base  string
				Set   map[string]json.RawMessage
				Model map[string]json.RawMessage
				Added map[string]map[string]any
			}
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatal(err)
			}
			base, err := os.ReadFile(filepath.Join(tokfiles.Dir(t, v.Base), "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			var tj map[string]json.RawMessage
			var model map[string]json.RawMessage
			var added []map[string]any
			if err := json.Unmarshal(base, &tj); err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(json.Unmarshal(tj["model"], &model), json.Unmarshal(tj["added_tokens"], &added)); err != nil {
				t.Fatal(err)
			}
			maps.Copy(tj, v.Set)
			maps.Copy(model, v.Model)
			for _, a := range added {
				maps.Copy(a, v.Added[fmt.Sprint(a["id"])])
			}
			if tj["model"], err = json.Marshal(model); err != nil {
				t.Fatal(err)
			}
			if tj["added_tokens"], err = json.Marshal(added); err != nil {
				t.Fatal(err)
			}
			out, err := json.Marshal(tj)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := Parse(out, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkCorpus(t, tok, texts, golden(t, name))
		})
	}
}

// Package hf encodes text into the token ids a Hugging Face tokenizer
// (tokenizer.json, as read by HF tokenizers 0.22 and so by vLLM) produces,
// exactly and in pure Go, so the gateway keys prefix-cache blocks by the ids
// the engine publishes in its KV events.
//
// It implements BPE models, byte-level (Qwen2/2.5/3, Llama 3.x, DeepSeek
// V3, GPT-2) and SentencePiece-style (Llama 2, Mistral: Prepend/Replace
// normalizers or Metaspace, byte fallback, unk fusing), added tokens with
// their lstrip/rstrip/single_word/normalized flags, the NFC normalizer,
// Split pre-tokenizers with string patterns or the Qwen, Llama 3, DeepSeek
// and GPT-2 regexes (a hand-written scanner each), ByteLevel and
// TemplateProcessing post-processors. Any other component or option, and
// any tokenizer_config.json setting with which transformers would change
// the pipeline, makes Load fail with an error naming it: the package never
// approximates.
//
// Text is split on added tokens first (special tokens written in the text
// are recognised, as vLLM encodes chat prompts); each segment between them
// is normalised, pre-tokenised and encoded on its own, as HF does, and its
// ids are kept in a bounded segment cache, so a conversation re-encodes
// only its new turn. Input is expected to be UTF-8 (as every Python str
// is); invalid bytes are encoded but no reference defines their ids.
//
// The differential tests compare against the ids HF's Rust tokenizers gave
// for a 10,400-string corpus (testdata/*.jsonl.gz), for the real Qwen3,
// Llama 3.1 and Llama 2 files and for the variants in
// testdata/variants.json. Regenerate them after make test-deps with
//
//	node engines/tokenize/hf/testdata/gen.mjs
//
// and time the reference on the benchmarks' text with
//
//	node bench/tokenize/ref.mjs
package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Tokenizer encodes text. It is immutable after Load and safe for concurrent
// use; its caches lock internally.
type Tokenizer struct {
	norm []normStep
	pre  []preStep
	bpe  bpe
	// raw holds the added tokens matched on the input as it is, normalized
	// those matched after the normalizer ran (HF's two passes).
	raw, normalized addedSet
	prefix, suffix  []uint32 // add_special_tokens ids around the sequence

	idToToken []string
	added     map[string]addedJSON // by content
	// unspelled holds the tokens of a byte-level vocabulary that are not in
	// its byte alphabet (bpe.vocab cannot hold them; no text encodes to them).
	unspelled map[string]uint32

	specials     map[string]string
	chatTemplate string

	segments *cache     // segment bytes -> ids
	words    *cache     // pre-tokenized word -> ids
	pool     *sync.Pool // of *encoder
}

// Cache bounds: a segment cache of this many bytes of keys and ids holds a
// few thousand conversations of a few KB each; words are short.
const (
	segmentCacheBytes = 64 << 20
	wordCacheBytes    = 16 << 20
	// maxCachedWord is the longest word the word cache keeps; longer ones
	// (a SentencePiece segment is one word) are left to the segment cache.
	maxCachedWord = 256
)

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// and dir/chat_template.jinja.
func Load(dir string) (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hf: %w", err)
	}
	t, err := Parse(tj, cfg)
	if err != nil {
		return nil, err
	}
	tmpl, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	switch {
	case err == nil:
		t.chatTemplate = string(tmpl)
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("hf: %w", err)
	}
	return t, nil
}

// Parse builds a Tokenizer from the contents of tokenizer.json and of
// tokenizer_config.json (nil when there is none).
func Parse(tokenizerJSON, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	var file map[string]json.RawMessage
	if err := unmarshal(tokenizerJSON, &file); err != nil {
		return nil, fmt.Errorf("hf: tokenizer.json: %w", err)
	}
	// truncation and padding are not read: transformers turns both off for
	// an encode that does not ask for them, which is how vLLM encodes.
	for k := range file {
		switch k {
		case "version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model":
		default:
			return nil, fmt.Errorf("hf: tokenizer.json: field %q not supported", k)
		}
	}
	t := &Tokenizer{specials: map[string]string{}}
	var err error
	if t.norm, err = parseTree("normalizer", file["normalizer"], "normalizers", nil, parseNormalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parseTree("pre_tokenizer", file["pre_tokenizer"], "pretokenizers", nil, parsePreTokenizer); err != nil {
		return nil, err
	}
	byteLevel := false
	for i, s := range t.pre {
		if s.kind == preByteLevel {
			if i != len(t.pre)-1 {
				return nil, fmt.Errorf("hf: tokenizer.json pre_tokenizer: ByteLevel followed by another pre-tokenizer not supported")
			}
			byteLevel = true
		}
	}
	if byteLevel && len(t.norm) > 0 {
		for _, n := range t.norm {
			if n.kind != normNFC {
				return nil, fmt.Errorf("hf: tokenizer.json normalizer: %s with a ByteLevel pre-tokenizer not supported", n.kind)
			}
		}
	}
	if isNull(file["model"]) {
		return nil, errors.New("hf: tokenizer.json model: missing")
	}
	if err := parseModel(file["model"], byteLevel, t); err != nil {
		return nil, err
	}
	var added []addedJSON
	if raw := file["added_tokens"]; !isNull(raw) {
		if err := unmarshal(raw, &added); err != nil {
			return nil, fmt.Errorf("hf: tokenizer.json added_tokens: %w", err)
		}
	}
	if err := parseAdded(added, t); err != nil {
		return nil, err
	}
	if _, err := parseTree("post_processor", file["post_processor"], "processors", t, parsePostProcessor); err != nil {
		return nil, err
	}
	if tokenizerConfigJSON != nil {
		if err := t.parseConfig(tokenizerConfigJSON, file["pre_tokenizer"]); err != nil {
			return nil, err
		}
	}
	t.segments = newCache(segmentCacheBytes)
	t.words = newCache(wordCacheBytes)
	t.pool = &sync.Pool{New: func() any { return new(encoder) }}
	return t, nil
}

// parseConfig reads the special tokens and chat template of
// tokenizer_config.json. It refuses the settings with which transformers
// (so vLLM) would not encode as tokenizer.json says: an add_prefix_space
// other than a top-level ByteLevel pre-tokenizer's (transformers rewrites
// the pre-tokenizer), and for the Llama/Gemma classes any add_prefix_space
// (they convert the slow tokenizer instead) or add_bos_token /
// add_eos_token disagreeing with the post-processor (they rebuild it).
func (t *Tokenizer) parseConfig(data []byte, preTokenizer json.RawMessage) error {
	var cfg map[string]json.RawMessage
	if err := unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("hf: tokenizer_config.json: %w", err)
	}
	for k, raw := range cfg {
		if s, ok := tokenContent(raw); ok && strings.HasSuffix(k, "_token") {
			t.specials[k] = s
		}
	}
	// transformers adds the special tokens of the config that tokenizer.json
	// lacks as added tokens, which would split the text where we do not.
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"} {
		if s, ok := t.specials[k]; ok && !t.isAdded(s) {
			return fmt.Errorf("hf: tokenizer_config.json %s: %q is not an added token of tokenizer.json (transformers would add it)", k, s)
		}
	}
	for _, k := range []string{"additional_special_tokens", "added_tokens_decoder"} {
		var list []json.RawMessage
		var byID map[string]json.RawMessage
		raw, ok := cfg[k]
		switch {
		case !ok || isNull(raw):
		case unmarshal(raw, &list) == nil:
		case unmarshal(raw, &byID) == nil:
			list = slices.Collect(maps.Values(byID))
		default:
			return fmt.Errorf("hf: tokenizer_config.json %s: %.80s is neither a list nor an object", k, raw)
		}
		for _, v := range list {
			if s, ok := tokenContent(v); !ok || !t.isAdded(s) {
				return fmt.Errorf("hf: tokenizer_config.json %s: %.80s is not an added token of tokenizer.json (transformers would add it)", k, v)
			}
		}
	}
	// An added_tokens_decoder entry whose flags differ replaces the token
	// in transformers (an absent normalized means not special).
	var decoder map[string]struct {
		addedJSON
		Normalized *bool `json:"normalized"`
	}
	if raw, ok := cfg["added_tokens_decoder"]; ok && !isNull(raw) {
		if err := unmarshal(raw, &decoder); err != nil {
			return fmt.Errorf("hf: tokenizer_config.json added_tokens_decoder: %w", err)
		}
	}
	for id, d := range decoder {
		a := d.addedJSON
		a.Normalized = !a.Special
		if d.Normalized != nil {
			a.Normalized = *d.Normalized
		}
		have := t.added[a.Content]
		a.ID = have.ID
		if strconv.FormatUint(uint64(have.ID), 10) != id || have != a {
			return fmt.Errorf("hf: tokenizer_config.json added_tokens_decoder[%s]: %+v differs from tokenizer.json's %+v", id, a, have)
		}
	}
	if raw, ok := cfg["chat_template"]; ok && !isNull(raw) {
		var list []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if unmarshal(raw, &t.chatTemplate) != nil {
			if err := unmarshal(raw, &list); err != nil {
				return fmt.Errorf("hf: tokenizer_config.json chat_template: %.80s is neither a string nor a list", raw)
			}
			for _, e := range list {
				if e.Name == "default" {
					t.chatTemplate = e.Template
				}
			}
		}
	}
	var splitSpecial bool
	if raw, ok := cfg["split_special_tokens"]; ok && (unmarshal(raw, &splitSpecial) != nil || splitSpecial) {
		return fmt.Errorf("hf: tokenizer_config.json split_special_tokens: %.40s not supported (special tokens in the text are always recognised)", raw)
	}
	var prefixSpace *bool
	if raw, ok := cfg["add_prefix_space"]; ok && !isNull(raw) {
		prefixSpace = new(bool)
		if err := unmarshal(raw, prefixSpace); err != nil {
			return fmt.Errorf("hf: tokenizer_config.json add_prefix_space: %.40s is not a bool", raw)
		}
	}
	if typ, _ := typeOf("pre_tokenizer", preTokenizer); typ == "ByteLevel" {
		if want := prefixSpace != nil && *prefixSpace; want != t.pre[0].prefixSpace {
			return fmt.Errorf("hf: tokenizer_config.json add_prefix_space: %v (absent is false) differs from tokenizer.json pre_tokenizer ByteLevel add_prefix_space %v",
				want, t.pre[0].prefixSpace)
		}
	}
	var class string
	_ = unmarshal(cfg["tokenizer_class"], &class)
	switch strings.TrimSuffix(class, "Fast") {
	case "LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer":
		if prefixSpace != nil {
			return fmt.Errorf("hf: tokenizer_config.json add_prefix_space: %v with %s not supported (transformers rebuilds the tokenizer from the slow one)", *prefixSpace, class)
		}
		for _, f := range []struct {
			key  string
			on   bool // transformers' default
			ids  []uint32
			name string
		}{{"add_bos_token", true, t.prefix, "bos_token"}, {"add_eos_token", false, t.suffix, "eos_token"}} {
			if raw, ok := cfg[f.key]; ok && !isNull(raw) {
				if err := unmarshal(raw, &f.on); err != nil {
					return fmt.Errorf("hf: tokenizer_config.json %s: %.40s is not a bool", f.key, raw)
				}
			}
			var want []uint32
			if id, ok := t.ID(t.specials[f.name]); f.on && ok {
				want = []uint32{id}
			}
			if !slices.Equal(want, f.ids) {
				return fmt.Errorf("hf: tokenizer_config.json %s: %v (%s %q) disagrees with tokenizer.json post_processor %v for %s",
					f.key, f.on, f.name, t.specials[f.name], f.ids, class)
			}
		}
	}
	return nil
}

func (t *Tokenizer) isAdded(content string) bool {
	_, ok := t.added[content]
	return ok
}

// tokenContent reads a token of tokenizer_config.json: a string or an
// object with its content.
func tokenContent(raw json.RawMessage) (string, bool) {
	var s string
	if !isNull(raw) && unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// grow makes idToToken hold id.
func (t *Tokenizer) grow(id uint32) {
	if int(id) >= len(t.idToToken) {
		t.idToToken = append(t.idToToken, make([]string, int(id)+1-len(t.idToToken))...)
	}
}

// Append appends the ids of text to dst and returns the extended slice;
// addSpecial is HF's add_special_tokens (the post-processor's BOS/EOS).
// Special tokens written in text are recognised either way. With warm caches
// and room in dst it allocates nothing.
func (t *Tokenizer) Append(dst []uint32, text []byte, addSpecial bool) []uint32 {
	dst, _ = t.AppendWithin(dst, text, addSpecial, -1)
	return dst
}

// AppendWithin is Append that encodes at most unseen bytes of text its
// segment cache does not hold (unseen < 0: any): false, and dst as it
// came, past that (the segments encoded by then are cached).
func (t *Tokenizer) AppendWithin(dst []uint32, text []byte, addSpecial bool, unseen int) ([]uint32, bool) {
	e := t.pool.Get().(*encoder)
	start := len(dst)
	e.unseen, e.over = unseen, false
	if addSpecial {
		dst = append(dst, t.prefix...)
	}
	dst = e.encode(t, dst, text)
	if addSpecial {
		dst = append(dst, t.suffix...)
	}
	over := e.over
	t.pool.Put(e)
	if over {
		return dst[:start], false
	}
	return dst, true
}

// Count returns len(t.Append(nil, text, addSpecial)) without keeping the ids.
func (t *Tokenizer) Count(text []byte, addSpecial bool) int {
	e := t.pool.Get().(*encoder)
	e.unseen, e.over = -1, false
	e.count = e.encode(t, e.count[:0], text)
	n := len(e.count)
	t.pool.Put(e)
	if addSpecial {
		n += len(t.prefix) + len(t.suffix)
	}
	return n
}

// Truncate cuts ids, which Append(nil, text, addSpecial) made, to the keep
// > 0 tokens vLLM leaves of a prompt under truncate_prompt_tokens: the
// last keep, or the first if right. vLLM has HF truncate the encoding,
// which cuts the text's ids and spares the post-processor's special
// tokens; when keep cannot hold those HF leaves the ids whole (its length
// arithmetic wraps) and vLLM's own cut, which spares nothing, follows.
// It works in place and returns ids[:min(keep, len(ids))].
func (t *Tokenizer) Truncate(ids []uint32, keep int, right, addSpecial bool) []uint32 {
	if keep <= 0 || keep >= len(ids) {
		return ids
	}
	pre, suf := 0, 0
	if addSpecial {
		pre, suf = len(t.prefix), len(t.suffix)
	}
	if keep < pre+suf || pre+suf == 0 {
		if right {
			return ids[:keep]
		}
		return ids[:copy(ids, ids[len(ids)-keep:])]
	}
	text, end := keep-pre-suf, len(ids)-suf
	if !right {
		copy(ids[pre:], ids[end-text:end])
	}
	copy(ids[pre+text:], ids[end:])
	return ids[:keep]
}

// ID returns the id of a vocabulary or added token.
func (t *Tokenizer) ID(token string) (uint32, bool) {
	if a, ok := t.added[token]; ok {
		return a.ID, true
	}
	if !t.bpe.byteLevel {
		id, ok := t.bpe.vocab[token]
		return id, ok
	}
	if raw, ok := byteLevelDecode(token); ok {
		id, ok := t.bpe.vocab[raw]
		return id, ok
	}
	id, ok := t.unspelled[token]
	return id, ok
}

// Token returns the string of id as the vocabulary spells it (byte-level
// vocabularies in their printable byte alphabet, e.g. "Ġthe").
func (t *Tokenizer) Token(id uint32) (string, bool) {
	if int(id) >= len(t.idToToken) || t.idToToken[id] == "" {
		return "", false
	}
	return t.idToToken[id], true
}

// BOS is tokenizer_config's bos_token, "" if none.
func (t *Tokenizer) BOS() string { return t.specials["bos_token"] }

// EOS is tokenizer_config's eos_token, "" if none.
func (t *Tokenizer) EOS() string { return t.specials["eos_token"] }

// ChatTemplate is chat_template.jinja when Load found one, else
// tokenizer_config's chat_template ("default" entry of the list form).
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// SpecialTokens returns a copy of tokenizer_config's *_token entries that
// name a token (bos_token, eos_token, pad_token, unk_token...), the values
// chat templates refer to.
func (t *Tokenizer) SpecialTokens() map[string]string {
	m := make(map[string]string, len(t.specials))
	for k, v := range t.specials {
		m[k] = v
	}
	return m
}

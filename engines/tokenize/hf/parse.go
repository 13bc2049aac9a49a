package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/bytedance/sonic"
)

// unmarshal is encoding/json's Unmarshal, several times faster on the
// megabytes of a tokenizer.json.
var unmarshal = sonic.ConfigStd.Unmarshal

// object decodes raw as a JSON object whose keys are all in known, so an
// option this package does not implement is refused instead of ignored.
func object(path string, raw json.RawMessage, known ...string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := unmarshal(raw, &m); err != nil || m == nil {
		return nil, fmt.Errorf("hf: tokenizer.json %s: not an object: %.80s", path, raw)
	}
	for k := range m {
		if !slices.Contains(known, k) {
			return nil, fmt.Errorf("hf: tokenizer.json %s: field %q not supported", path, k)
		}
	}
	return m, nil
}

// field decodes m[key] into v; a missing key leaves v as it is.
func field(path string, m map[string]json.RawMessage, key string, v any) error {
	raw, ok := m[key]
	if !ok || isNull(raw) {
		return nil
	}
	if err := unmarshal(raw, v); err != nil {
		return fmt.Errorf("hf: tokenizer.json %s.%s: %.80s: %v", path, key, raw, err)
	}
	return nil
}

// requireField is field for a key that must be present.
func requireField(path string, m map[string]json.RawMessage, key string, v any) error {
	if raw, ok := m[key]; !ok || isNull(raw) {
		return fmt.Errorf("hf: tokenizer.json %s.%s: missing", path, key)
	}
	return field(path, m, key, v)
}

// compact is raw on one line, for an error message.
func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func typeOf(path string, raw json.RawMessage) (string, error) {
	var head struct {
		Type string `json:"type"`
	}
	if err := unmarshal(raw, &head); err != nil || head.Type == "" {
		return "", fmt.Errorf("hf: tokenizer.json %s: no type: %.80s", path, raw)
	}
	return head.Type, nil
}

// parseTree walks a normalizer, pre-tokenizer or post-processor tree: a
// null tree is empty, a Sequence's nodes (its listKey field) are walked in
// order, and leaf parses each other node into out.
func parseTree[S any](path string, raw json.RawMessage, listKey string, out S, leaf func(path, typ string, raw json.RawMessage, out S) (S, error)) (S, error) {
	if isNull(raw) {
		return out, nil
	}
	typ, err := typeOf(path, raw)
	if err != nil {
		return out, err
	}
	if typ != "Sequence" {
		return leaf(path, typ, raw, out)
	}
	m, err := object(path, raw, "type", listKey)
	if err != nil {
		return out, err
	}
	var list []json.RawMessage
	if err := requireField(path, m, listKey, &list); err != nil {
		return out, err
	}
	for i, sub := range list {
		if out, err = parseTree(fmt.Sprintf("%s.%s[%d]", path, listKey, i), sub, listKey, out, leaf); err != nil {
			return out, err
		}
	}
	return out, nil
}

// parseNormalizer appends the step of one normalizer other than a Sequence.
func parseNormalizer(path, typ string, raw json.RawMessage, out []normStep) ([]normStep, error) {
	switch typ {
	case "NFC":
		if _, err := object(path, raw, "type"); err != nil {
			return nil, err
		}
		return append(out, normStep{kind: normNFC}), nil
	case "Prepend":
		m, err := object(path, raw, "type", "prepend")
		if err != nil {
			return nil, err
		}
		var s string
		if err := requireField(path, m, "prepend", &s); err != nil {
			return nil, err
		}
		return append(out, normStep{kind: normPrepend, to: s}), nil
	case "Replace":
		m, err := object(path, raw, "type", "pattern", "content")
		if err != nil {
			return nil, err
		}
		var pat map[string]string
		var content string
		if err := requireField(path, m, "pattern", &pat); err != nil {
			return nil, err
		}
		if err := requireField(path, m, "content", &content); err != nil {
			return nil, err
		}
		from, ok := pat["String"]
		if !ok || len(pat) != 1 || from == "" {
			return nil, fmt.Errorf("hf: tokenizer.json %s: Replace pattern %s not supported (only a non-empty String)", path, compact(m["pattern"]))
		}
		return append(out, normStep{kind: normReplace, from: from, to: content}), nil
	}
	return nil, fmt.Errorf("hf: tokenizer.json %s: normalizer %q not supported", path, typ)
}

// parsePreTokenizer appends the step of one pre-tokenizer other than a
// Sequence.
func parsePreTokenizer(path, typ string, raw json.RawMessage, out []preStep) ([]preStep, error) {
	switch typ {
	case "Split":
		m, err := object(path, raw, "type", "pattern", "behavior", "invert")
		if err != nil {
			return nil, err
		}
		var pat map[string]string
		var behavior string
		var invert bool
		if err := requireField(path, m, "pattern", &pat); err != nil {
			return nil, err
		}
		if err := requireField(path, m, "behavior", &behavior); err != nil {
			return nil, err
		}
		if err := field(path, m, "invert", &invert); err != nil {
			return nil, err
		}
		if invert {
			return nil, fmt.Errorf("hf: tokenizer.json %s: Split invert true not supported", path)
		}
		step := preStep{kind: preSplit}
		if step.behavior, err = parseBehavior(path, behavior); err != nil {
			return nil, err
		}
		switch {
		case len(pat) == 1 && pat["Regex"] != "":
			re := pat["Regex"]
			if step.scan = knownPatterns[re]; step.scan == nil {
				return nil, fmt.Errorf("hf: tokenizer.json %s: Split regex %q not supported", path, re)
			}
		case len(pat) == 1 && pat["String"] != "":
			step.literal = pat["String"]
		default:
			return nil, fmt.Errorf("hf: tokenizer.json %s: Split pattern %s not supported", path, compact(m["pattern"]))
		}
		return append(out, step), nil
	case "ByteLevel":
		m, err := object(path, raw, "type", "add_prefix_space", "trim_offsets", "use_regex")
		if err != nil {
			return nil, err
		}
		step := preStep{kind: preByteLevel}
		// Both default to true in HF's ByteLevel; trim_offsets moves offsets only.
		step.prefixSpace, step.useRegex = true, true
		if err := field(path, m, "add_prefix_space", &step.prefixSpace); err != nil {
			return nil, err
		}
		if err := field(path, m, "use_regex", &step.useRegex); err != nil {
			return nil, err
		}
		if step.useRegex {
			step.scan = scanGPT2
		}
		return append(out, step), nil
	case "Metaspace":
		// The older add_prefix_space form is refused with the other unknown fields.
		m, err := object(path, raw, "type", "replacement", "prepend_scheme", "split")
		if err != nil {
			return nil, err
		}
		step := preStep{kind: preMetaspace}
		var scheme string
		if err := requireField(path, m, "replacement", &step.literal); err != nil {
			return nil, err
		}
		if err := requireField(path, m, "prepend_scheme", &scheme); err != nil {
			return nil, err
		}
		if err := requireField(path, m, "split", &step.metaSplit); err != nil {
			return nil, err
		}
		if n := len([]rune(step.literal)); n != 1 {
			return nil, fmt.Errorf("hf: tokenizer.json %s.replacement: %q is not one character", path, step.literal)
		}
		switch scheme {
		case "always":
			step.prepend = prependAlways
		case "first":
			step.prepend = prependFirst
		case "never":
			step.prepend = prependNever
		default:
			return nil, fmt.Errorf("hf: tokenizer.json %s.prepend_scheme: %q not supported", path, scheme)
		}
		return append(out, step), nil
	}
	return nil, fmt.Errorf("hf: tokenizer.json %s: pre-tokenizer %q not supported", path, typ)
}

func parseBehavior(path, s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return splitRemoved, nil
	case "Isolated":
		return splitIsolated, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("hf: tokenizer.json %s.behavior: %q not supported", path, s)
}

// parsePostProcessor adds to t the ids add_special_tokens puts before and
// after the sequence, for one post-processor other than a Sequence.
func parsePostProcessor(path, typ string, raw json.RawMessage, t *Tokenizer) (*Tokenizer, error) {
	switch typ {
	case "ByteLevel":
		// The ByteLevel processor only trims offsets; ids pass unchanged.
		_, err := object(path, raw, "type", "add_prefix_space", "trim_offsets", "use_regex")
		return t, err
	case "TemplateProcessing":
		m, err := object(path, raw, "type", "single", "pair", "special_tokens")
		if err != nil {
			return t, err
		}
		var single []map[string]struct {
			ID string `json:"id"`
		}
		var specials map[string]struct {
			IDs []uint32 `json:"ids"`
		}
		if err := requireField(path, m, "single", &single); err != nil {
			return t, err
		}
		if err := field(path, m, "special_tokens", &specials); err != nil {
			return t, err
		}
		seenA := false
		for i, piece := range single {
			if seq, ok := piece["Sequence"]; ok && len(piece) == 1 {
				if seq.ID != "A" || seenA {
					return t, fmt.Errorf("hf: tokenizer.json %s.single[%d]: Sequence %q not supported", path, i, seq.ID)
				}
				seenA = true
				continue
			}
			sp, ok := piece["SpecialToken"]
			if !ok || len(piece) != 1 {
				return t, fmt.Errorf("hf: tokenizer.json %s.single[%d]: piece not supported", path, i)
			}
			st, ok := specials[sp.ID]
			if !ok {
				return t, fmt.Errorf("hf: tokenizer.json %s.single[%d]: special token %q not in special_tokens", path, i, sp.ID)
			}
			if seenA {
				t.suffix = append(t.suffix, st.IDs...)
			} else {
				t.prefix = append(t.prefix, st.IDs...)
			}
		}
		if !seenA {
			return t, fmt.Errorf("hf: tokenizer.json %s.single: no Sequence A", path)
		}
		return t, nil
	}
	return t, fmt.Errorf("hf: tokenizer.json %s: post-processor %q not supported", path, typ)
}

type addedJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// parseModel reads a BPE model. Vocabulary keys of a byte-level model are
// turned back into the bytes they stand for, so encoding works on raw bytes.
func parseModel(raw json.RawMessage, byteLevel bool, t *Tokenizer) error {
	const path = "model"
	typ, err := typeOf(path, raw)
	if err != nil {
		return err
	}
	if typ != "BPE" {
		return fmt.Errorf("hf: tokenizer.json %s: model %q not supported", path, typ)
	}
	m, err := object(path, raw, "type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
		"fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges")
	if err != nil {
		return err
	}
	var (
		dropout      float64
		prefix, suff string
		unk          string
		vocab        map[string]uint32
		merges       json.RawMessage
	)
	for _, f := range []struct {
		key string
		v   any
	}{{"dropout", &dropout}, {"continuing_subword_prefix", &prefix}, {"end_of_word_suffix", &suff}, {"unk_token", &unk},
		{"fuse_unk", &t.bpe.fuseUnk}, {"byte_fallback", &t.bpe.byteFallback}, {"ignore_merges", &t.bpe.ignoreMerges}} {
		if err := field(path, m, f.key, f.v); err != nil {
			return err
		}
	}
	if err := requireField(path, m, "vocab", &vocab); err != nil {
		return err
	}
	if merges = m["merges"]; isNull(merges) {
		merges = json.RawMessage("[]")
	}
	if dropout != 0 {
		return fmt.Errorf("hf: tokenizer.json %s.dropout: %v not supported", path, dropout)
	}
	if prefix != "" || suff != "" {
		return fmt.Errorf("hf: tokenizer.json %s: continuing_subword_prefix %q / end_of_word_suffix %q not supported", path, prefix, suff)
	}
	b := &t.bpe
	b.byteLevel = byteLevel
	b.vocab = make(map[string]uint32, len(vocab))
	maxID := uint32(0)
	for tok, id := range vocab {
		maxID = max(maxID, id)
		if !byteLevel {
			b.vocab[tok] = id
		} else if raw, ok := byteLevelDecode(tok); ok {
			b.vocab[raw] = id
		} else {
			if t.unspelled == nil {
				t.unspelled = map[string]uint32{}
			}
			t.unspelled[tok] = id
		}
	}
	if uint64(maxID) >= math.MaxInt32 {
		return fmt.Errorf("hf: tokenizer.json %s.vocab: id %d too large", path, maxID)
	}
	t.grow(maxID)
	for tok, id := range vocab {
		t.idToToken[id] = tok
	}
	if unk != "" {
		id, ok := vocab[unk]
		if !ok {
			return fmt.Errorf("hf: tokenizer.json %s.unk_token: %q not in vocab", path, unk)
		}
		b.unk, b.hasUnk = id, true
	}
	for i := range b.byteID {
		b.byteID[i], b.fallbackID[i] = -1, -1
		if id, ok := b.vocab[string([]byte{byte(i)})]; ok && byteLevel {
			b.byteID[i] = int32(id)
		}
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			b.fallbackID[i] = int32(id)
		}
	}
	if _, ok := vocab[meta]; ok && !byteLevel && !b.ignoreMerges {
		b.metaChunks = true
		for tok := range vocab {
			if strings.Contains(strings.TrimLeft(tok, meta), meta) {
				b.metaChunks = false
				break
			}
		}
	}
	if !byteLevel {
		for tok, id := range vocab {
			r, n := utf8.DecodeRuneInString(tok)
			if n != len(tok) || r >= 0x10000 || r == utf8.RuneError {
				continue
			}
			for int(r) >= len(b.charID) {
				b.charID = append(b.charID, -1)
			}
			b.charID[r] = int32(id)
		}
	}
	if byteLevel {
		for i, id := range b.byteID {
			if id < 0 {
				return fmt.Errorf("hf: tokenizer.json %s.vocab: byte-level vocabulary lacks byte 0x%02X", path, i)
			}
		}
	}
	// merges is a list of "left right" strings or, since tokenizers 0.20,
	// of [left, right] pairs.
	var pairs [][]string
	if unmarshal(merges, &pairs) != nil {
		var lines []string
		if err := unmarshal(merges, &lines); err != nil {
			return fmt.Errorf("hf: tokenizer.json %s.merges: neither strings nor pairs: %v", path, err)
		}
		pairs = make([][]string, len(lines))
		for i, line := range lines {
			if strings.Count(line, " ") != 1 {
				return fmt.Errorf("hf: tokenizer.json %s.merges[%d]: %q is not a pair", path, i, line)
			}
			left, right, _ := strings.Cut(line, " ")
			pairs[i] = []string{left, right}
		}
	}
	b.merges = newMergeTable(len(pairs))
	for i, pair := range pairs {
		if len(pair) != 2 {
			return fmt.Errorf("hf: tokenizer.json %s.merges[%d]: %q is not a pair", path, i, pair)
		}
		left, right := pair[0], pair[1]
		a, okA := vocab[left]
		c, okC := vocab[right]
		n, okN := vocab[left+right]
		if !okA || !okC || !okN {
			return fmt.Errorf("hf: tokenizer.json %s.merges[%d]: %q %q not in vocab", path, i, left, right)
		}
		// A repeated pair keeps its last rank, as HF's merge map does.
		b.merges.put(a, c, uint32(i), n)
	}
	return nil
}

// parseAdded installs the added tokens, special ones first (HF's order).
func parseAdded(list []addedJSON, t *Tokenizer) error {
	t.added = make(map[string]addedJSON, len(list))
	for _, special := range []bool{true, false} {
		for i, a := range list {
			if a.Special != special || a.Content == "" {
				continue
			}
			if id, ok := t.ID(a.Content); ok && id != a.ID {
				return fmt.Errorf("hf: tokenizer.json added_tokens[%d]: %q has id %d but the vocab says %d", i, a.Content, a.ID, id)
			}
			if uint64(a.ID) >= math.MaxInt32 {
				return fmt.Errorf("hf: tokenizer.json added_tokens[%d]: id %d too large", i, a.ID)
			}
			t.grow(a.ID)
			t.idToToken[a.ID] = a.Content
			t.added[a.Content] = a
			tok := addedToken{id: a.ID, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip}
			if a.Normalized {
				var e encoder
				t.normalized.add(string(e.normalize(t, []byte(a.Content))), tok)
			} else {
				t.raw.add(a.Content, tok)
			}
		}
	}
	return nil
}

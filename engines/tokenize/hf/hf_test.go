package hf

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

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

func load(t testing.TB, model string) *Tokenizer {
	t.Helper()
	tok, err := Load(tokfiles.Dir(t, model))
	if err != nil {
		t.Fatal(err)
	}
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
			checkCorpus(t, tok, texts, want)
			// Again with every segment and word cached.
			checkCorpus(t, tok, texts, want)
		})
	}
}

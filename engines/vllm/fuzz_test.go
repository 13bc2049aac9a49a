package vllm

import (
	"bytes"
	"testing"
)

// FuzzDecode checks that Decode never panics, and that whatever it accepts
// re-encodes to a fixed point: Encode(Decode(Encode(Decode(x)))) equals
// Encode(Decode(x)) byte for byte in every layout. The seed corpus in
// testdata/fuzz/FuzzDecode holds the three layouts' fixtures and truncated
// or corrupted variants of them; the seeds below add extra_keys of every
// shape vLLM sends (adapter, salt, multimodal pairs, embedding digests) and
// some it does not.
func FuzzDecode(f *testing.F) {
	f.Add(unhex(f, fixtureArray))
	f.Add(unhex(f, fixtureMap))
	f.Add(fixtureArrayMapEvents(f))
	f.Add(extraKeysFixture(f, 2, "L", false, false, []any{[]any{"L", []any{"img", 3}, "salt", []byte{1}}, []any{"L"}}))
	f.Add(extraKeysFixture(f, 2, "", false, true, []any{[]any{"salt"}, nil}))
	f.Add(extraKeysFixture(f, 1, "", true, false, []any{[]any{[]any{"img", -5}}}))
	f.Add(extraKeysFixture(f, 2, "", false, false, []any{"salt"}))
	f.Add(extraKeysFixture(f, 1, "", false, false, map[string]any{"a": []any{1.5, nil}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Decode(data)
		if err != nil {
			return
		}
		for _, enc := range []Encoding{EncodingArray, EncodingArrayMapEvents, EncodingMap} {
			p1, err := Encode(nil, &b, enc)
			if err != nil {
				t.Fatalf("%v: Encode of a decoded batch: %v", enc, err)
			}
			b2, err := Decode(p1)
			if err != nil {
				t.Fatalf("%v: Decode of Encode output: %v", enc, err)
			}
			p2, err := Encode(nil, &b2, enc)
			if err != nil {
				t.Fatalf("%v: second Encode: %v", enc, err)
			}
			if !bytes.Equal(p1, p2) {
				t.Fatalf("%v: not a fixed point:\n%x\n%x", enc, p1, p2)
			}
		}
	})
}

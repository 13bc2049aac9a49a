package radix_test

// An external test package: engines/tokenize imports radix, so a test in
// package radix that imports tokenize would be an import cycle.

import (
	"testing"

	"pdlb/engines/tokenize"
	"pdlb/radix"
)

func TestByteKeysAgreeWithTokenKeys(t *testing.T) {
	// Our tokenizer makes a token of 4 bytes, so byte blocks of 4×blockSize
	// name the same prefixes as token blocks (not the same key values).
	p := []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdefXY")
	tok := radix.AppendBlockKeys(nil, 1, tokenize.Append(nil, p), 16)
	byt := radix.AppendByteBlockKeys(nil, 1, p, 64)
	if len(tok) != 1 || len(byt) != 1 {
		t.Fatalf("got %d token keys and %d byte keys, want 1 and 1", len(tok), len(byt))
	}
}

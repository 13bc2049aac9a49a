package radix

import "testing"

func TestBlockKeysChain(t *testing.T) {
	seed := Seed("m")
	a := make([]uint32, 64)
	for i := range a {
		a[i] = uint32(i)
	}
	ka := AppendBlockKeys(nil, seed, a, 16)
	if len(ka) != 4 {
		t.Fatalf("got %d keys, want 4", len(ka))
	}
	// Extending the prompt keeps every earlier key.
	kb := AppendBlockKeys(nil, seed, append(a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99), 16)
	if len(kb) != 5 {
		t.Fatalf("got %d keys, want 5 (partial block ignored)", len(kb))
	}
	for i := range ka {
		if ka[i] != kb[i] {
			t.Fatalf("key %d changed when the prompt grew", i)
		}
	}
	// A change in block 0 changes every later key; another model changes all.
	c := append([]uint32(nil), a...)
	c[0] = 1000
	kc := AppendBlockKeys(nil, seed, c, 16)
	kd := AppendBlockKeys(nil, Seed("other"), a, 16)
	for i := range ka {
		if kc[i] == ka[i] || kd[i] == ka[i] {
			t.Fatalf("key %d did not depend on its prefix or model", i)
		}
	}
}

func TestBlockKeysNoAlloc(t *testing.T) {
	toks := make([]uint32, 2048)
	dst := make([]uint64, 0, 128)
	if n := testing.AllocsPerRun(100, func() { dst = AppendBlockKeys(dst[:0], 7, toks, 16) }); n != 0 {
		t.Fatalf("AppendBlockKeys allocates %v times per run", n)
	}
}

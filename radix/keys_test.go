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

// TestChainMatchesDefinition checks appendChain's unrolled rounds against
// its doc comment's formula, one 16-byte chunk at a time, for widths with
// and without whole 64-byte rounds and a short last chunk.
func TestChainMatchesDefinition(t *testing.T) {
	raw := make([]byte, 1000)
	for i := range raw {
		raw[i] = byte(i*7 + i>>3)
	}
	naive := func(h uint64, raw []byte, width int) []uint64 {
		var keys []uint64
		for off := 0; off+width <= len(raw); off += width {
			acc := uint64(width)
			for j := 0; j*16 < width; j++ {
				var c [16]byte
				copy(c[:], raw[off+j*16:off+width])
				acc += fold(le64(c[:])^(chainC0+uint64(j)*chainC2), le64(c[8:])^chainC1)
			}
			h = fold(h^acc, chainC3)
			keys = append(keys, h)
		}
		return keys
	}
	for _, width := range []int{1, 4, 15, 16, 17, 60, 64, 65, 100, 128, 200, 256, 400} {
		got, want := appendChain(nil, 5, raw, width), naive(5, raw, width)
		if len(got) != len(want) {
			t.Fatalf("width %d: %d keys, want %d", width, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("width %d: key %d is %x, want %x", width, i, got[i], want[i])
			}
		}
	}
}

// TestChain64 checks chain64 (assembly on amd64) against chain64Go for
// every block count up to 40 and every alignment of the input.
func TestChain64(t *testing.T) {
	raw := make([]byte, 8+64*40)
	for i := range raw {
		raw[i] = byte(i*131 + i>>5)
	}
	for off := 0; off < 8; off++ {
		for n := 1; n <= 40; n++ {
			got, want := make([]uint64, n), make([]uint64, n)
			chain64(got, uint64(off+n), raw[off:])
			chain64Go(want, uint64(off+n), raw[off:])
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("offset %d, %d blocks: key %d is %x, want %x", off, n, i, got[i], want[i])
				}
			}
		}
	}
}

func TestSeedWith(t *testing.T) {
	m := Seed("m")
	if SeedWith(m, "", "") != m {
		t.Fatal("SeedWith without extra keys changed the seed: plain prompts would lose their keys")
	}
	// Every combination gives its own seed, and none equals the plain one
	// or an Extend of it.
	seen := map[uint64]string{m: "plain", Extend(m, 0): "extend 0"}
	add := func(name string, s uint64) {
		t.Helper()
		if prev, dup := seen[s]; dup {
			t.Fatalf("%s has the seed of %s", name, prev)
		}
		seen[s] = name
	}
	add("lora a", SeedWith(m, "a", ""))
	add("salt a", SeedWith(m, "", "a"))
	add("lora a salt a", SeedWith(m, "a", "a"))
	add("lora a salt b", SeedWith(m, "a", "b"))
	add("lora b salt a", SeedWith(m, "b", "a"))
	add("salt b", SeedWith(m, "", "b"))
	add("other model salt a", SeedWith(Seed("other"), "", "a"))
	add("extend 1", Extend(m, 1))
	if SeedWith(m, "a", "b") != SeedWith(m, "a", "b") || Extend(m, 7) != Extend(m, 7) {
		t.Fatal("seeds are not deterministic")
	}
}

package tokenize

import (
	"math/rand/v2"
	"slices"
	"testing"

	"pdlb/radix"
)

func TestAppendBlockKeysMatchesTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 300; n++ {
		prompt := make([]byte, n)
		for i := range prompt {
			prompt[i] = byte(rng.IntN(256))
		}
		for _, bs := range []int{1, 2, 16, 64, 100} {
			want := radix.AppendBlockKeys(nil, 9, Append(nil, prompt), bs)
			got := AppendBlockKeys(nil, 9, prompt, bs)
			if !slices.Equal(got, want) {
				t.Fatalf("len %d block %d: got %d keys %x, want %d keys %x", n, bs, len(got), got, len(want), want)
			}
		}
	}
}

func FuzzAppendBlockKeys(f *testing.F) {
	f.Add([]byte("hello world, this is a prompt of some length"), 3)
	f.Fuzz(func(t *testing.T, prompt []byte, bs int) {
		bs = bs%70 + 1
		if bs <= 0 {
			bs = 1
		}
		if got, want := AppendBlockKeys(nil, 1, prompt, bs), radix.AppendBlockKeys(nil, 1, Append(nil, prompt), bs); !slices.Equal(got, want) {
			t.Fatalf("got %x, want %x", got, want)
		}
	})
}

func TestAppendBlockKeysAllocs(t *testing.T) {
	prompt := make([]byte, 8190)
	dst := make([]uint64, 0, 128)
	if n := testing.AllocsPerRun(100, func() { dst = AppendBlockKeys(dst[:0], 1, prompt, 16) }); n != 0 {
		t.Fatalf("%v allocs per run", n)
	}
}

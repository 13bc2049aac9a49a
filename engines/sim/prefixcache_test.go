package sim

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// naiveLRU is the global-scheduling study's OrderedDict LRU, a slice in
// recency order, storing a prompt's blocks last to first as the engines
// free them.
type naiveLRU struct {
	order []uint64
	cap   int
}

func (n *naiveLRU) match(keys []uint64) int {
	for i, k := range keys {
		if !slices.Contains(n.order, k) {
			return i
		}
	}
	return len(keys)
}

func (n *naiveLRU) store(keys []uint64) {
	for _, k := range slices.Backward(keys) {
		if i := slices.Index(n.order, k); i >= 0 {
			n.order = slices.Delete(n.order, i, i+1)
		}
		n.order = append(n.order, k)
	}
	for len(n.order) > n.cap {
		n.order = n.order[1:]
	}
}

func TestPrefixCacheAgreesWithNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := NewPrefixCache(50)
	n := &naiveLRU{cap: 50}
	for step := 0; step < 5000; step++ {
		keys := make([]uint64, 1+rng.IntN(12))
		base := uint64(rng.IntN(8)) * 100
		for i := range keys {
			keys[i] = base + uint64(i) + uint64(rng.IntN(3))*1000
		}
		if got, want := c.Match(keys), n.match(keys); got != want {
			t.Fatalf("step %d: Match = %d, naive %d", step, got, want)
		}
		var stored, evicted []uint64
		before := c.Len()
		stored, evicted = c.Store(keys, []uint64{}, []uint64{})
		n.store(keys)
		if c.Len() != len(n.order) || before+len(stored)-len(evicted) != c.Len() {
			t.Fatalf("step %d: Len = %d, naive %d (stored %d evicted %d)", step, c.Len(), len(n.order), len(stored), len(evicted))
		}
		for _, k := range n.order {
			if !c.Contains(k) {
				t.Fatalf("step %d: cache lost key %d", step, k)
			}
		}
	}
	c.Clear()
	if c.Len() != 0 || c.Match([]uint64{1}) != 0 {
		t.Fatal("Clear left blocks behind")
	}
}

func TestPhysics(t *testing.T) {
	p := DefaultPhysics()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := p.PrefillSec(20000); got != 1 {
		t.Fatalf("PrefillSec(20000) = %v, want 1", got)
	}
	if tps := p.DecodeTokensPerSec(64); tps < 2500 || tps > 3500 {
		t.Fatalf("decode throughput at batch 64 = %v tokens/s, want about 3,000", tps)
	}
	p.MaxBatch = 0
	if err := p.Validate(); err == nil {
		t.Fatal("max_batch = 0 accepted")
	}
}

// TestPrefixCacheHeldBlocks: blocks in use are matched but never evicted,
// and join the LRU list when released, last first; a Clear under them
// leaves them with their request until it releases them.
func TestPrefixCacheHeldBlocks(t *testing.T) {
	c := NewPrefixCache(4)
	running, _ := c.Hold([]uint64{1, 2}, 0, nil, nil)
	c.Store([]uint64{3, 4, 5}, nil, nil)
	if got := c.Evict(2, []uint64{}); !slices.Equal(got, []uint64{5}) || c.Match([]uint64{1, 2}) != 2 {
		t.Fatalf("evicted %v beside 2 blocks in use; want the stored prompt's tail [5], and 1, 2 kept", got)
	}
	other, _ := c.Hold([]uint64{1, 2, 6}, 2, nil, nil) // shares 1 and 2
	if got := c.Evict(2+3, []uint64{}); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("evicted %v beside 3 distinct blocks in use, want [4]", got)
	}
	c.Release(running)
	c.Release(other)
	if got := c.Evict(0, []uint64{}); len(got) != 0 || c.Len() != 4 {
		t.Fatalf("evicted %v with nothing in use; want none, 4 cached", got)
	}
	if got := c.Evict(3, []uint64{}); !slices.Equal(got, []uint64{3, 6, 2}) {
		t.Fatalf("evicted %v, want the least recently used, tails first: [3 6 2]", got)
	}
	held, _ := c.Hold([]uint64{1}, 1, nil, nil)
	c.Clear()
	if c.Match([]uint64{1}) != 0 || c.Len() != 1 {
		t.Fatalf("after Clear: Match %d, Len %d; want 0 and the block in use", c.Match([]uint64{1}), c.Len())
	}
	c.Release(held)
	if stored, evicted := c.Store([]uint64{1, 2, 3, 4, 5}, []uint64{}, []uint64{}); c.Len() != 4 || len(stored) != 5 || !slices.Equal(evicted, []uint64{5}) {
		t.Fatalf("after Clear and Release: Len %d, stored %v, evicted %v", c.Len(), stored, evicted)
	}
}

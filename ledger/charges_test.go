package ledger

import (
	"math/rand/v2"
	"testing"
)

// TestChargeTableAgainstMap drives the sharded linear-probing table and a
// plain map with the same random swaps, updates and removals, over few
// enough ids that probe runs collide, wrap around and grow, and checks they
// agree after every step.
func TestChargeTableAgainstMap(t *testing.T) {
	tab := newChargeTable()
	// tk spreads the ids over two shards only, so probe runs collide.
	tk := func(id uint64) Ticket { return Ticket{ID: id, home: uint8(id%2) + 1} }
	ref := map[uint64]int64{}    // id → kv
	active := map[uint64]int64{} // id → active not yet taken
	rng := rand.New(rand.NewPCG(1, 2))
	// f checks every id of the universe against the reference.
	f := func(step int) {
		t.Helper()
		for id := uint64(0); id < 3000; id++ {
			sh := &tab[tk(id).shard()]
			i, ok := sh.find(id)
			want, wantOK := ref[id]
			if ok != wantOK || (ok && sh.slots[i].c.kv != want) {
				t.Fatalf("step %d: id %d: table has %v (kv %d), map %v (%d)", step, id, ok, sh.slots[i].c.kv, wantOK, want)
			}
		}
	}
	for step := range 30000 {
		id := rng.Uint64N(3000)
		switch op := rng.IntN(10); {
		case op < 5:
			v := rng.Int64N(1000) + 1
			old, ok := tab.swap(tk(id), charge{kv: v, active: v})
			if want, wantOK := ref[id]; ok != wantOK || old.kv != want {
				t.Fatalf("step %d: swap %d replaced %v %d, want %v %d", step, id, ok, old.kv, wantOK, want)
			}
			ref[id], active[id] = v, v
		case op < 7:
			if _, n := tab.takeActive(tk(id)); n != active[id] {
				t.Fatalf("step %d: takeActive %d gave %d, want %d", step, id, n, active[id])
			}
			active[id] = 0
		default:
			c, ok := tab.take(tk(id))
			if want, wantOK := ref[id]; ok != wantOK || c.kv != want {
				t.Fatalf("step %d: take %d gave %v %d, want %v %d", step, id, ok, c.kv, wantOK, want)
			}
			delete(ref, id)
			delete(active, id)
		}
		if step%1000 == 0 {
			f(step)
		}
	}
	f(-1)
	n := 0
	for i := range tab {
		n += tab[i].n
	}
	if n != len(ref) {
		t.Fatalf("table counts %d entries, map has %d", n, len(ref))
	}
	// takeOlder removes exactly the old ones.
	for id := range ref {
		tab.swap(tk(id), charge{at: int64(id % 2), kv: ref[id]})
	}
	got := tab.takeOlder(1, nil)
	for _, e := range got {
		if e.c.at != 0 {
			t.Fatalf("took a charge at %d, cutoff 1", e.c.at)
		}
		delete(ref, e.id)
	}
	f(-2)
}

// TestLanesOfOnePodTakeTheirOwnShards: charges of one pod from different
// lanes (event loops) live in different shards, each lane's in one, and
// each is released from its own.
func TestLanesOfOnePodTakeTheirOwnShards(t *testing.T) {
	l := New(DefaultConfig(), Env{})
	l.SetPods(members("ns/a", "ns/b"))
	p := Prompt{Tokens: 100}
	seen := map[int]uint8{}
	var tickets []Ticket
	for lane := range uint8(chargeShards) {
		for i := range 3 {
			tk := Ticket{ID: uint64(lane)<<8 | uint64(i), Lane: lane}
			l.Charge(&tk, 1, -1, &p, 0)
			if other, ok := seen[tk.shard()]; ok && other != lane {
				t.Fatalf("lanes %d and %d of one pod share shard %d", other, lane, tk.shard())
			}
			seen[tk.shard()] = lane
			tickets = append(tickets, tk)
		}
	}
	if active, _ := l.Prefill(1); active == 0 {
		t.Fatal("nothing charged")
	}
	for _, tk := range tickets {
		l.PrefillDone(tk)
		l.Finish(tk)
	}
	if active, kv := l.Prefill(1); active != 0 || kv != 0 {
		t.Fatalf("after every release the pod holds active %d, kv %d; want 0, 0", active, kv)
	}
}

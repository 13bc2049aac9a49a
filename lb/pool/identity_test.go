package pool

import (
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"pdlb/lb/config"
	"pdlb/ledger"
	"pdlb/radix"
)

// fleet builds snapshots of pods of model "m" (and any others named),
// each reload on the last.
type fleet struct {
	t    *testing.T
	snap *Snapshot
}

// build builds and commits the next snapshot, as a reload does.
func (f *fleet) build(pods ...config.Pod) *Snapshot {
	f.t.Helper()
	s := f.prepare(pods...)
	s.Commit()
	f.snap = s
	return s
}

// prepare builds the next snapshot without committing it: a reload that
// fails after Build.
func (f *fleet) prepare(pods ...config.Pod) *Snapshot {
	f.t.Helper()
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}, {Name: "n", Policy: "least_request"}}
	cfg.Pods = pods
	if err := cfg.Validate(); err != nil {
		f.t.Fatal(err)
	}
	dial := func(string, time.Duration, *tls.Config) (net.Conn, error) {
		return nil, fmt.Errorf("no dialing in this test")
	}
	s, err := Build(&cfg, dial, f.snap)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func pod(name string, port int) config.Pod {
	return config.Pod{Name: name, Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", port)}
}

func (s *Snapshot) pod(name string) *Pod {
	for _, p := range s.Pods {
		if p.Config.Name == name {
			return p
		}
	}
	return nil
}

// TestIdentityAcrossReloads reloads a fleet through every kind of change
// and checks what each pod keeps: a pod named with the same identity keeps
// its id, state (ejection, weight aside) and index entries; any other is
// a new pod, with an id no pod had, and a pod that left has no entries.
func TestIdentityAcrossReloads(t *testing.T) {
	f := &fleet{t: t}
	s0 := f.build(pod("a", 1), pod("b", 2), pod("c", 3))
	keys := radix.AppendBlockKeys(nil, 1, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 1)
	m0 := s0.Models[0]
	for _, p := range s0.Pods {
		m0.Prefix.Insert(p.PrefixID, keys[:2+p.Slot])
	}
	s0.pod("a").Eject(0, time.Hour)
	depths := func(s *Snapshot) map[string]int32 {
		m := s.Model([]byte("m"))
		d := make([]int32, m.Slots)
		m.Prefix.Match(keys, d)
		out := map[string]int32{}
		for _, p := range m.Pods {
			out[p.Config.Name] = d[p.Slot]
		}
		return out
	}
	seen := map[int32]string{}
	for _, p := range s0.Pods {
		seen[p.ID] = p.Config.Name
	}
	// same reports whether name is the same pod in s as in before.
	same := func(before, s *Snapshot, name string) bool {
		t.Helper()
		p, q := before.pod(name), s.pod(name)
		kept := p.ID == q.ID && p.podState == q.podState
		if kept != (p.PrefixID == q.PrefixID && p.Slot == q.Slot) {
			t.Fatalf("%s: state kept %v, but its index id %d → %d", name, kept, p.PrefixID, q.PrefixID)
		}
		return kept
	}
	// fresh checks that name is a pod with an id never seen before.
	fresh := func(s *Snapshot, name string) {
		t.Helper()
		p := s.pod(name)
		if n, ok := seen[p.ID]; ok {
			t.Fatalf("%s has id %#x, %s's before", name, p.ID, n)
		}
		seen[p.ID] = name
		if d := depths(s)[name]; d != 0 {
			t.Fatalf("new pod %s matches %d blocks, want none", name, d)
		}
	}

	// b leaves, d comes, a's weight changes: nothing of it shows in s0
	// until the snapshot is committed.
	wa := pod("a", 1)
	wa.Weight = 3
	f.prepare(wa, pod("c", 3), pod("d", 4))
	if w := math.Float64frombits(s0.pod("a").weight.Load()); w != 1 || depths(s0)["b"] == 0 {
		t.Fatalf("a reload built and never committed changed s0: a's weight %v, b's depth %d", w, depths(s0)["b"])
	}
	s1 := f.build(wa, pod("c", 3), pod("d", 4))
	if !same(s0, s1, "a") || !same(s0, s1, "c") {
		t.Fatal("a or c is not the same pod after a reload that kept them")
	}
	fresh(s1, "d")
	if a := s1.pod("a"); !a.Ejected(1) || math.Float64frombits(a.weight.Load()) != 3 {
		t.Fatalf("a: ejected %v, weight %v; want its ejection kept and weight 3", a.Ejected(1), math.Float64frombits(a.weight.Load()))
	}
	if s1.Models[0].Prefix != m0.Prefix {
		t.Fatal("the model's index was rebuilt")
	}
	if d := depths(s1); d["a"] != 2 || d["c"] != 4 {
		t.Fatalf("depths after the reload %v, want a 2, c 4", d)
	}
	if st := m0.Prefix.Stats(); st.PodBlocks[s0.pod("b").Slot] != 0 {
		t.Fatalf("b left, its slot still holds %d blocks", st.PodBlocks[s0.pod("b").Slot])
	}
	// d took b's slot: a write still on its way for b lands nowhere.
	m0.Prefix.Insert(s0.pod("b").PrefixID, keys)
	if d := depths(s1)["d"]; d != 0 {
		t.Fatalf("b's late insert shows as d's: %d blocks", d)
	}

	// a comes back at another address, c under another name.
	s2 := f.build(pod("a", 5), pod("c2", 3), pod("d", 4))
	if same(s1, s2, "d") != true {
		t.Fatal("d is not the same pod")
	}
	fresh(s2, "a")
	fresh(s2, "c2")
	if s2.pod("a").Ejected(1) {
		t.Fatal("a at another address is still ejected")
	}

	// A UID tells apart a pod recreated under its name and address.
	u := pod("d", 4)
	u.UID = "uid-1"
	s3 := f.build(pod("a", 5), pod("c2", 3), u)
	fresh(s3, "d")
	s4 := f.build(pod("a", 5), pod("c2", 3), u)
	if !same(s3, s4, "d") {
		t.Fatal("d with the same UID is not the same pod")
	}

	// A pod moving to another model is another pod.
	n := pod("a", 5)
	n.Model = "n"
	s5 := f.build(n, pod("c2", 3), u)
	fresh(s5, "a")
	if len(s5.Model([]byte("m")).Pods) != 2 || s5.Model([]byte("m")).Prefix != m0.Prefix {
		t.Fatal("m lost its index when a pod left it")
	}
}

// TestIndexOutgrown: a model whose pods outgrow its index's width gets a
// wider one; ids and slots stay dense as pods come and go.
func TestIndexOutgrown(t *testing.T) {
	f := &fleet{t: t}
	var pods []config.Pod
	for i := range 64 {
		pods = append(pods, pod(fmt.Sprint("p", i), 1000+i))
	}
	m := f.build(pods...).Models[0]
	for range 3 {
		// The last pod leaves and comes back at another port: same slot.
		pods[63].Address = fmt.Sprintf("127.0.0.1:%d", 2000+len(pods))
		s := f.build(pods...)
		if s.Models[0].Prefix != m.Prefix || s.Models[0].Slots != 64 || s.pod("p63").ID&(1<<ledger.IndexBits-1) != 63 {
			t.Fatalf("churn of one pod: index kept %v, slots %d, p63's id %#x", s.Models[0].Prefix == m.Prefix, s.Models[0].Slots, s.pod("p63").ID)
		}
	}
	pods = append(pods, pod("p64", 1064))
	s := f.build(pods...)
	if s.Models[0].Prefix == m.Prefix || s.Models[0].Slots != 65 {
		t.Fatalf("65 pods: index kept %v, slots %d", s.Models[0].Prefix == m.Prefix, s.Models[0].Slots)
	}
}

// TestIDs: slots lowest first, each freed slot back under a new id, the
// generation wrapping within an int32.
func TestIDs(t *testing.T) {
	s := ids{bits: 4}
	take := func(want int32) {
		t.Helper()
		if id, err := s.take(); err != nil || id != want {
			t.Fatalf("take = %#x, %v; want %#x", id, err, want)
		}
	}
	for i := range int32(16) {
		take(i)
	}
	if _, err := s.take(); err == nil {
		t.Fatal("a 17th id in a space of 16")
	}
	if next := s.free(5); next != 5+16 {
		t.Fatalf("free(5) = %d", next)
	}
	s.free(2)
	take(2 + 16)
	take(5 + 16)
	if next := s.free(0x7ffffff3); next != 3 {
		t.Fatalf("free of the last generation = %#x, want 3", next)
	}
}

package radix

import "sync/atomic"

// entry is one (pod, node) the pod holds, linked into that pod's LRU list.
// It stands for the node's whole run: the run's blocks are consecutive in
// the pod's recency (deepest oldest), which split and canMerge preserve.
type entry struct {
	node, pod    int32
	older, newer int32
}

type podState struct {
	oldest, newest int32 // ends of the pod's LRU list of entries
	blocks         int   // blocks the pod holds
	// holder is the id of the pod that holds the slot (see SlotBits):
	// writes naming any other id are ignored.
	holder int32
}

func (t *Tree) newEntry(c, pod int32) int32 {
	e := t.freeEntry
	if e != none {
		t.freeEntry = t.entries[e].newer
	} else {
		t.entries = append(t.entries, entry{})
		e = int32(len(t.entries) - 1)
	}
	t.entries[e] = entry{node: c, pod: pod, older: none, newer: none}
	t.pairs.put(pairKey(c, pod), e)
	return e
}

// deleteEntry unlinks and frees the entry of (c, pod).
func (t *Tree) deleteEntry(c, pod int32) {
	k := pairKey(c, pod)
	e := t.pairs.get(k)
	t.unlink(pod, e)
	t.pairs.del(k)
	t.entries[e].newer = t.freeEntry
	t.freeEntry = e
}

func (t *Tree) unlink(pod, e int32) {
	x := &t.entries[e]
	if x.older != none {
		t.entries[x.older].newer = x.newer
	} else {
		t.pods[pod].oldest = x.newer
	}
	if x.newer != none {
		t.entries[x.newer].older = x.older
	} else {
		t.pods[pod].newest = x.older
	}
	x.older, x.newer = none, none
}

func (t *Tree) pushNewest(pod, e int32) {
	ps := &t.pods[pod]
	t.entries[e].older = ps.newest
	if ps.newest != none {
		t.entries[ps.newest].newer = e
	} else {
		ps.oldest = e
	}
	ps.newest = e
}

// insertAfter links e just newer than at.
func (t *Tree) insertAfter(pod, e, at int32) {
	x := &t.entries[e]
	x.older, x.newer = at, t.entries[at].newer
	if x.newer != none {
		t.entries[x.newer].older = e
	} else {
		t.pods[pod].newest = e
	}
	t.entries[at].newer = e
}

// touch makes c the pod's most recently used run.
func (t *Tree) touch(c, pod int32) {
	e := t.pairs.get(pairKey(c, pod))
	t.unlink(pod, e)
	t.pushNewest(pod, e)
}

func (t *Tree) addPod(c, pod int32) {
	n := t.nd(c)
	h := &t.holders(c)[pod>>6]
	beginWrite(n)
	atomic.StoreUint64(h, *h|1<<(pod&63))
	endWrite(n)
	t.pushNewest(pod, t.newEntry(c, pod))
	t.pods[pod].blocks += span(n.span).len()
}

func (t *Tree) dropPod(c, pod int32) {
	n := t.nd(c)
	h := &t.holders(c)[pod>>6]
	beginWrite(n)
	atomic.StoreUint64(h, *h&^(1<<(pod&63)))
	endWrite(n)
	t.deleteEntry(c, pod)
	t.pods[pod].blocks -= span(n.span).len()
}

// evict drops the pod's least recently used blocks until it is within
// capacity. The oldest run's deepest blocks go first; a run only partly
// over is split so the pod keeps its upper part.
func (t *Tree) evict(pod int32) {
	if t.capacity == 0 {
		return
	}
	for over := t.pods[pod].blocks - t.capacity; over > 0; over = t.pods[pod].blocks - t.capacity {
		c := t.entries[t.pods[pod].oldest].node
		if n := t.spanOf(c).len(); over < n {
			t.split(c, n-over) // c keeps the deepest over blocks
		}
		t.dropPod(c, pod)
		t.settle(c)
	}
}

func pairKey(c, pod int32) uint64 { return uint64(uint32(c))<<32 | uint64(uint32(pod)) }

// pairTable maps pairKey(node, pod) to that pair's entry: the writer's
// index into the LRU lists. Open addressing with linear probing and
// backward-shift deletion (no tombstones); writer-only, so plain memory.
type pairTable struct {
	keys  []uint64 // emptyPair when free
	vals  []int32
	n     int
	shift uint
}

// emptyPair is no pairKey: pods are below MaxPodsLimit.
const emptyPair = ^uint64(0)

func newPairTable() pairTable {
	var m pairTable
	m.resize(64)
	return m
}

func (m *pairTable) resize(n int) {
	keys, vals := m.keys, m.vals
	m.keys, m.vals = make([]uint64, n), make([]int32, n)
	for i := range m.keys {
		m.keys[i] = emptyPair
	}
	m.shift = 64
	for 1<<(64-m.shift) < n {
		m.shift--
	}
	m.n = 0
	for i, k := range keys {
		if k != emptyPair {
			m.put(k, vals[i])
		}
	}
}

func (m *pairTable) home(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> m.shift }

// get returns the entry of k, or none.
func (m *pairTable) get(k uint64) int32 {
	mask := uint64(len(m.keys) - 1)
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.keys[i] {
		case k:
			return m.vals[i]
		case emptyPair:
			return none
		}
	}
}

func (m *pairTable) put(k uint64, v int32) {
	if (m.n+1)*4 > len(m.keys)*3 {
		m.resize(2 * len(m.keys))
	}
	mask := uint64(len(m.keys) - 1)
	i := m.home(k)
	for m.keys[i] != emptyPair && m.keys[i] != k {
		i = (i + 1) & mask
	}
	if m.keys[i] == emptyPair {
		m.n++
	}
	m.keys[i], m.vals[i] = k, v
}

func (m *pairTable) del(k uint64) {
	mask := uint64(len(m.keys) - 1)
	i := m.home(k)
	for m.keys[i] != k {
		if m.keys[i] == emptyPair {
			return
		}
		i = (i + 1) & mask
	}
	// Shift later members of the probe run back into the hole, so lookups
	// never need tombstones: a slot j may move to hole i when its home is
	// no further along the run than i.
	for j := (i + 1) & mask; m.keys[j] != emptyPair; j = (j + 1) & mask {
		if (j-m.home(m.keys[j]))&mask >= (j-i)&mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.keys[i] = emptyPair
	m.n--
}

func (m *pairTable) bytes() int64 { return int64(len(m.keys)) * 12 }

package ledger

import (
	"math/bits"
	"sync"
	"unsafe"
)

// charge is what one request holds: the amounts it added to its pods'
// counters, so a release subtracts exactly those and counters never go below
// zero. A zero amount is a part already released (or never taken).
type charge struct {
	prefill, decode *podSlot // nil when that side was not charged
	active, kv      int64    // tokens on prefill
	decodeTokens    int64    // tokens on decode
	seqs            int64    // sequences decoded (Prompt.Sequences, at least 1)
	routedMs        int64    // decode routed_at, ledger-clock milliseconds
	at              int64    // when charged, ledger-clock nanoseconds (TTL)
}

// release subtracts what is left of c from its pods.
func (c *charge) release() {
	if s := c.prefill; s != nil {
		s.active.Add(-c.active)
		s.kv.Add(-c.kv)
	}
	if s := c.decode; s != nil {
		s.addDecode(-c.decodeTokens, -c.seqs, c.routedMs)
	}
}

// chargeShards spreads the charge table over independent locks. A charge
// lives in the shard of the pod it charged and the lane that charged it
// (see Ticket), so requests on different pods, or charged by different
// event loops, touch different cache lines: hashing by request id would
// send every core to every shard and bounce their lines between cores.
const (
	chargeShardBits = 6
	chargeShards    = 1 << chargeShardBits
	// minSlots is a shard's initial size (a power of two).
	minSlots = 16
	// laneStride spaces the lanes of one pod over the shards: odd, so
	// that 64 lanes of a pod take 64 shards.
	laneStride = 37
)

// chargeTable maps request id → charge. Each shard is a linear-probing
// hash table under a mutex, holding charges inline: one probe finds the
// slot a release updates in place. Not an xsync.MapOf: its entries are
// immutable and every insert or update allocates one, where this table
// allocates only when a shard grows, which keeps charge + release at zero
// allocations (and a Go map would hash twice per update).
//
// A slice, not an array behind a pointer: indexing through a pointer makes
// the compiler nil-check it with a load of shard 0's cache line on every
// access, which would bounce that line between cores too.
type chargeTable []chargeShard

type chargeShard struct {
	mu    sync.Mutex
	slots []chargeSlot // power-of-two length, at most 3/4 full
	n     int
	_     [64 - unsafe.Sizeof(sync.Mutex{}) - unsafe.Sizeof([]chargeSlot(nil)) - unsafe.Sizeof(0)]byte
}

type chargeSlot struct {
	id   uint64
	used bool
	gen  uint32 // the Ticket's gen at its Charge
	c    charge
}

// newChargeTable allocates the shards in one 4 KiB object, the size class
// whose objects start on 4 KiB boundaries, so each shard has its own cache
// line.
func newChargeTable() chargeTable {
	t := make(chargeTable, chargeShards)
	for i := range t {
		t[i].slots = make([]chargeSlot, minSlots)
	}
	return t
}

// hash is Fibonacci hashing: its top bits pick a slot, so sequential ids
// spread over the shard.
func hash(id uint64) uint64 { return id * 0x9E3779B97F4A7C15 }

// home is id's first slot: the top bits of its hash.
func (sh *chargeShard) home(id uint64) int {
	return int(hash(id) >> (64 - bits.TrailingZeros(uint(len(sh.slots)))))
}

// find returns id's slot and true, or the empty slot where it would go and
// false. Called with mu held.
func (sh *chargeShard) find(id uint64) (int, bool) {
	mask := len(sh.slots) - 1
	i := sh.home(id)
	for sh.slots[i].used {
		if sh.slots[i].id == id {
			return i, true
		}
		i = (i + 1) & mask
	}
	return i, false
}

// insert puts c under id, of generation gen, into the empty slot i that
// find returned.
func (sh *chargeShard) insert(i int, id uint64, gen uint32, c charge) {
	sh.slots[i] = chargeSlot{id: id, used: true, gen: gen, c: c}
	sh.n++
	if 4*sh.n > 3*len(sh.slots) {
		old := sh.slots
		sh.slots = make([]chargeSlot, 2*len(old))
		for k := range old {
			if old[k].used {
				j, _ := sh.find(old[k].id)
				sh.slots[j] = old[k]
			}
		}
	}
}

// remove empties slot i by backward-shift deletion: later entries of the
// probe run move up, so lookups never need tombstones.
func (sh *chargeShard) remove(i int) {
	mask := len(sh.slots) - 1
	for j := (i + 1) & mask; sh.slots[j].used; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		k := sh.home(sh.slots[j].id)
		if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		sh.slots[i] = sh.slots[j]
		i = j
	}
	sh.slots[i] = chargeSlot{}
	sh.n--
}

// swap stores c under t's id and gen in its shard and returns the charge
// it replaced.
func (tab chargeTable) swap(t Ticket, c charge) (old charge, ok bool) {
	sh, id := &tab[t.shard()], t.ID
	sh.mu.Lock()
	i, ok := sh.find(id)
	if ok {
		old = sh.slots[i].c
		sh.slots[i].c, sh.slots[i].gen = c, t.gen
	} else {
		sh.insert(i, id, t.gen, c)
	}
	sh.mu.Unlock()
	return old, ok
}

// take removes t's charge and returns it.
func (tab chargeTable) take(t Ticket) (c charge, ok bool) {
	sh, id := &tab[t.shard()], t.ID
	sh.mu.Lock()
	i, ok := sh.find(id)
	if ok {
		c = sh.slots[i].c
		sh.remove(i)
	}
	sh.mu.Unlock()
	return c, ok
}

// takeActive zeroes the active part of t's charge and returns its pod and
// amount; n == 0 when there is nothing left to release, or the charge is a
// later generation's than t.
func (tab chargeTable) takeActive(t Ticket) (s *podSlot, n int64) {
	sh, id := &tab[t.shard()], t.ID
	sh.mu.Lock()
	if i, ok := sh.find(id); ok && sh.slots[i].gen == t.gen {
		c := &sh.slots[i].c
		s, n = c.prefill, c.active
		c.active = 0
	}
	sh.mu.Unlock()
	return s, n
}

// moveDecode moves the decode part of t's charge to s (nil: none),
// routed at routedMs.
func (tab chargeTable) moveDecode(t Ticket, s *podSlot, routedMs int64) {
	sh, id := &tab[t.shard()], t.ID
	sh.mu.Lock()
	if i, ok := sh.find(id); ok {
		c := &sh.slots[i].c
		if old := c.decode; old != nil {
			old.addDecode(-c.decodeTokens, -c.seqs, c.routedMs)
		}
		c.decode, c.routedMs = s, routedMs
		if s != nil {
			s.addDecode(c.decodeTokens, c.seqs, routedMs)
			s.touch()
		}
	}
	sh.mu.Unlock()
}

// takeOlder removes every charge taken before cutoff (ledger-clock
// nanoseconds) and appends them, with their ids, to dst.
func (tab chargeTable) takeOlder(cutoff int64, dst []expired) []expired {
	for k := range tab {
		sh := &tab[k]
		sh.mu.Lock()
		first := len(dst)
		for i := range sh.slots {
			if e := &sh.slots[i]; e.used && e.c.at < cutoff {
				dst = append(dst, expired{e.id, e.c})
			}
		}
		// Removing shifts entries, so remove by id after the scan.
		for _, e := range dst[first:] {
			i, _ := sh.find(e.id)
			sh.remove(i)
		}
		sh.mu.Unlock()
	}
	return dst
}

type expired struct {
	id uint64
	c  charge
}

// Compile-time check that the shards fill exactly 4 KiB.
var _ [0]struct{} = [chargeShards*unsafe.Sizeof(chargeShard{}) - 4096]struct{}{}

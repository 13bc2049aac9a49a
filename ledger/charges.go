package ledger

import (
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
		s.decode.Add(-c.decodeTokens)
		s.decodeReqs.Add(-1)
		s.routedMs.Add(-c.routedMs)
	}
}

// chargeShards spreads the charge table over independent locks: concurrent
// requests land on different shards, each on its own cache line.
const (
	chargeShardBits = 6
	chargeShards    = 1 << chargeShardBits
)

// chargeTable maps request id → charge. It is a sharded Go map rather than
// an xsync.MapOf: MapOf entries are immutable and every insert or update
// allocates one, while a map that has grown to its working size inserts and
// deletes without allocating, which keeps charge + release at zero
// allocations.
type chargeTable [chargeShards]chargeShard

type chargeShard struct {
	mu sync.Mutex
	m  map[uint64]charge
	_  [64 - unsafe.Sizeof(sync.Mutex{}) - unsafe.Sizeof(map[uint64]charge(nil))]byte
}

func (t *chargeTable) init() {
	for i := range t {
		t[i].m = make(map[uint64]charge, 64)
	}
}

// shard picks id's shard by Fibonacci hashing, so sequential ids spread.
func (t *chargeTable) shard(id uint64) *chargeShard {
	return &t[(id*0x9E3779B97F4A7C15)>>(64-chargeShardBits)]
}

// swap stores c under id and returns the charge it replaced.
func (t *chargeTable) swap(id uint64, c charge) (old charge, ok bool) {
	sh := t.shard(id)
	sh.mu.Lock()
	old, ok = sh.m[id]
	sh.m[id] = c
	sh.mu.Unlock()
	return old, ok
}

// take removes id's charge and returns it.
func (t *chargeTable) take(id uint64) (c charge, ok bool) {
	sh := t.shard(id)
	sh.mu.Lock()
	c, ok = sh.m[id]
	if ok {
		delete(sh.m, id)
	}
	sh.mu.Unlock()
	return c, ok
}

// takeActive zeroes the active part of id's charge and returns its pod and
// amount; n == 0 when there is nothing left to release.
func (t *chargeTable) takeActive(id uint64) (s *podSlot, n int64) {
	sh := t.shard(id)
	sh.mu.Lock()
	if c, ok := sh.m[id]; ok && c.active != 0 {
		s, n = c.prefill, c.active
		c.active = 0
		sh.m[id] = c
	}
	sh.mu.Unlock()
	return s, n
}

// takeOlder removes every charge taken before cutoff (ledger-clock
// nanoseconds) and appends them, with their ids, to dst.
func (t *chargeTable) takeOlder(cutoff int64, dst []expired) []expired {
	for i := range t {
		sh := &t[i]
		sh.mu.Lock()
		for id, c := range sh.m {
			if c.at < cutoff {
				dst = append(dst, expired{id, c})
				delete(sh.m, id)
			}
		}
		sh.mu.Unlock()
	}
	return dst
}

type expired struct {
	id uint64
	c  charge
}

package hf

import "sync"

const cacheShards = 64

// cache maps text (a segment or a word) to its ids, keyed by a 64-bit hash
// and checked against the stored text, so a collision is a miss and never
// wrong ids. Memory is bounded: a shard that would pass its share of the
// limit is emptied. Safe for concurrent use; a hit allocates nothing.
type cache struct {
	limit  int // bytes per shard
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu    sync.RWMutex
	m     map[uint64]cacheEntry
	bytes int
	_     [40]byte // keeps shards on separate cache lines
}

type cacheEntry struct {
	key   string
	first bool
	ids   []uint32
}

// entryOverhead approximates a map entry's own bytes beyond key and ids.
const entryOverhead = 64

func newCache(limit int) *cache {
	c := &cache{limit: limit / cacheShards}
	for i := range c.shards {
		c.shards[i].m = map[uint64]cacheEntry{}
	}
	return c
}

// get appends the cached ids of key to dst.
func (c *cache) get(dst []uint32, h uint64, key []byte, first bool) ([]uint32, bool) {
	e, ok := c.lookup(h, key, first)
	if ok {
		dst = append(dst, e.ids...)
	}
	return dst, ok
}

// lookup returns key's entry. Its ids are never written: a caller may
// keep them past the entry's eviction.
func (c *cache) lookup(h uint64, key []byte, first bool) (cacheEntry, bool) {
	s := &c.shards[h%cacheShards]
	s.mu.RLock()
	e, ok := s.m[h]
	s.mu.RUnlock()
	if !ok || e.first != first || e.key != string(key) {
		return cacheEntry{}, false
	}
	return e, true
}

// put stores ids as key's and returns the entry it made, or false when
// key and ids alone would pass a shard's limit.
func (c *cache) put(h uint64, key []byte, first bool, ids []uint32) (cacheEntry, bool) {
	size := len(key) + 4*len(ids) + entryOverhead
	if size > c.limit {
		return cacheEntry{}, false
	}
	e := cacheEntry{key: string(key), first: first, ids: append([]uint32(nil), ids...)}
	s := &c.shards[h%cacheShards]
	s.mu.Lock()
	if old, ok := s.m[h]; ok {
		s.bytes -= len(old.key) + 4*len(old.ids) + entryOverhead
	}
	if s.bytes+size > c.limit {
		clear(s.m)
		s.bytes = 0
	}
	s.m[h] = e
	s.bytes += size
	s.mu.Unlock()
	return e, true
}

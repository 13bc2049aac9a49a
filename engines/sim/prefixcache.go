package sim

import "slices"

// PrefixCache is a pod's prefix cache: an LRU set of chained block keys with
// a capacity in blocks. A prompt hits the cache for as many leading blocks as
// are present; storing a prompt makes all its blocks the most recently used,
// its last block first and its first block last, then evicts least recently
// used blocks over capacity. A full cache thus drops a prompt's tail before
// its head, as the engines do: vLLM frees a request's blocks in reverse
// onto its free queue and evicts from the queue's head (KVCacheManager.free),
// SGLang's radix tree evicts leaves, TensorRT-LLM releases blocks in reverse.
// Otherwise it is the global-scheduling study's model (an OrderedDict with
// move_to_end per block), which bench/cluster reproduces.
//
// StoreCopies models vLLM, which does not deduplicate: a block computed
// again beside a cached copy is cached as another copy, its own entry in
// the LRU and its capacity.
//
// Nodes live in a slice with a free list, so the cache allocates only when it
// grows. It is not safe for concurrent use; the pod's scheduler owns it.
type PrefixCache struct {
	capacity int
	index    map[uint64]int32 // key → node of its oldest copy
	used     int              // nodes holding a copy
	nodes    []lruNode
	free     int32 // head of the free list, -1 if empty
	head     int32 // least recently used, -1 if empty
	tail     int32 // most recently used
}

type lruNode struct {
	key        uint64
	prev, next int32
	newer      int32 // node of the key's next newer copy, -1 if none
}

const none = -1

// NewPrefixCache returns an empty cache holding at most capacity blocks.
func NewPrefixCache(capacity int) *PrefixCache {
	return &PrefixCache{
		capacity: capacity,
		index:    make(map[uint64]int32, capacity+1),
		free:     none, head: none, tail: none,
	}
}

// Len returns the number of blocks held, copies included.
func (c *PrefixCache) Len() int { return c.used }

// Capacity returns the most blocks the cache holds.
func (c *PrefixCache) Capacity() int { return c.capacity }

// Match returns how many leading keys the cache holds. It does not change
// recency: only serving a request does.
func (c *PrefixCache) Match(keys []uint64) int {
	for i, k := range keys {
		if _, ok := c.index[k]; !ok {
			return i
		}
	}
	return len(keys)
}

// Contains reports whether the cache holds key.
func (c *PrefixCache) Contains(key uint64) bool {
	_, ok := c.index[key]
	return ok
}

// Store marks every key as most recently used, last to first, inserting
// those not held, then evicts the least recently used blocks over capacity. It appends
// the keys it inserted to stored and the keys it evicted to evicted (either
// may be nil when the caller does not publish events) and returns both.
func (c *PrefixCache) Store(keys []uint64, stored, evicted []uint64) ([]uint64, []uint64) {
	return c.StoreCopies(keys, len(keys), stored, evicted)
}

// StoreCopies is Store for a prompt whose blocks keys[from:] were computed
// anew, as vLLM computes every block past its prefix-cache hit: a key held
// already gets another copy, the most recently used, instead of a touch,
// and is reported in stored again. An evicted copy is reported in evicted,
// once a copy.
func (c *PrefixCache) StoreCopies(keys []uint64, from int, stored, evicted []uint64) ([]uint64, []uint64) {
	first := len(stored)
	for j := len(keys) - 1; j >= 0; j-- {
		k := keys[j]
		oldest, held := c.index[k]
		if held && j < from {
			c.unlink(oldest)
			c.pushTail(oldest)
			continue
		}
		i := c.alloc(k)
		if held {
			for c.nodes[oldest].newer != none {
				oldest = c.nodes[oldest].newer
			}
			c.nodes[oldest].newer = i
		} else {
			c.index[k] = i
		}
		c.pushTail(i)
		if stored != nil {
			stored = append(stored, k)
		}
	}
	slices.Reverse(stored[first:])
	for c.used > c.capacity {
		i := c.head
		k := c.nodes[i].key
		c.unlink(i)
		c.dropCopy(k, i)
		c.release(i)
		if evicted != nil {
			evicted = append(evicted, k)
		}
	}
	return stored, evicted
}

// dropCopy takes node i out of key k's copies, and k out of the index with
// its last copy.
func (c *PrefixCache) dropCopy(k uint64, i int32) {
	p := c.index[k]
	if p == i {
		if n := c.nodes[i].newer; n != none {
			c.index[k] = n
		} else {
			delete(c.index, k)
		}
		return
	}
	for c.nodes[p].newer != i {
		p = c.nodes[p].newer
	}
	c.nodes[p].newer = c.nodes[i].newer
}

// Clear drops every block, as an engine restart or a cache reset does.
func (c *PrefixCache) Clear() {
	clear(c.index)
	c.nodes = c.nodes[:0]
	c.used = 0
	c.free, c.head, c.tail = none, none, none
}

func (c *PrefixCache) alloc(k uint64) int32 {
	c.used++
	n := lruNode{key: k, prev: none, next: none, newer: none}
	if c.free != none {
		i := c.free
		c.free = c.nodes[i].next
		c.nodes[i] = n
		return i
	}
	c.nodes = append(c.nodes, n)
	return int32(len(c.nodes) - 1)
}

func (c *PrefixCache) release(i int32) {
	c.used--
	c.nodes[i].next = c.free
	c.free = i
}

func (c *PrefixCache) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev != none {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next != none {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = none, none
}

func (c *PrefixCache) pushTail(i int32) {
	c.nodes[i].prev = c.tail
	c.nodes[i].next = none
	if c.tail != none {
		c.nodes[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
}

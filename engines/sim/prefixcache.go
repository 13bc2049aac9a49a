package sim

import "slices"

// PrefixCache is a pod's prefix cache: chained block keys with a capacity
// in blocks, as vLLM's block pool keeps them. A prompt hits the cache for
// as many leading blocks as are present. The blocks of a running request
// are in use (Hold): they hit, but are never evicted. Released blocks join
// an LRU list, a request's last block first and its first block last, and
// a request that needs room evicts from the list's head (Evict). A full
// cache thus drops a prompt's tail before its head, as the engines do: vLLM
// frees a request's blocks in reverse onto its free queue, takes a hit
// block out of it (BlockPool.touch) and allocates from its head, evicting
// (get_new_blocks); SGLang's radix tree evicts unlocked leaves, TensorRT-LLM
// releases blocks in reverse. Store is the global-scheduling study's model
// (an OrderedDict with move_to_end per block), which bench/cluster
// reproduces: a request's blocks held and released at once.
//
// Hold's from models vLLM, which does not deduplicate: a block computed
// again beside a cached copy is cached as another copy, its own entry in
// the LRU and its capacity.
//
// Nodes live in a slice with a free list, so the cache allocates only when it
// grows. It is not safe for concurrent use; the pod's scheduler owns it.
type PrefixCache struct {
	capacity int
	index    map[uint64]int32 // key → node of its oldest copy
	used     int              // nodes holding a copy
	listed   int              // nodes in the LRU list: copies no request uses
	shared   int              // holds of a node beyond its first
	nodes    []lruNode
	free     int32   // head of the free list, -1 if empty
	head     int32   // least recently used, -1 if empty
	tail     int32   // most recently used
	held     []int32 // Store's scratch
}

type lruNode struct {
	key        uint64
	prev, next int32
	newer      int32 // node of the key's next newer copy, -1 if none
	refs       int32 // requests using it; listed only at 0
	cached     bool  // in the index: false once Clear dropped it under a request
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

// Len returns the number of blocks held, copies and blocks in use included.
func (c *PrefixCache) Len() int { return c.used }

// Shared returns the holds of blocks in use beyond a block's first: the
// blocks requests hold, each counted once, are their holds less Shared.
func (c *PrefixCache) Shared() int { return c.shared }

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

// InUse returns how many leading keys the cache holds in blocks a request
// uses: those Hold shares at no cost in room.
func (c *PrefixCache) InUse(keys []uint64) int {
	for i, k := range keys {
		if n, ok := c.index[k]; !ok || c.nodes[n].refs == 0 {
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

// Store holds every key and releases them at once, then evicts the least
// recently used blocks over capacity. It appends the keys it inserted to
// stored and the keys it evicted to evicted (either may be nil when the
// caller does not publish events) and returns both.
func (c *PrefixCache) Store(keys []uint64, stored, evicted []uint64) ([]uint64, []uint64) {
	c.held, stored = c.Hold(keys, len(keys), c.held[:0], stored)
	c.Release(c.held)
	return stored, c.Evict(0, evicted)
}

// Hold marks keys in use by a request, appending the node of each to
// nodes, which the request gives back to Release. Of keys[:from] those the
// cache holds are shared (their oldest copy); the rest, and every key of
// keys[from:], computed anew, get a new copy, reported in stored (if not
// nil). Blocks in use are never evicted.
func (c *PrefixCache) Hold(keys []uint64, from int, nodes []int32, stored []uint64) ([]int32, []uint64) {
	for j, k := range keys {
		i, held := c.index[k]
		switch {
		case held && j < from:
			if c.nodes[i].refs == 0 {
				c.unlink(i)
				c.listed--
			} else {
				c.shared++
			}
			c.nodes[i].refs++
		default:
			n := c.alloc(k)
			if held {
				for c.nodes[i].newer != none {
					i = c.nodes[i].newer
				}
				c.nodes[i].newer = n
			} else {
				c.index[k] = n
			}
			i = n
			if stored != nil {
				stored = append(stored, k)
			}
		}
		nodes = append(nodes, i)
	}
	return nodes, stored
}

// Release gives back the nodes a request held, last to first: a block no
// other request uses becomes the most recently used, so the request's
// first block is evicted last.
func (c *PrefixCache) Release(nodes []int32) {
	for _, i := range slices.Backward(nodes) {
		n := &c.nodes[i]
		if n.refs--; n.refs > 0 {
			c.shared--
			continue
		}
		if !n.cached {
			c.release(i)
			continue
		}
		c.pushTail(i)
		c.listed++
	}
}

// Evict evicts the least recently used blocks no request uses until they
// fit beside inUse blocks that requests hold (blocks Hold shared between
// requests counted as held once each), appending their keys to evicted (if
// not nil), a key once for each copy.
func (c *PrefixCache) Evict(inUse int, evicted []uint64) []uint64 {
	for c.listed > 0 && c.listed > c.capacity-inUse+c.shared {
		i := c.head
		k := c.nodes[i].key
		c.unlink(i)
		c.listed--
		c.dropCopy(k, i)
		c.release(i)
		if evicted != nil {
			evicted = append(evicted, k)
		}
	}
	return evicted
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
// Blocks in use stay with their requests, no longer cached, until released.
func (c *PrefixCache) Clear() {
	clear(c.index)
	for i := c.head; i != none; {
		next := c.nodes[i].next
		c.release(i)
		i = next
	}
	c.head, c.tail, c.listed = none, none, 0
	for i := range c.nodes {
		c.nodes[i].cached, c.nodes[i].newer = false, none
	}
}

func (c *PrefixCache) alloc(k uint64) int32 {
	c.used++
	n := lruNode{key: k, prev: none, next: none, newer: none, refs: 1, cached: true}
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

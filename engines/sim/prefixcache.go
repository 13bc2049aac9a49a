package sim

// PrefixCache is a pod's prefix cache: an LRU set of chained block keys with
// a capacity in blocks. A prompt hits the cache for as many leading blocks as
// are present; storing a prompt makes all its blocks the most recently used,
// in prompt order, then evicts least recently used blocks over capacity. That
// is exactly the global-scheduling study's model (an OrderedDict with
// move_to_end per block), so bench/cluster reproduces its numbers.
//
// Nodes live in a slice with a free list, so the cache allocates only when it
// grows. It is not safe for concurrent use; the pod's scheduler owns it.
type PrefixCache struct {
	capacity int
	index    map[uint64]int32
	nodes    []lruNode
	free     int32 // head of the free list, -1 if empty
	head     int32 // least recently used, -1 if empty
	tail     int32 // most recently used
}

type lruNode struct {
	key        uint64
	prev, next int32
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

// Len returns the number of blocks held.
func (c *PrefixCache) Len() int { return len(c.index) }

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

// Store marks every key as most recently used, in order, inserting those not
// held, then evicts the least recently used blocks over capacity. It appends
// the keys it inserted to stored and the keys it evicted to evicted (either
// may be nil when the caller does not publish events) and returns both.
func (c *PrefixCache) Store(keys []uint64, stored, evicted []uint64) ([]uint64, []uint64) {
	for _, k := range keys {
		if i, ok := c.index[k]; ok {
			c.unlink(i)
			c.pushTail(i)
			continue
		}
		i := c.alloc(k)
		c.index[k] = i
		c.pushTail(i)
		if stored != nil {
			stored = append(stored, k)
		}
	}
	for len(c.index) > c.capacity {
		i := c.head
		k := c.nodes[i].key
		c.unlink(i)
		delete(c.index, k)
		c.release(i)
		if evicted != nil {
			evicted = append(evicted, k)
		}
	}
	return stored, evicted
}

// Clear drops every block, as an engine restart or a cache reset does.
func (c *PrefixCache) Clear() {
	clear(c.index)
	c.nodes = c.nodes[:0]
	c.free, c.head, c.tail = none, none, none
}

func (c *PrefixCache) alloc(k uint64) int32 {
	if c.free != none {
		i := c.free
		c.free = c.nodes[i].next
		c.nodes[i] = lruNode{key: k, prev: none, next: none}
		return i
	}
	c.nodes = append(c.nodes, lruNode{key: k, prev: none, next: none})
	return int32(len(c.nodes) - 1)
}

func (c *PrefixCache) release(i int32) {
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

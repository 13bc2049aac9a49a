// Package kvindex turns a pod's KV-cache events into updates of the
// gateway's prefix index.
//
// The index never depends on reproducing an engine's block hash. For each
// BlockStored the feed computes the gateway's own block keys from the
// event's token ids: radix.AppendBlockKeys chained from the gateway key of
// the parent block (found through the pod's engine-hash → slot map), or
// from the prompt's seed when the blocks start a prompt:
// radix.SeedWith(radix.Seed(model), adapter, cache salt) with the event's
// extra keys, radix.Seed(model) for a plain prompt. Those are exactly the
// keys the gateway computes for a prompt with the same tokens, adapter and
// salt, so radix.Match finds them. A block the engine hashed with keys the
// gateway cannot compute for a request (multimodal inputs) chains from
// radix.Extend of its digest: it and every block after it match no text
// prompt, as in the engine.
//
// Engine and gateway block sizes may differ when one is a multiple of the
// other. An engine block of k gateway blocks maps to k gateway keys. When
// k engine blocks make one gateway block, the last of them (by its depth
// in the prompt) holds the gateway key, computed from the tokens of all k,
// which the pod keeps per block for that; the others hold the chain state
// so far (the previous gateway key or the prompt's seed, extended by any
// multimodal digests). A prompt's trailing engine blocks short of a whole
// gateway block get no key, as a request's partial block gets none. The
// engine-hash → slot map is kept to serve BlockRemoved, which names engine
// hashes only: the index names a block by its chain, rebuilt from the
// pod's slots.
//
// Memory per pod is bounded by Config.MaxBlocks engine blocks, about 73
// bytes each with one gateway key per block (BenchmarkMemoryPerBlock: map
// entry, slot, key, and the slack of grown slices), 8 more per extra key,
// and 4 per token when engine blocks are smaller than the gateway's; the
// default bound is thus about 19 MB per pod at worst with equal sizes. An engine cannot
// hold more blocks than its KV cache has, so a pod over the bound means the
// feed missed removals: the pod is cleared and rebuilt from later events.
//
// A pod whose engine runs several data-parallel ranks behind one API server
// (vLLM's --data-parallel-size) gets a feed per rank (Indexer.Ranks): each
// rank has its own cache and events, and the pod holds a block while any
// rank does. The feeds count the ranks' blocks behind each gateway key (one
// map entry per key, with a bit for each rank holding it) and take a key
// out of the index only when its last block goes. Pod.LongestRank tells
// which rank holds the longest prefix of a prompt, for the gateway to send
// the request there.
package kvindex

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"pdlb/engines"
	"pdlb/radix"
)

// Index is what the feed writes into (radix.Tree implements it). Its
// methods must be safe to call from several goroutines at once: each pod's
// feed writes from its own subscriber's goroutine (radix.Tree serialises
// writers with its own mutex); the feeds of one pod's ranks take turns.
type Index interface {
	// Insert: pod now holds the chain keys[0:len], keys[0] starting a
	// prompt.
	Insert(pod int32, keys []uint64)
	// Remove: pod no longer holds the last n blocks of chain (chain[0]
	// starting a prompt).
	Remove(pod int32, chain []uint64, n int)
	// RemovePod: pod holds nothing.
	RemovePod(pod int32)
}

// DefaultMaxBlocks bounds the engine blocks tracked per pod: 2^18 blocks of
// 16 tokens are 4M tokens, several times the KV cache of one GPU pod (an
// 80 GB card holds well under 1M tokens of an 8B model's KV).
const DefaultMaxBlocks = 1 << 18

// Config is shared by the pods an Indexer feeds.
type Config struct {
	// BlockSize is the gateway's block size in tokens (default
	// radix.DefaultBlockSize); engine block sizes must be multiples or
	// divisors of it.
	BlockSize int
	// MaxBlocks bounds the engine blocks tracked per pod (default
	// DefaultMaxBlocks).
	MaxBlocks int
}

func (c Config) withDefaults() Config {
	if c.BlockSize == 0 {
		c.BlockSize = radix.DefaultBlockSize
	}
	if c.MaxBlocks == 0 {
		c.MaxBlocks = DefaultMaxBlocks
	}
	return c
}

// Validate reports the first bad field of c (after defaults), naming it and
// quoting its value.
func (c Config) Validate() error {
	if c.BlockSize < 0 {
		return fmt.Errorf("kvindex: Config.BlockSize %d is negative", c.BlockSize)
	}
	if c.MaxBlocks < 0 {
		return fmt.Errorf("kvindex: Config.MaxBlocks %d is negative", c.MaxBlocks)
	}
	return nil
}

// Indexer feeds many pods' events into one Index.
type Indexer struct {
	idx Index
	cfg Config
}

// New validates cfg and returns an Indexer writing into idx.
func New(idx Index, cfg Config) (*Indexer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Indexer{idx: idx, cfg: cfg}, nil
}

// Pod returns the feed of one pod serving model: give it the pod's events
// (it implements the engines' event-sink interface, e.g. as the sink of a
// vllm.Subscriber); pod is its id in the index (a radix.Tree ignores the
// writes of a pod whose slot was vacated). The pod's state in the index is
// not touched until its first event.
func (ix *Indexer) Pod(pod int32, model string) *Pod {
	return &Pod{ix: ix, id: pod, seed: radix.Seed(model), byHash: make(map[uint64]int32)}
}

// Ranks returns the feeds of one pod serving model whose engine runs n
// data-parallel ranks, each publishing its own events: feed r takes rank
// r's. Each feed is a Pod, but the pod holds a gateway key in the index
// while a block of any rank holds it, so one rank's removals and clears
// leave the other ranks' copies. The feeds' event methods may be called
// from one goroutine each. Ranks(pod, model, 1) is a single Pod.
func (ix *Indexer) Ranks(pod int32, model string, n int) []*Pod {
	if n <= 1 {
		return []*Pod{ix.Pod(pod, model)}
	}
	shared := &rankHolds{held: make(map[uint64]keyHolds), more: make(map[rankKey]int32)}
	if n <= MaxRankedRanks {
		shared.words = (n + 63) / 64
		for r := range n {
			shared.all[r/64] |= 1 << (r % 64)
		}
	}
	feeds := make([]*Pod, n)
	for r := range feeds {
		feeds[r] = ix.Pod(pod, model)
		feeds[r].ranks, feeds[r].rank = shared, r
	}
	return feeds
}

// MaxRankedRanks is the most ranks a pod may have for LongestRank to tell
// them apart: a key's ranks are the bits of a mask of rankWords words.
const MaxRankedRanks = 64 * rankWords

// rankWords is the widest rank mask, in 64-bit words.
const rankWords = 16

// rankHolds is what the feeds of one pod's ranks share: for each gateway
// key, the number of live blocks of any rank holding it and which ranks
// those are. Its mutex is held through a feed's whole event, index writes
// included, so a key one rank releases cannot leave the index after
// another rank stored it again; LongestRank reads under it.
type rankHolds struct {
	mu   sync.RWMutex
	held map[uint64]keyHolds
	// more counts a rank's blocks under a key beyond its first (blocks of
	// different engine hashes with the same gateway key: rare), so that
	// the rank's bit goes with its last.
	more map[rankKey]int32
	// words is the width of a key's rank mask; 0 for a pod of more than
	// MaxRankedRanks, whose ranks get no bits. all has a bit for each
	// rank.
	words int
	all   [rankWords]uint64
	// wide holds the words of the keys' masks past their first, for a pod
	// of more than 64 ranks: words-1 of them from a key's slot times
	// words-1; free lists the slots of keys gone, zeroed.
	wide []uint64
	free []int32
}

// keyHolds are the holds of one gateway key: n blocks of ranks (bit r of
// the mask: rank r holds one at least), the mask's first word in ranks,
// the others at slot of rankHolds.wide.
type keyHolds struct {
	n     int32
	slot  int32
	ranks uint64
}

type rankKey struct {
	key  uint64
	rank int
}

// word is word w of k's rank mask.
func (h *rankHolds) word(k *keyHolds, w int) *uint64 {
	if w == 0 {
		return &k.ranks
	}
	return &h.wideOf(*k)[w-1]
}

// wideOf is the words of k's rank mask past its first: none on a pod of
// 64 ranks or fewer.
func (h *rankHolds) wideOf(k keyHolds) []uint64 {
	if h.words <= 1 {
		return nil
	}
	at := int(k.slot) * (h.words - 1)
	return h.wide[at : at+h.words-1]
}

// hold counts one more block of rank holding key.
func (h *rankHolds) hold(key uint64, rank int) {
	k, ok := h.held[key]
	if !ok && h.words > 1 {
		if n := len(h.free); n > 0 {
			k.slot, h.free = h.free[n-1], h.free[:n-1]
		} else {
			k.slot = int32(len(h.wide) / (h.words - 1))
			h.wide = append(h.wide, make([]uint64, h.words-1)...)
		}
	}
	k.n++
	if h.words > 0 {
		if w, bit := h.word(&k, rank/64), uint64(1)<<(rank%64); *w&bit == 0 {
			*w |= bit
		} else {
			h.more[rankKey{key, rank}]++
		}
	}
	h.held[key] = k
}

// release drops one hold of key by rank and reports whether it was the
// last of any rank.
func (h *rankHolds) release(key uint64, rank int) bool {
	k := h.held[key]
	if h.words > 0 {
		rk := rankKey{key, rank}
		switch c := h.more[rk]; {
		case c > 1:
			h.more[rk] = c - 1
		case c == 1:
			delete(h.more, rk)
		default:
			*h.word(&k, rank/64) &^= 1 << (rank % 64)
		}
	}
	if k.n--; k.n > 0 {
		h.held[key] = k
		return false
	}
	if h.words > 1 {
		clear(h.wideOf(k))
		h.free = append(h.free, k.slot)
	}
	delete(h.held, key)
	return true
}

// LongestRank says which of the pod's data-parallel ranks holds the
// longest prefix of chain (a prompt's gateway keys, chain[0] its first
// block's): rank, holding blocks of them, where every other rank holds
// next at most. rank is -1 when no rank holds more than all the others
// (a tie, or nothing held), and for a pod of one rank or of more than
// MaxRankedRanks. Safe to call from any goroutine; it allocates nothing.
func (p *Pod) LongestRank(chain []uint64) (rank, blocks, next int) {
	h := p.ranks
	if h == nil || h.words == 0 {
		return -1, 0, 0
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	// live: the ranks holding chain[:blocks]; next: the blocks held by
	// the ranks that dropped out last.
	words := h.words
	live := h.all
	for i, key := range chain {
		k, ok := h.held[key]
		if !ok {
			break
		}
		wide := h.wideOf(k)
		m := k.ranks & live[0]
		some, same := m != 0, m == live[0]
		for w, x := range wide {
			m := x & live[w+1]
			some, same = some || m != 0, same && m == live[w+1]
		}
		if !some {
			break
		}
		if !same {
			live[0] &= k.ranks
			for w, x := range wide {
				live[w+1] &= x
			}
			next = i
		}
		blocks = i + 1
	}
	rank, ones := -1, 0
	for w := range words {
		if n := bits.OnesCount64(live[w]); n > 0 {
			rank, ones = 64*w+bits.TrailingZeros64(live[w]), ones+n
		}
	}
	if blocks == 0 || ones != 1 {
		return -1, 0, 0
	}
	return rank, blocks, next
}

// PodCounters are a Pod's plain atomic counters, for the gateway to export.
type PodCounters struct {
	// Stored and Removed count engine blocks taken into and out of the
	// index.
	Stored  atomic.Uint64
	Removed atomic.Uint64
	// Orphans counts BlockStored events dropped because their parent block
	// is unknown (stored before the feed started, or lost): their keys
	// cannot be computed without the prefix.
	Orphans atomic.Uint64
	// Mismatched counts BlockStored events dropped because their block
	// size is neither a multiple nor a divisor of the gateway's, changed,
	// or does not match the number of tokens, or their extra keys do not
	// match the number of blocks.
	Mismatched atomic.Uint64
	// Overflows counts clears forced by MaxBlocks.
	Overflows atomic.Uint64
	// Clears counts AllBlocksCleared (including a restarted engine's).
	Clears atomic.Uint64
}

// Pod keeps one pod's (or one of its ranks') engine-hash → gateway-key map
// and writes its changes into the index. Its event methods must be called
// from one goroutine at a time (a Subscriber calls them from its own);
// Counters and Blocks may be read from any.
type Pod struct {
	ix   *Indexer
	id   int32
	seed uint64
	// ranks is shared by the feeds of the pod's data-parallel ranks; nil
	// for a pod of one (see Indexer.Ranks); rank is this feed's.
	ranks *rankHolds
	rank  int

	// blockSize is the engine's block size in tokens, fixed by the first
	// BlockStored after a clear; 0 before it. perBlock is the number of
	// gateway keys an engine block holds (its size / the gateway's, at
	// least 1); group the number of engine blocks in one gateway block
	// (the gateway's size / its size, at least 1). One of them is 1.
	blockSize, perBlock, group int

	// Engine blocks live in slots (an arena: parent links are slot
	// indices, so walking a prompt's chain costs no map lookups). Slot s
	// holds keys[s*perBlock : (s+1)*perBlock]: its gateway keys, or, when
	// group > 1 and it does not end a gateway block, the chain state (see
	// keysOf). With group > 1 its tokens are toks[s*blockSize :
	// (s+1)*blockSize].
	byHash map[uint64]int32
	slots  []slot
	keys   []uint64
	toks   []uint32
	free   []int32
	blocks atomic.Int64 // live (not tombstoned) slots

	// Scratch, reused across events.
	chain  []uint64
	path   []int32
	gwToks []uint32

	Counters PodCounters
}

type slot struct {
	hash     uint64
	parent   int32 // slot of the preceding block; -1 when it starts a prompt
	children int32 // slots whose parent this is
	depth    int32 // engine blocks before it in its prompt
	// copies counts the engine's physical copies of the block: vLLM keeps
	// duplicates under one hash and stores and evicts each with an event
	// (block_pool.py), but for a hit it reports (see BlockStored). 0 marks
	// a block evicted while blocks chained after it are still held: the
	// slot stays (their chain walks through it) until its last child goes.
	copies int32
}

// Blocks is the number of engine blocks the pod holds by its events.
func (p *Pod) Blocks() int { return int(p.blocks.Load()) }

// BlockStored indexes the blocks of one event (see the package doc).
func (p *Pod) BlockStored(parentHash uint64, hasParent bool, blockHashes []uint64, tokenIDs []uint32, blockSize int, extra engines.ExtraKeys) {
	if len(blockHashes) == 0 {
		return
	}
	if r := p.ranks; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	gw := p.ix.cfg.BlockSize
	if blockSize <= 0 || (blockSize%gw != 0 && gw%blockSize != 0) || len(tokenIDs) != len(blockHashes)*blockSize ||
		(p.blockSize != 0 && blockSize != p.blockSize) ||
		(extra.Media != nil && len(extra.Media) != len(blockHashes)) {
		p.Counters.Mismatched.Add(1)
		return
	}
	if !hasParent && p.holdsAll(blockHashes) {
		// A report of a prefix-cache hit, not a copy: vLLM's per-request
		// kv_cache_report_mode "full" stores a hit's blocks again from
		// the prompt's first (BlockPool.emit_cached_block_events) and
		// evicts them once. A copy from the first block needs a hit of
		// none while the pod holds it: a one-block prompt cached again,
		// or a request that skips the cache; that copy goes uncounted.
		return
	}
	if len(p.slots)-len(p.free)+len(blockHashes) > p.ix.cfg.MaxBlocks {
		p.Counters.Overflows.Add(1)
		p.clear()
		if hasParent {
			p.Counters.Orphans.Add(1) // its parent went with the clear
			return
		}
	}
	prev := int32(-1)
	seed := radix.SeedWith(p.seed, extra.LoRA, extra.CacheSalt)
	chain := p.chain[:0]
	if hasParent {
		s, ok := p.byHash[parentHash]
		if !ok || p.slots[s].copies == 0 {
			p.Counters.Orphans.Add(1)
			return
		}
		prev = s
		chain = p.appendPrefix(chain, s)
	}
	if p.blockSize == 0 {
		p.blockSize, p.perBlock, p.group = blockSize, max(1, blockSize/gw), max(1, gw/blockSize)
	}
	n0 := len(chain)
	if p.group == 1 && extra.Media == nil {
		// The common case in one call: every block's keys chain on.
		chain = radix.AppendBlockKeys(chain, p.stateAfter(prev, seed), tokenIDs, gw)
		for j, h := range blockHashes {
			prev = p.store(h, prev, chain[n0+j*p.perBlock:n0+(j+1)*p.perBlock], nil)
		}
	} else {
		chain = p.storeEach(chain, prev, seed, blockHashes, tokenIDs, extra.Media)
	}
	p.chain = chain
	p.Counters.Stored.Add(uint64(len(blockHashes)))
	if len(chain) > n0 {
		p.ix.idx.Insert(p.id, chain)
	}
}

// holdsAll says whether every one of the engine blocks hashes is live.
func (p *Pod) holdsAll(hashes []uint64) bool {
	for _, h := range hashes {
		if s, ok := p.byHash[h]; !ok || p.slots[s].copies == 0 {
			return false
		}
	}
	return true
}

// storeEach stores the blocks of an event block by block, chained after
// slot prev (seed: the prompt's), and appends their gateway keys to chain:
// BlockStored's way when a block's multimodal digest (media[j], if media
// is not nil) extends the chain state, or engine blocks are smaller than
// the gateway's.
func (p *Pod) storeEach(chain []uint64, prev int32, seed uint64, hashes []uint64, tokens []uint32, media []uint64) []uint64 {
	gw := p.ix.cfg.BlockSize
	for j, h := range hashes {
		state := p.stateAfter(prev, seed)
		if media != nil && media[j] != 0 {
			state = radix.Extend(state, media[j])
		}
		toks := tokens[j*p.blockSize : (j+1)*p.blockSize]
		if p.group == 1 {
			n := len(chain)
			chain = radix.AppendBlockKeys(chain, state, toks, gw)
			prev = p.store(h, prev, chain[n:], nil)
			continue
		}
		entry := [1]uint64{state} // a chain state, unless the block ends a gateway block
		if p.endsGroup(prev) {
			chain = radix.AppendBlockKeys(chain, state, p.groupTokens(prev, toks), gw)
			entry[0] = chain[len(chain)-1]
		}
		prev = p.store(h, prev, entry[:], toks)
	}
	return chain
}

// stateAfter is the chain state a block chained after slot prev starts
// from: seed (the prompt's) when prev < 0, else what prev left, its last
// gateway key or, inside a gateway block, its state. Chaining from a
// parent's last key gives the same keys as hashing the whole prompt from
// its seed.
func (p *Pod) stateAfter(prev int32, seed uint64) uint64 {
	if prev < 0 {
		return seed
	}
	return p.keys[int(prev)*p.perBlock+p.perBlock-1]
}

// endsGroup says whether a block chained after slot prev ends a gateway
// block (group > 1).
func (p *Pod) endsGroup(prev int32) bool {
	depth := 0
	if prev >= 0 {
		depth = int(p.slots[prev].depth) + 1
	}
	return (depth+1)%p.group == 0
}

// groupTokens returns the tokens of the gateway block that ends with an
// engine block of tokens toks chained after slot parent: the group-1
// engine blocks up to parent, then toks (in p.gwToks, reused).
func (p *Pod) groupTokens(parent int32, toks []uint32) []uint32 {
	bs := p.blockSize
	out := slices.Grow(p.gwToks[:0], p.group*bs)[:p.group*bs]
	copy(out[(p.group-1)*bs:], toks)
	for i := p.group - 2; i >= 0; i-- {
		copy(out[i*bs:(i+1)*bs], p.toks[int(parent)*bs:])
		parent = p.slots[parent].parent
	}
	p.gwToks = out
	return out
}

// keysOf returns the gateway keys slot s holds: none for a block that does
// not end a gateway block (its keys entry is a chain state, not a key).
func (p *Pod) keysOf(s int32) []uint64 {
	if p.group > 1 && (int(p.slots[s].depth)+1)%p.group != 0 {
		return nil
	}
	off := int(s) * p.perBlock
	return p.keys[off : off+p.perBlock]
}

// appendPrefix appends the gateway keys of the chain ending at slot s, from
// the prompt's first block on.
func (p *Pod) appendPrefix(dst []uint64, s int32) []uint64 {
	path := p.path[:0]
	for ; s >= 0; s = p.slots[s].parent {
		path = append(path, s)
	}
	for i := len(path) - 1; i >= 0; i-- {
		dst = append(dst, p.keysOf(path[i])...)
	}
	p.path = path
	return dst
}

// store records engine block h chained after slot parent with the given
// keys entries (perBlock of them) and tokens (group > 1), and returns its
// slot. A block already known keeps its slot and parent (engine hashes
// chain their parent's, so the same hash means the same prefix) and counts
// one more copy, revived if it was a tombstone.
func (p *Pod) store(h uint64, parent int32, keys []uint64, toks []uint32) int32 {
	if s, ok := p.byHash[h]; ok {
		p.slots[s].copies++
		if p.slots[s].copies == 1 {
			p.blocks.Add(1)
			p.hold(s)
		}
		return s
	}
	sl := slot{hash: h, parent: parent, copies: 1}
	if parent >= 0 {
		sl.depth = p.slots[parent].depth + 1
		p.slots[parent].children++
	}
	var s int32
	if n := len(p.free); n > 0 {
		s = p.free[n-1]
		p.free = p.free[:n-1]
		p.slots[s] = sl
		copy(p.keys[int(s)*p.perBlock:], keys)
		if len(toks) > 0 {
			// Only engine blocks smaller than the gateway's keep
			// tokens; p.toks is empty otherwise.
			copy(p.toks[int(s)*p.blockSize:], toks)
		}
	} else {
		s = int32(len(p.slots))
		p.slots = append(p.slots, sl)
		p.keys = append(p.keys, keys...)
		p.toks = append(p.toks, toks...)
	}
	p.byHash[h] = s
	p.blocks.Add(1)
	p.hold(s)
	return s
}

// hold counts live slot s's gateway keys as held by one more block of the
// pod's ranks.
func (p *Pod) hold(s int32) {
	if p.ranks == nil {
		return
	}
	for _, k := range p.keysOf(s) {
		p.ranks.hold(k, p.rank)
	}
}

// BlockRemoved takes the named engine blocks out of the index; unknown
// hashes are ignored, and a block with copies left loses one and stays.
// The index names blocks by their chain, so each block's is built before
// its slot is released (a removed block's slot stays while blocks chained
// after it are held, so blocks may come in any order). Blocks next to
// each other in the event and in one chain (an engine evicts a prompt's
// deepest blocks first; a list may also run from the root) go in one
// Remove.
func (p *Pod) BlockRemoved(blockHashes []uint64) {
	if r := p.ranks; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	p.Counters.Removed.Add(uint64(p.removeBlocks(blockHashes)))
}

// removeBlocks is BlockRemoved without the lock and the counter; it
// returns the number of blocks removed.
func (p *Pod) removeBlocks(blockHashes []uint64) int {
	removed := 0
	// Pending (when last ≥ 0): the last n keys of p.chain, blocks from the
	// child of slot above down to slot last.
	n, above, last := 0, int32(-1), int32(-1)
	for _, h := range blockHashes {
		s, ok := p.byHash[h]
		if !ok || p.slots[s].copies == 0 {
			continue
		}
		if p.slots[s].copies > 1 {
			p.slots[s].copies--
			continue
		}
		switch {
		case last >= 0 && s == above:
			above = p.slots[s].parent
		case last >= 0 && p.slots[s].parent == last:
			p.chain = append(p.chain, p.keysOf(s)...)
			last = s
		default:
			if n > 0 {
				p.remove(p.chain, n)
			}
			p.chain = p.appendPrefix(p.chain[:0], s)
			n, above, last = 0, p.slots[s].parent, s
		}
		n += len(p.keysOf(s))
		p.slots[s].copies = 0
		p.blocks.Add(-1)
		removed++
		p.release(s)
	}
	if n > 0 {
		p.remove(p.chain, n)
	}
	return removed
}

// remove takes the pod's last n blocks of chain out of the index: on a pod
// of several ranks only the keys no other block holds, in runs.
func (p *Pod) remove(chain []uint64, n int) {
	if p.ranks == nil {
		p.ix.idx.Remove(p.id, chain, n)
		return
	}
	run := 0 // released keys ending before chain[i]
	for i := len(chain) - n; i < len(chain); i++ {
		if p.ranks.release(chain[i], p.rank) {
			run++
			continue
		}
		if run > 0 {
			p.ix.idx.Remove(p.id, chain[:i], run)
			run = 0
		}
	}
	if run > 0 {
		p.ix.idx.Remove(p.id, chain, run)
	}
}

// release frees removed slot s once nothing chains through it, and then
// its removed ancestors that this leaves childless.
func (p *Pod) release(s int32) {
	for s >= 0 && p.slots[s].copies == 0 && p.slots[s].children == 0 {
		parent := p.slots[s].parent
		delete(p.byHash, p.slots[s].hash)
		p.free = append(p.free, s)
		if parent >= 0 {
			p.slots[parent].children--
		}
		s = parent
	}
}

// AllBlocksCleared forgets the pod's blocks and takes them out of the index
// (a rank's: those no other rank holds).
func (p *Pod) AllBlocksCleared() {
	if r := p.ranks; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	p.Counters.Clears.Add(1)
	p.clear()
}

// clear forgets the pod's blocks: all of the pod's in the index, or only
// those of this rank's that no other rank holds.
func (p *Pod) clear() {
	if p.ranks == nil {
		p.ix.idx.RemovePod(p.id)
	} else {
		// A clear drops every copy: leave one of each for removeBlocks.
		for i := range p.slots {
			p.slots[i].copies = min(p.slots[i].copies, 1)
		}
		p.removeBlocks(p.leavesUp())
	}
	clear(p.byHash)
	p.slots, p.keys, p.toks, p.free = p.slots[:0], p.keys[:0], p.toks[:0], p.free[:0]
	p.blockSize, p.perBlock, p.group = 0, 0, 0
	p.blocks.Store(0)
}

// leavesUp lists the hashes of the pod's blocks as removeBlocks takes them
// in fewest runs: from each leaf up its chain, to the first block listed
// before.
func (p *Pod) leavesUp() []uint64 {
	listed := make([]bool, len(p.slots))
	hashes := make([]uint64, 0, len(p.byHash))
	for _, s := range p.byHash {
		if p.slots[s].children > 0 {
			continue
		}
		for ; s >= 0 && !listed[s]; s = p.slots[s].parent {
			listed[s] = true
			hashes = append(hashes, p.slots[s].hash)
		}
	}
	return hashes
}

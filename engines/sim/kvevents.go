package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"pdlb/engines"
)

// KVEventSink receives a pod's prefix-cache changes, in the order they
// happen, as vLLM publishes them on its KV-events socket. The pod's scheduler
// goroutine calls it, holding no lock a request waits on; a slow sink slows
// the pod's simulated clock, so a sink should queue and return. The slices
// are the pod's scratch: valid only during the call.
type KVEventSink interface {
	// BlockStored reports blocks newly cached (as vLLM, a block computed
	// again beside a cached copy too), the prompt's and then those its
	// answer filled, in order, each chained to the one before; parentHash
	// is the block before the first (hasParent false when the first is
	// the prompt's first block). tokenIDs holds the blocks' tokens
	// concatenated (an answer's: the ids the pod generated), blockSize per
	// block;
	// extra what the pod hashed into them besides (the request's cache
	// salt, on a run that starts a prompt, as vLLM publishes it).
	BlockStored(parentHash uint64, hasParent bool, blockHashes []uint64, tokenIDs []uint32, blockSize int, extra engines.ExtraKeys)
	// BlockRemoved reports blocks evicted from the cache, a hash once for
	// each copy evicted, when a request takes their room: as vLLM, before
	// that request's BlockStored. Blocks of running requests are never
	// evicted.
	BlockRemoved(blockHashes []uint64)
	// AllBlocksCleared reports that the whole cache was dropped.
	AllBlocksCleared()
}

// engineSeed is the first link of the pod's block-hash chain. Real engines
// hash blocks their own way (vLLM: sha256 or Python hash of the parent hash
// and the token ids, salted by PYTHONHASHSEED), so the gateway must never
// rely on an engine's hashes equalling its own keys; it rebuilds its keys
// from the events' token ids. The sim keeps that honest: its hashes are
// radix.AppendBlockKeys chains over the same tokens but from this seed,
// xxhash of "sim-engine", the model and the pod's HashSeed, which differs
// from radix.Seed(model). Pods with one model and HashSeed agree, as vLLM
// pods with one PYTHONHASHSEED do. A prompt with a cache salt chains from
// radix.SeedWith(engineSeed, "", salt) instead, so prompts of different
// salts share no block, as in vLLM.
func engineSeed(model string, hashSeed uint64) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString("sim-engine\x00")
	_, _ = d.WriteString(model)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], hashSeed)
	_, _ = d.Write(b[:])
	return d.Sum64()
}

// publishStored reports the blocks of keys[lo:] that PrefixCache.Hold cached
// (stored, a subsequence of keys[lo:] in order) as one BlockStored per run
// of consecutive blocks: a run's parent is the block before it, which the
// cache already held. tokens are the tokens of keys[lo:]'s blocks, salt
// the request's cache salt and lora its adapter ("" for none).
func publishStored(sink KVEventSink, keys []uint64, lo int, stored []uint64, tokens []uint32, salt, lora string, blockSize int) {
	j := 0
	for i := lo; i < len(keys) && j < len(stored); {
		if keys[i] != stored[j] {
			i++
			continue
		}
		start := i
		for i < len(keys) && j < len(stored) && keys[i] == stored[j] {
			i++
			j++
		}
		var parent uint64
		extra := engines.ExtraKeys{LoRA: lora}
		if start > 0 {
			parent = keys[start-1]
		} else {
			extra.CacheSalt = salt
		}
		sink.BlockStored(parent, start > 0, keys[start:i], tokens[(start-lo)*blockSize:(i-lo)*blockSize], blockSize, extra)
	}
}

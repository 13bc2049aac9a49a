// Package sim is the simulated engine pod: pdlb's stand-in for a GPU running
// vLLM, SGLang or TensorRT-LLM.
//
// physics.go and prefixcache.go are its timing model, kept as pure functions
// and plain data so that the live pod (wall time divided by --speedup) and
// bench/cluster (virtual time) apply the same physics and their results can
// be compared.
package sim

import (
	"errors"

	"pdlb/internal/yamlkeys"
	"pdlb/kvxfer"
)

// Defaults of the timing model. Prefill speed, block size and cache size are
// the global-scheduling study's (20,000 tokens/s, blocks of 64 tokens, 3,000
// blocks per pod); the decode curve gives about 3,000 tokens/s at a batch of
// 64, the study's decode capacity under its TPOT target.
const (
	DefaultPrefillTokensPerSec = 20000
	DefaultDecodeBaseSec       = 0.010
	DefaultDecodePerSeqSec     = 0.0002
	DefaultMaxBatch            = 64
	DefaultBlockSize           = 64
	DefaultCacheBlocks         = 3000
	DefaultKVBytesPerToken     = 131072 // fp16 KV of an 8B model: 2 × 32 layers × 8 heads × 128 dims × 2 bytes
	DefaultLinkBytesPerSec     = 25e9   // one 200 Gb/s NIC
	DefaultLinkLatencySec      = 0.0005
)

// Physics is one pod's timing model. Times are in seconds, sizes in tokens
// unless a field says otherwise. The zero value is not usable; start from
// DefaultPhysics.
type Physics struct {
	// PrefillTokensPerSec is how fast the pod, or each of its
	// data-parallel ranks, computes prompt tokens that missed its prefix
	// cache (default 20,000).
	PrefillTokensPerSec float64
	// DecodeBaseSec is the time of one decode step with a batch of one
	// (default 0.010).
	DecodeBaseSec float64
	// DecodePerSeqSec is what each sequence in the batch adds to a step
	// (default 0.0002): memory traffic grows with the batch.
	DecodePerSeqSec float64
	// MaxBatch is the most sequences decoded at once (default 64), on
	// each data-parallel rank; the rest wait in the queue.
	MaxBatch int
	// BlockSize is the number of tokens per KV block (default 64).
	BlockSize int
	// CacheBlocks is the KV capacity in blocks (default 3,000) of the pod,
	// or of each of its data-parallel ranks, shared by running sequences
	// and the LRU prefix cache.
	CacheBlocks int
	// KVBytesPerToken is the size of one token's KV cache in bytes (default
	// 131,072), for transfer times.
	KVBytesPerToken float64
	// LinkBytesPerSec and LinkLatencySec model the KV transfer link
	// (defaults 25e9 bytes/s and 0.0005 s).
	LinkBytesPerSec float64
	LinkLatencySec  float64
	// AdapterLoadSec is the time to bring a LoRA adapter into a GPU slot
	// before a prefill that needs it (default 0.2; see LoRASlots).
	AdapterLoadSec float64
}

// DefaultPhysics returns the timing model with every default.
func DefaultPhysics() Physics {
	return Physics{
		PrefillTokensPerSec: DefaultPrefillTokensPerSec,
		DecodeBaseSec:       DefaultDecodeBaseSec,
		DecodePerSeqSec:     DefaultDecodePerSeqSec,
		MaxBatch:            DefaultMaxBatch,
		BlockSize:           DefaultBlockSize,
		CacheBlocks:         DefaultCacheBlocks,
		KVBytesPerToken:     DefaultKVBytesPerToken,
		LinkBytesPerSec:     DefaultLinkBytesPerSec,
		LinkLatencySec:      DefaultLinkLatencySec,
		AdapterLoadSec:      DefaultAdapterLoadSec,
	}
}

var errPhysics = errors.New("sim: invalid physics")

// Validate rejects values the model cannot run with, naming the field.
func (p Physics) Validate() error {
	bad := func(field string, v any, why string) error {
		return &fieldError{errPhysics, field, yamlkeys.Quote(v), why}
	}
	const positive, notNegative = "must be positive", "must not be negative"
	switch {
	case !(p.PrefillTokensPerSec > 0):
		return bad("prefill_tokens_per_sec", p.PrefillTokensPerSec, positive)
	case !(p.DecodeBaseSec > 0):
		return bad("decode_base_sec", p.DecodeBaseSec, positive)
	case p.DecodePerSeqSec < 0:
		return bad("decode_per_seq_sec", p.DecodePerSeqSec, notNegative)
	case p.MaxBatch <= 0:
		return bad("max_batch", p.MaxBatch, positive)
	case p.BlockSize <= 0:
		return bad("block_size", p.BlockSize, positive)
	case p.CacheBlocks <= 0:
		return bad("cache_blocks", p.CacheBlocks, positive)
	case !(p.KVBytesPerToken > 0):
		return bad("kv_bytes_per_token", p.KVBytesPerToken, positive)
	case !(p.LinkBytesPerSec > 0):
		return bad("link_bytes_per_sec", p.LinkBytesPerSec, positive)
	case p.LinkLatencySec < 0:
		return bad("link_latency_sec", p.LinkLatencySec, notNegative)
	case p.AdapterLoadSec < 0:
		return bad("adapter_load_sec", p.AdapterLoadSec, notNegative)
	}
	return nil
}

// PrefillSec is the time to compute uncached prompt tokens.
func (p Physics) PrefillSec(uncached int) float64 {
	return float64(uncached) / p.PrefillTokensPerSec
}

// DecodeStepSec is the time of one decode step that advances every one of
// batch sequences by one token: the pod's TPOT at that batch.
func (p Physics) DecodeStepSec(batch int) float64 {
	if batch < 1 {
		batch = 1
	}
	return p.DecodeBaseSec + float64(batch)*p.DecodePerSeqSec
}

// DecodeTokensPerSec is the pod's output throughput at a batch.
func (p Physics) DecodeTokensPerSec(batch int) float64 {
	if batch < 1 {
		return 0
	}
	return float64(batch) / p.DecodeStepSec(batch)
}

// TransferSec is the time to move the KV cache of tokens over the link.
func (p Physics) TransferSec(tokens int) float64 {
	return p.Link().Sec(p.KVBytes(tokens))
}

// KVBytes is the size of the KV cache of tokens.
func (p Physics) KVBytes(tokens int) float64 { return float64(tokens) * p.KVBytesPerToken }

// Link is the pod's KV transfer link as kvxfer's timing model.
func (p Physics) Link() kvxfer.Link {
	return kvxfer.Link{BytesPerSec: p.LinkBytesPerSec, LatencySec: p.LinkLatencySec}
}

// Blocks is the number of KV blocks tokens occupy (a partial block counts).
func (p Physics) Blocks(tokens int) int { return (tokens + p.BlockSize - 1) / p.BlockSize }

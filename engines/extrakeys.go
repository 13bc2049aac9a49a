package engines

// DefaultKVReplayPort is the port of a pod's KV-event replay socket when
// its configuration names none, on the host of its KV events: the port
// after vLLM's PUB default (5557), where deployments put it (vLLM opens a
// replay socket only when configured one).
const DefaultKVReplayPort = 5558

// ExtraKeys is what an engine hashed into a run of stored blocks besides
// their token ids (vLLM's extra_keys): the index keys those blocks apart
// from plain ones, as the engine does. The zero value means none: plain
// blocks.
type ExtraKeys struct {
	// LoRA is the adapter the blocks were computed with ("" for none);
	// vLLM hashes its name into every block.
	LoRA string
	// CacheSalt is the request's cache_salt ("" for none). vLLM hashes it
	// into a prompt's first block only, so it is set only on a run that
	// starts a prompt; later blocks carry it through their parent.
	CacheSalt string
	// Media holds one digest per block of what else the engine hashed
	// into it (multimodal inputs, prompt embeddings, keys newer than this
	// code), 0 for a block without; nil when no block has any. The
	// gateway cannot compute these for a request, so such blocks only
	// need keys no text prompt has.
	Media []uint64
}

// Package vllm speaks vLLM's KV-cache event protocol on both sides of the
// wire: the Go types and msgpack codec of its events (this file), a
// Publisher with vLLM's PUB socket and replay ROUTER (kvpublisher.go), and a
// per-pod Subscriber that follows a publisher, repairs sequence gaps through
// replay and notices restarts (kvsubscriber.go). An engine started with
// --data-parallel-size runs a publisher per rank, rank r on the configured
// ports + r: StartRanks starts such a set, and a Subscriber follows one
// rank (SubscriberConfig.DataParallelRank).
//
// # Wire format
//
// vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) sends each batch as
// a three-frame ZMQ message [topic, seq, payload]: seq is the batch's
// sequence number as an 8-byte big-endian signed integer, counting from 0
// when the publisher starts; payload is a KVEventBatch encoded by msgspec's
// msgpack encoder. A KVEventBatch has ts (float seconds since the Unix
// epoch), events (a list of tagged events) and, in later versions,
// data_parallel_rank (default None). The events are msgspec Structs tagged
// with their class name: BlockStored, BlockRemoved, AllBlocksCleared.
//
// vLLM has shipped three layouts of the same structs, all decoded here:
//
//   - EncodingArray: batch and events are arrays (array_like=True); an
//     event's first element is its tag. Trailing fields at their defaults
//     may be omitted, and arrays longer than the fields known are accepted.
//   - EncodingArrayMapEvents: the batch is an array and each event is a map
//     with the tag under "type".
//   - EncodingMap: batch and events are maps (the current vLLM layout);
//     fields at their defaults are omitted (omit_defaults=True), fields
//     without a default are always present, possibly nil.
//
// Field order of BlockStored: block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium, lora_name, extra_keys, group_idx,
// kv_cache_spec_kind, then newer optional fields; of BlockRemoved: block_hashes, medium, group_idx, ...;
// AllBlocksCleared has none. Unknown map keys and extra trailing array
// elements are skipped, so newer vLLM fields do not break decoding, and
// events with an unknown tag are left out (Batch.Unknown). A block_size of 0 is
// accepted: vLLM's OffloadingConnector stores its CPU blocks with no
// tokens and block_size 0.
//
// SGLang (python/sglang/srt/disaggregation/kv_events.py) publishes the
// same framing and structs up to medium. A salted BlockStored carries the
// request's cache_salt after them: in the array layout as a
// BlockStoredMetadata map {cache_salt, session_id} where vLLM has
// lora_name, in the map layout as a cache_salt field. Decode reads it as
// the salt vLLM puts in extra_keys. Under EAGLE speculative decoding
// SGLang lists each token id as the bigram [token, next token]; Decode
// keeps the token.
//
// # Extra keys
//
// extra_keys holds, per block of block_hashes, what vLLM hashed into the
// block besides its tokens (generate_block_hash_extra_keys): None, or a
// tuple (an array) of the LoRA adapter's name (first, in every block of an
// adapter's prompt), the multimodal inputs overlapping the block
// ([identifier, offset] pairs; bare identifier strings in the first
// versions that published extra_keys), the request's cache_salt (a string,
// in the prompt's first block only) and prompt-embedding digests (bytes).
// Decode types them: the adapter's name is recognised by equality with
// lora_name; in a block that starts a prompt the last string after it is
// the cache salt; everything else, and any shape vLLM does not send (a
// tuple count other than the number of blocks, a non-array), is folded
// into the block's Media digest, so such blocks never match a text prompt.
// An older multimodal first block holding a bare identifier and no salt
// reads as salted by the identifier: it still matches no plain prompt.
//
// # Block hashes
//
// A block hash is an integer (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1;
// older vLLM sent Python hash() values, which may be negative) or bytes (the
// raw digest, when that variable is 0). Integers are kept as their 64-bit
// two's-complement pattern. Bytes are folded exactly as vLLM folds them in
// int mode (maybe_convert_block_hash: int.from_bytes(digest, "big") masked to
// 64 bits, i.e. the last eight bytes read big-endian), so one block has one
// uint64 name whichever way the engine was configured.
package vllm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"pdlb/engines"
)

// Kind says which event an Event is.
type Kind uint8

// The event kinds, named after the msgspec tags (Python class names) vLLM
// writes on the wire.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// Tag names on the wire.
const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

// MediumGPU is vLLM's MEDIUM_GPU, the medium of blocks in GPU memory.
const MediumGPU = "GPU"

// String returns the wire tag of k.
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return tagBlockStored
	case BlockRemoved:
		return tagBlockRemoved
	case AllBlocksCleared:
		return tagAllBlocksCleared
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one KV-cache event. Fields a kind does not have stay zero. For
// the optional integer fields vLLM's None and 0 are the same value here:
// vLLM never sends lora_id 0 (LoRA ids start at 1) and sends group_idx None
// where there is a single KV-cache group.
type Event struct {
	Kind Kind
	// BlockHashes are the engine's hashes of the stored or removed blocks,
	// in chain order for BlockStored.
	BlockHashes []uint64
	// ParentHash is the engine hash of the block preceding BlockHashes[0]
	// in its prompt; HasParent is false when the first block starts the
	// prompt (parent_block_hash None).
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the tokens of the stored blocks, concatenated:
	// len(BlockHashes)*BlockSize of them.
	TokenIDs []uint32
	// BlockSize is the number of tokens one engine block holds.
	BlockSize int
	// LoraID is vLLM's lora_id (0: no adapter). LoraName is lora_name
	// ("" for None).
	LoraID   int64
	LoraName string
	// Medium is where the blocks live ("GPU", "CPU", ...; "" for None).
	Medium string
	// CacheSalt is the cache_salt found in the extra keys (SGLang: its
	// cache_salt) of a BlockStored that starts a prompt ("" for none);
	// Media is, per block, the digest of its other extra keys (0 for
	// none; nil when no block has any). See the package doc. Encode
	// writes lora_name and CacheSalt into
	// extra_keys as vLLM does; a digest cannot be written back, so Encode
	// leaves Media out.
	CacheSalt string
	Media     []uint64
	// GroupIdx is the event's KV-cache group (group_idx); HasGroup is
	// false for None, as vLLM sent before it named groups and SGLang
	// sends. SpecKind is a BlockStored's kv_cache_spec_kind, the kind of
	// cache its group holds ("full_attention", "sliding_window", "mamba",
	// ...; "" for None).
	GroupIdx int64
	HasGroup bool
	SpecKind string
}

// Extra returns the extra keys of a BlockStored in the engine-neutral form
// the index reads. An adapter's blocks from a vLLM that sends lora_id
// without lora_name are keyed by a name no request has (unnamedLoRA): the
// id is the pod's own numbering, which the gateway cannot map to a name,
// and keying them as base-model blocks would match them wrongly.
func (ev *Event) Extra() engines.ExtraKeys {
	lora := ev.LoraName
	if lora == "" && ev.LoraID != 0 {
		lora = unnamedLoRA + strconv.FormatInt(ev.LoraID, 10)
	}
	return engines.ExtraKeys{LoRA: lora, CacheSalt: ev.CacheSalt, Media: ev.Media}
}

// unnamedLoRA prefixes the stand-in name of an adapter known by id only; a
// NUL byte keeps it apart from any model name a request may send.
const unnamedLoRA = "\x00lora_id:"

// Batch is a KVEventBatch: the events one publish call carried.
type Batch struct {
	// TS is the publisher's wall clock in seconds since the Unix epoch
	// (Python's time.time()).
	TS     float64
	Events []Event
	// Unknown counts the events Decode left out of Events for a type it
	// does not know: they are skipped, not failed, so that the known
	// events beside them are not lost (vLLM's offloading connectors
	// publish their own events in the same batches as the block pool's).
	Unknown int
	// DPRank is data_parallel_rank; HasDPRank is false for None (older
	// vLLM has no such field).
	DPRank    int64
	HasDPRank bool
}

// BlockEvents is a KV-cache event stream as calls, one per event. The
// Publisher implements it (the simulated engine calls it as its prefix
// cache stores and evicts blocks); a Subscriber calls it on its sink (the
// gateway's index feed) with the events of the pod it follows, in order,
// a batch's run of BlockRemoved events in one call.
// Callees must not keep the slices past the call: callers reuse them.
type BlockEvents interface {
	// BlockStored: the engine cached len(blockHashes) blocks of blockSize
	// tokens each, chained after the block hashed parentHash (hasParent
	// false: the first block starts a prompt). tokenIDs holds their tokens,
	// len(blockHashes)*blockSize of them; extra what the engine hashed
	// into them besides (its Media slice is the caller's too).
	BlockStored(parentHash uint64, hasParent bool, blockHashes []uint64, tokenIDs []uint32, blockSize int, extra engines.ExtraKeys)
	// BlockRemoved: the engine evicted these blocks.
	BlockRemoved(blockHashes []uint64)
	// AllBlocksCleared: the engine dropped its whole prefix cache.
	AllBlocksCleared()
}

// Encoding selects one of the layouts vLLM has shipped (see the package
// doc). All three decode with Decode. The zero value is the layout current
// vLLM sends.
type Encoding uint8

// The layouts, newest first.
const (
	EncodingMap Encoding = iota
	EncodingArrayMapEvents
	EncodingArray
)

// String names enc as configuration spells it.
func (enc Encoding) String() string {
	switch enc {
	case EncodingArray:
		return "array"
	case EncodingArrayMapEvents:
		return "array_map_events"
	case EncodingMap:
		return "map"
	}
	return fmt.Sprintf("Encoding(%d)", uint8(enc))
}

// ParseEncoding is the inverse of Encoding.String.
func ParseEncoding(s string) (Encoding, error) {
	for _, enc := range []Encoding{EncodingMap, EncodingArrayMapEvents, EncodingArray} {
		if enc.String() == s {
			return enc, nil
		}
	}
	return 0, fmt.Errorf("vllm: unknown KV event encoding %q (known: map, array_map_events, array)", s)
}

// Sentinel errors of Decode; the messages wrapping them say where.
var (
	ErrMalformed = errors.New("vllm: malformed KV event batch")
	errTrailing  = fmt.Errorf("%w: trailing bytes after the batch", ErrMalformed)
)

// maxDepth bounds the nesting of values Decode skips (extra_keys and unknown
// future fields). vLLM nests a few levels; the bound keeps hostile input
// from recursing as deep as it is long.
const maxDepth = 32

// Decode parses one KVEventBatch payload in any of the layouts vLLM has
// shipped. It never panics on malformed input and allocates no more than the
// payload's size justifies: every length is checked against the bytes left.
func Decode(payload []byte) (Batch, error) {
	d := decoder{buf: payload}
	d.r.Reset(payload)
	md := msgpack.GetDecoder()
	defer msgpack.PutDecoder(md)
	// A *bytes.Reader is an io.ByteScanner, so the msgpack decoder reads it
	// directly, unbuffered: d.r.Len() is always the bytes not yet decoded,
	// which the bounds checks and zero-copy string reads rely on.
	md.Reset(&d.r)
	d.d = md

	b, err := d.batch()
	if err != nil {
		return Batch{}, err
	}
	if d.r.Len() != 0 {
		return Batch{}, errTrailing
	}
	return b, nil
}

type decoder struct {
	buf []byte
	r   bytes.Reader
	d   *msgpack.Decoder
	// extraAt is the offset of the current event's extra_keys value, -1
	// if it has none: the value is typed once the event's other fields
	// are known.
	extraAt int
	// salt is the current event's SGLang cache_salt ("" for none), kept
	// until its parent is known.
	salt string
}

func (d *decoder) fail(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %s at byte %d: %w", ErrMalformed, what, len(d.buf)-d.r.Len(), err)
}

func (d *decoder) failf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformed, fmt.Sprintf(format, args...), len(d.buf)-d.r.Len())
}

func (d *decoder) peek() (byte, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, d.fail("value", err)
	}
	return c, nil
}

// nilNext consumes a nil if one is next.
func (d *decoder) nilNext() (bool, error) {
	c, err := d.peek()
	if err != nil || c != msgpcode.Nil {
		return false, err
	}
	return true, d.d.Skip()
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

// arrayLen reads an array header; each element takes at least one byte, so a
// count beyond the bytes left is a lie and is rejected before anything is
// allocated for it.
func (d *decoder) arrayLen(what string) (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, d.failf("%s: want array, got code 0x%02x", what, c)
	}
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, d.fail(what, err)
	}
	if n > d.r.Len() {
		return 0, d.failf("%s: array of %d elements in %d bytes", what, n, d.r.Len())
	}
	return n, nil
}

func (d *decoder) mapLen(what string) (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !isMap(c) {
		return 0, d.failf("%s: want map, got code 0x%02x", what, c)
	}
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return 0, d.fail(what, err)
	}
	if n > d.r.Len()/2 {
		return 0, d.failf("%s: map of %d entries in %d bytes", what, n, d.r.Len())
	}
	return n, nil
}

// raw returns the bytes of the str or bin value next, as a slice of the
// payload (no copy; callers copy what they keep).
func (d *decoder) raw(what string) ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return nil, d.failf("%s: want str or bin, got code 0x%02x", what, c)
	}
	n, err := d.d.DecodeBytesLen()
	if err != nil {
		return nil, d.fail(what, err)
	}
	if n > d.r.Len() {
		return nil, d.failf("%s: %d bytes announced, %d left", what, n, d.r.Len())
	}
	off := len(d.buf) - d.r.Len()
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, d.fail(what, err)
	}
	return d.buf[off : off+n : off+n], nil
}

// str reads a str (or bin) value, nil as "". Common values are interned so
// per-event strings do not allocate.
func (d *decoder) str(what string) (string, error) {
	if isNil, err := d.nilNext(); isNil || err != nil {
		return "", err
	}
	b, err := d.raw(what)
	if err != nil {
		return "", err
	}
	for _, known := range interned {
		if string(b) == known {
			return known, nil
		}
	}
	return string(b), nil
}

// interned are the strings most events repeat: decoding them allocates
// nothing.
var interned = [...]string{MediumGPU, "full_attention", "mla_attention", "sliding_window", "mamba"}

// int reads an integer (nil as 0).
func (d *decoder) int(what string) (int64, error) {
	if isNil, err := d.nilNext(); isNil || err != nil {
		return 0, err
	}
	bits, unsigned64, err := d.intBits(what)
	if err != nil {
		return 0, err
	}
	if unsigned64 && bits > math.MaxInt64 {
		return 0, d.failf("%s: %d out of range", what, bits)
	}
	return int64(bits), nil
}

// intBits reads the msgpack integer next. It returns the value's 64-bit
// two's-complement pattern; unsigned64 is true for the uint64 format, whose
// values above MaxInt64 read as negative if taken as signed.
func (d *decoder) intBits(what string) (bits uint64, unsigned64 bool, err error) {
	off := len(d.buf) - d.r.Len()
	bits, unsigned64, n := intAt(d.buf, off)
	if n <= 0 {
		return 0, false, d.intErr(what, off, n)
	}
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return 0, false, d.fail(what, err)
	}
	return bits, unsigned64, nil
}

// intAt decodes the msgpack integer at buf[off:] straight from the payload
// (token ids and hashes are the bulk of every batch; this is several times
// faster than the generic decoder). n is the bytes it took: 0 if buf ends
// first, -1 if the value there is not an integer.
func intAt(buf []byte, off int) (bits uint64, unsigned64 bool, n int) {
	if off >= len(buf) {
		return 0, false, 0
	}
	c := buf[off]
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, 1
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), false, 1
	case c >= msgpcode.Uint8 && c <= msgpcode.Uint64, c >= msgpcode.Int8 && c <= msgpcode.Int64:
		signed := c >= msgpcode.Int8
		w := 1 << (c - msgpcode.Uint8) // 1, 2, 4 or 8 bytes follow
		if signed {
			w = 1 << (c - msgpcode.Int8)
		}
		if off+1+w > len(buf) {
			return 0, false, 0
		}
		for _, x := range buf[off+1 : off+1+w] {
			bits = bits<<8 | uint64(x)
		}
		if signed && w < 8 {
			shift := 64 - 8*w // sign-extend
			bits = uint64(int64(bits<<shift) >> shift)
		}
		return bits, c == msgpcode.Uint64, 1 + w
	}
	return 0, false, -1
}

// bigramAt decodes, as intAt does, a token SGLang lists as the bigram
// [token, next token] its radix cache keys pages by under EAGLE
// speculative decoding: the token is the first.
func bigramAt(buf []byte, off int) (bits uint64, unsigned64 bool, n int) {
	if off >= len(buf) {
		return 0, false, 0
	}
	if buf[off] != msgpcode.FixedArrayLow|2 {
		return 0, false, -1
	}
	bits, unsigned64, w := intAt(buf, off+1)
	if w <= 0 {
		return 0, false, w
	}
	_, _, next := intAt(buf, off+1+w)
	if next <= 0 {
		return 0, false, next
	}
	return bits, unsigned64, 1 + w + next
}

// intErr is the error for intAt's failure n at off.
func (d *decoder) intErr(what string, off, n int) error {
	if n == 0 {
		return d.fail(what, io.ErrUnexpectedEOF)
	}
	return d.failf("%s: want integer, got code 0x%02x", what, d.buf[off])
}

// hash reads one block hash: an integer of either sign, kept as its 64-bit
// pattern, or bytes folded as vLLM folds them (see the package doc).
func (d *decoder) hash(what string) (uint64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if isInt(c) {
		h, _, err := d.intBits(what)
		return h, err
	}
	b, err := d.raw(what)
	if err != nil {
		return 0, err
	}
	return FoldHash(b), nil
}

// FoldHash maps a byte-string block hash to the uint64 vLLM would have sent
// in int mode: the bytes as a big-endian integer, masked to 64 bits.
func FoldHash(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var h uint64
	for _, x := range b {
		h = h<<8 | uint64(x)
	}
	return h
}

func (d *decoder) hashes(what string) ([]uint64, error) {
	n, err := d.arrayLen(what)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = d.hash(what); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *decoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen("token_ids")
	if err != nil {
		return nil, err
	}
	out := make([]uint32, n)
	// The hot loop: decode from the payload with a local offset and move
	// the reader once at the end.
	start := len(d.buf) - d.r.Len()
	off := start
	for i := range out {
		bits, unsigned64, w := intAt(d.buf, off)
		if w < 0 {
			bits, unsigned64, w = bigramAt(d.buf, off)
		}
		if w <= 0 {
			_, _ = d.r.Seek(int64(off-start), io.SeekCurrent) // report the failing offset
			return nil, d.intErr("token_ids", off, w)
		}
		if bits > math.MaxUint32 {
			_, _ = d.r.Seek(int64(off-start), io.SeekCurrent)
			if !unsigned64 {
				return nil, d.failf("token_ids: token %d out of range", int64(bits))
			}
			return nil, d.failf("token_ids: token %d out of range", bits)
		}
		out[i] = uint32(bits)
		off += w
	}
	if _, err := d.r.Seek(int64(off-start), io.SeekCurrent); err != nil {
		return nil, d.fail("token_ids", err)
	}
	return out, nil
}

func (d *decoder) float(what string) (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Double && c != msgpcode.Float && !isInt(c) {
		return 0, d.failf("%s: want number, got code 0x%02x", what, c)
	}
	f, err := d.d.DecodeFloat64()
	if err != nil {
		return 0, d.fail(what, err)
	}
	return f, nil
}

// skip steps over one value of any type, bounded in depth and checked in
// length.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return d.failf("values nested deeper than %d", maxDepth)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen("value")
		if err != nil {
			return err
		}
		for range n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := d.mapLen("value")
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		_, err := d.raw("value")
		return err
	case msgpcode.IsExt(c):
		return d.failf("msgpack extension type 0x%02x not used by vLLM", c)
	}
	if err := d.d.Skip(); err != nil {
		return d.fail("value", err)
	}
	return nil
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	c, err := d.peek()
	if err != nil {
		return b, err
	}
	if isArray(c) {
		n, err := d.arrayLen("batch")
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, d.failf("batch: %d fields, want ts and events", n)
		}
		if b.TS, err = d.float("ts"); err != nil {
			return b, err
		}
		if b.Events, b.Unknown, err = d.events(); err != nil {
			return b, err
		}
		if n >= 3 {
			if b.DPRank, b.HasDPRank, err = d.optInt("data_parallel_rank"); err != nil {
				return b, err
			}
		}
		for i := 3; i < n; i++ {
			if err := d.skip(1); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	n, err := d.mapLen("batch")
	if err != nil {
		return b, err
	}
	var sawTS, sawEvents bool
	for range n {
		k, err := d.raw("batch key")
		if err != nil {
			return b, err
		}
		switch string(k) {
		case "ts":
			b.TS, err = d.float("ts")
			sawTS = true
		case "events":
			b.Events, b.Unknown, err = d.events()
			sawEvents = true
		case "data_parallel_rank":
			b.DPRank, b.HasDPRank, err = d.optInt("data_parallel_rank")
		default:
			err = d.skip(1)
		}
		if err != nil {
			return b, err
		}
	}
	if !sawTS || !sawEvents {
		return b, d.failf("batch: ts or events missing")
	}
	return b, nil
}

func (d *decoder) optInt(what string) (int64, bool, error) {
	if isNil, err := d.nilNext(); isNil || err != nil {
		return 0, false, err
	}
	v, err := d.int(what)
	return v, err == nil, err
}

// events decodes a batch's events, leaving out those of an unknown type,
// which it counts.
func (d *decoder) events() (out []Event, unknown int, err error) {
	n, err := d.arrayLen("events")
	if err != nil {
		return nil, 0, err
	}
	out = make([]Event, n)
	j := 0
	for range n {
		c, err := d.peek()
		if err != nil {
			return nil, 0, err
		}
		if isArray(c) {
			err = d.arrayEvent(&out[j])
		} else {
			err = d.mapEvent(&out[j])
		}
		if err != nil {
			return nil, 0, err
		}
		if out[j].Kind == 0 {
			unknown++
			continue
		}
		j++
	}
	return out[:j], unknown, nil
}

func (d *decoder) kind(what string) (Kind, error) {
	tag, err := d.raw(what)
	if err != nil {
		return 0, err
	}
	switch string(tag) {
	case tagBlockStored:
		return BlockStored, nil
	case tagBlockRemoved:
		return BlockRemoved, nil
	case tagAllBlocksCleared:
		return AllBlocksCleared, nil
	}
	return 0, nil
}

// Positional fields of each kind after the tag, in vLLM's declaration order.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func fieldsOf(k Kind) []string {
	switch k {
	case BlockStored:
		return storedFields
	case BlockRemoved:
		return removedFields
	}
	return nil
}

// required is how many leading fields an array event must carry: the ones
// every vLLM version has and that have no default.
func required(k Kind) int {
	switch k {
	case BlockStored:
		return 4 // block_hashes, parent_block_hash, token_ids, block_size
	case BlockRemoved:
		return 1 // block_hashes
	}
	return 0
}

func (d *decoder) arrayEvent(ev *Event) error {
	n, err := d.arrayLen("event")
	if err != nil {
		return err
	}
	if n == 0 {
		return d.failf("event: empty array, want tag first")
	}
	if ev.Kind, err = d.kind("event tag"); err != nil {
		return err
	}
	n--
	if ev.Kind == 0 {
		for range n {
			if err := d.skip(1); err != nil {
				return err
			}
		}
		return nil
	}
	if n < required(ev.Kind) {
		return d.failf("%s: %d fields, want at least %d", ev.Kind, n, required(ev.Kind))
	}
	fields := fieldsOf(ev.Kind)
	d.extraAt, d.salt = -1, ""
	for i := range n {
		if i < len(fields) {
			err = d.field(ev, fields[i])
		} else {
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.finishStored(ev)
}

func (d *decoder) mapEvent(ev *Event) error {
	n, err := d.mapLen("event")
	if err != nil {
		return err
	}
	// The tag may come anywhere (msgspec writes it first), so fields are
	// collected into the union Event and checked against the kind at the
	// end.
	var sawHashes, sawTokens, sawSize, unknown bool
	d.extraAt, d.salt = -1, ""
	for range n {
		k, err := d.raw("event key")
		if err != nil {
			return err
		}
		if string(k) == "type" {
			if ev.Kind != 0 || unknown {
				return d.failf("event: type given twice")
			}
			if ev.Kind, err = d.kind("event type"); err != nil {
				return err
			}
			if ev.Kind == 0 {
				*ev = Event{}
				unknown = true
			}
			continue
		}
		if unknown {
			if err := d.skip(1); err != nil {
				return err
			}
			continue
		}
		// Field names come from the table, not from the payload, so
		// matching a key allocates nothing.
		name := ""
		for _, f := range storedFields {
			if string(k) == f {
				name = f
				break
			}
		}
		if string(k) == sglangSalt {
			name = sglangSalt
		}
		sawHashes = sawHashes || name == "block_hashes"
		sawTokens = sawTokens || name == "token_ids"
		sawSize = sawSize || name == "block_size"
		if err := d.field(ev, name); err != nil {
			return err
		}
	}
	if unknown {
		return nil
	}
	switch ev.Kind {
	case BlockStored:
		if !sawHashes || !sawTokens || !sawSize {
			return d.failf("BlockStored: block_hashes, token_ids or block_size missing")
		}
		return d.finishStored(ev)
	case BlockRemoved:
		if !sawHashes {
			return d.failf("BlockRemoved: block_hashes missing")
		}
	case AllBlocksCleared:
	default:
		return d.failf("event: no type")
	}
	return nil
}

// field decodes the value of one named field into ev.
func (d *decoder) field(ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = d.hashes(name)
	case "parent_block_hash":
		var isNil bool
		if isNil, err = d.nilNext(); err == nil && !isNil {
			ev.ParentHash, err = d.hash(name)
			ev.HasParent = err == nil
		}
	case "token_ids":
		ev.TokenIDs, err = d.tokens()
	case "block_size":
		var v int64
		if v, err = d.int(name); err == nil {
			if v < 0 || v > math.MaxInt32 {
				return d.failf("block_size %d out of range", v)
			}
			ev.BlockSize = int(v)
		}
	case "lora_id":
		ev.LoraID, err = d.int(name)
	case "medium":
		ev.Medium, err = d.str(name)
	case "lora_name":
		var c byte
		if c, err = d.peek(); err == nil && isMap(c) {
			err = d.sglangMetadata()
		} else if err == nil {
			ev.LoraName, err = d.str(name)
		}
	case sglangSalt:
		d.salt, err = d.str(name)
	case "group_idx":
		var isNil bool
		if isNil, err = d.nilNext(); err == nil && !isNil {
			ev.GroupIdx, err = d.int(name)
			ev.HasGroup = err == nil
		}
	case "kv_cache_spec_kind":
		ev.SpecKind, err = d.str(name)
	case "extra_keys":
		d.extraAt = len(d.buf) - d.r.Len()
		err = d.skip(1)
	default:
		err = d.skip(1)
	}
	return err
}

// sglangSalt is the key of SGLang's cache_salt, in its metadata map and
// in its map-layout events.
const sglangSalt = "cache_salt"

// sglangMetadata reads SGLang's BlockStoredMetadata map, which its array
// layout puts where vLLM has lora_name: the cache_salt, skipping the rest
// (session_id, which does not key blocks).
func (d *decoder) sglangMetadata() error {
	n, err := d.mapLen("metadata")
	if err != nil {
		return err
	}
	for range n {
		k, err := d.raw("metadata key")
		if err != nil {
			return err
		}
		if string(k) == sglangSalt {
			d.salt, err = d.str(sglangSalt)
		} else {
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// finishStored completes a BlockStored once all its fields are read: it
// types its extra keys and takes an SGLang salt as the salt of a run that
// starts a prompt, as vLLM's extra_keys give it; later runs carry it
// through their parent.
func (d *decoder) finishStored(ev *Event) error {
	if ev.Kind != BlockStored {
		return nil
	}
	if err := d.typeExtraKeys(ev); err != nil {
		return err
	}
	if d.salt != "" && !ev.HasParent {
		ev.CacheSalt = d.salt
	}
	return nil
}

// typeExtraKeys reads the BlockStored ev's extra_keys, already checked by
// skip at d.extraAt, into CacheSalt and Media (see the package doc). It
// runs once the event's other fields are read, since lora_name, the parent
// and the number of blocks decide what each key is, and map fields may
// come in any order.
func (d *decoder) typeExtraKeys(ev *Event) error {
	if d.extraAt < 0 {
		return nil
	}
	end := len(d.buf) - d.r.Len()
	if _, err := d.r.Seek(int64(d.extraAt), io.SeekStart); err != nil {
		return d.fail("extra_keys", err)
	}
	if err := d.extraKeys(ev, end); err != nil {
		return err
	}
	if _, err := d.r.Seek(int64(end), io.SeekStart); err != nil {
		return d.fail("extra_keys", err)
	}
	return nil
}

// extraKeys types the extra_keys value next, which ends at end.
func (d *decoder) extraKeys(ev *Event, end int) error {
	if isNil, err := d.nilNext(); isNil || err != nil {
		return err
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	if isArray(c) {
		n, err := d.arrayLen("extra_keys")
		if err != nil {
			return err
		}
		if n == len(ev.BlockHashes) {
			for j := range n {
				m, err := d.blockExtraKeys(ev, j == 0 && !ev.HasParent)
				if err != nil {
					return err
				}
				if m == 0 {
					continue
				}
				if ev.Media == nil {
					ev.Media = make([]uint64, n)
				}
				ev.Media[j] = m
			}
			return nil
		}
	}
	// Not one entry per block: which block a key belongs to is unknown,
	// so every block gets the digest of the whole value.
	ev.CacheSalt = ""
	if len(ev.BlockHashes) > 0 {
		ev.Media = make([]uint64, len(ev.BlockHashes))
		m := digestExtra(0, d.buf[d.extraAt:end])
		for j := range ev.Media {
			ev.Media[j] = m
		}
	}
	return nil
}

// blockExtraKeys reads one block's extra keys and returns the digest of
// those that are neither the adapter's name nor, in a block that starts a
// prompt (first), the cache salt, which it stores in ev.CacheSalt.
func (d *decoder) blockExtraKeys(ev *Event, first bool) (uint64, error) {
	start := len(d.buf) - d.r.Len()
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, d.skip(2)
	}
	if !isArray(c) {
		if err := d.skip(2); err != nil {
			return 0, err
		}
		return digestExtra(0, d.buf[start:len(d.buf)-d.r.Len()]), nil
	}
	n, err := d.arrayLen("extra_keys")
	if err != nil {
		return 0, err
	}
	var m uint64
	var salt, saltRaw []byte // the last string so far, and its msgpack bytes
	for i := range n {
		at := len(d.buf) - d.r.Len()
		c, err := d.peek()
		if err != nil {
			return 0, err
		}
		if !msgpcode.IsString(c) {
			if err := d.skip(3); err != nil {
				return 0, err
			}
			m = digestExtra(m, d.buf[at:len(d.buf)-d.r.Len()])
			continue
		}
		s, err := d.raw("extra_keys")
		if err != nil {
			return 0, err
		}
		switch raw := d.buf[at : len(d.buf)-d.r.Len()]; {
		case i == 0 && ev.LoraName != "" && string(s) == ev.LoraName:
		case first:
			if saltRaw != nil {
				m = digestExtra(m, saltRaw)
			}
			salt, saltRaw = s, raw
		default:
			m = digestExtra(m, raw)
		}
	}
	if salt != nil {
		ev.CacheSalt = string(salt)
	}
	return m, nil
}

// digestExtra folds the msgpack bytes of one extra key into the digest m
// of a block's keys so far (0: none yet); the result is never 0.
func digestExtra(m uint64, raw []byte) uint64 {
	m = bits.RotateLeft64(m, 23) ^ xxhash.Sum64(raw)
	if m == 0 {
		m = 1
	}
	return m
}

// Encode appends b to dst in layout enc and returns the extended slice.
// Fields are written as msgspec writes them: required fields always (None
// as nil), defaulted fields only when they differ from their default.
// Block hashes are written as integers (vLLM's int mode).
func Encode(dst []byte, b *Batch, enc Encoding) ([]byte, error) {
	if enc > EncodingArray {
		return dst, fmt.Errorf("vllm: unknown KV event encoding %d", enc)
	}
	w := appendWriter{b: dst}
	e := msgpack.GetEncoder()
	defer msgpack.PutEncoder(e)
	e.Reset(&w)
	en := encoder{e: e}
	en.batch(b, enc)
	return w.b, en.err
}

// appendWriter is the io.Writer the msgpack encoder appends through; it
// implements WriteByte and WriteString so the encoder uses it unbuffered.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *appendWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}

func (w *appendWriter) WriteString(s string) (int, error) {
	w.b = append(w.b, s...)
	return len(s), nil
}

// encoder keeps the first error so the layout code reads as a sequence of
// writes. (appendWriter never fails; an unknown Kind does.)
type encoder struct {
	e   *msgpack.Encoder
	err error
}

func (en *encoder) keep(err error) {
	if en.err == nil {
		en.err = err
	}
}

func (en *encoder) arrayLen(n int) { en.keep(en.e.EncodeArrayLen(n)) }
func (en *encoder) mapLen(n int)   { en.keep(en.e.EncodeMapLen(n)) }
func (en *encoder) str(s string)   { en.keep(en.e.EncodeString(s)) }
func (en *encoder) int(v int64)    { en.keep(en.e.EncodeInt(v)) }
func (en *encoder) null()          { en.keep(en.e.EncodeNil()) }

// optStr writes s, or nil for "".
func (en *encoder) optStr(s string) {
	if s == "" {
		en.null()
		return
	}
	en.str(s)
}

// optInt writes v, or nil for 0.
func (en *encoder) optInt(v int64) {
	if v == 0 {
		en.null()
		return
	}
	en.int(v)
}

// extraKeys writes BlockStored ev's extra_keys as vLLM does: per block
// the adapter's name, and in the first block the salt (when salt), or nil
// for a block with neither.
func (en *encoder) extraKeys(ev *Event, salt bool) {
	en.arrayLen(len(ev.BlockHashes))
	for j := range ev.BlockHashes {
		n := 0
		if ev.LoraName != "" {
			n++
		}
		if salt && j == 0 {
			n++
		}
		if n == 0 {
			en.null()
			continue
		}
		en.arrayLen(n)
		if ev.LoraName != "" {
			en.str(ev.LoraName)
		}
		if salt && j == 0 {
			en.str(ev.CacheSalt)
		}
	}
}

func (en *encoder) hashes(hs []uint64) {
	en.arrayLen(len(hs))
	for _, h := range hs {
		en.keep(en.e.EncodeUint(h))
	}
}

func (en *encoder) batch(b *Batch, enc Encoding) {
	n := 2
	if b.HasDPRank {
		n = 3
	}
	if enc == EncodingMap {
		en.mapLen(n)
		en.str("ts")
	} else {
		en.arrayLen(n)
	}
	en.keep(en.e.EncodeFloat64(b.TS))
	if enc == EncodingMap {
		en.str("events")
	}
	en.arrayLen(len(b.Events))
	for i := range b.Events {
		en.event(&b.Events[i], enc == EncodingArray)
	}
	if b.HasDPRank {
		if enc == EncodingMap {
			en.str("data_parallel_rank")
		}
		en.int(b.DPRank)
	}
}

// event writes ev as an array (tag first) or as a map (tag under "type").
// In both, required fields are written, and extra_keys, group_idx and
// kv_cache_spec_kind when set; in the array layout an unset one is written
// as nil before a set one to keep it at its position.
func (en *encoder) event(ev *Event, array bool) {
	var n int
	salt := ev.CacheSalt != "" && !ev.HasParent
	extra := ev.LoraName != "" || salt
	group := ev.HasGroup
	// Which of BlockStored's optional fields to write: extra_keys,
	// group_idx, kv_cache_spec_kind.
	opt := [3]bool{extra, group, ev.SpecKind != ""}
	if array {
		opt[1] = opt[1] || opt[2]
		opt[0] = opt[0] || opt[1]
	}
	switch ev.Kind {
	case BlockStored:
		n = 7 // block_hashes .. lora_name
		for _, o := range opt {
			if o {
				n++
			}
		}
	case BlockRemoved:
		n = 2 // block_hashes, medium
		if group {
			n++
		}
	case AllBlocksCleared:
	default:
		en.keep(fmt.Errorf("vllm: cannot encode event of %v", ev.Kind))
		return
	}
	key := func(string) {}
	if array {
		en.arrayLen(n + 1)
		en.str(ev.Kind.String())
	} else {
		en.mapLen(n + 1)
		en.str("type")
		en.str(ev.Kind.String())
		key = en.str
	}
	switch ev.Kind {
	case BlockStored:
		key("block_hashes")
		en.hashes(ev.BlockHashes)
		key("parent_block_hash")
		if ev.HasParent {
			en.keep(en.e.EncodeUint(ev.ParentHash))
		} else {
			en.null()
		}
		key("token_ids")
		en.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			en.keep(en.e.EncodeUint(uint64(t)))
		}
		key("block_size")
		en.int(int64(ev.BlockSize))
		key("lora_id")
		en.optInt(ev.LoraID)
		key("medium")
		en.optStr(ev.Medium)
		key("lora_name")
		en.optStr(ev.LoraName)
		if opt[0] {
			key("extra_keys")
			if extra {
				en.extraKeys(ev, salt)
			} else {
				en.null()
			}
		}
		if opt[1] {
			key("group_idx")
			if group {
				en.int(ev.GroupIdx)
			} else {
				en.null()
			}
		}
		if opt[2] {
			key("kv_cache_spec_kind")
			en.str(ev.SpecKind)
		}
	case BlockRemoved:
		key("block_hashes")
		en.hashes(ev.BlockHashes)
		key("medium")
		en.optStr(ev.Medium)
		if group {
			key("group_idx")
			en.int(ev.GroupIdx)
		}
	}
}

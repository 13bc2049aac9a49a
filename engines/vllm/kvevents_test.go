package vllm

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// unhex turns a fixture written as commented hex (one msgpack item a line)
// into bytes; everything after '#' on a line is a comment.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	var clean strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	return b
}

// hexStr is the hex of a string's bytes, for fixtures.
func hexStr(s string) string { return hex.EncodeToString([]byte(s)) }

// Fixture (a): the array layout of early vLLM (EventBatch and KVCacheEvent
// both array_like=True; BlockStored with five fields ending at lora_id,
// BlockRemoved with block_hashes only; Python hash() block hashes, which can
// be negative).
var fixtureArray = `
92                          # EventBatch [ts, events]
cb 3ff8000000000000         # ts 1.5
93                          # events: 3
 96                         # BlockStored, 5 fields after the tag
  ab ` + hexStr("BlockStored") + `
  93                        # block_hashes
   cf fedcba9876543210      #   uint64 above MaxInt64
   fe                       #   -2 (negative fixint)
   d3 8000000000000000      #   math.MinInt64
  c0                        # parent_block_hash None
  9c 01 02 03 04 05 06 07 08 cc c8 cd 0100 ce 00010000 7f   # token_ids: 12
  04                        # block_size 4
  c0                        # lora_id None
 92                         # BlockRemoved
  ac ` + hexStr("BlockRemoved") + `
  91 fe                     # block_hashes [-2]
 91 b0 ` + hexStr("AllBlocksCleared") + `
`

// Fixture (c): the map layout of current vLLM, with hashes as bytes (the
// raw 32-byte digest), extra keys of a LoRA multimodal block, its group's
// kind, and a field newer than this decoder that must be skipped.
var fixtureMap = `
83                          # KVEventBatch {ts, events, data_parallel_rank}
a2 ` + hexStr("ts") + ` cb 41d954fc40100000   # 1700000000.25
a6 ` + hexStr("events") + `
92
 8c                         # BlockStored: 12 entries
  a4 ` + hexStr("type") + ` ab ` + hexStr("BlockStored") + `
  ac ` + hexStr("block_hashes") + `
   91 c4 20 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
  b1 ` + hexStr("parent_block_hash") + `
   c4 20 ffffffffffffffffffffffffffffffffffffffffffffffff0000000000000007
  a9 ` + hexStr("token_ids") + ` 92 0a 0b
  aa ` + hexStr("block_size") + ` 02
  a7 ` + hexStr("lora_id") + ` 07
  a6 ` + hexStr("medium") + ` a3 ` + hexStr("GPU") + `
  a9 ` + hexStr("lora_name") + ` a5 ` + hexStr("sql-x") + `
  aa ` + hexStr("extra_keys") + ` 91 93  # one block: (lora, (mm id, offset), embeds digest)
   a5 ` + hexStr("sql-x") + ` 92 a3 ` + hexStr("abc") + ` 00 c4 02 0102
  a9 ` + hexStr("group_idx") + ` 01
  b2 ` + hexStr("kv_cache_spec_kind") + ` ae ` + hexStr("full_attention") + `
  b5 ` + hexStr("kv_cache_future_field") + ` 91 c0
 84                         # BlockRemoved: 4 entries, type not first
  ac ` + hexStr("block_hashes") + ` 92 01 c4 03 010203
  a4 ` + hexStr("type") + ` ac ` + hexStr("BlockRemoved") + `
  a6 ` + hexStr("medium") + ` a3 ` + hexStr("CPU") + `
  a9 ` + hexStr("group_idx") + ` 02
b2 ` + hexStr("data_parallel_rank") + ` 03
`

// fixtureEncoder returns msgpack's low-level encoder writing into buf, and
// must, which fails the test on an encoding error.
func fixtureEncoder(t testing.TB) (buf *bytes.Buffer, e *msgpack.Encoder, must func(error)) {
	buf = new(bytes.Buffer)
	must = func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	return buf, msgpack.NewEncoder(buf), must
}

// fixtureArrayMapEvents builds layout (b) (EventBatch array_like, events
// tagged maps) with msgpack's low-level encoder, field by field in msgspec's
// order, independently of Encode.
func fixtureArrayMapEvents(t testing.TB) []byte {
	t.Helper()
	buf, e, must := fixtureEncoder(t)
	must(e.EncodeArrayLen(3)) // ts, events, data_parallel_rank
	must(e.EncodeFloat64(42.0))
	must(e.EncodeArrayLen(2))
	// BlockStored with every required field and omitted defaults.
	must(e.EncodeMapLen(8))
	for _, kv := range []struct {
		k string
		v any
	}{
		{"type", "BlockStored"},
		{"block_hashes", []int64{-7, 9}},
		{"parent_block_hash", int64(-1)},
		{"token_ids", []uint32{100, 200, 300, 400}},
		{"block_size", 2},
		{"lora_id", nil},
		{"medium", "GPU"},
		{"lora_name", nil},
	} {
		must(e.EncodeString(kv.k))
		must(e.Encode(kv.v))
	}
	must(e.EncodeMapLen(1))
	must(e.EncodeString("type"))
	must(e.EncodeString("AllBlocksCleared"))
	must(e.EncodeInt(0)) // data_parallel_rank 0
	return buf.Bytes()
}

func TestDecodeFixtures(t *testing.T) {
	f := func(name string, payload []byte, want Batch) {
		t.Helper()
		got, err := Decode(payload)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}
	minInt64 := uint64(1) << 63
	f("array", unhex(t, fixtureArray), Batch{
		TS: 1.5,
		Events: []Event{
			{
				Kind:        BlockStored,
				BlockHashes: []uint64{0xfedcba9876543210, ^uint64(1), minInt64},
				TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 7, 8, 200, 256, 65536, 127},
				BlockSize:   4,
			},
			{Kind: BlockRemoved, BlockHashes: []uint64{^uint64(1)}},
			{Kind: AllBlocksCleared},
		},
	})
	f("array_map_events", fixtureArrayMapEvents(t), Batch{
		TS: 42,
		Events: []Event{
			{
				Kind:        BlockStored,
				BlockHashes: []uint64{^uint64(6), 9},
				ParentHash:  ^uint64(0),
				HasParent:   true,
				TokenIDs:    []uint32{100, 200, 300, 400},
				BlockSize:   2,
				Medium:      MediumGPU,
			},
			{Kind: AllBlocksCleared},
		},
		HasDPRank: true,
	})
	f("map", unhex(t, fixtureMap), Batch{
		TS: 1700000000.25,
		Events: []Event{
			{
				Kind:        BlockStored,
				BlockHashes: []uint64{0x18191a1b1c1d1e1f},
				ParentHash:  7,
				HasParent:   true,
				TokenIDs:    []uint32{10, 11},
				BlockSize:   2,
				LoraID:      7,
				LoraName:    "sql-x",
				Medium:      MediumGPU,
				Media:       []uint64{digestExtra(digestExtra(0, unhex(t, "92 a3"+hexStr("abc")+"00")), unhex(t, "c4 02 0102"))},
				GroupIdx:    1,
				HasGroup:    true,
				SpecKind:    "full_attention",
			},
			{Kind: BlockRemoved, BlockHashes: []uint64{1, 0x010203}, Medium: "CPU", GroupIdx: 2, HasGroup: true},
		},
		DPRank:    3,
		HasDPRank: true,
	})
}

// extraKeysFixture encodes a batch of one map-layout BlockStored of
// blocks one-token blocks with extraKeys (msgpack-encoded as given),
// lora_name lora (nil for "") and a parent when hasParent; extraFirst puts
// extra_keys before the other fields, where msgspec writes it after.
func extraKeysFixture(t testing.TB, blocks int, lora string, hasParent, extraFirst bool, extraKeys any) []byte {
	t.Helper()
	buf, e, must := fixtureEncoder(t)
	must(e.EncodeArrayLen(2))
	must(e.EncodeFloat64(1))
	must(e.EncodeArrayLen(1))
	must(e.EncodeMapLen(8))
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	var parent, loraName any
	if hasParent {
		parent = 99
	}
	if lora != "" {
		loraName = lora
	}
	type field struct {
		k string
		v any
	}
	fields := []field{
		{"type", "BlockStored"},
		{"block_hashes", hashes},
		{"parent_block_hash", parent},
		{"token_ids", make([]uint32, blocks)},
		{"block_size", 1},
		{"lora_name", loraName},
		{"medium", "GPU"},
	}
	if extraFirst {
		fields = slices.Insert(fields, 1, field{"extra_keys", extraKeys})
	} else {
		fields = append(fields, field{"extra_keys", extraKeys})
	}
	for _, kv := range fields {
		must(e.EncodeString(kv.k))
		must(e.Encode(kv.v))
	}
	return buf.Bytes()
}

// TestDecodeExtraKeys types extra_keys of the shapes vLLM sends, and of
// shapes it does not, which must leave the blocks unmatchable.
func TestDecodeExtraKeys(t *testing.T) {
	type want struct {
		salt  string
		media []bool // per block: has a digest; nil: Media nil
	}
	f := func(blocks int, lora string, hasParent, extraFirst bool, extraKeys any, w want) {
		t.Helper()
		b, err := Decode(extraKeysFixture(t, blocks, lora, hasParent, extraFirst, extraKeys))
		if err != nil {
			t.Fatalf("%v: %v", extraKeys, err)
		}
		ev := b.Events[0]
		var media []bool
		if ev.Media != nil {
			media = make([]bool, len(ev.Media))
			for i, m := range ev.Media {
				media[i] = m != 0
			}
		}
		if ev.CacheSalt != w.salt || !slices.Equal(media, w.media) || (media == nil) != (w.media == nil) {
			t.Fatalf("extra_keys %v (lora %q, parent %v): salt %q media %v, want %q %v", extraKeys, lora, hasParent, ev.CacheSalt, media, w.salt, w.media)
		}
	}
	mm := func(id string, offset int) []any { return []any{id, offset} }
	// Text-only blocks: no keys, a salt, an adapter, both.
	f(2, "", false, false, nil, want{})
	f(2, "", false, false, []any{[]any{"s1"}, nil}, want{salt: "s1"})
	f(2, "L", false, false, []any{[]any{"L", "s1"}, []any{"L"}}, want{salt: "s1"})
	f(2, "L", false, true, []any{[]any{"L", "s1"}, []any{"L"}}, want{salt: "s1"})
	f(2, "L", false, false, []any{[]any{"L"}, []any{"L"}}, want{})
	f(1, "L", true, false, []any{[]any{"L"}}, want{})
	// The salt lives in a prompt's first block only: a string in a later
	// block is something else.
	f(1, "", true, false, []any{[]any{"s1"}}, want{media: []bool{true}})
	f(1, "", true, true, []any{[]any{"s1"}}, want{media: []bool{true}})
	// Multimodal and prompt-embedding keys, with and without a salt.
	f(3, "", false, false, []any{[]any{mm("img", 3), "s1"}, []any{mm("img", -13)}, nil},
		want{salt: "s1", media: []bool{true, true, false}})
	f(2, "L", false, false, []any{[]any{"L", "s1", []byte{1, 2}}, []any{"L", []byte{3}}},
		want{salt: "s1", media: []bool{true, true}})
	f(1, "", false, false, []any{[]any{"old-id", "s1"}}, want{salt: "s1", media: []bool{true}})
	// Shapes vLLM does not send: every block becomes unmatchable.
	f(2, "", false, false, []any{[]any{"s1"}}, want{media: []bool{true, true}})
	f(2, "", false, false, "s1", want{media: []bool{true, true}})
	f(1, "", false, false, []any{"s1"}, want{media: []bool{true}})
	f(1, "", false, false, []any{map[string]int{"a": 1}}, want{media: []bool{true}})
	f(0, "", false, false, []any{}, want{})
}

// sglangFixture encodes a batch of SGLang's KV events as SGLang 0.5.18
// and later write them: the batch an array [ts, events, attn_dp_rank];
// events positional arrays (tag, block_hashes, parent_block_hash,
// token_ids, block_size, lora_id, medium), a salted store followed by its
// BlockStoredMetadata map, or, when maps, tagged maps whose cache_salt
// and session_id are fields of the event. One salted store starts a
// prompt, an unsalted one continues it, then a removal.
func sglangFixture(t testing.TB, maps bool) []byte {
	t.Helper()
	buf, e, must := fixtureEncoder(t)
	type field struct {
		k string
		v any
	}
	event := func(fields []field, meta []field) {
		if !maps {
			must(e.EncodeArrayLen(len(fields) + min(len(meta), 1)))
			for _, f := range fields {
				must(e.Encode(f.v))
			}
			if len(meta) > 0 {
				must(e.EncodeMapLen(len(meta)))
				for _, f := range meta {
					must(e.EncodeString(f.k))
					must(e.Encode(f.v))
				}
			}
			return
		}
		must(e.EncodeMapLen(len(fields) + len(meta)))
		for _, f := range append(fields, meta...) {
			must(e.EncodeString(f.k))
			must(e.Encode(f.v))
		}
	}
	stored := func(hash, parent any, tokens []uint32) []field {
		return []field{{"type", "BlockStored"}, {"block_hashes", []any{hash}}, {"parent_block_hash", parent},
			{"token_ids", tokens}, {"block_size", len(tokens)}, {"lora_id", nil}, {"medium", "GPU"}}
	}
	must(e.EncodeArrayLen(3))
	must(e.EncodeFloat64(2.5))
	must(e.EncodeArrayLen(3))
	event(stored(11, nil, []uint32{1, 2}), []field{{"cache_salt", "tenant-a"}, {"session_id", "s-1"}})
	event(stored(12, 11, []uint32{3, 4}), []field{{"session_id", "s-1"}})
	event([]field{{"type", "BlockRemoved"}, {"block_hashes", []any{10}}, {"medium", "GPU"}}, nil)
	must(e.EncodeInt(0))
	return buf.Bytes()
}

// TestDecodeSGLangCacheSalt: SGLang's salted stores carry the request's
// cache_salt beside vLLM's positional fields, or as a field of a map
// event; it keys the prompt's blocks as the gateway keys a salted request.
func TestDecodeSGLangCacheSalt(t *testing.T) {
	want := Batch{
		TS: 2.5,
		Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: MediumGPU, CacheSalt: "tenant-a"},
			{Kind: BlockStored, BlockHashes: []uint64{12}, ParentHash: 11, HasParent: true, TokenIDs: []uint32{3, 4}, BlockSize: 2, Medium: MediumGPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{10}, Medium: MediumGPU},
		},
		HasDPRank: true,
	}
	for _, maps := range []bool{false, true} {
		got, err := Decode(sglangFixture(t, maps))
		if err != nil {
			t.Fatalf("maps %v: %v", maps, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("maps %v:\n got %+v\nwant %+v", maps, got, want)
		}
	}
}

// TestDecodeSGLangBigrams: under EAGLE speculative decoding (DeepSeek's
// MTP included) SGLang's radix cache keys pages by bigrams, and its
// BlockStored lists each token as the pair [token, next token]; the block
// holds the first of each.
func TestDecodeSGLangBigrams(t *testing.T) {
	buf, e, must := fixtureEncoder(t)
	must(e.EncodeArrayLen(3))
	must(e.EncodeFloat64(1))
	must(e.EncodeArrayLen(1))
	must(e.Encode([]any{"BlockStored", []uint64{21}, nil, [][]uint32{{5, 6}, {6, 70000}, {70000, 8}}, 3, nil, "GPU"}))
	must(e.EncodeInt(0))
	got, err := Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := Event{Kind: BlockStored, BlockHashes: []uint64{21}, TokenIDs: []uint32{5, 6, 70000}, BlockSize: 3, Medium: MediumGPU}
	if !reflect.DeepEqual(got.Events, []Event{want}) {
		t.Fatalf("got %+v\nwant %+v", got.Events, want)
	}
	// Anything else in token_ids is still refused.
	for _, bad := range [][]any{{[]uint32{1}}, {[]uint32{1, 2, 3}}, {[]any{1, "x"}}, {[]any{-1, 2}}} {
		buf, e, must := fixtureEncoder(t)
		must(e.EncodeArrayLen(2))
		must(e.EncodeFloat64(1))
		must(e.Encode([]any{[]any{"BlockStored", []uint64{21}, nil, bad, 1, nil, "GPU"}}))
		if _, err := Decode(buf.Bytes()); !errors.Is(err, ErrMalformed) {
			t.Fatalf("token_ids %v: err %v, want ErrMalformed", bad, err)
		}
	}
}

func TestFoldHash(t *testing.T) {
	f := func(in string, want uint64) {
		t.Helper()
		b, _ := hex.DecodeString(in)
		if got := FoldHash(b); got != want {
			t.Fatalf("FoldHash(%s) = %#x, want %#x", in, got, want)
		}
	}
	f("", 0)
	f("01", 1)
	f("0102", 0x0102)
	f("0102030405060708", 0x0102030405060708)
	f("ff0102030405060708", 0x0102030405060708) // masked to 64 bits
}

func TestDecodeRejects(t *testing.T) {
	f := func(name, payload string) {
		t.Helper()
		_, err := Decode(unhex(t, payload))
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("%s: err = %v, want ErrMalformed", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	f("empty", "")
	f("not a container", "05")
	f("batch too short", "91 cb 3ff8000000000000")
	f("ts not a number", "92 a1 78 90")
	f("events not an array", "92 cb 3ff8000000000000 05")
	f("array claims more than the payload", "92 cb 3ff8000000000000 dd ffffffff")
	f("map claims more than the payload", "82 a2 "+hexStr("ts")+" 01 a1 78 df ffffffff")
	f("string claims more than the payload", "92 cb 3ff8000000000000 91 91 db ffffffff 00")
	f("tag not a string", "92 cb 3ff8000000000000 91 91 01")
	f("empty event array", "92 cb 3ff8000000000000 91 90")
	f("BlockStored missing fields", "92 cb 3ff8000000000000 91 92 ab "+hexStr("BlockStored")+" 90")
	f("hash of wrong type", "92 cb 3ff8000000000000 91 92 ac "+hexStr("BlockRemoved")+" 91 c3")
	f("negative token", "92 cb 3ff8000000000000 91 95 ab "+hexStr("BlockStored")+" 90 c0 91 ff 01")
	f("map event without type", "92 cb 3ff8000000000000 91 81 ac "+hexStr("block_hashes")+" 90")
	// A known type after an unknown one would skip the known one's checks.
	f("type twice", "92 cb 3ff8000000000000 91 82 a4 "+hexStr("type")+" a3 "+hexStr("Foo")+" a4 "+hexStr("type")+" ac "+hexStr("BlockRemoved"))
	f("map BlockStored without tokens", "92 cb 3ff8000000000000 91 82 a4 "+hexStr("type")+" ab "+hexStr("BlockStored")+" ac "+hexStr("block_hashes")+" 90")
	f("map batch without events", "81 a2 "+hexStr("ts")+" 01")
	f("trailing bytes", "92 cb 3ff8000000000000 90 00")
	f("extension type", "94 cb 3ff8000000000000 90 c0 d4 01 02")
	f("truncated", "92 cb 3ff80000")
	// 40 nested arrays inside an ignored trailing batch field.
	f("too deep", "94 cb 3ff8000000000000 90 c0"+strings.Repeat(" 91", 40)+" 00")
}

func TestEncodeRoundTrip(t *testing.T) {
	b := Batch{
		TS: 1700000123.5,
		Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{1, ^uint64(0)}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU},
			{Kind: BlockStored, BlockHashes: []uint64{5}, ParentHash: 1 << 63, HasParent: true, TokenIDs: []uint32{9, 0xffffffff}, BlockSize: 2, LoraID: 3, LoraName: "a", GroupIdx: 4, HasGroup: true},
			{Kind: BlockStored, BlockHashes: []uint64{6, 7}, TokenIDs: []uint32{1, 2}, BlockSize: 1, CacheSalt: "salt", GroupIdx: 1, HasGroup: true},
			{Kind: BlockStored, BlockHashes: []uint64{8, 9}, TokenIDs: []uint32{1, 2}, BlockSize: 1, LoraID: 1, LoraName: "a", CacheSalt: "a"},
			{Kind: BlockStored, BlockHashes: []uint64{10}, TokenIDs: []uint32{1}, BlockSize: 1, SpecKind: "full_attention"},
			{Kind: BlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{1}, BlockSize: 1, CacheSalt: "s", GroupIdx: 2, HasGroup: true, SpecKind: "mamba"},
			{Kind: BlockStored, BlockHashes: []uint64{12}, TokenIDs: []uint32{1}, BlockSize: 1, HasGroup: true, SpecKind: "full_attention"},
			{Kind: BlockRemoved, BlockHashes: []uint64{5, 1}, Medium: MediumGPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{}, GroupIdx: 1, HasGroup: true},
			{Kind: BlockRemoved, BlockHashes: []uint64{12}, Medium: MediumGPU, HasGroup: true},
			{Kind: AllBlocksCleared},
		},
	}
	withRank := b
	withRank.DPRank, withRank.HasDPRank = 2, true
	empty := Batch{TS: 0, Events: []Event{}}
	f := func(in Batch, enc Encoding) {
		t.Helper()
		p, err := Encode(nil, &in, enc)
		if err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		got, err := Decode(p)
		if err != nil {
			t.Fatalf("%v: decode: %v", enc, err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("%v:\n got %+v\nwant %+v", enc, got, in)
		}
	}
	for _, enc := range []Encoding{EncodingArray, EncodingArrayMapEvents, EncodingMap} {
		f(b, enc)
		f(withRank, enc)
		f(empty, enc)
	}
}

// TestEncodeLayouts pins the bytes Encode writes against the fixtures'
// layouts: the array layout of a batch equals fixture (a) where the fixture
// is expressible (Encode always writes medium and lora_name, which (a)'s
// vLLM did not have, so compare a BlockRemoved-only batch), and the map
// layout puts the tag first as msgspec does.
func TestEncodeLayouts(t *testing.T) {
	b := Batch{TS: 1.5, Events: []Event{{Kind: AllBlocksCleared}}}
	got, err := Encode(nil, &b, EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, "92 cb 3ff8000000000000 91 91 b0 "+hexStr("AllBlocksCleared"))
	if !bytes.Equal(got, want) {
		t.Fatalf("array layout:\n got %x\nwant %x", got, want)
	}
	got, err = Encode(nil, &b, EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	want = unhex(t, "82 a2 "+hexStr("ts")+" cb 3ff8000000000000 a6 "+hexStr("events")+
		" 91 81 a4 "+hexStr("type")+" b0 "+hexStr("AllBlocksCleared"))
	if !bytes.Equal(got, want) {
		t.Fatalf("map layout:\n got %x\nwant %x", got, want)
	}
	if _, err := Encode(nil, &Batch{Events: []Event{{}}}, EncodingMap); err == nil {
		t.Fatal("Encode of an event without a kind succeeded")
	}
	if _, err := Encode(nil, &b, Encoding(9)); err == nil {
		t.Fatal("Encode with an unknown encoding succeeded")
	}
}

func TestParseEncoding(t *testing.T) {
	for _, enc := range []Encoding{EncodingArray, EncodingArrayMapEvents, EncodingMap} {
		got, err := ParseEncoding(enc.String())
		if err != nil || got != enc {
			t.Fatalf("ParseEncoding(%q) = %v, %v", enc.String(), got, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil || !strings.Contains(err.Error(), `"json"`) {
		t.Fatalf("ParseEncoding(json) err = %v, want it to quote the value", err)
	}
}

// TestIntAt checks the fast integer path against msgpack's encoder in
// every integer format, at the edges of each width.
func TestIntAt(t *testing.T) {
	f := func(encode func(*msgpack.Encoder) error, wantBits uint64, wantU64 bool) {
		t.Helper()
		var buf bytes.Buffer
		if err := encode(msgpack.NewEncoder(&buf)); err != nil {
			t.Fatal(err)
		}
		bits, u64, n := intAt(buf.Bytes(), 0)
		if n != buf.Len() || bits != wantBits || u64 != wantU64 {
			t.Fatalf("%x: got %#x %v n=%d, want %#x %v n=%d", buf.Bytes(), bits, u64, n, wantBits, wantU64, buf.Len())
		}
		if _, _, n := intAt(buf.Bytes()[:buf.Len()-1], 0); buf.Len() > 1 && n != 0 {
			t.Fatalf("%x truncated: n=%d, want 0", buf.Bytes(), n)
		}
	}
	i := func(v int64) uint64 { return uint64(v) }
	f(func(e *msgpack.Encoder) error { return e.EncodeInt(0) }, 0, false)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt(127) }, 127, false)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt(-32) }, i(-32), false)
	f(func(e *msgpack.Encoder) error { return e.EncodeUint8(255) }, 255, false)
	f(func(e *msgpack.Encoder) error { return e.EncodeUint16(65535) }, 65535, false)
	f(func(e *msgpack.Encoder) error { return e.EncodeUint32(1<<32 - 1) }, 1<<32-1, false)
	f(func(e *msgpack.Encoder) error { return e.EncodeUint64(1<<64 - 1) }, 1<<64-1, true)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt8(-128) }, i(-128), false)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt16(-32768) }, i(-32768), false)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt32(-1 << 31) }, i(-1<<31), false)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt64(-1 << 63) }, i(-1<<63), false)
	f(func(e *msgpack.Encoder) error { return e.EncodeInt8(5) }, 5, false)
	if _, _, n := intAt([]byte{0xc0}, 0); n != -1 {
		t.Fatalf("nil: n=%d, want -1", n)
	}
}

// TestExtraLoRA: an adapter's blocks are keyed by its lora_name; by a name
// no request sends when vLLM gives only its lora_id; plain blocks by none.
func TestExtraLoRA(t *testing.T) {
	f := func(ev Event, want string) {
		t.Helper()
		if got := ev.Extra().LoRA; got != want {
			t.Errorf("%+v: LoRA %q, want %q", ev, got, want)
		}
	}
	f(Event{}, "")
	f(Event{LoraID: 2, LoraName: "sql"}, "sql")
	f(Event{LoraID: 2}, "\x00lora_id:2")
}

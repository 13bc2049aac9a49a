package vllm

import (
	"testing"
	"time"

	"pdlb/engines"
)

// prefillBatch is a typical batch: one prompt's 32 blocks of 16 tokens
// stored, and 8 blocks evicted to make room.
func prefillBatch() Batch {
	hashes := make([]uint64, 32)
	tokens := make([]uint32, 32*16)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for i := range tokens {
		tokens[i] = uint32(i * 7919 % 150000)
	}
	return Batch{TS: 1.7e9, Events: []Event{
		{Kind: BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 16, Medium: MediumGPU},
		{Kind: BlockRemoved, BlockHashes: hashes[:8], Medium: MediumGPU},
	}, HasDPRank: true}
}

func BenchmarkDecode(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArrayMapEvents, EncodingArray} {
		b.Run(enc.String(), func(b *testing.B) {
			batch := prefillBatch()
			payload, err := Encode(nil, &batch, enc)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	batch := prefillBatch()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = Encode(buf[:0], &batch, EncodingMap); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkPublisherBlockStored is the engine's cost per event: a copy
// under a mutex, while the publisher's goroutine batches and sends.
func BenchmarkPublisherBlockStored(b *testing.B) {
	p, err := NewPublisher(PublisherConfig{
		Endpoint:       "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0",
		FlushInterval:  time.Millisecond,
		BufferSteps:    64,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	hashes := []uint64{1}
	tokens := make([]uint32, 16)
	b.ReportAllocs()
	for b.Loop() {
		p.BlockStored(7, true, hashes, tokens, 16, engines.ExtraKeys{})
	}
}

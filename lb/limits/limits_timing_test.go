package limits

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// benchKeys is a set of 1,000 keys with limits high enough that the
// benchmarks measure admission, not refusals.
func benchKeys(b *testing.B) (*Keys, []byte) {
	cfg := make([]APIKey, 1000)
	for i := range cfg {
		cfg[i] = APIKey{Name: strconv.Itoa(i), SHA256: HashKey("sk-" + strconv.Itoa(i)), RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 30, MaxConcurrent: 1 << 20}
	}
	return newTestKeys(b, cfg...), []byte("Bearer sk-500")
}

// BenchmarkLookup is the cost of authenticating one request: hashing a
// bearer token and finding its key.
func BenchmarkLookup(b *testing.B) {
	ks, header := benchKeys(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, d := ks.Lookup(header, nil); !d.OK() {
			b.Fatal(d.Limit)
		}
	}
}

// BenchmarkAdmit is one request's whole limits path: Lookup, Admit, Done.
// The clock moves a millisecond a request, so the buckets refill faster
// than the benchmark drains them however many iterations it runs.
func BenchmarkAdmit(b *testing.B) {
	ks, header := benchKeys(b)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		k, _ := ks.Lookup(header, nil)
		if d := k.Admit(now, 500); !d.OK() {
			b.Fatal(d.Limit)
		}
		k.Done(now, 100)
	}
}

// BenchmarkAdmitParallel is BenchmarkAdmit from every core on one key, the
// worst case for the buckets' compare-and-swap loops. A goroutine
// preempted between reading the shared clock and admitting comes back with
// a time the others moved past, which the buckets may refuse, as they
// would a request whose clock ran backwards: refusals are reported
// (refused/op), not failed, since they cost the same compare-and-swap.
func BenchmarkAdmitParallel(b *testing.B) {
	ks, header := benchKeys(b)
	start := time.Now()
	var ticks, refused atomic.Int64 // one shared clock, so no goroutine runs ahead of the buckets
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := start.Add(time.Duration(ticks.Add(1)) * time.Millisecond)
			k, _ := ks.Lookup(header, nil)
			if d := k.Admit(now, 500); !d.OK() {
				refused.Add(1)
				continue
			}
			k.Done(now, 100)
		}
	})
	b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
}

// BenchmarkRefused is a refusal's cost before its error is rendered.
func BenchmarkRefused(b *testing.B) {
	ks := newTestKeys(b, APIKey{Name: "a", SHA256: HashKey("sk-a"), RequestsPerMinute: 1})
	k, _ := ks.Lookup([]byte("Bearer sk-a"), nil)
	now := time.Now()
	k.Admit(now, 0)
	b.ReportAllocs()
	for b.Loop() {
		if d := k.Admit(now, 0); d.OK() {
			b.Fatal("admitted")
		}
	}
}

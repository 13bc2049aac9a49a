package ledger

import (
	"strconv"
	"sync/atomic"
	"testing"
)

func benchLedger(b *testing.B, pods int) *Ledger {
	b.Helper()
	l := New(DefaultConfig(), Env{})
	names := make([]string, pods)
	for i := range names {
		names[i] = "ns/pod-" + strconv.Itoa(i)
	}
	l.SetPods(members(names...))
	return l
}

// BenchmarkChargeRelease is one prefill charge and its two releases (active
// when the prefill returns, KV when the request finishes) on one goroutine.
// The clock reading is the selection's (the gateway reads it once per
// request anyway), so it is not timed here. Target: ≤ 100 ns/op, 0
// allocs/op.
func BenchmarkChargeRelease(b *testing.B) {
	l := benchLedger(b, 8)
	p := Prompt{Tokens: 2000}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t := Ticket{ID: uint64(i)}
		l.Charge(&t, int32(i&7), -1, &p, int64(i))
		l.PrefillDone(t)
		l.Finish(t)
	}
}

// BenchmarkChargeReleasePD is a whole disaggregated request: prefill and
// decode charged in one call, then the active release and the finish.
func BenchmarkChargeReleasePD(b *testing.B) {
	l := benchLedger(b, 8)
	p := Prompt{Tokens: 2000}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t := Ticket{ID: uint64(i)}
		l.Charge(&t, int32(i&3), int32(4+i&3), &p, int64(i))
		l.PrefillDone(t)
		l.Finish(t)
	}
}

// BenchmarkChargeReleaseParallel runs BenchmarkChargeRelease's loop on
// every P, each goroutine on its own pod and its own request ids; compare
// its ns/op (per operation over all goroutines) with the serial one for the
// throughput gain.
func BenchmarkChargeReleaseParallel(b *testing.B) {
	l := benchLedger(b, 64)
	var next atomic.Int32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		g := next.Add(1) - 1
		pod := g % 64
		p := Prompt{Tokens: 2000}
		id := uint64(g) << 40
		for pb.Next() {
			id++
			t := Ticket{ID: id}
			l.Charge(&t, pod, -1, &p, int64(id))
			l.PrefillDone(t)
			l.Finish(t)
		}
	})
}

// BenchmarkChargeSession adds the session-delta lookup (a key copy and an
// xsync.MapOf update) to the prefill charge.
func BenchmarkChargeSession(b *testing.B) {
	l := benchLedger(b, 8)
	p := Prompt{Tokens: 2000, Model: "m", SessionKey: "chat-42"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t := Ticket{ID: uint64(i)}
		p.Tokens = int64(2000 + i%1000)
		l.Charge(&t, int32(i&7), -1, &p, int64(i))
		l.Finish(t)
	}
}

// BenchmarkDecodeView is what filling one decode candidate costs.
func BenchmarkDecodeView(b *testing.B) {
	l := benchLedger(b, 8)
	p := Prompt{Tokens: 2000}
	for i := range 100 {
		l.Charge(&Ticket{ID: uint64(i)}, -1, int32(i&7), &p, l.Now())
	}
	now := l.Now()
	var sink float64
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t, a := l.Decode(int32(i&7), now)
		sink += t + a
	}
	_ = sink
}

// BenchmarkChargeReleaseOnePod runs BenchmarkChargeRelease's loop on every
// P, all on one pod, as a gateway with more event loops than pods charges:
// every goroutine in one lane (every charge in the pod's shard), then
// each in a lane of its own.
func BenchmarkChargeReleaseOnePod(b *testing.B) {
	for _, lanes := range []string{"one lane", "a lane each"} {
		b.Run(lanes, func(b *testing.B) {
			l := benchLedger(b, 8)
			var next atomic.Int32
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1) - 1
				lane := uint8(0)
				if lanes != "one lane" {
					lane = uint8(g)
				}
				p := Prompt{Tokens: 2000}
				id := uint64(g) << 40
				for pb.Next() {
					id++
					t := Ticket{ID: id, Lane: lane}
					l.Charge(&t, 3, -1, &p, int64(id))
					l.PrefillDone(t)
					l.Finish(t)
				}
			})
		})
	}
}

package admit

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLanesUnderContention: deferrals, withdrawals, retries and
// expiries across lanes from many goroutines keep each lane's count and
// oldest entry those of the ring (removeAt's invariant), checked while
// they run and once they are done.
func TestLanesUnderContention(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Classes[Interactive].MaxWait = 2
	cfg.Classes[Batch].MaxWait = 5
	cfg.DeferQueue = 64
	c, _ := New(cfg)
	lanes := []string{"a", "b", "c", "d"}
	var clock atomic.Int64 // tenths of a second
	now := func() float64 { return float64(clock.Add(1)) / 10 }
	check := func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, l := range c.lanes {
			n, first := 0, Deferred{}
			for i := c.count - 1; i >= 0; i-- {
				if e := c.ring[(c.head+i)%len(c.ring)]; e.Lane == l.first.Lane {
					n, first = n+1, e
				}
			}
			if n != l.n || first != l.first {
				return fmt.Errorf("lane %q: counts %d, oldest %+v; the ring holds %d, oldest %+v", l.first.Lane, l.n, l.first, n, first)
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 2000 {
				id := uint64(g)<<32 | uint64(i)
				class := Class(r.IntN(int(NumClasses)))
				lane := lanes[r.IntN(len(lanes))]
				var v Verdict
				if r.IntN(2) == 0 {
					v = c.Decide(class, lane, id, now(), 1000, 0)
				} else {
					v = c.Judge(class, lane, id, now(), 1000, 0)
				}
				if v.Action != Defer {
					continue
				}
				for range r.IntN(4) {
					c.First(id)
					c.Head()
				}
				switch r.IntN(3) {
				case 0:
					c.Withdraw(id)
				case 1:
					c.Retry(id, now(), 0, 0) // admitted only as its lane's oldest
				} // else left to Expired, or to the drain below
			}
		})
	}
	wg.Go(func() {
		for range 4000 {
			c.Expired(now())
		}
	})
	stop := make(chan struct{})
	var bad atomic.Pointer[error]
	var checker sync.WaitGroup
	checker.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := check(); err != nil {
				bad.Store(&err)
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	checker.Wait()
	if err := bad.Load(); err != nil {
		t.Fatal(*err)
	}
	for {
		d, ok := c.Head()
		if !ok {
			break
		}
		if !c.Withdraw(d.ID) {
			t.Fatalf("the head %+v could not be withdrawn", d)
		}
		if err := check(); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.lanes) != 0 {
		t.Fatalf("lanes %+v left over an empty ring", c.lanes)
	}
}

package kvxfer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	s, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// outcomes records each hold's release.
type outcomes struct {
	mu  sync.Mutex
	got map[string]Outcome
	ch  chan string
}

func newOutcomes() *outcomes { return &outcomes{got: map[string]Outcome{}, ch: make(chan string, 64)} }

func (o *outcomes) hold(handle string, bytes int64, ttl time.Duration) Hold {
	return Hold{Handle: handle, Tokens: int(bytes / 16), Bytes: bytes, TTL: ttl, Released: func(out Outcome) {
		o.mu.Lock()
		o.got[handle] = out
		o.mu.Unlock()
		o.ch <- handle
	}}
}

func (o *outcomes) wait(t *testing.T, handle string, want Outcome) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		o.mu.Lock()
		got, ok := o.got[handle]
		o.mu.Unlock()
		if ok {
			if got != want {
				t.Fatalf("%s released %v, want %v", handle, got, want)
			}
			return
		}
		select {
		case <-o.ch:
		case <-timeout:
			t.Fatalf("%s never released", handle)
		}
	}
}

func TestDescriptorRoundTrip(t *testing.T) {
	f := func(d Descriptor) {
		t.Helper()
		got, err := ParseDescriptor(d.String())
		if err != nil || got != d {
			t.Fatalf("ParseDescriptor(%q) = %+v, %v; want %+v", d.String(), got, err, d)
		}
	}
	f(Descriptor{Addr: "127.0.0.1:7000", Handle: "42", Tokens: 640, Bytes: 81920})
	f(Descriptor{Addr: "[::1]:1", Handle: "room-7/x y", Tokens: 0, Bytes: 0})
	bad := func(s string) {
		t.Helper()
		if d, err := ParseDescriptor(s); err == nil {
			t.Fatalf("ParseDescriptor(%q) = %+v, want an error", s, d)
		}
	}
	bad("http://127.0.0.1:1/x")
	bad("kvxfer://127.0.0.1:1/")
	bad("kvxfer://nohost/x")
	bad("kvxfer://127.0.0.1:1/x?tokens=-1")
	bad("kvxfer://127.0.0.1:1/x?bytes=many")
	bad("%")
}

func TestLinkSec(t *testing.T) {
	l := Link{BytesPerSec: 25e9, LatencySec: 0.0005}
	if got, want := l.Sec(25e9), 1.0005; got != want {
		t.Fatalf("Sec(25e9) = %v, want %v", got, want)
	}
	if got := l.Sec(0); got != 0.0005 {
		t.Fatalf("Sec(0) = %v, want the latency", got)
	}
}

func TestPullMovesBytesAndReleases(t *testing.T) {
	o := newOutcomes()
	s := testServer(t, ServerConfig{})
	const n = 3<<20 + 17 // several chunks and a partial one
	d, err := s.Hold(o.hold("h1", n, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if d.Addr != s.Addr() || d.Handle != "h1" || d.Bytes != n {
		t.Fatalf("descriptor %+v", d)
	}
	if holds, bytes := s.Held(); holds != 1 || bytes != n {
		t.Fatalf("Held = %d, %d", holds, bytes)
	}
	tr, err := TCP{}.Pull(context.Background(), d, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Bytes != n || tr.Elapsed <= 0 {
		t.Fatalf("transfer %+v", tr)
	}
	o.wait(t, "h1", PickedUp)
	if holds, bytes := s.Held(); holds != 0 || bytes != 0 {
		t.Fatalf("after pickup Held = %d, %d", holds, bytes)
	}
	// Picked up once: a second pull finds nothing.
	if _, err := (TCP{}).Pull(context.Background(), d, 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second pull: %v, want ErrNotHeld", err)
	}
}

func TestPaceSetsTransferTime(t *testing.T) {
	const pace = 60 * time.Millisecond
	s := testServer(t, ServerConfig{Pace: func(int64) time.Duration { return pace }})
	for _, n := range []int64{0, 1 << 20} {
		d, err := s.Hold(Hold{Bytes: n, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := TCP{}.Pull(context.Background(), d, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Only a lower bound: the machine may be slow, never fast.
		if tr.Bytes != n || tr.Elapsed < pace {
			t.Fatalf("%d bytes: transfer %+v, want at least %v", n, tr, pace)
		}
	}
}

func TestPullMissingHandle(t *testing.T) {
	s := testServer(t, ServerConfig{})
	_, err := TCP{}.Pull(context.Background(), Descriptor{Addr: s.Addr(), Handle: "nope"}, 0)
	if !errors.Is(err, ErrNotHeld) {
		t.Fatalf("err = %v, want ErrNotHeld", err)
	}
	// Waiting a little does not change that.
	_, err = TCP{}.Pull(context.Background(), Descriptor{Addr: s.Addr(), Handle: "nope"}, 30*time.Millisecond)
	if !errors.Is(err, ErrNotHeld) {
		t.Fatalf("waiting: err = %v, want ErrNotHeld", err)
	}
	if _, err := (TCP{}).Pull(context.Background(), Descriptor{Addr: s.Addr()}, 0); err == nil {
		t.Fatal("empty handle: no error")
	}
}

func TestPullWaitsForHold(t *testing.T) {
	o := newOutcomes()
	s := testServer(t, ServerConfig{})
	type result struct {
		tr  Transfer
		err error
	}
	res := make(chan result, 1)
	go func() {
		tr, err := TCP{}.Pull(context.Background(), Descriptor{Addr: s.Addr(), Handle: "room-9"}, time.Minute)
		res <- result{tr, err}
	}()
	time.Sleep(20 * time.Millisecond) // let the pull arrive first; either order must work
	if _, err := s.Hold(o.hold("room-9", 1000, time.Minute)); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || r.tr.Bytes != 1000 {
		t.Fatalf("pull: %+v, %v", r.tr, r.err)
	}
	o.wait(t, "room-9", PickedUp)
}

func TestHoldExpires(t *testing.T) {
	o := newOutcomes()
	s := testServer(t, ServerConfig{})
	d, err := s.Hold(o.hold("old", 10, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	o.wait(t, "old", Expired)
	if _, err := (TCP{}).Pull(context.Background(), d, 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("pull after expiry: %v", err)
	}
}

func TestHoldRules(t *testing.T) {
	o := newOutcomes()
	s := testServer(t, ServerConfig{})
	if _, err := s.Hold(Hold{Bytes: 1}); err == nil {
		t.Fatal("zero TTL accepted")
	}
	if _, err := s.Hold(o.hold("x", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Hold(Hold{Handle: "x", TTL: time.Minute}); err == nil {
		t.Fatal("duplicate handle accepted")
	}
	if !s.Release("x") || s.Release("x") {
		t.Fatal("Release: want true then false")
	}
	o.wait(t, "x", Dropped)
	a, _ := s.Hold(Hold{TTL: time.Minute})
	b, _ := s.Hold(Hold{TTL: time.Minute})
	if a.Handle == "" || a.Handle == b.Handle {
		t.Fatalf("server-picked handles %q, %q", a.Handle, b.Handle)
	}
}

func TestCloseDropsHolds(t *testing.T) {
	o := newOutcomes()
	s, err := Listen(ServerConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Hold(o.hold("k", 5, time.Minute)); err != nil {
		t.Fatal(err)
	}
	// A waiting pull ends when the server closes.
	res := make(chan error, 1)
	go func() {
		_, err := TCP{}.Pull(context.Background(), Descriptor{Addr: s.Addr(), Handle: "never"}, time.Minute)
		res <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	o.wait(t, "k", Dropped)
	if err := <-res; err == nil {
		t.Fatal("waiting pull succeeded after Close")
	}
	if _, err := s.Hold(Hold{TTL: time.Minute}); err == nil {
		t.Fatal("Hold after Close accepted")
	}
}

func TestPullCancel(t *testing.T) {
	s := testServer(t, ServerConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		_, err := TCP{}.Pull(ctx, Descriptor{Addr: s.Addr(), Handle: "late"}, time.Minute)
		res <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The server noticed the client leave: the KV, held later, stays for
	// another pull.
	o := newOutcomes()
	d, err := s.Hold(o.hold("late", 7, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// It may still be on its way back to the shelf: wait for it.
	if tr, err := (TCP{}).Pull(context.Background(), d, time.Minute); err != nil || tr.Bytes != 7 {
		t.Fatalf("pull after a cancelled one: %+v, %v", tr, err)
	}
	o.wait(t, "late", PickedUp)
}

func TestConcurrentPulls(t *testing.T) {
	o := newOutcomes()
	s := testServer(t, ServerConfig{})
	const pulls = 16
	ds := make([]Descriptor, pulls)
	for i := range ds {
		var err error
		if ds[i], err = s.Hold(Hold{Bytes: int64(i) * 100_003, TTL: time.Minute, Released: func(out Outcome) {
			o.mu.Lock()
			o.got[string(rune('a'+i))] = out
			o.mu.Unlock()
		}}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, pulls)
	for i, d := range ds {
		wg.Go(func() {
			tr, err := TCP{}.Pull(context.Background(), d, 0)
			if err == nil && tr.Bytes != d.Bytes {
				err = errors.New("short transfer")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if holds, _ := s.Held(); holds != 0 {
		t.Fatalf("%d holds left", holds)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.got) != pulls {
		t.Fatalf("%d releases, want %d", len(o.got), pulls)
	}
}

func TestPullUnreachable(t *testing.T) {
	s, err := Listen(ServerConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	_ = s.Close()
	if _, err := (TCP{DialTimeout: time.Second}).Pull(context.Background(), Descriptor{Addr: addr, Handle: "x"}, 0); err == nil || errors.Is(err, ErrNotHeld) {
		t.Fatalf("err = %v, want a dial error", err)
	}
}

package limits

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestHostCache: the first dial of a name waits for its lookup; later
// ones take the answer at once, and one past the refresh age looks the
// name up again behind the dial; a lookup that fails keeps the last good
// answer, and addresses are never looked up.
func TestHostCache(t *testing.T) {
	var mu sync.Mutex
	answer := []netip.Addr{netip.MustParseAddr("10.0.0.5")}
	var fail bool
	lookups := make(chan string, 16)
	h := newHostCache(50*time.Millisecond, func(_ context.Context, host string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		lookups <- host
		if fail {
			return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
		}
		return answer, nil
	})
	got := func(want string) {
		t.Helper()
		addrs, err := h.addrs("vllm-0.vllm", time.Second)
		if err != nil || len(addrs) != 1 || addrs[0].String() != want {
			t.Fatalf("addrs: %v %v, want %s", addrs, err, want)
		}
	}
	looked := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			select {
			case <-lookups:
			case <-time.After(5 * time.Second):
				t.Fatalf("lookup %d of %d did not happen", i+1, n)
			}
		}
		select {
		case host := <-lookups:
			t.Fatalf("one lookup too many (%s)", host)
		case <-time.After(20 * time.Millisecond):
		}
	}
	set := func(f func()) { mu.Lock(); f(); mu.Unlock() }

	got("10.0.0.5")
	got("10.0.0.5")
	looked(1)

	// Past the refresh age: the dial has the old answer, the new one is
	// there for the next.
	set(func() { answer = []netip.Addr{netip.MustParseAddr("10.0.0.6")} })
	time.Sleep(60 * time.Millisecond)
	got("10.0.0.5")
	looked(1)
	got("10.0.0.6")

	// The resolver fails: dials go on to the last answer.
	set(func() { fail = true })
	time.Sleep(60 * time.Millisecond)
	got("10.0.0.6")
	looked(1)
	got("10.0.0.6")

	// An address is no name; a name never resolved fails the dial.
	if addrs, err := h.addrs("::1", time.Second); err != nil || len(addrs) != 1 || !addrs[0].IsLoopback() {
		t.Fatalf("an address: %v %v", addrs, err)
	}
	var dnsErr *net.DNSError
	if _, err := h.addrs("vllm-1.vllm", time.Second); !errors.As(err, &dnsErr) {
		t.Fatalf("a name that does not resolve: %v", err)
	}
	looked(1)
}

// TestDialByName: pods dialed by host name go through the cache, each of
// the name's addresses tried in turn ("localhost" may be ::1 first, and
// the pod listens on 127.0.0.1 only).
func TestDialByName(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	var f *FDs
	c, err := f.Dial(net.JoinHostPort("localhost", port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := f.Dial("localhost", time.Second); err == nil {
		t.Fatal("an address without a port dialed")
	}
}

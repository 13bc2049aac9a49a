package limits

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"
)

// hostRefresh is how often a pod's host name is looked up again while
// the gateway dials it (Envoy's dns_refresh_rate default).
const hostRefresh = 5 * time.Second

// hostCache keeps the addresses pod host names resolved to. A pod dialed
// by name (a StatefulSet's vllm-0.vllm:8000) would otherwise wait on the
// resolver at every new connection, several queries each under
// Kubernetes' ndots:5, and a resolver's hiccup would fail the dials,
// count them against healthy pods and eject them. A dial takes the last
// good answer; one older than hostRefresh is looked up again behind it,
// and a failed lookup keeps what was there. Only the first dial of a name
// waits for its lookup.
type hostCache struct {
	lookup  func(ctx context.Context, host string) ([]netip.Addr, error)
	refresh time.Duration // hostRefresh; shorter in tests

	mu sync.Mutex
	m  map[string]*hostEntry
}

type hostEntry struct {
	addrs      []netip.Addr
	at         time.Time // of the last lookup, answered or not
	refreshing bool
}

// podHosts serves every pod dial of the process (DialThen).
var podHosts = newHostCache(hostRefresh, func(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
})

func newHostCache(refresh time.Duration, lookup func(context.Context, string) ([]netip.Addr, error)) *hostCache {
	return &hostCache{lookup: lookup, refresh: refresh, m: make(map[string]*hostEntry)}
}

// addrs returns what host resolves to: itself when it is an address; the
// first lookup's answer within timeout; later, the last good answer at
// once.
func (h *hostCache) addrs(host string, timeout time.Duration) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	h.mu.Lock()
	if e := h.m[host]; e != nil {
		if time.Since(e.at) >= h.refresh && !e.refreshing {
			e.refreshing = true
			go h.lookupAgain(host, e, timeout)
		}
		addrs := e.addrs
		h.mu.Unlock()
		return addrs, nil
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addrs, err := h.lookup(ctx, host)
	if err == nil && len(addrs) == 0 {
		err = &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.m[host] == nil {
		h.m[host] = &hostEntry{addrs: addrs, at: time.Now()}
	}
	h.mu.Unlock()
	return addrs, nil
}

func (h *hostCache) lookupAgain(host string, e *hostEntry, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addrs, err := h.lookup(ctx, host)
	h.mu.Lock()
	defer h.mu.Unlock()
	e.refreshing, e.at = false, time.Now()
	if err == nil && len(addrs) > 0 {
		e.addrs = addrs
	}
}

// Package kvxfer moves a request's KV cache from the pod that computed it (a
// prefill pod) to the pod that continues it (a decode pod).
//
// A source pod holds KV under a handle and describes it with a Descriptor;
// engines carry that descriptor in their own fields (vLLM's
// kv_transfer_params, SGLang's bootstrap room, TensorRT-LLM's
// encoded_opaque_state) and the destination pod pulls it through a
// Transport. TCP is the transport here: it moves real bytes between
// simulated pods over loopback or a LAN, so transfer times are measured, not
// assumed; an RDMA or NIXL transport would implement the same interface.
// Link is the bandwidth/latency model planners and simulators use for the
// same transfers.
package kvxfer

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
)

// Descriptor names KV held on a source pod for pickup. It is engine-neutral:
// the gateway never reads it, only copies the engine's fields that carry it.
type Descriptor struct {
	// Addr is the host:port of the source's transfer server.
	Addr string
	// Handle identifies the held KV on that server (a room, a request id).
	Handle string
	// Tokens is the number of prompt tokens whose KV is held.
	Tokens int
	// Bytes is what the transport moves for them (after any scaling the
	// source applies); the server reports the authoritative length.
	Bytes int64
}

const scheme = "kvxfer"

var errDescriptor = errors.New("kvxfer: invalid descriptor")

// String encodes d as kvxfer://host:port/handle?tokens=N&bytes=M, the form
// engines put in opaque fields.
func (d Descriptor) String() string {
	q := url.Values{}
	q.Set("tokens", strconv.Itoa(d.Tokens))
	q.Set("bytes", strconv.FormatInt(d.Bytes, 10))
	u := url.URL{Scheme: scheme, Host: d.Addr, Path: "/" + d.Handle, RawQuery: q.Encode()}
	return u.String()
}

// ParseDescriptor decodes what String encodes.
func ParseDescriptor(s string) (Descriptor, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Descriptor{}, fmt.Errorf("%w: %q: %w", errDescriptor, s, err)
	}
	if u.Scheme != scheme || len(u.Path) < 2 {
		return Descriptor{}, fmt.Errorf("%w: %q is not kvxfer://host:port/handle", errDescriptor, s)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return Descriptor{}, fmt.Errorf("%w: %q: %w", errDescriptor, s, err)
	}
	d := Descriptor{Addr: u.Host, Handle: u.Path[1:]}
	q := u.Query()
	if v := q.Get("tokens"); v != "" {
		if d.Tokens, err = strconv.Atoi(v); err != nil || d.Tokens < 0 {
			return Descriptor{}, fmt.Errorf("%w: %q: tokens = %q", errDescriptor, s, v)
		}
	}
	if v := q.Get("bytes"); v != "" {
		if d.Bytes, err = strconv.ParseInt(v, 10, 64); err != nil || d.Bytes < 0 {
			return Descriptor{}, fmt.Errorf("%w: %q: bytes = %q", errDescriptor, s, v)
		}
	}
	return d, nil
}

// Package sglang holds SGLang's prefill/decode exchange.
package sglang

import (
	"math/rand/v2"
	"strconv"

	"pdlb/engines"
)

// PD is SGLang's prefill/decode exchange: one body, the client's plus
// bootstrap_host and bootstrap_port (where the decode pod fetches the KV
// from the prefill pod) and bootstrap_room (the number both pods meet
// under), goes to both pods at once; the decode pod's response is the
// answer and the prefill pod's is drained. Both legs carry rid, the
// gateway's request id, so a stuck decode request can be dropped with
// POST /abort_request {"rid": ...}.
type PD struct{}

// AbortPath is SGLang's abort endpoint.
const AbortPath = "/abort_request"

// Kind implements engines.Protocol.
func (PD) Kind() engines.Kind { return engines.SGLang }

// Concurrent implements engines.Protocol.
func (PD) Concurrent() bool { return true }

// Begin implements engines.Protocol: draws the bootstrap room, a random
// non-negative int63 (rand/v2's generator is per-goroutine-safe and
// lock-free).
func (PD) Begin(x *engines.Exchange) { x.ID = rand.Int64() }

// PrefillInfoPath implements engines.Protocol.
func (PD) PrefillInfoPath() string { return "" }

// PrefillBody implements engines.Protocol.
func (PD) PrefillBody(dst, orig []byte, x *engines.Exchange) ([]byte, error) {
	port := x.BootstrapPort
	if port == 0 {
		port = engines.DefaultBootstrapPort
	}
	// One small stack buffer holds the four values.
	var buf [256]byte
	b := engines.AppendJSONString(buf[:0], x.PrefillHost)
	host := len(b)
	b = strconv.AppendInt(b, int64(port), 10)
	portEnd := len(b)
	b = strconv.AppendInt(b, x.ID, 10)
	room := len(b)
	b = engines.AppendJSONString(b, x.RequestID)
	edits := [4]engines.Edit{
		{Key: "bootstrap_host", Value: b[:host]},
		{Key: "bootstrap_port", Value: b[host:portEnd]},
		{Key: "bootstrap_room", Value: b[portEnd:room]},
		{Key: "rid", Value: b[room:]},
	}
	n := len(edits)
	if x.RequestID == "" {
		n-- // keep the client's rid, if any
	}
	return engines.EditObject(dst, orig, edits[:n]...)
}

// PrefillAnswers implements engines.Protocol.
func (PD) PrefillAnswers([]byte) bool { return false }

// DecodeBody implements engines.Protocol: the same body as the prefill leg.
func (p PD) DecodeBody(dst, orig, _ []byte, x *engines.Exchange) ([]byte, error) {
	return p.PrefillBody(dst, orig, x)
}

// Abort implements engines.Protocol. Without a request id it falls back to
// closing the connection: SGLang matches rid as a prefix, so an empty one
// would abort every request on the pod.
func (PD) Abort(dst []byte, x *engines.Exchange) (string, []byte) {
	if x.RequestID == "" {
		return "", nil
	}
	dst = append(dst, `{"rid":`...)
	dst = engines.AppendJSONString(dst, x.RequestID)
	return AbortPath, append(dst, '}')
}

var _ engines.Protocol = PD{}

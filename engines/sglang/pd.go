// Package sglang holds SGLang's prefill/decode exchange.
package sglang

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"

	"pdlb/engines"
)

// PD is SGLang's prefill/decode exchange: one body, the client's plus
// bootstrap_host and bootstrap_port (where the decode pod fetches the KV
// from the prefill pod) and bootstrap_room (the number both pods meet
// under), goes to both pods at once; the decode pod's response is the
// answer and the prefill pod's is drained. A completion batch takes the
// three as lists of one per prompt, as SGLang's router sends them
// (inject_bootstrap_into_value in sgl-model-gateway's
// src/routers/http/pd_router.rs): SGLang runs each prompt as a request of
// its own under its own room. Both legs carry rid, the gateway's request
// id and the room (appendRID), so a stuck decode request can be dropped
// with POST /abort_request {"rid": ...}.
type PD struct{}

// AbortPath is SGLang's abort endpoint.
const AbortPath = "/abort_request"

// Kind implements engines.Protocol.
func (PD) Kind() engines.Kind { return engines.SGLang }

// Concurrent implements engines.Protocol.
func (PD) Concurrent() bool { return true }

// AwaitsPrefill implements engines.Protocol: SGLang's router relays the
// decode stream as it comes, reading the prefill leg's body only to merge
// logprobs (sgl-model-gateway's src/routers/http/pd_router.rs).
func (PD) AwaitsPrefill() bool { return false }

// Begin implements engines.Protocol: draws the bootstrap room, a random
// non-negative int63 (rand/v2's generator is per-goroutine-safe and
// lock-free); a batch's prompts take it and the rooms after it, which
// stay int63s. With a prefill rank chosen, the room moves to the value
// ≡ the rank modulo the prefill pod's ranks in its run of that many: the
// prefill side runs the leg on rank room % ranks (the DataParallel-
// Controller's follow_bootstrap_room, a prefill server's default) and the
// decode side fetches the KV from that rank (target_dp_group in the KV
// receivers of sglang/srt/disaggregation).
func (PD) Begin(x *engines.Exchange) {
	limit := math.MaxInt64 - int64(max(x.Batch, 1)) + 1
	x.ID = rand.Int64N(limit)
	if x.PrefillRanks > 1 {
		x.ID = roomOnRank(x.ID, limit, int64(x.PrefillRank), int64(x.PrefillRanks))
	}
}

// roomOnRank is the room ≡ rank (mod n) in room's run of n values, or in
// the run before it where that value is not below limit (room < limit,
// 0 <= rank < n, n <= limit).
func roomOnRank(room, limit, rank, n int64) int64 {
	run := room - room%n
	if run >= limit-rank {
		run -= n
	}
	return run + rank
}

// PrefillInfoPath implements engines.Protocol.
func (PD) PrefillInfoPath() string { return "" }

// PrefillBody implements engines.Protocol.
func (PD) PrefillBody(dst, orig []byte, x *engines.Exchange) ([]byte, error) {
	port := x.BootstrapPort
	if port == 0 {
		port = engines.DefaultBootstrapPort
	}
	n := max(x.Batch, 1)
	// One stack buffer holds the four values, unless a batch's lists
	// outgrow it.
	var buf [512]byte
	b := appendValues(buf[:0], n, func(b []byte, _ int) []byte { return engines.AppendJSONString(b, x.PrefillHost) })
	host := len(b)
	b = appendValues(b, n, func(b []byte, _ int) []byte { return strconv.AppendInt(b, int64(port), 10) })
	portEnd := len(b)
	b = appendValues(b, n, func(b []byte, i int) []byte { return strconv.AppendInt(b, x.ID+int64(i), 10) })
	room := len(b)
	b = appendRID(b, x)
	edits := [4]engines.Edit{
		{Key: "bootstrap_host", Value: b[:host]},
		{Key: "bootstrap_port", Value: b[host:portEnd]},
		{Key: "bootstrap_room", Value: b[portEnd:room]},
		{Key: "rid", Value: b[room:]},
	}
	k := len(edits)
	if x.RequestID == "" {
		k-- // keep the client's rid, if any
	}
	return engines.EditObject(dst, orig, edits[:k]...)
}

// appendValues appends the value v makes for prompt 0 of n, or a list of
// the values of all n.
func appendValues(b []byte, n int, v func(b []byte, i int) []byte) []byte {
	if n == 1 {
		return v(b, 0)
	}
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = v(b, i)
	}
	return append(b, ']')
}

// PrefillAnswers implements engines.Protocol.
func (PD) PrefillAnswers([]byte) bool { return false }

// DecodeBody implements engines.Protocol: the same body as the prefill leg.
func (p PD) DecodeBody(dst, orig, _ []byte, x *engines.Exchange) ([]byte, error) {
	return p.PrefillBody(dst, orig, x)
}

// Abort implements engines.Protocol. Without a request id it falls back to
// closing the connection: SGLang matches rid as a prefix, so an empty one
// would abort every request on the pod. So it does for a batch, whose
// prompts SGLang runs under rid_0, rid_1, ...: its tokenizer manager
// passes an abort on only for a rid it holds as named
// (TokenizerManager.abort_request), which the batch's own rid is not.
func (PD) Abort(dst []byte, x *engines.Exchange) (string, []byte) {
	if x.RequestID == "" || x.Batch > 1 {
		return "", nil
	}
	dst = append(dst, `{"rid":`...)
	dst = appendRID(dst, x)
	return AbortPath, append(dst, '}')
}

// appendRID appends, as a JSON string, the rid the exchange's legs carry:
// the request id, then its room in 16 hex digits. SGLang's scheduler
// aborts every request whose rid starts with the one /abort_request names,
// and request ids alone are not prefix-free (a client's job-1 and job-10,
// or the gateway's own ids of one connection): with the room, whose
// digits are as many for all and drawn at random, one abort matches its
// own request only.
func appendRID(b []byte, x *engines.Exchange) []byte {
	b = engines.AppendJSONString(b, x.RequestID)
	// Neither '-' nor a hex digit is escaped: in before the closing quote.
	return fmt.Appendf(b[:len(b)-1], "-%016x\"", uint64(x.ID))
}

var _ engines.Protocol = PD{}

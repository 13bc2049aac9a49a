package vllm

import (
	"fmt"

	"pdlb/engines"
)

// PD is vLLM's prefill/decode exchange over a NIXL-style KV connector, as
// vLLM's disaggregated proxy drives it: the prefill leg asks the prefill
// pod to compute the prompt's KV, produce one token and keep the KV for a
// remote decode; its response carries kv_transfer_params (the pod's engine
// id, block ids, host and port) that the decode leg hands to the decode
// pod, which pulls the KV and generates. The legs are sequential; vLLM
// cancels a request whose connection closes, so closing is the abort.
type PD struct{}

// prefillKVParams asks the prefill pod to hold the KV for a remote decode.
const prefillKVParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// Kind implements engines.Protocol.
func (PD) Kind() engines.Kind { return engines.VLLM }

// Concurrent implements engines.Protocol: the decode leg needs the prefill
// response's kv_transfer_params.
func (PD) Concurrent() bool { return false }

// AwaitsPrefill implements engines.Protocol; vLLM's exchange is
// sequential.
func (PD) AwaitsPrefill() bool { return false }

// Begin implements engines.Protocol; vLLM needs no exchange id.
func (PD) Begin(*engines.Exchange) {}

// PrefillInfoPath implements engines.Protocol.
func (PD) PrefillInfoPath() string { return "" }

// PrefillBody implements engines.Protocol: the client's body with
// kv_transfer_params for a remote decode, stream false and max_tokens 1
// (max_completion_tokens 1 where the client set it), without
// stream_options (invalid without stream), min_tokens (vLLM rejects
// min_tokens above max_tokens) and a Messages request's enabled thinking.
func (PD) PrefillBody(dst, orig []byte, _ *engines.Exchange) ([]byte, error) {
	edits := [...]engines.Edit{
		{Key: "kv_transfer_params", Value: []byte(prefillKVParams)},
		{Key: "stream", Value: []byte("false")},
		{Key: "max_tokens", Value: []byte("1")},
		{Key: "max_completion_tokens", Value: []byte("1"), IfPresent: true},
		{Key: "stream_options"},
		{Key: "min_tokens"},
		// A Messages request's enabled thinking: newer releases refuse a
		// budget_tokens not under max_tokens, which 1 would make every
		// budget; the budget bounds generation alone, which the prefill
		// leg does not do. (Thinking disabled, which shapes the prompt,
		// stays.)
		{Key: "thinking"},
	}
	n := len(edits)
	if !thinkingEnabled(orig) {
		n--
	}
	return engines.EditObject(dst, orig, edits[:n]...)
}

// thinkingEnabled reports whether body (a Messages request) asks for
// thinking with a budget: {"thinking": {"type": "enabled", ...}}.
func thinkingEnabled(body []byte) bool {
	thinking, ok, err := engines.Field(body, "thinking")
	if err != nil || !ok || len(thinking) == 0 || thinking[0] != '{' {
		return false
	}
	typ, ok, err := engines.Field(thinking, "type")
	return err == nil && ok && string(typ) == `"enabled"`
}

// PrefillAnswers implements engines.Protocol: a vLLM prefill never answers
// the request itself.
func (PD) PrefillAnswers([]byte) bool { return false }

// DecodeBody implements engines.Protocol: the client's body plus the
// prefill response's kv_transfer_params, an object; or, where they are
// null, without any, as vLLM's proxy sends it: the prefill's one token
// ended its answer (EOS, a stop), and vLLM's KV connectors hand over the
// KV of a length-capped prefill only, so the decode pod prefills itself.
func (PD) DecodeBody(dst, orig, prefillResp []byte, _ *engines.Exchange) ([]byte, error) {
	kv, ok, err := engines.Field(prefillResp, "kv_transfer_params")
	if err == nil && ok && string(kv) == "null" {
		kv = nil
	} else if err != nil || !ok || len(kv) == 0 || kv[0] != '{' {
		return dst, fmt.Errorf("%w: no kv_transfer_params object", engines.ErrPrefillResponse)
	}
	return engines.EditObject(dst, orig, engines.Edit{Key: "kv_transfer_params", Value: kv})
}

// Abort implements engines.Protocol: closing the connection aborts.
func (PD) Abort([]byte, *engines.Exchange) (string, []byte) { return "", nil }

var _ engines.Protocol = PD{}

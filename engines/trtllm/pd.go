// Package trtllm holds TensorRT-LLM's prefill/decode exchange (the
// "context" and "generation" legs of trtllm-serve's OpenAI disaggregation
// protocol).
package trtllm

import (
	"bytes"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"pdlb/engines"
)

// Style is the dispatch mode (AIBrix's AIBRIX_TRT_SCHEDULE_STYLE).
type Style uint8

const (
	// ContextFirst sends the context leg, waits for its response, and sends
	// the generation leg with the returned disaggregated_params and
	// prompt_token_ids.
	ContextFirst Style = iota
	// GenerationFirst sends both legs at once with a shared
	// disagg_request_id and schedule_style 1; the generation leg carries
	// the context pod's transceiver endpoint from its /server_info. It
	// needs the Python KV-cache transceiver on both roles and identical
	// tokenizers (the generation pod tokenizes the prompt itself).
	GenerationFirst
)

// ParseStyle reads "context_first" or "generation_first".
func ParseStyle(s string) (Style, error) {
	switch s {
	case "context_first":
		return ContextFirst, nil
	case "generation_first":
		return GenerationFirst, nil
	}
	return 0, fmt.Errorf("trtllm: unknown schedule style %q (known: context_first, generation_first)", s)
}

// ServerInfoPath is where a context pod publishes its generation-first
// metadata.
const ServerInfoPath = "/server_info"

// PD is TensorRT-LLM's exchange in one style. Build it with NewPD.
type PD struct {
	style Style
	ids   *IDs
}

// NewPD returns the exchange for style, drawing disagg_request_ids with
// machine id machineID (0 ≤ machineID < 1024; distinct per gateway process
// sharing TRT workers).
func NewPD(style Style, machineID int) (*PD, error) {
	ids, err := NewIDs(machineID, time.Now)
	if err != nil {
		return nil, err
	}
	return &PD{style: style, ids: ids}, nil
}

// Kind implements engines.Protocol.
func (*PD) Kind() engines.Kind { return engines.TRTLLM }

// Concurrent implements engines.Protocol.
func (p *PD) Concurrent() bool { return p.style == GenerationFirst }

// AwaitsPrefill implements engines.Protocol: trtllm-serve's disaggregated
// server gathers both legs of a generation_first request before it
// returns the generation stream (openai_disagg_service.py,
// _send_disagg_request_gen_first).
func (p *PD) AwaitsPrefill() bool { return p.style == GenerationFirst }

// Begin implements engines.Protocol: draws the disagg_request_id.
func (p *PD) Begin(x *engines.Exchange) { x.ID = p.ids.Next() }

// PrefillInfoPath implements engines.Protocol.
func (p *PD) PrefillInfoPath() string {
	if p.style == GenerationFirst {
		return ServerInfoPath
	}
	return ""
}

// PrefillBody implements engines.Protocol: the client's body with
// disaggregated_params {request_type: "context_only", disagg_request_id}
// (and schedule_style 1 in generation_first), stream false and no
// stream_options. The context pod itself limits the leg to one token.
func (p *PD) PrefillBody(dst, orig []byte, x *engines.Exchange) ([]byte, error) {
	var buf [128]byte
	b := append(buf[:0], `{"request_type":"context_only","disagg_request_id":`...)
	b = strconv.AppendInt(b, x.ID, 10)
	if p.style == GenerationFirst {
		b = append(b, `,"schedule_style":1`...)
	}
	b = append(b, '}')
	return engines.EditObject(dst, orig,
		engines.Edit{Key: "disaggregated_params", Value: b},
		engines.Edit{Key: "stream", Value: []byte("false")},
		engines.Edit{Key: "stream_options"},
	)
}

// PrefillAnswers implements engines.Protocol: a context response whose
// only choice finished for a reason other than "length" or "not_finished"
// (a stop token at the first position) is the whole answer.
func (p *PD) PrefillAnswers(prefillResp []byte) bool {
	if p.style == GenerationFirst {
		return false
	}
	choice, ok := firstChoice(prefillResp)
	if !ok {
		return false
	}
	reason, ok, _ := engines.Field(choice, "finish_reason")
	return ok && !bytes.Equal(reason, []byte(`"length"`)) && !bytes.Equal(reason, []byte(`"not_finished"`)) && !bytes.Equal(reason, []byte("null"))
}

func firstChoice(resp []byte) ([]byte, bool) {
	choices, ok, err := engines.Field(resp, "choices")
	if err != nil || !ok {
		return nil, false
	}
	return engines.FirstElement(choices)
}

// DecodeBody implements engines.Protocol.
//
// context_first: the client's body with the context response's
// choices[0].disaggregated_params, request_type set to "generation_only",
// and the context pod's prompt_token_ids (as prompt_token_ids for chat, as
// the prompt for completions) so both pods see the same tokens.
//
// generation_first: the client's body with disaggregated_params
// {request_type: "generation_only", disagg_request_id, schedule_style 1}
// plus the members of the context pod's /server_info
// disaggregated_params (its transceiver endpoint and rank).
func (p *PD) DecodeBody(dst, orig, prefillResp []byte, x *engines.Exchange) ([]byte, error) {
	if p.style == GenerationFirst {
		return p.generationFirstBody(dst, orig, x)
	}
	choice, ok := firstChoice(prefillResp)
	if !ok {
		return dst, fmt.Errorf("%w: no choices", engines.ErrPrefillResponse)
	}
	params, ok, _ := engines.Field(choice, "disaggregated_params")
	if !ok || params[0] != '{' {
		return dst, fmt.Errorf("%w: no choices[0].disaggregated_params object", engines.ErrPrefillResponse)
	}
	// Build the edited params at the end of dst, the body after them, then
	// move the body down over the params: one buffer, no allocation.
	base := len(dst)
	dst, err := engines.EditObject(dst, params, engines.Edit{Key: "request_type", Value: []byte(`"generation_only"`)})
	if err != nil {
		return dst[:base], err
	}
	mid := len(dst)
	edits := [2]engines.Edit{{Key: "disaggregated_params", Value: dst[base:mid]}}
	n := 1
	if ids, ok, _ := engines.Field(prefillResp, "prompt_token_ids"); ok && ids[0] == '[' {
		key := "prompt"
		if x.Chat {
			key = "prompt_token_ids"
		}
		edits[1], n = engines.Edit{Key: key, Value: ids}, 2
	}
	dst, err = engines.EditObject(dst, orig, edits[:n]...)
	if err != nil {
		return dst[:base], err
	}
	// edits[0].Value aliases dst[base:mid]; if EditObject grew dst, the
	// old array held the params and the new one holds them too (append
	// copies), so the body it wrote is right either way.
	return append(dst[:base], dst[mid:]...), nil
}

func (p *PD) generationFirstBody(dst, orig []byte, x *engines.Exchange) ([]byte, error) {
	info, ok, err := engines.Field(x.PrefillInfo, "disaggregated_params")
	inner := bytes.TrimSpace(info)
	if err != nil || !ok || len(inner) < 2 || inner[0] != '{' {
		return dst, fmt.Errorf("%w: the context pod's %s has no disaggregated_params object", engines.ErrPrefillResponse, ServerInfoPath)
	}
	inner = bytes.TrimSpace(inner[1 : len(inner)-1])
	if len(inner) == 0 {
		// A context pod with the C++ transceiver answers an empty object:
		// it cannot serve generation_first.
		return dst, fmt.Errorf("%w: the context pod's %s disaggregated_params is empty", engines.ErrPrefillResponse, ServerInfoPath)
	}
	var buf [256]byte
	b := append(buf[:0], `{"request_type":"generation_only","disagg_request_id":`...)
	b = strconv.AppendInt(b, x.ID, 10)
	b = append(b, `,"schedule_style":1,`...)
	b = append(b, inner...)
	b = append(b, '}')
	return engines.EditObject(dst, orig, engines.Edit{Key: "disaggregated_params", Value: b})
}

// Abort implements engines.Protocol: TRT-LLM cancels on disconnect.
func (*PD) Abort([]byte, *engines.Exchange) (string, []byte) { return "", nil }

// IDs draws Snowflake-style disagg_request_ids, unique across the gateway
// processes that share TRT workers as long as their machine ids differ:
//
//	[41 bits: ms since 2023-01-01][10 bits: machine id][12 bits: counter]
//
// Ids are at least 2^42, which TRT-LLM's executor reads as global
// (cross-worker) ids; the counter wraps after 4096 ids in one millisecond.
// Next is safe for concurrent use and lock-free.
type IDs struct {
	machine int64
	counter atomic.Int64
	now     func() time.Time
}

// Snowflake layout constants.
const (
	idCounterBits = 12
	idMachineBits = 10
	idTimeBits    = 41
	minGlobalID   = int64(1) << 42
)

// idEpoch is 2023-01-01T00:00:00Z, so the 41-bit time field lasts to 2092.
var idEpoch = time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC)

// NewIDs returns a generator for machineID, reading the clock with now.
func NewIDs(machineID int, now func() time.Time) (*IDs, error) {
	if machineID < 0 || machineID >= 1<<idMachineBits {
		return nil, fmt.Errorf("trtllm: machine id %d is not in [0, %d)", machineID, 1<<idMachineBits)
	}
	return &IDs{machine: int64(machineID), now: now}, nil
}

// Next returns a new id.
func (g *IDs) Next() int64 {
	ms := max(g.now().Sub(idEpoch).Milliseconds(), 0) & (1<<idTimeBits - 1)
	c := g.counter.Add(1) & (1<<idCounterBits - 1)
	id := ms<<(idMachineBits+idCounterBits) | g.machine<<idCounterBits | c
	if id < minGlobalID {
		// Only in the first ~17 minutes after the epoch (or with a clock
		// before it): lift into the global range.
		id |= minGlobalID
	}
	return id
}

var _ engines.Protocol = (*PD)(nil)

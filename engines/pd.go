package engines

import (
	"encoding/json"
	"errors"

	"github.com/bytedance/sonic"
)

// Protocol shapes the prefill/decode exchange of one engine: the bodies of
// the two legs, whether they go out together, and how to abort. The
// gateway drives every engine through it, so no engine field name appears
// in lb/. Implementations: vllm.PD, sglang.PD, trtllm.PD.
//
// Bodies are rewritten by splicing bytes: the client's other fields reach
// the pods byte for byte, and a rewrite costs one copy of the body into dst
// (caller-owned, appended to, so a pooled buffer makes it allocation-free).
// Implementations are safe for concurrent use.
type Protocol interface {
	// Kind names the engine.
	Kind() Kind
	// Concurrent says whether both legs go out at once (SGLang, TRT-LLM
	// generation_first); otherwise the decode leg waits for the prefill
	// response (vLLM, TRT-LLM context_first), and DecodeBody needs it.
	Concurrent() bool
	// AwaitsPrefill says the engine's own disaggregated server relays a
	// concurrent exchange's decode stream only once the prefill leg
	// answered (TensorRT-LLM generation_first), not as it comes
	// (SGLang's router).
	AwaitsPrefill() bool
	// Begin fills the exchange's engine-drawn values (x.ID) before either
	// body is built.
	Begin(x *Exchange)
	// PrefillInfoPath is a path to GET on the prefill pod before the
	// exchange, whose answer goes in x.PrefillInfo; "" when none is needed.
	PrefillInfoPath() string
	// PrefillBody appends the prefill leg's body for the client's body orig.
	PrefillBody(dst, orig []byte, x *Exchange) ([]byte, error)
	// PrefillAnswers says the prefill response already answers the request
	// (TRT-LLM: it finished at its first token), so the gateway returns it
	// instead of sending the decode leg.
	PrefillAnswers(prefillResp []byte) bool
	// DecodeBody appends the decode leg's body. prefillResp is the prefill
	// leg's whole response body, nil when Concurrent.
	DecodeBody(dst, orig, prefillResp []byte, x *Exchange) ([]byte, error)
	// Abort returns the path and body to POST on the decode pod to drop the
	// exchange's decode request; path "" means closing the connection is
	// the abort (the engine cancels on disconnect).
	Abort(dst []byte, x *Exchange) (path string, body []byte)
}

// Exchange is one request's PD exchange as the protocol needs it. The
// caller owns it (a pooled per-request object).
type Exchange struct {
	// RequestID is the gateway's id of the request (X-Request-Id).
	RequestID string
	// Chat says the request is /v1/chat/completions (else /v1/completions).
	Chat bool
	// Batch is the number of prompts of a completion batch (0 or 1: one
	// prompt); only a protocol whose Kind.ExchangesBatch gets more.
	Batch int
	// PrefillHost is the prefill pod's host, without port.
	PrefillHost string
	// BootstrapPort is the prefill pod's KV bootstrap port (SGLang; 0 means
	// DefaultBootstrapPort).
	BootstrapPort int
	// ID is the exchange's engine-level id, drawn by Begin: SGLang's
	// bootstrap_room, TRT-LLM's disagg_request_id.
	ID int64
	// PrefillRank is the data-parallel rank, of the prefill pod's
	// PrefillRanks, that the prompt is to be prefilled on, for an engine
	// that picks the rank by ID (SGLang: bootstrap_room % ranks); 0 ranks:
	// none chosen. vLLM's prefill leg names its rank in a header instead.
	PrefillRank, PrefillRanks int
	// PrefillInfo is the body the prefill pod answered PrefillInfoPath
	// with (TRT-LLM generation_first: its /server_info).
	PrefillInfo []byte
}

// PDOptions are the engine-specific settings of PD exchanges, as a
// profile's PD options carry them (validated there).
type PDOptions struct {
	// TRTMachineID is the machine id in TensorRT-LLM disagg_request_ids,
	// in [0, TRTMachineIDLimit); gateways sharing TRT workers need
	// distinct ones.
	TRTMachineID int `yaml:"trt_machine_id"`
	// TRTScheduleStyle is TRTContextFirst or TRTGenerationFirst.
	TRTScheduleStyle string `yaml:"trt_schedule_style"`
}

// TRTMachineIDLimit is the exclusive bound of PDOptions.TRTMachineID (a
// 10-bit field of the id).
const TRTMachineIDLimit = 1 << 10

// TensorRT-LLM's schedule styles (PDOptions.TRTScheduleStyle).
const (
	TRTContextFirst    = "context_first"
	TRTGenerationFirst = "generation_first"
)

// DefaultBootstrapPort is SGLang's bootstrap port when a pod declares none
// (AIBrix's model.aibrix.ai/sglang-bootstrap-port label, default 8998).
const DefaultBootstrapPort = 8998

// Errors of body rewriting.
var (
	ErrNotObject = errors.New("engines: body is not a JSON object")
	// ErrPrefillResponse: the prefill response lacks what the decode leg
	// needs; the prefill leg failed as far as the client is concerned.
	ErrPrefillResponse = errors.New("engines: prefill response lacks the handoff parameters")
)

// Edit is one change to the top-level members of a JSON object.
type Edit struct {
	// Key is the member's name (plain, unescaped).
	Key string
	// Value is the new raw JSON value; nil deletes the member.
	Value []byte
	// IfPresent replaces the member only where the object has it.
	IfPresent bool
}

// EditObject appends obj with edits applied to its top-level members: a
// member an edit names has its value replaced in place (the first
// occurrence; later duplicates are dropped) or is deleted; a Value edit
// whose key is absent is appended at the end, unless IfPresent. Every
// other byte of obj, whitespace included, is copied unchanged. obj must be
// valid JSON (checked) and an object; at most 64 edits.
func EditObject(dst, obj []byte, edits ...Edit) ([]byte, error) {
	it, err := members(obj)
	if err != nil {
		return dst, err
	}
	if len(edits) > 64 {
		panic("BUG: engines: more than 64 edits")
	}
	var done uint64
	emitted, prevEnd, first := 0, -1, true
	for {
		m, ok := it.next()
		if !ok {
			break
		}
		if first {
			dst = append(dst, obj[:m.keyStart]...)
		}
		e := m.match(edits)
		// A delete edit drops the member, and so does a replace edit for
		// a later duplicate of a member it already replaced.
		if drop := e >= 0 && (edits[e].Value == nil || done&(1<<e) != 0); !drop {
			if emitted > 0 {
				// The original separator before this member, which
				// holds one comma whatever was dropped before it.
				dst = append(dst, obj[prevEnd:m.keyStart]...)
			}
			if e >= 0 {
				dst = append(dst, obj[m.keyStart:m.valStart]...)
				dst = append(dst, edits[e].Value...)
				done |= 1 << e
			} else {
				dst = append(dst, obj[m.keyStart:m.valEnd]...)
			}
			emitted++
		}
		prevEnd, first = m.valEnd, false
	}
	if first {
		dst = append(dst, obj[:it.p]...) // up to the closing brace
		prevEnd = it.p
	}
	for e := range edits {
		ed := &edits[e]
		if done&(1<<e) != 0 || ed.Value == nil || ed.IfPresent {
			continue
		}
		if emitted > 0 {
			dst = append(dst, ',')
		}
		dst = AppendJSONString(dst, ed.Key)
		dst = append(dst, ':')
		dst = append(dst, ed.Value...)
		emitted++
	}
	return append(dst, obj[prevEnd:]...), nil
}

// Field returns the raw value of obj's top-level member key (the last, if
// it repeats, as JSON decoders keep), and whether there is one.
func Field(obj []byte, key string) ([]byte, bool, error) {
	it, err := members(obj)
	if err != nil {
		return nil, false, err
	}
	var v []byte
	found := false
	probe := [1]Edit{{Key: key}}
	for {
		m, ok := it.next()
		if !ok {
			return v, found, nil
		}
		if m.match(probe[:]) == 0 {
			v, found = obj[m.valStart:m.valEnd], true
		}
	}
}

// FirstElement returns the first element of the JSON array arr (already
// validated, e.g. a Field of a validated object), and false for an empty
// array or a non-array.
func FirstElement(arr []byte) ([]byte, bool) {
	p := skipWS(arr, 0)
	if p >= len(arr) || arr[p] != '[' {
		return nil, false
	}
	p = skipWS(arr, p+1)
	if p >= len(arr) || arr[p] == ']' {
		return nil, false
	}
	return arr[p:skipValue(arr, p)], true
}

// AppendJSONString appends s as a JSON string.
func AppendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// memberIter walks the top-level members of a validated JSON object. It
// trusts the grammar (sonic.Valid ran) and tells values apart by their
// first byte, so it costs a few compares per token plus the string scans.
type memberIter struct {
	b []byte
	p int // next unread byte; on the closing brace once done
}

type member struct {
	keyStart, valStart, valEnd int
	key                        []byte // raw, between the quotes
	esc                        bool   // key holds escapes
}

func members(obj []byte) (memberIter, error) {
	if !sonic.Valid(obj) {
		return memberIter{}, ErrNotObject
	}
	p := skipWS(obj, 0)
	if obj[p] != '{' {
		return memberIter{}, ErrNotObject
	}
	return memberIter{b: obj, p: skipWS(obj, p+1)}, nil
}

func (it *memberIter) next() (m member, ok bool) {
	b := it.b
	if b[it.p] == ',' {
		it.p = skipWS(b, it.p+1)
	}
	if b[it.p] == '}' {
		return m, false
	}
	m.keyStart = it.p
	end := skipString(b, it.p)
	m.key = b[it.p+1 : end-1]
	for _, c := range m.key {
		if c == '\\' {
			m.esc = true
			break
		}
	}
	p := skipWS(b, end)
	m.valStart = skipWS(b, p+1) // past ':'
	m.valEnd = skipValue(b, m.valStart)
	it.p = skipWS(b, m.valEnd)
	return m, true
}

// match returns the index of the edit naming m's key, or -1.
func (m *member) match(edits []Edit) int {
	key := m.key
	if m.esc {
		// Rare: a client escaped a key ("\u0073tream"). Decode it so the
		// edit still finds it.
		var s string
		raw := make([]byte, 0, len(key)+2)
		raw = append(append(append(raw, '"'), key...), '"')
		if json.Unmarshal(raw, &s) != nil {
			return -1
		}
		key = []byte(s)
	}
	for e := range edits {
		if string(key) == edits[e].Key {
			return e
		}
	}
	return -1
}

func skipWS(b []byte, p int) int {
	for p < len(b) {
		switch b[p] {
		case ' ', '\t', '\n', '\r':
			p++
		default:
			return p
		}
	}
	return p
}

// skipString returns the offset just past the string opening at b[p].
func skipString(b []byte, p int) int {
	for i := p + 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the offset just past the value starting at b[p].
func skipValue(b []byte, p int) int {
	switch b[p] {
	case '"':
		return skipString(b, p)
	case '{', '[':
		depth := 0
		for i := p; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	default:
		for i := p; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
		}
		return len(b)
	}
}

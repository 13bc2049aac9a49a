package sim

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/kvxfer"
)

// Prefill/decode disaggregation: how a pod plays its role under each
// engine's protocol. Every protocol comes down to the same two legs:
//
//   - A prefill leg (on a prefill pod) computes the prompt's KV and its
//     first token, holds the KV on the pod's kvxfer server and answers
//     with whatever the decode pod needs to find it: one JSON body, or an
//     event stream for a streamed SGLang leg, which needs nothing. Pull-style protocols (vLLM, TensorRT-LLM context_first) answer at
//     once; push-style ones (SGLang, TensorRT-LLM generation_first), whose
//     decode leg is already waiting, answer once the KV was taken.
//   - A decode leg (on a decode pod) takes a batch slot and KV room, pulls
//     the KV from the prefill pod over kvxfer, then produces the whole
//     answer from its first token, exactly as a combined pod would: token
//     i depends only on the seed, the prompt and i, so the answer equals a
//     combined pod's byte for byte in content.
//
// An SGLang completion batch plays both legs once per prompt, each prompt
// under its own bootstrap room.
//
// Held KV is released on pickup or after Config.KVTimeout; Stats'
// HeldKVBlocks shows it. A combined pod ignores every PD field, as an
// engine started without a KV connector does.

// kvTransferParams is vLLM's kv_transfer_params (NIXL connector fields).
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
}

// disaggParams is TensorRT-LLM's DisaggregatedParams
// (tensorrt_llm/serve/openai_protocol.py).
type disaggParams struct {
	RequestType        string   `json:"request_type"`
	FirstGenTokens     []uint32 `json:"first_gen_tokens"`
	CtxRequestID       *int64   `json:"ctx_request_id"`
	EncodedOpaqueState *string  `json:"encoded_opaque_state"`
	DraftTokens        []uint32 `json:"draft_tokens"`
	DisaggRequestID    *int64   `json:"disagg_request_id"`
	CtxDPRank          *int     `json:"ctx_dp_rank"`
	CtxInfoEndpoint    *string  `json:"ctx_info_endpoint"`
	ScheduleStyle      *int     `json:"schedule_style"`
}

// TensorRT-LLM's request types and DisaggScheduleStyle values.
const (
	trtContextOnly     = "context_only"
	trtGenerationOnly  = "generation_only"
	trtGenerationFirst = 1
	trtEndpointScheme  = "tcp://"
)

type legKind uint8

const (
	legPlain legKind = iota
	legPrefill
	legDecode
)

// pdLeg is what a request asks of the pod under its engine's protocol.
type pdLeg struct {
	kind legKind
	// Prefill legs: the handle to hold the KV under ("" lets the kvxfer
	// server pick one), and whether to answer only after pickup.
	handle string
	push   bool
	// room is an SGLang leg's bootstrap room.
	room uint64
	// Decode legs: where the KV is, and how long the source should wait
	// for it to be held (0: it must be held already); unreachable, when
	// set, is why the KV cannot be fetched at all.
	src         kvxfer.Descriptor
	wait        time.Duration
	unreachable error
	// TensorRT-LLM's disagg_request_id, echoed in the context response.
	disaggID *int64
}

// legsOf reads a request's PD fields for the pod's engine and role: the
// leg each of its prompts plays. A leg the pod's role does not serve is an
// error; a combined pod serves everything as a plain request. Only SGLang
// gives each prompt of a batch a leg of its own; the sim serves the other
// engines' batches on plain requests only.
func (p *Pod) legsOf(req *genRequest, prompts int) ([]pdLeg, error) {
	role := p.Role()
	if role == RoleCombined {
		return []pdLeg{{}}, nil
	}
	legs := []pdLeg{{}}
	var err error
	switch p.cfg.Engine {
	case engines.VLLM:
		legs[0], err = vllmLeg(req.KVTransferParams)
	case engines.SGLang:
		legs, err = sglangLegs(req, role, prompts, p.cfg.KVTimeout, p.cfg.BootstrapPort)
	case engines.TRTLLM:
		legs[0], err = p.trtLeg(req.DisaggregatedParams)
	}
	if err != nil {
		return nil, err
	}
	switch kind := legs[0].kind; {
	case kind == legPrefill && role != RolePrefill:
		return nil, badRequest("this pod's role is %s: it does not serve prefill legs", role)
	case kind == legDecode && role != RoleDecode:
		return nil, badRequest("this pod's role is %s: it does not serve decode legs", role)
	case kind != legPlain && len(legs) < prompts:
		return nil, badRequest("a batch of %d prompts on a %s leg: the sim serves batches on plain requests only", prompts, legNames[kind])
	}
	return legs, nil
}

func vllmLeg(kv *kvTransferParams) (pdLeg, error) {
	switch {
	case kv == nil:
		return pdLeg{}, nil
	case kv.DoRemoteDecode:
		return pdLeg{kind: legPrefill}, nil
	case !kv.DoRemotePrefill:
		return pdLeg{}, nil
	case kv.RemoteHost == nil || kv.RemotePort == nil || kv.RemoteRequestID == nil:
		return pdLeg{}, badRequest("kv_transfer_params with do_remote_prefill needs remote_host, remote_port and remote_request_id")
	}
	return pdLeg{kind: legDecode, src: kvxfer.Descriptor{
		Addr: net.JoinHostPort(*kv.RemoteHost, strconv.Itoa(*kv.RemotePort)), Handle: *kv.RemoteRequestID,
	}}, nil
}

// errNoBootstrapRoom is SGLang's refusal of a request without
// bootstrap_room on a pod in either disaggregation mode: its scheduler
// aborts the request with a 400 rather than prefill it locally.
var errNoBootstrapRoom = errors.New("Invalid request: Disaggregated request received without bootstrap room id")

// errBootstrapIndex is SGLang's failure, a 500, on a request whose list of
// bootstrap values is shorter than its batch: GenerateReqInput.__getitem__
// indexes each list by the prompt's place.
var errBootstrapIndex = errors.New("Internal server error: list index out of range")

// sglangLegs: one body goes to both pods; the pod's role says which leg
// each prompt plays. Each prompt takes its own bootstrap values, from a
// list of one per prompt or the one value of all; one room numbers the
// batch's prompts on from it (GenerateReqInput._normalize_bootstrap_params
// in python/sglang/srt/managers/io_struct.py). A prompt without a room is
// refused (errNoBootstrapRoom). The room is the handle on the prefill
// pod's bootstrap server. A decode leg without bootstrap_port uses
// ownPort, the pod's configured one, as SGLang's
// Scheduler.handle_generate_request fills in
// --disaggregation-bootstrap-port (default 8998). One without
// bootstrap_host is taken too: SGLang's KV receiver formats the missing
// host as "None" and fails to fetch the prefill's parallel info there,
// which fails the handshake once the request is queued.
func sglangLegs(req *genRequest, role string, prompts int, kvTimeout time.Duration, ownPort int) ([]pdLeg, error) {
	legs := make([]pdLeg, prompts)
	for i := range legs {
		room, okRoom := req.BootstrapRoom.at(i)
		host, okHost := req.BootstrapHost.at(i)
		port, okPort := req.BootstrapPort.at(i)
		switch {
		case !okRoom || !okHost || !okPort:
			return nil, errBootstrapIndex
		case room == nil:
			return nil, errNoBootstrapRoom
		case *room < 0:
			return nil, badRequest("bootstrap_room = %d must not be negative", *room)
		}
		n := uint64(*room)
		if !req.BootstrapRoom.isList {
			n += uint64(i)
		}
		handle := strconv.FormatUint(n, 10)
		if role == RolePrefill {
			legs[i] = pdLeg{kind: legPrefill, handle: handle, push: true, room: n}
			continue
		}
		portN := cmp.Or(ownPort, engines.DefaultBootstrapPort)
		if port != nil {
			portN = int(*port)
		}
		hostS := ""
		if host != nil {
			hostS = *host
		}
		legs[i] = pdLeg{kind: legDecode, wait: kvTimeout, src: kvxfer.Descriptor{
			Addr: net.JoinHostPort(cmp.Or(hostS, "None"), strconv.Itoa(portN)), Handle: handle,
		}}
		if hostS == "" {
			legs[i].unreachable = errors.New("could not fetch the prefill's parallel info: no bootstrap_host")
		}
	}
	return legs, nil
}

func (p *Pod) trtLeg(dp *disaggParams) (pdLeg, error) {
	if dp == nil {
		return pdLeg{}, nil
	}
	genFirst := dp.ScheduleStyle != nil && *dp.ScheduleStyle == trtGenerationFirst
	switch dp.RequestType {
	case trtContextOnly:
		leg := pdLeg{kind: legPrefill, push: genFirst, disaggID: dp.DisaggRequestID}
		if genFirst {
			if dp.DisaggRequestID == nil {
				return pdLeg{}, badRequest("a generation_first context_only request needs disagg_request_id")
			}
			leg.handle = strconv.FormatInt(*dp.DisaggRequestID, 10)
		}
		return leg, nil
	case trtGenerationOnly:
	default:
		return pdLeg{}, nil // context_and_generation: a plain request
	}
	if genFirst {
		// The context pod's address comes from its /server_info, the
		// handle is the shared disagg_request_id.
		if dp.CtxInfoEndpoint == nil || dp.DisaggRequestID == nil {
			return pdLeg{}, badRequest("a generation_first generation_only request needs ctx_info_endpoint and disagg_request_id")
		}
		return pdLeg{kind: legDecode, wait: p.cfg.KVTimeout, src: kvxfer.Descriptor{
			Addr: strings.TrimPrefix(*dp.CtxInfoEndpoint, trtEndpointScheme), Handle: strconv.FormatInt(*dp.DisaggRequestID, 10),
		}}, nil
	}
	if dp.EncodedOpaqueState == nil {
		return pdLeg{}, badRequest("a generation_only request needs encoded_opaque_state")
	}
	raw, err := base64.StdEncoding.DecodeString(*dp.EncodedOpaqueState)
	if err != nil {
		return pdLeg{}, badRequest("encoded_opaque_state: %v", err)
	}
	src, err := kvxfer.ParseDescriptor(string(raw))
	if err != nil {
		return pdLeg{}, badRequest("encoded_opaque_state: %v", err)
	}
	return pdLeg{kind: legDecode, src: src}, nil
}

// kvBytes is what a transfer of tokens' KV moves: the full size scaled by
// KVScale.
func (p *Pod) kvBytes(tokens int) int64 {
	return int64(math.Ceil(p.cfg.Physics.KVBytes(tokens) * p.cfg.KVScale))
}

// kvPace is the wall time a transfer of n (scaled) bytes takes: the link's
// time for the full size, divided by Speedup.
func (p *Pod) kvPace(n int64) time.Duration {
	sec := p.cfg.Physics.Link().Sec(float64(n)/p.cfg.KVScale) / p.cfg.Speedup
	return time.Duration(sec * float64(time.Second))
}

// pullKV is receiveKV in the request's kv_pull span, with failed to
// answer a failed pull: true when the response is due.
func (p *Pod) pullKV(ctx *fasthttp.RequestCtx, span *genSpan, rs []*request, legs []pdLeg, failed func(error)) bool {
	pulled := span.step("kv_pull")
	ok, err := p.receiveKV(ctx.Conn(), rs, legs)
	pulled()
	if err != nil {
		failed(err)
	}
	return ok
}

// receiveKV pulls the KV of a decode leg's requests, rs[i]'s from
// legs[i].src once the scheduler admitted it, and lets each one's prefill
// run as its KV arrives. It returns true when the response is due,
// aborted requests included; false when the client on conn left, or with
// the error of a failed pull, which cancels them all.
func (p *Pod) receiveKV(conn net.Conn, rs []*request, legs []pdLeg) (bool, error) {
	pullCtx, cancel := context.WithCancel(context.Background())
	type pulled struct {
		i   int
		err error
	}
	done := make(chan pulled, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			select {
			case <-r.admitted:
			case <-pullCtx.Done():
				return
			}
			tr, err := kvxfer.Transfer{}, legs[i].unreachable
			if err == nil {
				tr, err = p.transport.Pull(pullCtx, legs[i].src, legs[i].wait)
			}
			p.m.kvPulled(r.rank, tr.Elapsed.Seconds()*p.cfg.Speedup, err == nil)
			done <- pulled{i, err}
		})
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	cancelAll := func() {
		for _, r := range rs {
			p.sched.send(schedMsg{kind: msgCancel, req: r})
		}
	}
	poll := time.NewTicker(disconnectPoll)
	defer poll.Stop()
	settled := make([]bool, len(rs)) // its KV arrived, or it was aborted
	left, woke := len(rs), false
	for left > 0 {
		select {
		case d := <-done:
			if settled[d.i] {
				continue // aborted while pulling
			}
			if d.err != nil {
				cancelAll()
				return false, fmt.Errorf("KV transfer from %s failed: %v", legs[d.i].src.Addr, d.err)
			}
			settled[d.i], left = true, left-1
			p.sched.send(schedMsg{kind: msgKVReady, req: rs[d.i]})
		case <-rs[0].notify:
			// Aborted (SGLang's /abort_request): answered as any aborted
			// request, without its KV.
			woke = true
			for i, r := range rs {
				if _, reason := r.load(); !settled[i] && reason != finishNone {
					settled[i], left = true, left-1
				}
			}
		case <-poll.C:
			if connGone(conn) {
				cancelAll()
				return false, nil
			}
		case <-p.sched.exited:
			return true, nil
		}
	}
	if woke {
		// Wait reads progress on a wake-up, so hand this one on.
		select {
		case rs[0].notify <- struct{}{}:
		default:
		}
	}
	return true, nil
}

// pdAnswer is a prefill leg's fields in its response body (raw JSON).
type pdAnswer struct {
	kvTransferParams []byte
	disaggParams     []byte
	promptTokenIDs   []uint32
}

// answerPrefill waits for a prefill leg's first token of each of its
// requests, holds rs[i]'s KV under legs[i]'s handle for pickup and answers
// with the engine's handoff fields: as one body, or, with sse, as an event
// stream (SGLang's leg carries the client's "stream" and has no handoff
// fields to answer). Only SGLang's legs carry several prompts.
func (p *Pod) answerPrefill(ctx *fasthttp.RequestCtx, rs []*request, legs []pdLeg, chat bool, respID string, created int64, texts []textStream, sse *sseWriter) {
	conn := ctx.Conn()
	outs := p.waitAll(rs, conn, nil)
	if outs == nil {
		return // the client is gone; the scheduler unpinned the KV
	}
	prompt := 0
	for _, r := range rs {
		prompt += len(r.tokens)
	}
	produced, _ := totals(outs)
	model := cmp.Or(rs[0].lora, p.cfg.Model)
	answer := func(pd *pdAnswer) {
		if sse != nil {
			var b []byte
			for i, o := range outs {
				b = sse.appendDelta(b, i, texts[i].appendText(nil, 0, o.produced), o.produced, o.reason)
			}
			ctx.SetContentType(sseContentType)
			ctx.SetBody(sse.appendEnd(b, produced))
			return
		}
		choices := make([]choice, len(outs))
		for i, o := range outs {
			choices[i] = choice{text: texts[i].appendText(nil, 0, o.produced), reason: o.reason}
		}
		writeJSON(ctx, appendFullResponse(nil, p.cfg.Engine, chat, respID, created, model, choices, prompt, produced, pd))
	}
	unpin := func(rs []*request) {
		for _, r := range rs {
			p.sched.send(schedMsg{kind: msgUnpin, req: r})
		}
	}
	for _, o := range outs {
		if o.reason == finishAbort {
			unpin(rs)
			answer(nil)
			return
		}
	}
	picked := make(chan kvxfer.Outcome, len(rs))
	var d kvxfer.Descriptor
	for i, r := range rs {
		var err error
		d, err = p.xfer.Load().Hold(kvxfer.Hold{
			Handle: legs[i].handle, Tokens: len(r.tokens), Bytes: p.kvBytes(len(r.tokens)), TTL: p.cfg.KVTimeout,
			Released: func(o kvxfer.Outcome) {
				p.sched.send(schedMsg{kind: msgUnpin, req: r})
				if o == kvxfer.Expired {
					p.m.kvHoldExpired(r.rank)
				}
				picked <- o
			},
		})
		if err != nil {
			// What it held already goes with its pickup or its timeout.
			unpin(rs[i:])
			p.failAccepted(ctx, sse != nil, fasthttp.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
	}
	if legs[0].push {
		for range rs {
			if !p.awaitPickup(conn, picked) {
				p.failAccepted(ctx, sse != nil, fasthttp.StatusInternalServerError, "InternalServerError", "the KV was not taken by a decode pod")
				return
			}
		}
	}
	var pd pdAnswer
	switch p.cfg.Engine {
	case engines.VLLM:
		pd.kvTransferParams = p.vllmParams(d)
	case engines.TRTLLM:
		pd.disaggParams = p.trtParams(d, texts[0], legs[0])
		pd.promptTokenIDs = rs[0].tokens
	}
	answer(&pd)
}

// awaitPickup waits until the decode pod took the KV, as SGLang's prefill
// answers only then; false if it expired or was dropped first. A client
// that leaves stops the wait, not the hold.
func (p *Pod) awaitPickup(conn net.Conn, picked <-chan kvxfer.Outcome) bool {
	poll := time.NewTicker(disconnectPoll)
	defer poll.Stop()
	for {
		select {
		case o := <-picked:
			return o == kvxfer.PickedUp
		case <-poll.C:
			if connGone(conn) {
				return false
			}
		}
	}
}

// vllmParams is the kv_transfer_params a vLLM prefill pod returns: where a
// decode pod reads the blocks.
func (p *Pod) vllmParams(d kvxfer.Descriptor) []byte {
	host, port, _ := net.SplitHostPort(d.Addr)
	portN, _ := strconv.Atoi(port)
	blocks := make([]int, p.cfg.Physics.Blocks(d.Tokens))
	for i := range blocks {
		blocks[i] = i
	}
	b, _ := json.Marshal(struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		RemoteBlockIDs  []int  `json:"remote_block_ids"`
		RemoteEngineID  string `json:"remote_engine_id"`
		RemoteRequestID string `json:"remote_request_id"`
		RemoteHost      string `json:"remote_host"`
		RemotePort      int    `json:"remote_port"`
		TPSize          int    `json:"tp_size"`
	}{true, false, blocks, p.cfg.Name, d.Handle, host, portN, 1})
	return b
}

// trtParams is the disaggregated_params a TensorRT-LLM context pod returns.
func (p *Pod) trtParams(d kvxfer.Descriptor, text textStream, leg pdLeg) []byte {
	ctxID, _ := strconv.ParseInt(d.Handle, 10, 64) // handles are decimal int63s
	state := base64.StdEncoding.EncodeToString([]byte(d.String()))
	b, _ := json.Marshal(disaggParams{
		RequestType:        trtContextOnly,
		FirstGenTokens:     tokenize.Append(nil, []byte(text.word(0))),
		CtxRequestID:       &ctxID,
		EncodedOpaqueState: &state,
		DisaggRequestID:    leg.disaggID,
	})
	return b
}

// trtServerInfo serves TensorRT-LLM's GET /server_info: a context pod's
// generation-first metadata, as its Python KV-cache transceiver reports it.
// Other pods report empty disaggregated_params, as the C++ one does.
func (p *Pod) trtServerInfo(ctx *fasthttp.RequestCtx) {
	params := map[string]any{}
	if p.Role() == RolePrefill {
		params["ctx_info_endpoint"] = trtEndpointScheme + p.KVXferAddr()
		params["ctx_dp_rank"] = 0
	}
	body, _ := json.Marshal(map[string]any{"disaggregated_params": params})
	writeJSON(ctx, body)
}

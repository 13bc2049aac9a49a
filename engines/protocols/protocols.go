// Package protocols chooses the engine package that serves a pod: its PD
// exchange, its KV-event feed and the metadata its prefill pods publish.
// The gateway goes through here, so nothing under lb/ imports
// engines/vllm, engines/sglang or engines/trtllm (they import engines,
// hence a package of its own).
package protocols

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/sglang"
	"pdlb/engines/trtllm"
	"pdlb/engines/vllm"
)

// For returns the PD exchange of engine k under o, which the caller has
// validated (a bad style or machine id is a BUG panic). TensorRT-LLM's
// carry a disagg_request_id generator, one per style and machine id for
// the process, so ids stay unique however many requests draw them.
func For(k engines.Kind, o engines.PDOptions) engines.Protocol {
	switch k {
	case engines.SGLang:
		return sglang.PD{}
	case engines.TRTLLM:
		style, err := trtllm.ParseStyle(o.TRTScheduleStyle)
		if err != nil {
			panic("BUG: protocols: unvalidated trt_schedule_style: " + err.Error())
		}
		if o.TRTMachineID < 0 || o.TRTMachineID >= engines.TRTMachineIDLimit {
			panic("BUG: protocols: unvalidated trt_machine_id")
		}
		slot := &trtProtocols[style][o.TRTMachineID]
		if pd := slot.Load(); pd != nil {
			return pd
		}
		pd, err := trtllm.NewPD(style, o.TRTMachineID)
		if err != nil {
			panic("BUG: protocols: unvalidated trt_machine_id: " + err.Error())
		}
		slot.CompareAndSwap(nil, pd)
		return slot.Load()
	}
	return vllm.PD{}
}

var trtProtocols [2][engines.TRTMachineIDLimit]atomic.Pointer[trtllm.PD]

// The lazy prefill-info lookup (TRT-LLM generation_first's /server_info):
// once per prefill pod a minute, within 3 s, as AIBrix does it.
const (
	prefillInfoTTL     = time.Minute
	prefillInfoTimeout = 3 * time.Second
)

type prefillInfoEntry struct {
	body []byte
	at   time.Time
}

// PrefillInfo is one pod's answer to engines.Protocol.PrefillInfoPath,
// kept a minute. The answer is its process's (TRT-LLM: its KV
// transceiver's endpoint), so the pod holds it and drops it when its
// process may have changed (Forget). The zero value is empty; it is
// safe for concurrent use.
type PrefillInfo struct {
	entry atomic.Pointer[prefillInfoEntry]
}

// Get returns the answer of the pod at addr to GET path, asked through
// client with auth as its Authorization (nil: none) unless kept. The body is shared: callers must not modify it.
func (p *PrefillInfo) Get(client *fasthttp.HostClient, addr, path string, auth []byte) ([]byte, error) {
	if e := p.entry.Load(); e != nil && time.Since(e.at) < prefillInfoTTL {
		return e.body, nil
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(path)
	req.SetHost(addr)
	if auth != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, auth)
	}
	err := client.DoTimeout(req, resp, prefillInfoTimeout)
	if err == nil && resp.StatusCode() != fasthttp.StatusOK {
		err = errors.New("status " + fasthttp.StatusMessage(resp.StatusCode()))
	}
	if err != nil {
		return nil, err
	}
	// A copy: resp goes back to its pool.
	body := append([]byte(nil), resp.Body()...)
	p.entry.Store(&prefillInfoEntry{body: body, at: time.Now()})
	return body, nil
}

// Forget drops the kept answer: the pod failed a health check, and may
// come back as another process.
func (p *PrefillInfo) Forget() { p.entry.Store(nil) }

// KVSubscriber follows one pod's KV events; its Counters are for export.
type KVSubscriber = vllm.Subscriber

// SubscribeKVEvents follows a pod's ZMQ KV-event stream at endpoint (and
// its replay endpoint, "" for the default) into sink until closed: that of
// its data-parallel rank rank, on both ports + rank. Pods publish in
// vLLM's event format (kv_events in the pod's configuration). The feed's
// changes of state go to log (nil: nowhere).
func SubscribeKVEvents(endpoint, replay string, rank int, sink vllm.BlockEvents, log *slog.Logger) (*KVSubscriber, error) {
	return vllm.NewSubscriber(vllm.SubscriberConfig{Endpoint: endpoint, ReplayEndpoint: replay, DataParallelRank: int64(rank), Log: log}, sink)
}

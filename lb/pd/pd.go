// Package pd carries out a prefill/decode pair: the exchange of its legs
// through the engine's protocol (Call.RunPair), what the legs of a
// concurrent exchange share (Link), the decode watchdog, the abort call,
// the headers and the metrics. The gateway decides the pair and owns the
// request's placement, ledger charge and answer; it lends them to the
// exchange as a Host and a Fleet.
package pd

import (
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/pool"
)

// abortTimeout bounds an abort call; what the pod answers changes nothing.
const abortTimeout = 2 * time.Second

// Abort tells pod to drop the exchange's request where the protocol has a
// call for it (SGLang's /abort_request), in the background.
func Abort(proto engines.Protocol, ex *engines.Exchange, pod *pool.Pod) {
	path, body := proto.Abort(nil, ex)
	if path == "" {
		return // closing the connection is the abort
	}
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(path)
		req.SetHost(pod.Config.Address)
		pod.Authorize(req)
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		// What the pod answers changes nothing.
		_ = pod.Client.DoTimeout(req, resp, abortTimeout)
	}()
}

// Headers of PD answers (AIBrix's x-error-pd-* distinguish a gateway's
// PD failure from a 5xx the decode pod itself sent).
const (
	HeaderPrefillPod   = "x-pdlb-prefill-pod"
	HeaderDecodePod    = "x-pdlb-decode-pod"
	HeaderPrefillError = "x-error-pd-prefill"
	HeaderDecodeError  = "x-error-pd-decode"
)

// HostOf is the host part of a host:port address, without allocating.
func HostOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			h := addr[:i]
			if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
				h = h[1 : len(h)-1]
			}
			return h
		}
	}
	return addr
}

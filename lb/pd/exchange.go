package pd

import (
	"bytes"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/engines/protocols"
	"pdlb/lb/fail"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// The exchange of a PD pair, driven through the engine's
// engines.Protocol:
//
//   - sequential (vLLM, TensorRT-LLM context_first): the prefill leg, whole
//     and non-streaming; then the decode leg built from its answer, relayed
//     to the client. A context answer that is already final (TRT) is the
//     client's answer.
//   - concurrent (SGLang, TensorRT-LLM generation_first): both legs at
//     once, each in its own goroutine; the request waits for whichever
//     settles the matter first. A failed prefill leg aborts the decode leg
//     at once (SGLang: POST /abort_request; otherwise its connection is
//     closed as soon as it is known) and answers the client with
//     x-error-pd-prefill.
//
// Cleanup of KV a prefill leg left behind, by engine: a decode leg that
// cannot go to its pod goes to another decode pod of the model (same
// roleset first) with the same body, which takes the KV. Where none is
// left, vLLM and TensorRT-LLM context_first prefill pods hold the KV until
// their own timeout (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by
// default): neither has a call to drop it, and the prefill leg's
// connection has already ended. An SGLang or generation_first prefill leg
// still waiting for the pickup when its decode leg fails, before or after
// the decode answer's head, is given up (abandonPrefill): its connection
// is closed, SGLang's pod also gets /abort_request.

// ProbeTaken is RunPair's outcome for a pair whose prefill pod is
// half-open and whose one probe another request took since the decision:
// nothing was sent, the pod is tried, and the request is decided anew.
var ProbeTaken = &fail.Failure{E: openai.Overloaded("another request took the half-open prefill pod's probe")}

// RunPair carries out a PDPair decision (c.Pre, c.Dec): nil once the
// client is answered.
func (c *Call) RunPair() *fail.Failure {
	h, pre := c.host, c.Pre
	if !h.PlacePair(pre, c.Dec) {
		h.Tried(pre)
		return c.dropPair(nil, ProbeTaken)
	}
	c.proto = protocols.For(pre.Engine, c.Opts.PDOptions)
	// The prefill leg's request carries the client's headers and the
	// request id the host settles on.
	up := h.Upstream(pre)
	c.ex = engines.Exchange{
		RequestID:     h.RequestID(),
		Chat:          c.chat,
		Batch:         c.batch,
		PrefillHost:   HostOf(pre.Config.Address),
		BootstrapPort: pre.Config.BootstrapPort,
	}
	c.ex.PrefillRank, c.ex.PrefillRanks = h.PrefillRank(pre)
	c.proto.Begin(&c.ex)
	if path := c.proto.PrefillInfoPath(); path != "" {
		info, err := pre.PrefillInfo.Get(pre.Client, pre.Config.Address, path, pre.Auth())
		if err != nil {
			fasthttp.ReleaseRequest(up)
			// Nothing of the request went out: another pair may take it, as
			// after a prefill leg that failed so, and a refusal takes the
			// pod out of the next picks.
			c.fleet.CallFailed(pre, err)
			return c.dropPair(pre, &fail.Failure{E: openai.UpstreamError("prefill pod " + pre.Config.Name + " " + path + ": " + err.Error()),
				PDHeader: HeaderPrefillError, Pod: pre, Reason: fail.ReasonOf(err)})
		}
		c.ex.PrefillInfo = info
	}
	var err error
	c.preBody, err = c.proto.PrefillBody(c.preBody[:0], c.ctx.PostBody(), &c.ex)
	if err == nil && c.proto.Concurrent() {
		// Otherwise the decode body waits for the prefill answer.
		c.decBody, err = c.proto.DecodeBody(c.decBody[:0], c.ctx.PostBody(), nil, &c.ex)
	}
	if err != nil {
		fasthttp.ReleaseRequest(up)
		return c.dropPair(pre, &fail.Failure{E: openai.UpstreamError(err.Error()), PDHeader: HeaderPrefillError})
	}
	c.active = true
	// The legs may run long: a client that leaves cuts them, on fasthttp
	// too.
	c.gone = frontend.WatchClient(c.ctx)
	c.legsStart = time.Now()
	if c.proto.Concurrent() {
		return c.runConcurrent(up)
	}
	return c.runSequential(up)
}

// dropPair undoes a pair whose legs were not both sent: the prefill pod's
// placement (when the prefill leg never went out) and the decode pod's
// pending pick.
func (c *Call) dropPair(pre *pool.Pod, f *fail.Failure) *fail.Failure {
	if pre != nil {
		c.host.Unplace(pre)
		if f.MayRetry() {
			c.host.Tried(pre)
		}
	}
	c.Ticket.Done()
	c.active = false
	if c.link != nil {
		c.link.Release()
		c.link = nil
	}
	return f
}

// runSequential: the prefill leg, then the decode leg with its answer.
func (c *Call) runSequential(up *fasthttp.Request) *fail.Failure {
	pre := c.Pre
	up.SetBodyRaw(c.preBody)
	resp := fasthttp.AcquireResponse()
	_, err := c.fleet.Send(c.gone, nil, pre, up, resp, time.Now().Add(c.Opts.PrefillRequestTimeout), nil)
	fasthttp.ReleaseRequest(up)
	status := 0
	if err == nil {
		status = resp.StatusCode()
		c.preResp = append(c.preResp[:0], resp.Body()...)
	}
	c.prefillEnd = time.Now()
	if err == nil {
		// Only an answer times the prefill: a leg refused, reset, timed
		// out or cut short would read as a prefill that took that long.
		c.Metrics.Prefill.Update(c.prefillEnd.Sub(c.legsStart).Seconds())
	}
	f := prefillFailure(c.fleet, pre, status, c.preResp, err, c.Opts.PrefillRequestTimeout)
	c.host.PrefillDone(pre, c.prefillEnd, err == upstream.ErrCut, f == nil)
	if f == nil && c.proto.PrefillAnswers(c.preResp) {
		// The context pod finished at its first token: its answer is the
		// client's, and the decode pod gets nothing.
		c.Ticket.Done()
		c.active = false
		c.host.AnswerFromPrefill(pre, resp, c.preResp)
		return nil
	}
	fasthttp.ReleaseResponse(resp)
	pre.Release(c.seqs)
	if f == nil && c.clientLeft() {
		// No decode leg for a client that left during the prefill; the
		// prefill pod drops its KV where the protocol can say so.
		Abort(c.proto, &c.ex, pre)
		f = fail.ClientLeft
	}
	if f == nil {
		if c.decBody, err = c.proto.DecodeBody(c.decBody[:0], c.ctx.PostBody(), c.preResp, &c.ex); err != nil {
			f = &fail.Failure{E: openai.UpstreamError(err.Error()), PDHeader: HeaderPrefillError}
		}
	}
	if f != nil {
		return c.prefillFailed(f)
	}
	return c.sequentialDecode()
}

// prefillFailure classifies a finished prefill leg: nil for a 200 answer,
// else the client's error (retryable when no byte of the leg's answer came,
// or it was a 503).
func prefillFailure(fl Fleet, pre *pool.Pod, status int, body []byte, err error, timeout time.Duration) *fail.Failure {
	switch {
	case err == upstream.ErrCut:
		return fail.ClientLeft
	case err != nil:
		fl.CallFailed(pre, err)
		f := fl.PodFailure(pre, err, timeout)
		f.PDHeader = HeaderPrefillError
		return f
	case status != fasthttp.StatusOK:
		return answeredFailure(fl, pre, status, prefillAnswered(status, body))
	}
	if e := streamedError(body); e != nil {
		return answeredFailure(fl, pre, e.Status, e)
	}
	pre.ReportSuccess()
	return nil
}

// answeredFailure is the client's failure for a prefill leg pre answered
// with an error of status, e.
func answeredFailure(fl Fleet, pre *pool.Pod, status int, e *openai.Error) *fail.Failure {
	if fail.IsFault(status) {
		fl.PodFailed(pre)
	}
	f := &fail.Failure{E: e, PDHeader: HeaderPrefillError, Pod: pre}
	if status == fasthttp.StatusServiceUnavailable {
		f.Reason = fail.Unavailable
	}
	return f
}

// streamedError is the engine's error event in a prefill answer that is an
// event stream, nil for any other answer. SGLang's prefill leg carries the
// client's "stream", and SGLang fails a streamed request it accepted (a
// scheduler abort, a failed KV transfer) with 200 and an error event
// (serving_chat.py), not with an error status.
func streamedError(body []byte) *openai.Error {
	if !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("data:")) {
		return nil
	}
	var tc openai.TokenCounter
	for rest := body; ; {
		n := openai.EventLen(rest)
		if n < 0 {
			return nil
		}
		ev := openai.Event(rest[:n])
		rest = rest[n:]
		tc.Observe(ev)
		if status, ok := tc.EngineError(); ok {
			return openai.EngineErrorEvent(ev, status)
		}
	}
}

// prefillAnswered is the client's error for a prefill leg the pod
// answered with status: the pod's own words, cut.
func prefillAnswered(status int, body []byte) *openai.Error {
	typ := openai.TypeServer
	if status < 500 {
		typ = openai.TypeInvalidRequest
	}
	const limit = 512
	if len(body) > limit {
		body = body[:limit]
	}
	return &openai.Error{Status: status, Type: typ, Message: "The prefill pod answered " + strconv.Itoa(status) + ": " + string(body)}
}

// sequentialDecode sends the decode leg after a prefill leg that answered,
// moving it to another decode pod while pods refuse the connection, and
// relays the answer.
func (c *Call) sequentialDecode() *fail.Failure {
	for {
		c.host.TakeDecode()
		dec := c.Dec
		up, resp := c.host.Upstream(dec), fasthttp.AcquireResponse()
		up.SetBodyRaw(c.decBody)
		// Streamed even for a whole answer: the watchdog times its reads.
		resp.StreamBody = true
		var err error
		c.firstN, err = c.fleet.Send(c.gone, nil, dec, up, resp, c.decodeHeadersBy(), c.firstOf(c.first[:]))
		fasthttp.ReleaseRequest(up)
		if err == nil {
			c.Ticket.Done()
			c.respond(resp, c.first[:c.firstN])
			return nil
		}
		fasthttp.ReleaseResponse(resp)
		dec.Release(c.seqs)
		if err == upstream.ErrCut {
			return c.dropPair(nil, fail.ClientLeft)
		}
		if c.moveDecode(dec, err) {
			continue
		}
		return c.dropPair(nil, c.decodeFailure(err))
	}
}

// moveDecode counts a decode leg that failed on dec (err) and moves it to
// another decode pod if dec never received it and the host allows a
// retry and has a pod. A leg dec received may have read the prefill's KV,
// which the prefill pod then frees (vLLM's NIXL, SGLang's bootstrap), so
// another decode pod cannot count on it: its failure goes back to the
// host, which may retry the whole pair.
func (c *Call) moveDecode(dec *pool.Pod, err error) bool {
	c.fleet.CallFailed(dec, err)
	c.host.Tried(dec)
	f := c.fleet.PodFailure(dec, err, c.fleet.ResponseTimeout(c.stream))
	return f.Reason == fail.Refused && c.host.MoveDecode(f)
}

// firstOf is where a decode leg reads a stream's first body bytes, with
// its head: engines send a stream's head before they pull the KV, and the
// client is answered nothing until its first event, so a prefill leg or
// watchdog that fails first still gets the client a clean error. Nil
// for a whole answer, whose body is read whole.
func (c *Call) firstOf(buf []byte) []byte {
	if !c.stream {
		return nil
	}
	return buf
}

// decodeHeadersBy is the deadline of the decode leg's response headers
// and a stream's first event (and, without a stream, its whole body): the
// watchdog's first-response bound for a stream, its response bound
// without one, else the upstream's (ResponseTimeout).
func (c *Call) decodeHeadersBy() time.Time {
	limit := c.watchdogLimit()
	c.watched = limit > 0
	if !c.watched {
		return time.Now().Add(c.fleet.ResponseTimeout(c.stream))
	}
	return c.firstBy(limit)
}

// watchdogLimit is how long after the prefill's success the decode leg
// may take to answer: its first chunk for a stream, its whole answer
// otherwise (0: no bound).
func (c *Call) watchdogLimit() time.Duration {
	if c.stream {
		return c.Opts.DecodeFirstResponseTimeout
	}
	return c.Opts.DecodeResponseTimeout
}

// decodeFailure is the client's error for a decode leg that got no
// response headers: the watchdog's 504 when its deadline passed.
func (c *Call) decodeFailure(err error) *fail.Failure {
	if c.watched && pool.IsTimeout(err) {
		return c.watchdog(err)
	}
	f := c.fleet.PodFailure(c.Dec, err, c.fleet.ResponseTimeout(c.stream))
	f.PDHeader = HeaderDecodeError
	return f
}

// respond relays the decode leg's answer, and a stream's first body
// bytes read already, with the pair's headers.
func (c *Call) respond(resp *fasthttp.Response, first []byte) {
	if conn := upstream.ConnOf(resp); conn != nil && !c.stream && c.Opts.DecodeResponseTimeout > 0 {
		// The whole body is due within the watchdog's bound of the
		// prefill's success, which a concurrent prefill leg may have
		// reported only after the headers' deadline was set.
		c.watched = true
		_ = conn.SetReadDeadline(c.firstBy(c.Opts.DecodeResponseTimeout))
	}
	c.ctx.Response.Header.Set(HeaderPrefillPod, c.Pre.Config.Name)
	c.ctx.Response.Header.Set(HeaderDecodePod, c.Dec.Config.Name)
	c.host.Respond(c.Dec, resp, first)
}

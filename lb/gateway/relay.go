package gateway

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/fail"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// respond relays pod's response, whose headers are in, to the client and
// finishes the request.
func (g *Gateway) respond(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, pod *pool.Pod, resp *fasthttp.Response) {
	// Headers are in: from here on the pod owes the client this response.
	status := resp.StatusCode()
	switch {
	case !x.reachesEngine(), !x.req.Kind.Generates() && status < 500 && status >= 300:
		// The API server answered without the engine (a tokenization,
		// an API the pod does not serve): whether the engine works, the
		// requests that reach it say; nor does this end the probe of a
		// pod ejected.
	case fail.IsFault(status):
		g.podFailed(pod)
	case status < 500:
		pod.ReportSuccess()
	}
	answerHead(ctx, resp, x, pod.Config.Name)
	x.responding(pod)
	g.stored(x, m, pod, status)

	if x.req.Stream && status == fasthttp.StatusOK {
		g.keepLogHead(ctx, x)
		// x.times is zero: releaseCompletion clears it.
		x.modelStats = g.metrics.model(m)
		x.via.relay(x, pod, resp)
		return
	}
	// A whole response: read it all before answering, so a pod that breaks
	// midway still gets the client a clean 502 instead of a truncated body.
	// The client read it already unless the request asked for a stream (an
	// error answer to a stream, or a PD decode leg).
	var err error
	if resp.IsBodyStream() {
		buf := relayBufs.Get().(*[relayBufferBytes]byte)
		err = upstream.ReadWhole(ctx.Response.BodyWriter(), resp.BodyStream(), g.cfg.Upstream.MaxResponseBytes, buf[:])
		relayBufs.Put(buf)
	} else {
		ctx.Response.SetBody(resp.Body())
	}
	if err != nil {
		upstream.CloseStream(resp, err)
		ctx.Response.ResetBody()
		if x.pd == nil || x.pd.PrefillCut() == nil {
			// Not when a failed prefill leg cut the read: the pod did not fail.
			g.callFailed(pod, err, x.reachesEngine())
		}
		f := g.streamFailure(x, err)
		writeFailure(ctx, f)
		x.failure, status = f.E, f.E.Status
	} else if status == fasthttp.StatusOK && x.req.Kind.Outputs() {
		// Its usage is the output the API key's token bucket and
		// pdlb_completion_tokens_total are charged.
		x.counted.ObserveBody(ctx.Response.Body())
	}
	g.finish(x, m, pod, resp, status)
}

// answerHead gives ctx's client resp's status and the pod's header (x's
// head lines when the loop scanned them, else resp's), less the fields
// answerField drops and those its Connection nominates; x-pdlb-pod names
// pod, and X-Request-Id is the request's, whatever the pod sent.
func answerHead(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, x *completion, pod string) {
	ctx.SetStatusCode(resp.StatusCode())
	// Only the pod's Content-Type, as behind nginx: not fasthttp's
	// default (text/plain) where the pod sent none.
	ctx.Response.Header.SetNoDefaultContentType(true)
	cors, keyed := x.g.corsPolicy.on, len(x.rateHead) > 0
	if x.head.Raw {
		passHead(ctx, &x.head, pod, x.reqID, x.rateHead, cors)
		return
	}
	// Else its visit yields fasthttp's default Content-Type.
	resp.Header.SetNoDefaultContentType(true)
	var nominated []byte // as in buildUpstream
	resp.Header.VisitAll(func(k, v []byte) {
		if answerField(k, cors, keyed) {
			ctx.Response.Header.AddBytesKV(k, v)
		} else if nominatesIn(k, v) {
			nominated = append(append(nominated, v...), ',')
		}
	})
	if nominated != nil {
		eachNominated(nominated, func(k []byte) {
			// The pod's fields only: what the gateway set stays, as on
			// the loop, where the pod's lines are filtered apart.
			if answerField(k, cors, keyed) {
				ctx.Response.Header.DelBytes(k)
			}
		})
	}
	ctx.Response.Header.Set(headerPod, pod)
	ctx.Response.Header.SetBytesV(headerRequestID, x.reqID)
	addFields(ctx, x.rateHead)
}

// addFields adds header lines (name: value CRLF each) to ctx's answer.
func addFields(ctx *fasthttp.RequestCtx, lines []byte) {
	upstream.EachField(lines, func(k, v, _ []byte) { ctx.Response.Header.AddBytesKV(k, v) })
}

// passHead gives ctx's client the pod's header lines that answerField
// (with cors, and keyed when rate is not empty) and the pod's Connection
// leave, byte for byte, then x-pdlb-pod, X-Request-Id and the lines of
// rate (the key's rate-limit fields); head's lines are filtered in place.
func passHead(ctx *fasthttp.RequestCtx, head *upstream.AnswerHead, pod string, id, rate []byte, cors bool) {
	kept, keyed := head.Lines[:0], len(rate) > 0
	var nominated []byte
	upstream.EachField(head.Lines, func(k, v, line []byte) {
		if answerField(k, cors, keyed) {
			kept = append(kept, line...)
		} else if nominatesIn(k, v) {
			nominated = append(append(nominated, v...), ',')
		}
	})
	if nominated != nil {
		rest := kept
		kept = kept[:0]
		upstream.EachField(rest, func(k, _, line []byte) {
			if !namedIn(nominated, k) {
				kept = append(kept, line...)
			}
		})
	}
	kept = append(append(append(kept, headerPod+": "...), pod...), "\r\n"...)
	kept = append(append(append(kept, headerRequestID+": "...), id...), "\r\n"...)
	kept = append(kept, rate...)
	head.Lines = kept
	if !frontend.PassHead(ctx, kept) {
		addFields(ctx, kept)
	}
}

// answerField reports whether a pod's header field named k goes on to the
// client: not the hop-by-hop ones, nor the engine's Server (uvicorn under
// vLLM and SGLang), which stays behind as nginx and Envoy keep their
// upstreams' to themselves, nor the pod's Date (the answer's is the
// gateway's, as behind nginx), nor those the gateway sets itself
// (X-Request-Id, x-pdlb-*, with cors on the Access-Control-* ones, and
// when keyed, for a key with rate limits, the rate-limit fields).
func answerField(k []byte, cors, keyed bool) bool {
	switch {
	case isHopByHop(k):
		return false
	case keyed && rateLimitField(k):
		return false
	case cors && len(k) > len(accessControl) && (k[0]|0x20) == 'a' && bytes.EqualFold(k[:len(accessControl)], accessControl):
		return false
	case len(k) == len(server) && bytes.EqualFold(k, server),
		len(k) == len(date) && bytes.EqualFold(k, date),
		len(k) == len(requestID) && bytes.EqualFold(k, requestID),
		len(k) >= len(pdlbPrefix) && (k[0]|0x20) == 'x' && bytes.EqualFold(k[:len(pdlbPrefix)], pdlbPrefix):
		return false
	}
	return true
}

// nominatesIn reports whether the field k: v is a Connection header that
// nominates others (hop-by-hop too).
func nominatesIn(k, v []byte) bool {
	return len(k) == len(connection) && bytes.EqualFold(k, connection) && nominates(v)
}

// relay copies the SSE stream of resp to the client event by event as it
// arrives and returns the status to count: 200, 499 when the client went
// away, or the error status of a stream that broke (the client still saw
// 200, then an error event).
//
// Only whole events are written, so a stream that breaks midway never leaves
// half an event in front of the error event. Nothing is decoded, and token
// counting scans the bytes in place.
//
// A stream spends nearly all its life waiting for the pod's next event, and
// thousands wait at once, so it waits holding no buffer: it reads one byte
// into the completion, and only when that byte begins an event does it take a
// pooled relay buffer for the rest of what arrived, which goes back once
// the events in it are written. The writer's buffer, likewise, is held only
// from an event's Write to the Flush, which comes before the relay waits
// for the pod again (BeforeRead).
//
// client (frontend.ClientCut, nil where the front end has none) cuts the
// wait for the pod when the client leaves: a pod still prefilling has
// sent its head and nothing more for a while, and no write to the client
// would find it gone before the first token.
func (g *Gateway) relay(w *frontend.StreamWriter, resp *fasthttp.Response, x *completion, pod *pool.Pod, client upstream.Cut) int {
	conn := upstream.ConnOf(resp)
	x.client = clientLeft{conn: conn}
	if conn != nil {
		abortCut{g}.Watch((*wakeRead)(conn))
		defer abortCut{g}.Unwatch((*wakeRead)(conn))
		if client != nil {
			client.Watch(&x.client)
			defer client.Unwatch(&x.client)
		}
		// The events the pod's bytes made go out when its connection
		// is read again (BeforeRead), not at every read of the stream:
		// a read of the stream is one HTTP chunk, which an engine makes
		// of each event.
		x.out = w
		conn.SetReadHook(x)
		defer conn.SetReadHook(nil)
	}
	stream := resp.BodyStream()
	t := &x.times
	for {
		n, err := x.primed, error(nil)
		if n > 0 {
			x.primed = 0
		} else {
			n, err = g.readUpstream(stream, x.wait[:])
		}
		if n > 0 {
			t.started = true
			werr := g.pass(w, x.wait[:n], x, pod)
			// The byte began an event, or continued one, that needs more:
			// block for it with a buffer. Had it ended one, the event
			// goes out first, and the relay waits bufferless again.
			if werr == nil && err == nil && len(x.events.Pending()) > 0 {
				buf := relayBufs.Get().(*[relayBufferBytes]byte)
				if n, err = g.readUpstream(stream, buf[:]); n > 0 {
					werr = g.pass(w, buf[:n], x, pod)
				}
				relayBufs.Put(buf)
			}
			if werr == nil && conn == nil {
				werr = w.Flush()
			}
			if werr != nil {
				upstream.CloseStream(resp, werr)
				return fail.StatusClientClosed
			}
			if err == nil {
				err = x.events.Err()
			}
		}
		if err == io.EOF && !x.cutShort() {
			break
		}
		if err == io.EOF {
			// A pod's stream without length ends at its close, and a
			// chunked one can end early: the pod cut it.
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			upstream.CloseStream(resp, err)
			// The events gathered go out before the stream's end; a
			// flush that failed (here or in BeforeRead) is the client's.
			if x.client.left.Load() || w.Flush() != nil {
				return fail.StatusClientClosed
			}
			return g.relayBroke(w, x, err)
		}
	}
	return g.relayEnded(x, pod)
}

// BeforeRead runs before each read of a worker relay's pod connection
// (upstream.ReadHook): what the bytes read so far made goes to the
// client, and the pod's time to send more starts again. The deadline is
// moved only now and then (the pod connection sets it a 64th late and
// keeps it while later ones fit under it, so a stream is cut at most that
// late); a PD decode leg's deadline is its own. The shutdown and the
// client's leaving are asked after the deadline moved: a cut that came
// before the move set a deadline the move undid.
func (x *completion) BeforeRead() error {
	if err := x.out.Flush(); err != nil {
		return err
	}
	g := x.g
	deadline := time.Now().Add(g.cfg.Upstream.StreamIdleTimeout)
	if x.pd != nil {
		deadline = x.pd.ReadDeadline(deadline, x.times.started)
	}
	_ = x.client.conn.SetReadDeadline(deadline)
	if g.aborting.Load() {
		return errShuttingDown
	}
	if x.client.left.Load() {
		return frontend.ErrClientGone
	}
	return nil
}

// cutShort says a stream whose body ended cleanly was cut all the same:
// midway through an event, or before the [DONE] engines end every
// completion's and transcription's stream with, a Messages stream's
// message_stop or a Responses API stream's response.completed (the kinds
// whose events the counter sees: EndMarked), unless the engine's own error
// event ended it: vLLM's Messages stream has no message_stop after one.
func (x *completion) cutShort() bool {
	if x.events.Cut() {
		return true
	}
	_, failed := x.counted.EngineError()
	return x.req.Kind.EndMarked() && !x.counted.Done() && !failed
}

// relayBroke ends a stream that broke with err with an error event and
// returns the status to count.
func (g *Gateway) relayBroke(w *frontend.StreamWriter, x *completion, err error) int {
	e := g.streamFailure(x, err).E
	x.failure = e
	buf := relayBufs.Get().(*[relayBufferBytes]byte)
	// In the shape of the stream's API, which its clients parse.
	switch {
	case x.req.Kind == openai.KindMessages:
		_, _ = w.Write(openai.AppendMessagesErrorEvent(buf[:0], e))
	case x.req.Kind.StreamsResponses():
		_, _ = w.Write(openai.AppendResponsesErrorEvent(buf[:0], e, x.nextSeq))
	default:
		_, _ = w.Write(openai.AppendErrorEvent(buf[:0], e))
	}
	relayBufs.Put(buf)
	_ = w.Flush()
	return e.Status
}

// relayEnded ends a stream that ran to its end and returns the status to
// count: 200, having learned the stream's TPOT; or, when the engine's own
// error event ended it, that event's status (the client got the event as
// the pod sent it), a 5xx counting against the pod.
func (g *Gateway) relayEnded(x *completion, pod *pool.Pod) int {
	if status, failed := x.counted.EngineError(); failed {
		if fail.IsFault(status) {
			g.podFailed(pod)
		}
		return status
	}
	t := &x.times
	// The choices' tokens come interleaved, a step's worth at a time: n
	// for each prompt of a completion batch, so each choice's count times
	// the prompts times n.
	if n := float64(x.counted.Tokens()) / float64(x.sequences()); n > 1 && x.req.Kind.Outputs() {
		tpot := t.last.Sub(t.first).Seconds() / (n - 1)
		x.modelStats.tpot.Update(tpot)
		// The pod's step time at its batch teaches its TPOT line, which
		// admission predicts from.
		batch, _ := g.decodeBatch(pod)
		pod.DecodeLine().Observe(max(batch, 1), tpot)
		if g.admit != nil {
			g.admit.Observe(x.class, t.first.Sub(x.start).Seconds(), tpot)
		}
	}
	return fasthttp.StatusOK
}

// Body relays the pod's next bytes of a stream on the event loop
// (frontend.Sink).
func (x *completion) Body(w *frontend.StreamWriter, p []byte) error {
	g := x.g
	if g.aborting.Load() {
		return errShuttingDown
	}
	x.times.started = true
	if err := g.pass(w, p, x, x.pod); err != nil {
		return err
	}
	return x.events.Err()
}

// End ends a stream relayed on the event loop (frontend.Sink).
func (x *completion) End(w *frontend.StreamWriter, err error) {
	g := x.g
	switch {
	case err == nil && x.cutShort():
		err = io.ErrUnexpectedEOF
	case errors.Is(err, frontend.ErrAborted):
		// AbortStreams' (the server aborts the loops' relays with it).
		err = errShuttingDown
	}
	var code int
	switch {
	case err == nil:
		code = g.relayEnded(x, x.pod)
	case errors.Is(err, frontend.ErrClientGone):
		code = fail.StatusClientClosed
	default:
		code = g.relayBroke(w, x, err)
	}
	g.finish(x, x.m, x.pod, x.resp, code)
}

// relayBufferBytes is the most one upstream read relays at once. Engines
// send an event of a few hundred bytes at a time, and an event larger than
// the buffer is reassembled by the SSE splitter.
const relayBufferBytes = 8 << 10

var relayBufs = sync.Pool{New: func() any { return new([relayBufferBytes]byte) }}

// tokenTimes is what a relay learns of its stream's timing: whether any
// byte arrived, and when the first and the latest token events did.
type tokenTimes struct {
	started     bool
	first, last time.Time
}

// wakeRead is a relay's pod connection as what the abort Cut cuts: its
// read is woken, and readUpstream ends the stream.
type wakeRead upstream.Conn

func (c *wakeRead) Cut() { _ = (*upstream.Conn)(c).SetReadDeadline(time.Now()) }

// clientLeft is a relay's pod connection as what its client's leaving
// cuts: left is set and the read woken, and the relay ends the stream as
// the client's (499), not the pod's failure. Its zero value is cut by
// nothing.
type clientLeft struct {
	conn *upstream.Conn
	left atomic.Bool
}

func (c *clientLeft) Cut() {
	c.left.Store(true)
	(*wakeRead)(c.conn).Cut()
}

// readUpstream reads the pod's next bytes into b for a relay. Once
// Shutdown's grace is over it ends the stream instead, dropping what it
// read, rather than let the stream run on or cut it mid-event. Before the
// pod's socket is read, BeforeRead ends the stream once the grace is over
// or the client left.
func (g *Gateway) readUpstream(stream io.Reader, b []byte) (int, error) {
	n, err := stream.Read(b)
	if g.aborting.Load() {
		return 0, errShuttingDown
	}
	return n, err
}

// pass feeds the pod's bytes b to the stream's SSE splitter and writes every
// event they complete, unchanged, counting tokens on the way (of the kinds
// whose output is counted: a stored response's retrieval replays one
// counted when it was made) and noting the end marker and the engine's
// error event (EndMarked). It returns the client's write error.
func (g *Gateway) pass(w *frontend.StreamWriter, b []byte, x *completion, pod *pool.Pod) error {
	t := &x.times
	if err := writeExplain(w, x); err != nil {
		return err
	}
	x.events.Feed(b)
	// The events in b arrived together: one clock read times them all.
	var now time.Time
	for {
		ev, ok := x.events.Next()
		if !ok {
			return nil
		}
		before := x.counted.Tokens()
		_, failed := x.counted.EngineError()
		switch {
		case x.req.Kind.Outputs():
			x.counted.Observe(ev)
		case x.req.Kind.EndMarked():
			x.counted.ObserveEnd(ev)
		}
		if status, now := x.counted.EngineError(); now && !failed {
			x.failure = openai.EngineErrorEvent(ev, status)
		}
		x.tr.event(ev)
		if x.req.Kind.StreamsResponses() {
			if n, ok := ev.SequenceNumber(); ok {
				x.nextSeq = n + 1
			}
		}
		if x.counted.Tokens() > before && x.req.Kind.Outputs() {
			if now.IsZero() {
				now = time.Now()
			}
			t.last = now
			if t.first.IsZero() {
				t.first = t.last
				g.prefillDone(x, pod, t.first)
				if x.pd != nil {
					x.pd.FirstToken(t.first)
				}
				x.tr.firstToken(t.first)
				x.modelStats.ttft.Update(t.first.Sub(x.start).Seconds())
			}
		}
		if x.counted.UsageOnly() && x.req.UsageHidden() {
			continue // the gateway asked for it (parse)
		}
		if _, err := w.Write(ev); err != nil {
			return err
		}
	}
}

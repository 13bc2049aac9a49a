package gateway

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/frontend"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
)

// The access log: one JSON object per request, written when its answer is
// done (config access_log). The line is built on the stack, with no
// allocation, and handed to the log's buffer; see lb/accesslog.

// lineBytes is the stack buffer a line is built in; a longer one (a long
// path or error message) spills to the heap.
const lineBytes = 768

// logCompletion writes the line of completion request x, answered with
// status; pod is the pod that answered (nil when none did), e the error the
// gateway answered with itself, if any. ctx is x's request, unless a
// stream's relay ends it: that may not touch ctx, and keepLogHead kept
// what the line needs of it.
func (g *Gateway) logCompletion(ctx *fasthttp.RequestCtx, x *completion, pod *pool.Pod, status int, e *openai.Error) {
	if g.access == nil {
		return
	}
	var buf [lineBytes]byte
	now := time.Now()
	b := appendTime(buf[:0], now)
	if len(x.logHead) > 0 {
		b = append(b, x.logHead...)
	} else {
		b = appendWhat(appendWho(b, ctx, x.reqID), ctx)
	}
	b = appendInt(b, "status", status)
	b = appendMillis(b, "duration_ms", now.Sub(x.start))
	b = appendBytesField(b, "model", x.req.Model)
	if x.served != "" {
		b = appendField(b, "served_model", x.served)
	}
	b = strconv.AppendBool(appendName(b, "stream"), x.req.Stream)
	if x.found != nil {
		b = appendField(b, "api_key", x.found.Name)
	}
	if pod != nil {
		b = appendField(b, "pod", pod.Config.Name)
		if x.pd != nil && x.pd.Pre != nil && x.pd.Pre != pod {
			b = appendField(b, "prefill_pod", x.pd.Pre.Config.Name)
		}
	}
	b = appendInt(b, "attempts", x.attempts)
	if len(x.retriedFrom) > 0 {
		b = appendRetried(b, x.retriedFrom)
	}
	b = appendInt(b, "prompt_tokens", x.req.PromptTokens())
	if pod != nil {
		b = appendInt(b, "cached_tokens", x.chosen.CachedTokens)
		b = appendInt(b, "completion_tokens", int(x.counted.Tokens()))
	}
	if !x.times.first.IsZero() {
		b = appendMillis(b, "ttft_ms", x.times.first.Sub(x.start))
	}
	if x.predictedTTFT > 0 {
		b = appendMillis(b, "predicted_ttft_ms", time.Duration(x.predictedTTFT*float64(time.Second)))
	}
	if e != nil {
		b = appendField(b, "error", e.Message)
	}
	g.access.Write(append(b, '}'))
}

// appendRetried appends the attempts that failed and were retried, as
// nginx's $upstream_addr and $upstream_status list them: each one's pod,
// its pdlb_upstream_retries_total reason and its error.
func appendRetried(b []byte, fs []*failure) []byte {
	b = append(appendName(b, "retried"), '[')
	for i, f := range fs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		b = openai.AppendJSONString(append(b, `"pod":`...), f.Pod.Config.Name)
		b = openai.AppendJSONString(append(b, `,"reason":`...), string(f.Reason))
		b = openai.AppendJSONString(append(b, `,"error":`...), f.E.Message)
		b = append(b, '}')
	}
	return append(b, ']')
}

// keepLogHead keeps in x what its access log line needs of ctx, before a
// stream's relay, which may not touch ctx, begins.
func (g *Gateway) keepLogHead(ctx *fasthttp.RequestCtx, x *completion) {
	if g.access != nil {
		x.logHead = appendWhat(appendWho(x.logHead[:0], ctx, x.reqID), ctx)
	}
}

// logPlain writes the line of a request answered without a completion:
// /v1/models, /health, a wrong path or method, too many headers; e is the
// error it was answered with, if any. start is when it began, zero for a
// request the front end could not read: its method and path are unknown.
func (g *Gateway) logPlain(ctx *fasthttp.RequestCtx, start time.Time, e *openai.Error) {
	if g.access == nil {
		return
	}
	var buf [lineBytes]byte
	now := time.Now()
	b := appendWho(appendTime(buf[:0], now), ctx, ctx.Request.Header.Peek(headerRequestID))
	if !start.IsZero() {
		b = appendWhat(b, ctx)
	}
	b = appendInt(b, "status", ctx.Response.StatusCode())
	if !start.IsZero() {
		b = appendMillis(b, "duration_ms", now.Sub(start))
	}
	if e != nil {
		b = appendField(b, "error", e.Message)
	}
	g.access.Write(append(b, '}'))
}

// appendTime opens a line with now, in UTC to the millisecond
// ("2026-12-02T17:07:31.042Z"). The text up to the second is formatted
// once a second and shared, as nginx caches its log's time: formatting a
// time is the costliest part of a line.
func appendTime(b []byte, now time.Time) []byte {
	now = now.UTC()
	sec := now.Unix()
	c := logSecond.Load()
	if c == nil || c.unix != sec {
		c = &secondText{unix: sec, text: now.AppendFormat(nil, "2006-01-02T15:04:05")}
		logSecond.Store(c)
	}
	b = append(append(b, `{"time":"`...), c.text...)
	return append(appendThousandths(b, int64(now.Nanosecond()/int(time.Millisecond))), 'Z', '"')
}

// appendThousandths appends n, 0 to 999, as a fraction's three digits
// after its point.
func appendThousandths(b []byte, n int64) []byte {
	return append(b, '.', byte('0'+n/100), byte('0'+n/10%10), byte('0'+n%10))
}

// secondText is a second's time as the access log writes it; logSecond
// the last one formatted, replaced whole (lines are written on any
// goroutine).
type secondText struct {
	unix int64
	text []byte
}

var logSecond atomic.Pointer[secondText]

// appendWho appends the request's id and its client's address.
func appendWho(b []byte, ctx *fasthttp.RequestCtx, id []byte) []byte {
	b = appendBytesField(b, "request_id", id)
	if a, ok := frontend.ClientAddr(ctx); ok {
		b = append(appendName(b, "client"), '"')
		b = append(a.AppendTo(b), '"')
	}
	return b
}

// appendWhat appends the request's method and path.
func appendWhat(b []byte, ctx *fasthttp.RequestCtx) []byte {
	b = appendBytesField(b, "method", ctx.Method())
	return appendBytesField(b, "path", ctx.RequestURI())
}

// appendField appends ,"name":"value", escaped; nothing when value is empty.
func appendField(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	return openai.AppendJSONString(appendName(b, name), value)
}

// appendBytesField is appendField for a value in bytes.
func appendBytesField(b []byte, name string, value []byte) []byte {
	if len(value) == 0 {
		return b
	}
	return openai.AppendJSONBytes(appendName(b, name), value)
}

func appendInt(b []byte, name string, v int) []byte {
	return strconv.AppendInt(appendName(b, name), int64(v), 10)
}

// appendMillis appends d in milliseconds, to the microsecond ("812.402"),
// in integers, which cost less than formatting a float.
func appendMillis(b []byte, name string, d time.Duration) []byte {
	b = appendName(b, name)
	us := d.Microseconds()
	if us < 0 {
		b, us = append(b, '-'), -us
	}
	return appendThousandths(strconv.AppendInt(b, us/1000, 10), us%1000)
}

// appendName appends ,"name": to a line.
func appendName(b []byte, name string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

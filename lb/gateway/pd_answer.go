package gateway

import (
	"github.com/valyala/fasthttp"

	"pdlb/lb/openai"
	"pdlb/lb/pd"
	"pdlb/lb/pool"
)

// answerFromPrefill answers x with the prefill leg's answer (a TensorRT-LLM
// context response that finished at its first token), as is; a streaming
// client gets it as the stream it asked for.
func (g *Gateway) answerFromPrefill(ctx *fasthttp.RequestCtx, x *completion, m *pool.Model, pre *pool.Pod, resp *fasthttp.Response) {
	p := x.pd
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.Set(headerPod, pre.Config.Name)
	ctx.Response.Header.Set(pd.HeaderPrefillPod, pre.Config.Name)
	ctx.Response.Header.SetBytesV(headerRequestID, ctx.Request.Header.Peek(headerRequestID))
	status := fasthttp.StatusOK
	if !x.req.Stream {
		ctx.SetContentType("application/json")
		ctx.SetBody(p.preResp)
	} else if body, err := pd.AppendAnswerSSE(nil, p.preResp, x.req.Kind == openai.KindChat, x.req.IncludeUsage); err != nil {
		e := openai.UpstreamError("the context pod's final answer does not parse: " + err.Error())
		writeFailure(ctx, answer(e))
		x.failure, status = e, e.Status
	} else {
		ctx.SetContentType("text/event-stream; charset=utf-8")
		ctx.SetBody(body)
	}
	g.finish(x, m, pre, resp, status)
}

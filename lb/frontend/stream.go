package frontend

import "github.com/valyala/fasthttp"

// SetBodyStreamWriter makes sw write ctx's response body, as
// ctx.SetBodyStreamWriter does, on either front end. On the gnet front end
// sw runs on the connection's worker and its bufio.Writer flushes straight
// into HTTP chunks on the socket; fasthttp's own SetBodyStreamWriter runs sw
// in a goroutine of its own and copies its output through an in-memory
// pipe, which is what the fasthttp front end does with it too.
func SetBodyStreamWriter(ctx *fasthttp.RequestCtx, sw fasthttp.StreamWriter) {
	if gc, ok := ctx.Conn().(*gconn); ok {
		gc.stream = sw
		return
	}
	ctx.SetBodyStreamWriter(sw)
}

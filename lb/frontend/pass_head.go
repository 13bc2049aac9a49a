package frontend

import (
	"github.com/valyala/fasthttp"
)

// PassHead gives ctx's answer lines, header lines each "name: value\r\n",
// as they are, after the fields its header holds, when it is next
// rendered; lines must not repeat those fields, and ctx's header must not
// default its Content-Type (SetNoDefaultContentType). False when ctx's
// front end cannot (fasthttp's server): the caller adds them to the
// header instead.
func PassHead(ctx *fasthttp.RequestCtx, lines []byte) bool {
	switch c := ctx.Conn().(type) {
	case *gconn:
		c.pass, c.passFor = append(c.pass[:0], lines...), ctx
	case *h2Stream:
		// A stream has one request: no ctx to tell apart.
		c.pass = append(c.pass[:0], lines...)
	default:
		return false
	}
	return true
}

// appendHead renders ctx's header block into gc.out, with the lines
// PassHead gave it.
func (gc *gconn) appendHead(ctx *fasthttp.RequestCtx) {
	gc.out = ctx.Response.Header.AppendBytes(gc.out[:0])
	if gc.passFor == ctx {
		// Before the blank line that ends the block.
		gc.out = append(append(gc.out[:len(gc.out)-2], gc.pass...), crlf...)
	}
	gc.passFor = nil
}

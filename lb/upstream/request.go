package upstream

import "github.com/valyala/fasthttp"

// AppendRequest appends req as fasthttp's Request.Write would send it,
// directly rather than through a pooled bufio.Writer: req's body is in
// memory (the gateway's are) and it has no trailers. The Host header and
// the request target go as req's header holds them; only a request
// without a Host header takes both from its URI.
func AppendRequest(dst []byte, req *fasthttp.Request) []byte {
	h := &req.Header
	if len(h.Host()) == 0 {
		uri := req.URI()
		uri.DisablePathNormalizing = true
		h.SetHostBytes(uri.Host())
		h.SetRequestURIBytes(uri.RequestURI())
	}
	body := req.Body()
	if len(body) > 0 || !(h.IsGet() || h.IsHead()) {
		h.SetContentLength(len(body))
	}
	return append(h.AppendBytes(dst), body...)
}

package frontend_test

import (
	"io"
	"strings"
	"testing"

	"pdlb/lb/frontend"
)

// BenchmarkH2Requests times small requests over one h2c connection to the
// gnet front end, from one stream at a time per GOMAXPROCS or sixteen:
// with many, streams share the connection's writes.
func BenchmarkH2Requests(b *testing.B) {
	addr := serveWith(b, frontend.NameGNet, newApp().handler(), frontend.Options{MaxBodyBytes: testMaxBody})
	c := h2Client(nil)
	for _, streams := range []int{1, 16} {
		b.Run(map[int]string{1: "streams=1", 16: "streams=16"}[streams], func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(streams)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Post("http://"+addr+"/echo", "text/plain", strings.NewReader("x"))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

package frontend_test

import (
	"bytes"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/racebuild"
	"pdlb/lb/frontend"
	"pdlb/lb/openai"
)

// relayEvents is an upstream stream: completion chunks as vLLM sends them.
var relayEvents = func() [][]byte {
	evs := make([][]byte, 4096)
	for i := range evs {
		evs[i] = fmt.Appendf(nil, `data: {"id":"cmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok%d"},"finish_reason":null}]}`+"\n\n", i)
	}
	return evs
}()

// relay is the gateway's relay loop without the upstream socket: each
// upstream read brings one event, which goes through the SSE splitter and
// the token counter and is written and flushed to the client unchanged.
func relay(ctx *fasthttp.RequestCtx) {
	n := ctx.QueryArgs().GetUintOrZero("n")
	ctx.SetContentType("text/event-stream")
	frontend.SetBodyStreamWriter(ctx, func(w *frontend.StreamWriter) {
		var events openai.Splitter
		var tokens openai.TokenCounter
		for i := 0; i < n; i++ {
			events.Feed(relayEvents[i%len(relayEvents)])
			for {
				ev, ok := events.Next()
				if !ok {
					break
				}
				tokens.Observe(ev)
				if _, err := w.Write(ev); err != nil {
					return
				}
			}
			if err := w.Flush(); err != nil {
				return
			}
		}
	})
}

// TestRelayAllocs counts the heap allocations of the whole process (front
// end, stream writer, client) per relayed event: the difference between a
// long and a short stream, so what a stream costs once (its request
// context, the handler's closure, fasthttp's pipe) cancels out.
//
// None on either front end (on gnet, the loop's task queue holds its
// tasks by value; gnet v2.9.7's AsyncWritev allocated three).
func TestRelayAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts are the race detector's under -race")
	}
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, name, frontend.Handler{Serve: relay, Error: writeFrontError})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 64<<10)
			// The stream's last bytes, across reads.
			lastChunk := []byte("\r\n0\r\n\r\n")
			last := make([]byte, 0, 2*len(lastChunk))
			stream := func(n int) uint64 {
				req := []byte("GET /relay?n=" + strconv.Itoa(n) + " HTTP/1.1\r\nHost: x\r\n\r\n")
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				if _, err := c.Write(req); err != nil {
					t.Fatal(err)
				}
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
				for last = last[:0]; !bytes.HasSuffix(last, lastChunk); {
					k, err := c.Read(buf)
					if err != nil {
						t.Fatal(err)
					}
					last = append(last, buf[max(0, k-len(lastChunk)):k]...)
					last = append(last[:0], last[max(0, len(last)-len(lastChunk)):]...)
				}
				runtime.ReadMemStats(&after)
				return after.Mallocs - before.Mallocs
			}
			stream(100) // warms the pools
			const short, long = 200, 4200
			var best float64 = -1
			// The least of three: a stray allocation elsewhere in the
			// process (a timer, the runtime) lands in one run, not all.
			for range 3 {
				per := (float64(stream(long)) - float64(stream(short))) / (long - short)
				if best < 0 || per < best {
					best = per
				}
			}
			t.Logf("%.3f allocations per relayed event", best)
			if best > 0.05 {
				t.Fatalf("%.3f allocations per relayed event, want 0", best)
			}
		})
	}
}

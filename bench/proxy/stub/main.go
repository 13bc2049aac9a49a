// Command stub is the upstream of the proxy and SSE benchmarks: a fasthttp
// server that answers an OpenAI chat completion the way vLLM shapes it,
// without doing any work, so a benchmark measures the proxy in front of it
// and not the engine.
//
//   - POST /v1/chat/completions, /v1/completions: a fixed ~1 KB vLLM-shaped
//     completion; with "stream":true in the body, an SSE stream of
//     X-Stub-Events chunks (default --events), one every X-Stub-Interval
//     (default --interval), each stamped with "sent_ns", the wall-clock
//     nanoseconds just before the chunk was written, then "data: [DONE]".
//   - GET /health: 200.
//   - GET /metrics: vLLM's load gauges with static values, so a gateway's
//     health checks and scrapes see an idle pod.
//
// The request body is never parsed: the stub only looks for the stream flag,
// since a JSON decode per request would make the stub, not the proxy, the
// bottleneck of a benchmark on shared cores.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// completion is the non-streaming answer: a vLLM 0.x chat completion whose
// content pads the body to about 1 KB, the size the proxy benchmark names.
var completion = []byte(`{"id":"chatcmpl-stub","object":"chat.completion","created":1700000000,"model":"bench",` +
	`"choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":"` +
	strings.Repeat("lorem ipsum dolor sit amet ", 23) +
	`","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
	`"usage":{"prompt_tokens":256,"total_tokens":456,"completion_tokens":200,"prompt_tokens_details":null},` +
	`"prompt_logprobs":null,"kv_transfer_params":null}`)

// metrics is an idle vLLM pod's exposition, the names pdlb's scraper reads.
var metrics = []byte(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="bench"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="bench"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="bench"} 0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="bench"} 0
`)

var streamFlags = [][]byte{[]byte(`"stream":true`), []byte(`"stream": true`)}

// Chunk framing: the stamp sits between chunkHead and chunkTail, so a
// reader finds it at a fixed offset from "sent_ns":.
const (
	chunkHead = `data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":"bench","sent_ns":`
	chunkTail = `,"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	done      = "data: [DONE]\n\n"
)

type stub struct {
	events   int
	interval time.Duration
}

func (s *stub) serve(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/chat/completions", "/v1/completions":
		if !ctx.IsPost() {
			ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
			return
		}
		ctx.SetContentType("application/json")
		if isStream(ctx.PostBody()) {
			s.stream(ctx)
			return
		}
		ctx.SetBody(completion)
	case "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4")
		ctx.SetBody(metrics)
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
	}
}

func isStream(body []byte) bool {
	for _, f := range streamFlags {
		if bytes.Contains(body, f) {
			return true
		}
	}
	return false
}

// stream answers with the SSE chunks the request's X-Stub-* headers ask
// for. Each chunk is flushed on its own, as an engine sends each token.
func (s *stub) stream(ctx *fasthttp.RequestCtx) {
	events, interval := s.events, s.interval
	if v := ctx.Request.Header.Peek("X-Stub-Events"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 0 {
			ctx.Error("X-Stub-Events: not a count: "+string(v), fasthttp.StatusBadRequest)
			return
		}
		events = n
	}
	if v := ctx.Request.Header.Peek("X-Stub-Interval"); len(v) > 0 {
		d, err := time.ParseDuration(string(v))
		if err != nil || d < 0 {
			ctx.Error("X-Stub-Interval: not a duration: "+string(v), fasthttp.StatusBadRequest)
			return
		}
		interval = d
	}
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		buf := make([]byte, 0, len(chunkHead)+len(chunkTail)+20)
		t := time.NewTicker(max(interval, time.Microsecond))
		defer t.Stop()
		for i := 0; i < events; i++ {
			if i > 0 {
				<-t.C
			}
			buf = append(buf[:0], chunkHead...)
			buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
			buf = append(buf, chunkTail...)
			if _, err := w.Write(buf); err != nil {
				return
			}
			if err := w.Flush(); err != nil {
				return
			}
		}
		_, _ = w.WriteString(done)
		_ = w.Flush()
	})
}

func main() {
	fs := flag.NewFlagSet("stub", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:8001", "address to serve on")
	s := &stub{}
	fs.IntVar(&s.events, "events", 16, "chunks per stream when the request has no X-Stub-Events header")
	fs.DurationVar(&s.interval, "interval", 10*time.Millisecond, "gap between chunks when the request has no X-Stub-Interval header")
	_ = fs.Parse(os.Args[1:])
	srv := &fasthttp.Server{
		Handler:               s.serve,
		Name:                  "stub",
		NoDefaultServerHeader: true,
		// The SSE benchmark holds ten thousand streams on one stub.
		Concurrency: 1 << 20,
	}
	fmt.Fprintf(os.Stderr, "stub listening on %s\n", *listen)
	log.Fatal(srv.ListenAndServe(*listen))
}

package load

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/admit"
	"pdlb/lb/config"
)

// testSpeedup makes the sim pods' seconds shorter, yet keeps a decode step
// (10 ms simulated) longer than the pods' 2 ms tick, so tokens mostly
// reach the client in separate chunks and TPOT is measurable.
const testSpeedup = 2

// testFleet starts n sim pods of model m behind a gateway on loopback and
// returns the gateway's base URL and the pods' /metrics URLs.
func testFleet(t *testing.T, model string, n int) (target string, metrics []string) {
	t.Helper()
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", ""
	cfg.Health.Interval = 50 * time.Millisecond
	for i := range n {
		p, err := sim.Start(sim.Config{Name: fmt.Sprintf("%s-%d", model, i), Model: model, Listen: "127.0.0.1:0", Speedup: testSpeedup})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		cfg.Pods = append(cfg.Pods, config.Pod{Name: p.Config().Name, Model: model, Address: p.Addr()})
		metrics = append(metrics, "http://"+p.Addr()+"/metrics")
	}
	s, err := lb.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return "http://" + s.Addr(), metrics
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func mustWorkload(t *testing.T, spec WorkloadSpec) Workload {
	t.Helper()
	w, err := NewWorkload(spec)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestRunThroughGateway sends the multi-turn chat through a real gateway
// to sim pods and checks the report against what was sent, as chat
// completions, as Responses API requests and as Messages API requests.
func TestRunThroughGateway(t *testing.T) {
	for _, api := range []string{APIChat, APIResponses, APIMessages} {
		t.Run(api, func(t *testing.T) { runThroughGateway(t, api) })
	}
}

func runThroughGateway(t *testing.T, api string) {
	// One pod, so every system prompt misses once at most.
	target, metrics := testFleet(t, "m", 1)
	const n, out = 40, 16
	cfg := Config{
		Target: target, Body: BodyOptions{Model: "m", Stream: true, IgnoreEOS: true, API: api},
		Arrival: Constant, Rate: 50, Requests: n, Timeout: 10 * time.Second, Metrics: metrics,
	}
	rep, err := Run(context.Background(), cfg, mustWorkload(t, WorkloadSpec{Name: WorkloadSeedChat, OutputTokens: out, BatchFraction: 0.25}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != n || rep.OK != n || rep.Lost != 0 || len(rep.Errors) != 0 {
		t.Fatalf("requests %d ok %d lost %d errors %v, want %d all ok", rep.Requests, rep.OK, rep.Lost, rep.Errors, n)
	}
	classes := 0
	for _, c := range rep.Classes {
		classes += c.Requests
	}
	if classes != n || len(rep.Classes) != 2 {
		t.Fatalf("classes %+v do not add up to %d requests of both classes", rep.Classes, n)
	}
	for _, r := range rep.Results {
		if r.Tokens != out || r.Status != http.StatusOK {
			t.Fatalf("result %+v: want %d tokens and status 200", r, out)
		}
		if !(r.TTFT > 0 && r.TTFT < r.E2E) || !(r.TPOT >= 0) {
			t.Fatalf("result %+v: want 0 < TTFT < e2e and TPOT ≥ 0", r)
		}
	}
	// A client that lags reads several tokens at once (TPOT 0 if all), but
	// not most of the time.
	if rep.TTFT.N != n || rep.TPOT.N != n || !(rep.TPOT.P50 > 0) || !(rep.TTFT.P50 <= rep.TTFT.P99) || !(rep.TTFT.P99 < rep.E2E.Max) {
		t.Fatalf("quantiles TTFT %+v TPOT %+v e2e %+v", rep.TTFT, rep.TPOT, rep.E2E)
	}
	// Every session starts from one of 20 system prompts of 2,048 tokens,
	// each missing once at most: at least 20 of the 40 requests hit 2,048
	// of their fewer than 2,700 tokens.
	if rep.HitRate == nil || !(*rep.HitRate > 0.35 && *rep.HitRate <= 1) {
		t.Fatalf("hit rate %v (%s), want the system prompts cached", deref(rep.HitRate), rep.MetricsError)
	}

	dir := t.TempDir()
	paths, err := rep.WritePlots(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 4 {
		t.Fatalf("wrote %v, want 4 charts", paths)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: %d bytes, %v: want a PNG", p, len(b), err)
		}
	}
}

// TestRunErrors points runs at what cannot answer and checks every
// request is counted where it belongs.
func TestRunErrors(t *testing.T) {
	target, _ := testFleet(t, "m", 1)

	closed := closedTarget(t)

	// A server whose streams break: one token, then the connection closes
	// (lost) or an error event ends it (stream).
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"hi"}}]}`+"\n\n")
		if r.Header.Get(headerPriority) == admit.Batch.String() {
			io.WriteString(w, `data: {"error":{"message":"boom","code":500}}`+"\n\n")
			return
		}
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // cut the connection without ending the chunked body
	}))
	defer broken.Close()

	// A server that never answers in time.
	block := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(block)

	f := func(name, target, model string, batch float64, want map[string]int, wantLost int) {
		t.Helper()
		const n = 6
		cfg := Config{Target: target, Body: BodyOptions{Model: model, Stream: true}, Arrival: Closed, Concurrency: 3,
			Requests: n, Timeout: 300 * time.Millisecond}
		rep, err := Run(context.Background(), cfg, mustWorkload(t, WorkloadSpec{Name: WorkloadMixed, LongFraction: 0.01, OutputTokens: 4, BatchFraction: batch}))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sum := rep.OK + rep.Lost
		for _, v := range rep.Errors {
			sum += v
		}
		if rep.Requests != n || sum != n || rep.Lost != wantLost || fmt.Sprint(rep.Errors) != fmt.Sprint(want) {
			t.Fatalf("%s: requests %d ok %d lost %d errors %v; want %d requests, lost %d, errors %v", name, rep.Requests, rep.OK, rep.Lost, rep.Errors, n, wantLost, want)
		}
		for _, c := range rep.Classes {
			if c.Attainment != 0 {
				t.Fatalf("%s: class %+v: failed requests must count as misses", name, c)
			}
		}
	}
	f("unknown model", target, "no-such-model", 0, map[string]int{"404": 6}, 0)
	f("closed port", closed, "m", 0, map[string]int{"connect": 6}, 0)
	f("broken stream", broken.URL, "m", 0, map[string]int{}, 6)
	f("error event", broken.URL, "m", 1, map[string]int{"stream": 6}, 0)
	f("timeout", slow.URL, "m", 0, map[string]int{}, 6)
}

func TestConfigValidate(t *testing.T) {
	f := func(edit func(*Config), want bool) {
		t.Helper()
		c := Config{Arrival: Poisson, Rate: 1, Duration: time.Second}
		edit(&c)
		err := c.withDefaults().Validate()
		if (err == nil) != want {
			t.Fatalf("%+v: Validate() = %v, want ok %v", c, err, want)
		}
	}
	f(func(*Config) {}, true)
	f(func(c *Config) { c.Target = "http://localhost:8080/" }, true)
	f(func(c *Config) { c.Target = "http://[::1]:8080" }, true)
	f(func(c *Config) { c.Target = "http://10.0.0.5:8080" }, false)
	f(func(c *Config) { c.Target, c.AllowRemote = "http://10.0.0.5:8080", true }, true)
	f(func(c *Config) { c.Target = "127.0.0.1:8080" }, false)
	f(func(c *Config) { c.Targets = []string{"http://127.0.0.1:8081"} }, true)
	f(func(c *Config) { c.Targets = []string{"http://10.0.0.5:8080"} }, false)
	f(func(c *Config) { c.Target = "http://127.0.0.1:8080/v1" }, false)
	f(func(c *Config) { c.Rate = 0 }, false)
	f(func(c *Config) { c.Duration = 0 }, false)
	f(func(c *Config) { c.Duration, c.Requests = 0, 10 }, true)
	f(func(c *Config) { c.Duration, c.Arrival = 0, Replay }, true)
	f(func(c *Config) { c.Arrival = Closed }, false)
	f(func(c *Config) { c.Arrival, c.Concurrency = Closed, 4 }, true)
	f(func(c *Config) { c.Timeout = -time.Second }, false)
	f(func(c *Config) { c.SLO[admit.Batch].TTFT = 1 }, false) // interactive's TTFT left at 0
	f(func(c *Config) { c.Metrics = []string{"not a url"} }, false)
	f(func(c *Config) { c.Body.API = APIResponses }, true)
	f(func(c *Config) { c.Body.API = "completions" }, false)
}

func TestParseCacheCounters(t *testing.T) {
	text := []byte(`# HELP vllm:prefix_cache_hits_total hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m",engine="0"} 300
vllm:prefix_cache_queries_total{model_name="m",engine="0"} 1000
vllm:prefix_cache_queries_total{model_name="m",engine="1"} 1000
sglang:cached_tokens_total{model_name="m"} 50
sglang:prompt_tokens_total{model_name="m"} 100
vllm:prompt_tokens_total{model_name="m",engine="0"} 99999
garbage line
vllm:prefix_cache_hits_total nan-ish
`)
	c := parseCacheCounters(text)
	if c.hits != 350 || c.queries != 2100 {
		t.Fatalf("got %+v, want hits 350 queries 2100", c)
	}
	if r, ok := c.hitRateSince(cacheCounters{hits: 50, queries: 100}); !ok || r != 0.15 {
		t.Fatalf("hitRateSince = %v %v, want 0.15", r, ok)
	}
	if _, ok := c.hitRateSince(c); ok {
		t.Fatal("no queries between two equal scrapes must give no rate")
	}
}

// closedTarget is the base URL of a port that was free a moment ago:
// nothing listens there.
func closedTarget(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

// TestReadResponsesStream: a Responses stream is whole at its
// response.completed (named by its event line or by its data's type
// alone), a StreamError at the API's error or response.failed events, and
// lost when it ends before either.
func TestReadResponsesStream(t *testing.T) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	head := ev("response.created", `{"type":"response.created","response":{"status":"in_progress","usage":null}}`) +
		ev("response.output_text.delta", `{"delta":"Hi","type":"response.output_text.delta"}`) +
		ev("response.output_text.delta", `{"delta":" there","type":"response.output_text.delta"}`)
	done := `{"response":{"status":"completed","usage":{"input_tokens":9,"output_tokens":2}},"type":"response.completed"}`
	failed := `{"response":{"status":"failed","error":{"code":"server_error","message":"engine died"},"usage":{"input_tokens":9,"output_tokens":1}},"type":"response.failed"}`
	for _, c := range []struct {
		name, stream string
		want         Outcome
	}{
		{"completed", head + ev("response.completed", done), OK},
		{"completed, data only", head + "data: " + done + "\n\n", OK},
		{"cut", head, Lost},
		{"error event", head + ev("error", `{"type":"error","code":"server_error","message":"engine died"}`), StreamError},
		{"response.failed", head + ev("response.failed", failed), StreamError},
	} {
		var res Result
		readStream(strings.NewReader(c.stream), time.Now(), &res, true)
		if res.Outcome != c.want || c.want == OK && res.Tokens != 2 {
			t.Errorf("%s: outcome %v, %d tokens; want %v", c.name, res.Outcome, res.Tokens, c.want)
		}
	}
}

// TestReadMessagesStream: an Anthropic Messages stream is whole at its
// message_stop, failed at an error event, lost when it ends before
// either; its tokens are its text deltas until message_delta's usage.
func TestReadMessagesStream(t *testing.T) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	head := ev("message_start", `{"type":"message_start","message":{"id":"m","content":[],"usage":{"input_tokens":9,"output_tokens":0}}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":9,"output_tokens":2}}`)
	for _, c := range []struct {
		name, stream string
		want         Outcome
	}{
		{"stopped", head + ev("message_stop", `{"type":"message_stop"}`), OK},
		{"cut", head, Lost},
		{"error event", head + ev("error", `{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`), StreamError},
	} {
		var res Result
		readStream(strings.NewReader(c.stream), time.Now(), &res, true)
		if res.Outcome != c.want || res.Tokens != 2 {
			t.Errorf("%s: outcome %v, %d tokens; want %v, 2", c.name, res.Outcome, res.Tokens, c.want)
		}
	}
}

package gateway

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/accesslog"
	"pdlb/lb/config"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
)

// loggedCompletion is a finished streamed completion as the access log sees
// it, with a gateway whose log writes to a temporary file.
func loggedCompletion(t testing.TB) (*Gateway, *fasthttp.RequestCtx, *completion, *pool.Pod, string) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := accesslog.Open(path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := &Gateway{access: l}
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/chat/completions")
	req.Header.Set(headerRequestID, "req-1")
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
	x := acquireCompletion(time.Now())
	x.reqID = requestIDOf(x.reqID[:0], ctx, req.Header.Peek(headerRequestID))
	if err := x.req.Parse(openai.KindChat, []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"a \"quoted\" prompt"}]}`)); err != nil {
		t.Fatal(err)
	}
	x.tried, x.attempts = append(x.tried, 0), 1
	x.times.first = x.start.Add(5 * time.Millisecond)
	pod := &pool.Pod{Config: config.Pod{Name: "pod-0"}}
	return g, ctx, x, pod, path
}

// TestAccessLogLine: a line costs no allocation, and a stream's line is the
// same whether it was built from the request or from what keepLogHead kept.
func TestAccessLogLine(t *testing.T) {
	g, ctx, x, pod, path := loggedCompletion(t)
	e := &openai.Error{Message: `broke "here"`}
	if n := testing.AllocsPerRun(100, func() { g.logCompletion(ctx, x, pod, 502, e) }); n != 0 {
		t.Fatalf("%v allocations per line", n)
	}
	g.keepLogHead(ctx, x)
	g.logCompletion(nil, x, pod, 502, e)
	if err := g.access.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	// Past the time, which moves, every line is the same.
	rest := func(l string) string { return l[strings.Index(l, `,"request_id"`):] }
	const want = `,"request_id":"req-1","client":"10.1.2.3:5555","method":"POST","path":"/v1/chat/completions","status":502,"duration_ms":`
	for _, l := range lines {
		if !strings.HasPrefix(rest(l), want) || !strings.HasSuffix(l, `,"model":"m","stream":true,"pod":"pod-0","attempts":1,"prompt_tokens":11,"cached_tokens":0,"completion_tokens":0,"ttft_ms":5.000,"error":"broke \"here\""}`) {
			t.Fatalf("line %s", l)
		}
	}
	if len(lines) != 102 {
		t.Fatalf("%d lines, want 102", len(lines))
	}
}

func BenchmarkAccessLogLine(b *testing.B) {
	g, ctx, x, pod, _ := loggedCompletion(b)
	b.ReportAllocs()
	for b.Loop() {
		g.logCompletion(ctx, x, pod, 200, nil)
	}
}

// TestLogTimeAndMillis: the access log's time and durations read as
// time.Time's RFC 3339 to the millisecond and a float's %.3f, across
// seconds (the second's text is cached) and signs.
func TestLogTimeAndMillis(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	at := time.Date(2026, 12, 31, 23, 59, 58, 0, time.FixedZone("CET", 3600))
	for range 5000 {
		at = at.Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
		want := `{"time":"` + at.UTC().Format("2006-01-02T15:04:05.000Z07:00") + `"`
		if got := string(appendTime(nil, at)); got != want {
			t.Fatalf("%v: %s, want %s", at, got, want)
		}
		d := time.Duration(rng.Int64N(int64(2*time.Hour))) - time.Hour
		if rng.IntN(4) == 0 {
			d /= 1000000
		}
		want = `,"d":` + strconv.FormatFloat(float64(d.Microseconds())/1e3, 'f', 3, 64)
		if got := string(appendMillis(nil, "d", d)); got != want {
			t.Fatalf("%v: %s, want %s", d, got, want)
		}
	}
}

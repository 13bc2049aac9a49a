// Package chaos is issue 9's chaos scenario: the gateway, in process, over
// simulated pods on loopback, under a bounded load while the pods are
// killed, hung, slowed and restarted at random. It reports every request
// as completed, answered with a clean error, or lost, and checks that the
// gateway's token ledgers, goroutines and memory come back afterwards.
package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/ledger"
)

// Config sizes a run.
type Config struct {
	// Pods is the number of simulated pods (default 4).
	Pods int
	// Requests is the number sent, spread evenly over Duration (default
	// 300).
	Requests int
	// Duration is how long requests are sent and faults injected (default
	// 10s).
	Duration time.Duration
	// StreamShare is the fraction of streaming requests (default 0.5).
	StreamShare float64
	// FaultEvery is the mean time between two faults (default 500ms); each
	// lasts between FaultEvery and 9×FaultEvery, so some hangs outlast the
	// gateway's response and stream-idle timeouts.
	FaultEvery time.Duration
	// ClientTimeout is how long a client waits for a whole answer before
	// counting the request lost (default 20s): well above the gateway's
	// own upstream timeouts below, so only a gateway that drops a request
	// can make it expire.
	ClientTimeout time.Duration
	// Seed makes the faults and the load repeatable (default 1).
	Seed uint64
	// Log, if set, gets the gateway's log.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Pods == 0 {
		c.Pods = 4
	}
	if c.Requests == 0 {
		c.Requests = 300
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.StreamShare == 0 {
		c.StreamShare = 0.5
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 500 * time.Millisecond
	}
	if c.ClientTimeout == 0 {
		c.ClientTimeout = 20 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Report is what a run saw.
type Report struct {
	Sent, Completed int
	// CleanErrors counts answers in OpenAI's error shape by HTTP status;
	// a stream cut with an SSE error event counts under "stream".
	CleanErrors map[string]int
	// Lost counts requests with no answer within the client timeout, a
	// broken connection without an error event, or an error not in
	// OpenAI's shape, by reason; LostSamples holds a few of them.
	Lost        map[string]int
	LostSamples []string
	// Faults counts the faults injected, by kind; RestartsFailed the
	// killed pods that did not come back when their kill ended (their
	// proxy's port taken meanwhile), which stayed down longer.
	Faults         map[string]int
	RestartsFailed int
	// ByFault is what the clients saw of the requests a fault met, by the
	// kind of the last fault each met (the pods' proxies tell: reset or
	// hung before the answer's first byte, cut or hung mid-stream), then
	// by outcome: "completed", the status of a clean error, "stream error
	// event", "lost".
	ByFault map[string]map[string]int
	// Retries is the gateway's pdlb_upstream_retries_total by reason (a
	// refused connection shows only here), BudgetExhausted the retries
	// its retry budget refused.
	Retries         map[string]int
	BudgetExhausted int
	// HealthyErrors counts, by status, the requests answered with an
	// error status (not a stream cut after its head) while some pod was
	// healthy by the fault schedule (schedule.healthyAt): the errors a
	// client should never see. Origins counts them by where they came
	// from (origin), ErrorSamples describes a few.
	HealthyErrors map[string]int
	Origins       map[string]int
	ErrorSamples  []string
	// LedgerAfter is the sum of the gateway's pd_token_load_* gauges once
	// the load ended: tokens still charged to some pod.
	LedgerAfter int64
	// Goroutines and RSS (bytes) before the load, after it with the
	// gateway still up, and after the gateway and pods are closed.
	GoroutinesBefore, GoroutinesAfter, GoroutinesClosed int
	RSSBefore, RSSAfter, RSSClosed                      int64
	Elapsed                                             time.Duration
}

// LostTotal is the number of requests lost.
func (r *Report) LostTotal() int {
	n := 0
	for _, v := range r.Lost {
		n += v
	}
	return n
}

// String renders the report as a few lines of text.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sent %d, completed %d, clean errors %d %v, lost %d %v\n", r.Sent, r.Completed, sum(r.CleanErrors), sorted(r.CleanErrors), r.LostTotal(), sorted(r.Lost))
	fmt.Fprintf(&b, "faults %v over %s, restarts failed %d\n", sorted(r.Faults), r.Elapsed.Round(time.Millisecond), r.RestartsFailed)
	for _, kind := range []string{faultReset, faultHungBefore, faultCut, faultHungMid} {
		fmt.Fprintf(&b, "%s: %d requests, the clients saw %v\n", kind, sum(r.ByFault[kind]), sorted(r.ByFault[kind]))
	}
	fmt.Fprintf(&b, "gateway retries by reason %v, refused by the retry budget %d\n", sorted(r.Retries), r.BudgetExhausted)
	fmt.Fprintf(&b, "errors while another healthy pod existed: %d %v, from %v\n", sum(r.HealthyErrors), sorted(r.HealthyErrors), sorted(r.Origins))
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(&b, "error: %s\n", s)
	}
	fmt.Fprintf(&b, "ledger charges after: %d tokens\n", r.LedgerAfter)
	fmt.Fprintf(&b, "goroutines %d before, %d after, %d closed; RSS %.1f MiB before, %.1f MiB after, %.1f MiB closed\n",
		r.GoroutinesBefore, r.GoroutinesAfter, r.GoroutinesClosed, mib(r.RSSBefore), mib(r.RSSAfter), mib(r.RSSClosed))
	for _, s := range r.LostSamples {
		fmt.Fprintf(&b, "lost: %s\n", s)
	}
	return b.String()
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func sorted(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + strconv.Itoa(m[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// model is the one model the fleet serves.
const model = "chaos"

// fleet is the pods and their proxies, the faults their requests met,
// and when each pod was faulty.
type fleet struct {
	mu       sync.Mutex
	pods     []*sim.Pod
	proxies  []*faultProxy
	faults   faultLog
	schedule schedule
	// restartsFailed counts killed pods that did not come back when their
	// fault ended (the next kill they draw tries again).
	restartsFailed atomic.Int32
}

// schedule is the harness's timeline of faults: when each pod was killed,
// hung or slowed, until it was itself again (a killed pod: restarted).
type schedule struct {
	mu    sync.Mutex
	spans [][]span // by pod
}

// span is one fault of a pod; to is zero while it goes on.
type span struct {
	kind     string
	from, to time.Time
}

func (sp span) covers(t time.Time) bool {
	return !t.Before(sp.from) && (sp.to.IsZero() || t.Before(sp.to))
}

func (s *schedule) begin(pod int, kind string, at time.Time) {
	s.mu.Lock()
	s.spans[pod] = append(s.spans[pod], span{kind: kind, from: at})
	s.mu.Unlock()
}

// stateAt is the fault pod was under at t, "ok" for none.
func (s *schedule) stateAt(pod int, t time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range s.spans[pod] {
		if sp.covers(t) {
			return sp.kind
		}
	}
	return "ok"
}

func (s *schedule) end(pod int, at time.Time) {
	s.mu.Lock()
	s.spans[pod][len(s.spans[pod])-1].to = at
	s.mu.Unlock()
}

// describeAt says what each pod was under at t and since when (after the
// run's start), and for one without a fault which it came out of last:
// how long the gateway had to see a pod back before an error.
func (s *schedule) describeAt(t, start time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := func(t time.Time) string { return t.Sub(start).Round(time.Millisecond).String() }
	var b strings.Builder
	for pod, spans := range s.spans {
		if pod > 0 {
			b.WriteString(", ")
		}
		var last *span
		for i := range spans {
			sp := &spans[i]
			if sp.covers(t) {
				last = sp
				break
			}
			if !sp.from.After(t) && !sp.to.IsZero() && !sp.to.After(t) {
				last = sp
			}
		}
		switch {
		case last == nil:
			fmt.Fprintf(&b, "%d ok", pod)
		case last.covers(t):
			fmt.Fprintf(&b, "%d %s since %s", pod, last.kind, at(last.from))
		default:
			fmt.Fprintf(&b, "%d ok since %s (%s)", pod, at(last.to), last.kind)
		}
	}
	return b.String()
}

// healthyAt is the pods no fault touched at t.
func (s *schedule) healthyAt(t time.Time) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var healthy []int
	for pod, spans := range s.spans {
		faulty := false
		for _, sp := range spans {
			faulty = faulty || sp.covers(t)
		}
		if !faulty {
			healthy = append(healthy, pod)
		}
	}
	return healthy
}

func startPod(i int) (*sim.Pod, error) {
	// Speedup 5: a decode step takes about 2 ms of wall time, so answers
	// of 16 to 256 tokens stream for 30 to 500 ms and a kill cuts some.
	return sim.Start(sim.Config{Name: fmt.Sprintf("%s-%d", model, i), Model: model, Listen: "127.0.0.1:0", Speedup: 5, DefaultMaxTokens: 32})
}

func startFleet(n int) (*fleet, error) {
	f := &fleet{faults: faultLog{byID: map[string]string{}, visits: map[string][]visit{}}, schedule: schedule{spans: make([][]span, n)}}
	for i := 0; i < n; i++ {
		pod, err := startPod(i)
		if err != nil {
			f.close()
			return nil, err
		}
		proxy, err := newFaultProxy(i, pod.Addr(), &f.faults)
		if err != nil {
			pod.Close()
			f.close()
			return nil, err
		}
		f.pods = append(f.pods, pod)
		f.proxies = append(f.proxies, proxy)
	}
	return f, nil
}

func (f *fleet) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, p := range f.proxies {
		p.close()
		if f.pods[i] != nil {
			f.pods[i].Close()
		}
	}
}

// gatewayConfig has timeouts short enough that a hung pod costs a request
// a few seconds, not minutes, and a dead one is ejected at once.
func gatewayConfig(f *fleet) config.Config {
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.ConnectTimeout = 500 * time.Millisecond
	cfg.Upstream.ResponseTimeout = 3 * time.Second
	cfg.Upstream.WholeResponseTimeout = 3 * time.Second
	cfg.Upstream.StreamIdleTimeout = time.Second
	cfg.Upstream.Retries = 2
	// Hedging on, as in pdlb demo: a hung pod's request moves on well
	// before the response timeout.
	cfg.Upstream.Retry.FirstByte = config.FirstByte{Factor: 3, Floor: config.DefaultFirstByteFloor}
	// One pod of four holds about a quarter of the requests in flight (10
	// or so at 30 a second): a budget under that share, or a floor under
	// what one pod holds, cannot move a failed pod's requests.
	cfg.Upstream.Retry.Budget = config.RetryBudget{Percent: 50, MinRetries: 10}
	cfg.Health.Interval = 100 * time.Millisecond
	cfg.Health.Timeout = 200 * time.Millisecond
	cfg.Health.MetricsInterval = 200 * time.Millisecond
	cfg.Health.EjectAfterFailures = 2
	cfg.Health.EjectionTime = 500 * time.Millisecond
	for i, p := range f.proxies {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprintf("%s-%d", model, i), Model: model, Address: p.addr})
	}
	return cfg
}

// Run runs the scenario and returns its report. The error is for a run
// that could not be set up; what the run saw, lost requests included, is
// in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	rep := &Report{CleanErrors: map[string]int{}, Lost: map[string]int{}, Faults: map[string]int{}, ByFault: map[string]map[string]int{},
		HealthyErrors: map[string]int{}, Origins: map[string]int{}}
	rep.GoroutinesBefore, rep.RSSBefore = runtime.NumGoroutine(), rss()

	f, err := startFleet(cfg.Pods)
	if err != nil {
		return nil, err
	}
	// The access log tells where each error answer came from.
	logDir, err := os.MkdirTemp("", "chaos")
	if err != nil {
		f.close()
		return nil, err
	}
	defer os.RemoveAll(logDir)
	gcfg := gatewayConfig(f)
	gcfg.AccessLog = filepath.Join(logDir, "access.log")
	gw, err := lb.Start(gcfg, cfg.Log)
	if err != nil {
		f.close()
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Timeout: cfg.ClientTimeout, Transport: tr}

	start := time.Now()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	var chaosDone sync.WaitGroup
	chaosDone.Add(1)
	go func() {
		defer chaosDone.Done()
		injectFaults(runCtx, f, cfg, rand.New(rand.NewPCG(cfg.Seed, 1)), rep)
	}()

	var mu sync.Mutex
	var load sync.WaitGroup
	// erred is the requests answered with an error status while a pod was
	// healthy, by id, with the healthy pods and the answer's time.
	erred := map[string]erredRequest{}
	gap := cfg.Duration / time.Duration(cfg.Requests)
	for i := 0; i < cfg.Requests; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * gap)); wait > 0 {
			time.Sleep(wait)
		}
		stream := rng.Float64() < cfg.StreamShare
		maxTokens := 16 + rng.IntN(240)
		load.Add(1)
		go func() {
			defer load.Done()
			var h head
			outcome, detail := send(client, gw.Addr(), i, stream, maxTokens, &h)
			var healthy []int
			if h.status != 0 && h.status != http.StatusOK {
				healthy = f.schedule.healthyAt(h.at)
			}
			mu.Lock()
			defer mu.Unlock()
			rep.Sent++
			if len(healthy) > 0 {
				rep.HealthyErrors[strconv.Itoa(h.status)]++
				erred[requestID(i)] = erredRequest{healthy: healthy, after: h.at.Sub(start), pods: f.schedule.describeAt(h.at, start)}
			}
			saw := "lost"
			switch outcome {
			case completed:
				rep.Completed++
				saw = "completed"
			case cleanError:
				rep.CleanErrors[detail]++
				saw = detail
				if detail == "stream" {
					saw = "stream error event"
				}
			default:
				rep.Lost[detail]++
				if len(rep.LostSamples) < 10 {
					rep.LostSamples = append(rep.LostSamples, fmt.Sprintf("request %d (stream %v): %s", i, stream, detail))
				}
			}
			if kind := f.faults.kind(requestID(i)); kind != "" {
				if rep.ByFault[kind] == nil {
					rep.ByFault[kind] = map[string]int{}
				}
				rep.ByFault[kind][saw]++
			}
		}()
	}
	load.Wait()
	stop()
	chaosDone.Wait()
	rep.Elapsed = time.Since(start)
	rep.RestartsFailed = int(f.restartsFailed.Load())
	tr.CloseIdleConnections()

	// Charges are released as requests end; give the last ones a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rep.LedgerAfter, err = ledgerCharges(gw.AdminAddr(), rep)
		if err != nil || rep.LedgerAfter == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	runtime.GC()
	rep.GoroutinesAfter, rep.RSSAfter = runtime.NumGoroutine(), rss()

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = gw.Shutdown(sctx)
	cancel()
	f.close()
	if lerr := explainErrors(rep, gcfg.AccessLog, erred, f, start, gcfg.Upstream.Retries); err == nil {
		err = lerr
	}
	// Idle worker goroutines of the closed servers exit within their idle
	// period (250 ms for sim pods).
	time.Sleep(time.Second)
	runtime.GC()
	rep.GoroutinesClosed, rep.RSSClosed = runtime.NumGoroutine(), rss()
	return rep, err
}

// injectFaults hits a random pod every FaultEvery on average until ctx
// ends, with kill, hang and slow in turn so a short run sees each, every
// fault lasting a random while, at most one at a time per pod; then it
// restores every pod.
func injectFaults(ctx context.Context, f *fleet, cfg Config, rng *rand.Rand, rep *Report) {
	var wg sync.WaitGroup
	defer wg.Wait()
	busy := make([]bool, len(f.proxies))
	var busyMu sync.Mutex
	kinds := []string{"kill", "hang", "slow"}
	for n := 0; ; {
		wait := time.Duration(rng.Int64N(int64(2 * cfg.FaultEvery)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		i := rng.IntN(len(f.proxies))
		busyMu.Lock()
		if busy[i] {
			busyMu.Unlock()
			continue
		}
		busy[i] = true
		busyMu.Unlock()
		kind := kinds[n%len(kinds)]
		n++
		lasts := cfg.FaultEvery + time.Duration(rng.Int64N(int64(8*cfg.FaultEvery)))
		rep.Faults[kind]++
		wg.Add(1)
		go func() {
			defer wg.Done()
			fault(ctx, f, i, kind, lasts, cfg.Log)
			busyMu.Lock()
			busy[i] = false
			busyMu.Unlock()
		}()
	}
}

// fault applies kind to pod i for lasts (or until ctx ends), then restores
// it: a killed pod is restarted behind the same address.
func fault(ctx context.Context, f *fleet, i int, kind string, lasts time.Duration, log *slog.Logger) {
	proxy := f.proxies[i]
	f.schedule.begin(i, kind, time.Now())
	switch kind {
	case "kill":
		f.mu.Lock()
		pod := f.pods[i]
		f.pods[i] = nil
		f.mu.Unlock()
		proxy.kill()
		// nil: its last restart failed; this fault's end tries again.
		if pod != nil {
			_ = pod.Kill()
		}
	case "hang":
		proxy.mode.Store(modeHung)
	case "slow":
		proxy.mode.Store(modeSlow)
	}
	select {
	case <-ctx.Done():
	case <-time.After(lasts):
	}
	proxy.mode.Store(modeNormal)
	if kind != "kill" {
		f.schedule.end(i, time.Now())
		return
	}
	pod, err := startPod(i)
	if err == nil {
		// The proxy's port was free while the pod was down: under go test
		// ./... another package's listener or dial may have taken it.
		if err = proxy.restart(pod.Addr()); err != nil {
			pod.Close()
		}
	}
	if err != nil {
		f.restartsFailed.Add(1)
		log.Error("chaos: restart failed", "pod", i, "err", err)
		return
	}
	f.mu.Lock()
	f.pods[i] = pod
	f.mu.Unlock()
	f.schedule.end(i, time.Now())
}

type outcome int

const (
	completed outcome = iota
	cleanError
	lost
)

// requestID is request i's X-Request-Id, which the gateway passes on to
// the pods.
func requestID(i int) string { return "chaos-" + strconv.Itoa(i) }

// head is the status of an answer and when it came; zero when none came.
type head struct {
	status int
	at     time.Time
}

// send makes one request and classifies its answer; h gets its head.
func send(client *http.Client, addr string, i int, stream bool, maxTokens int, h *head) (outcome, string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"chaos request %d: tell me a story"}],"max_tokens":%d,"stream":%v}`, model, i, maxTokens, stream)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return lost, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", requestID(i))
	resp, err := client.Do(req)
	if err != nil {
		return lost, "no answer: " + errKind(err)
	}
	defer resp.Body.Close()
	h.status, h.at = resp.StatusCode, time.Now()
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		if err != nil || !isOpenAIError(b) {
			return lost, "status " + strconv.Itoa(resp.StatusCode) + " not in OpenAI's error shape"
		}
		return cleanError, strconv.Itoa(resp.StatusCode)
	}
	if !stream {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return lost, "body broken: " + errKind(err)
		}
		var out struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if json.Unmarshal(b, &out) != nil || len(out.Choices) == 0 {
			return lost, "200 without a completion"
		}
		return completed, ""
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	done, errEvent := false, false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		switch {
		case !ok:
		case string(data) == "[DONE]":
			done = true
		case isOpenAIError(data):
			errEvent = true
		}
	}
	switch {
	case errEvent:
		return cleanError, "stream"
	case sc.Err() != nil:
		return lost, "stream broken without an error event: " + errKind(sc.Err())
	case !done:
		return lost, "stream ended without [DONE] or an error event"
	}
	return completed, ""
}

// errKind names an error without its addresses, so reasons aggregate.
func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout"):
		return "client timeout"
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "unexpected EOF"
	case strings.Contains(err.Error(), "reset by peer"):
		return "connection reset"
	}
	return err.Error()
}

// isOpenAIError: vLLM nests its error under "error"; SGLang and
// TensorRT-LLM answer a flat ErrorResponse whose object is "error".
func isOpenAIError(b []byte) bool {
	type body struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	}
	var e struct {
		Error  *body  `json:"error"`
		Object string `json:"object"`
		body
	}
	if json.Unmarshal(b, &e) != nil {
		return false
	}
	if e.Error == nil && e.Object == "error" {
		e.Error = &e.body
	}
	return e.Error != nil && e.Error.Message != "" && e.Error.Type != ""
}

// ledgerCharges sums the token ledger gauges on the admin /metrics page,
// and reads the retry counters into rep.
func ledgerCharges(admin string, rep *Report) (int64, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var total int64
	rep.Retries = map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if reason, ok := strings.CutPrefix(line, `pdlb_upstream_retries_total{reason="`); ok && len(fields) == 2 {
			rep.Retries[reason[:strings.IndexByte(reason, '"')]], _ = strconv.Atoi(fields[1])
		}
		if strings.HasPrefix(line, "pdlb_upstream_retry_budget_exhausted_total ") && len(fields) == 2 {
			rep.BudgetExhausted, _ = strconv.Atoi(fields[1])
		}
		if !strings.HasPrefix(line, ledger.MetricActiveTokens) && !strings.HasPrefix(line, ledger.MetricKVTokens) && !strings.HasPrefix(line, ledger.MetricDecodeTokens) {
			continue
		}
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		total += int64(v)
	}
	return total, sc.Err()
}

// erredRequest is a request answered with an error status while the
// healthy pods were healthy, after the run's start.
type erredRequest struct {
	healthy []int
	after   time.Duration
	// pods is the schedule then (schedule.describeAt).
	pods string
}

// accessLine is the part of an access log line explainErrors reads.
type accessLine struct {
	RequestID string           `json:"request_id"`
	Status    int              `json:"status"`
	Pod       string           `json:"pod"`
	Attempts  int              `json:"attempts"`
	Error     string           `json:"error"`
	Retried   []retriedAttempt `json:"retried"`
}

// retriedAttempt is an attempt of an access log line's request that
// failed and was retried.
type retriedAttempt struct {
	Pod    string `json:"pod"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// explainErrors reads the gateway's access log at path and counts each
// erred request by its origin into rep, with a few samples.
func explainErrors(rep *Report, path string, erred map[string]erredRequest, f *fleet, start time.Time, retries int) error {
	faults, sched := &f.faults, &f.schedule
	if len(erred) == 0 {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for line := range bytes.Lines(b) {
		var l accessLine
		if json.Unmarshal(line, &l) != nil {
			continue
		}
		e, ok := erred[l.RequestID]
		if !ok {
			continue
		}
		delete(erred, l.RequestID)
		o := origin(l, retries)
		rep.Origins[o]++
		if len(rep.ErrorSamples) < 10 {
			var visits []string
			for _, v := range faults.visited(l.RequestID) {
				visits = append(visits, fmt.Sprintf("%d (%s) at %s", v.pod, sched.stateAt(v.pod, v.at), v.at.Sub(start).Round(time.Millisecond)))
			}
			var tried strings.Builder
			for _, r := range l.Retried {
				fmt.Fprintf(&tried, "; %s failed (%s): %s", r.Pod, r.Reason, r.Error)
			}
			rep.ErrorSamples = append(rep.ErrorSamples, fmt.Sprintf("%s at %s: %d (%s), %d attempts, on pods [%s], while pods %v were healthy (pods: %s)%s; then %s: %s",
				l.RequestID, e.after.Round(time.Millisecond), l.Status, o, l.Attempts, strings.Join(visits, ", "), e.healthy, e.pods, tried.String(), l.Pod, l.Error))
		}
	}
	rep.Origins["not in the access log"] += len(erred)
	if rep.Origins["not in the access log"] == 0 {
		delete(rep.Origins, "not in the access log")
	}
	return nil
}

// origin says where an error answer came from: the gateway found no pod
// to try, a pod's own answer was relayed, the request spent its retries,
// or it had retries left: then no pod was left to try, or its last
// failure was not retried (the retry budget, a reason upstream.retry_on
// leaves out, a byte already sent), which the access log does not tell
// apart.
func origin(l accessLine, retries int) string {
	switch {
	case strings.HasPrefix(l.Error, "No healthy inference server"):
		return "gateway: no pod available"
	case l.Error == "":
		return fmt.Sprintf("pod %s's own %d", l.Pod, l.Status)
	case l.retriesSpent() >= retries:
		return "retries spent"
	}
	return "retries left: no pod left, or not retried"
}

// retriesSpent counts the request's retries as the gateway does: each
// attempt after the first spends one, but a move off a pod found dead
// ("down") on the request's first attempt there (its freeMove), which
// the attempts count too.
func (l *accessLine) retriesSpent() int {
	spent := l.Attempts - 1
	for i, r := range l.Retried {
		if r.Reason == "down" && !slices.ContainsFunc(l.Retried[:i], func(e retriedAttempt) bool { return e.Pod == r.Pod }) {
			spent--
		}
	}
	return spent
}

// rss is the process's resident set in bytes (0 where /proc is missing).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

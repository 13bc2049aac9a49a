package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"pdlb/lb/admit"
)

// Arrival is how requests are spaced.
type Arrival uint8

// Arrival processes.
const (
	// Poisson: open loop, exponential gaps at Rate per second on average.
	Poisson Arrival = iota
	// Constant: open loop, one request every 1/Rate seconds.
	Constant
	// Closed: Concurrency requests in flight, each followed at once by the
	// next.
	Closed
	// Replay: open loop at the times the workload gives (a trace's).
	Replay
)

var arrivalNames = []string{"poisson", "constant", "closed", "replay"}

func (a Arrival) String() string { return arrivalNames[a] }

// Defaults of a Config.
const (
	DefaultTarget   = "http://127.0.0.1:8080"
	DefaultModel    = "demo-vllm"
	DefaultTimeout  = 60 * time.Second
	DefaultMaxConns = 256
)

// SLO is one priority class's targets, in seconds; a zero TPOT has none.
type SLO struct {
	TTFT, TPOT float64
}

// DefaultSLOs returns the gateway's admission targets (lb/admit's
// defaults), so attainment here is measured against what the gateway
// promises.
func DefaultSLOs() [admit.NumClasses]SLO {
	var s [admit.NumClasses]SLO
	s[admit.Interactive] = SLO{TTFT: admit.DefaultInteractiveTTFTSLO, TPOT: admit.DefaultInteractiveTPOTSLO}
	s[admit.Batch] = SLO{TTFT: admit.DefaultBatchTTFTSLO}
	return s
}

// Config is one run. Zero fields take their defaults, except the bounds.
type Config struct {
	// Target is the base URL requests go to (default DefaultTarget).
	Target string
	// Targets are more base URLs: requests then go round robin over
	// Target and these, in the order they are sent (see targets.go).
	Targets []string
	// AllowRemote lets Target name a host other than loopback; a load
	// generator pointed at the wrong address is an attack.
	AllowRemote bool
	// Body is the model and streaming mode of every request (Model default
	// DefaultModel).
	Body BodyOptions
	// Arrival spaces requests; Rate (requests per second) drives Poisson
	// and Constant, Concurrency drives Closed.
	Arrival     Arrival
	Rate        float64
	Concurrency int
	// Duration stops sending once that long has passed since the start; 0
	// for no time bound. Requests stops after that many; 0 for no count
	// bound. A run needs one of the two unless it replays a trace.
	Duration time.Duration
	Requests int
	// Timeout bounds each request, answer included (default 60 s): past it
	// the request counts as lost.
	Timeout time.Duration
	// MaxConns bounds the connections to the target (default 256);
	// requests beyond it wait for one, and their wait counts in their
	// latency.
	MaxConns int
	// Seed drives Poisson gaps.
	Seed uint64
	// SLO are the targets attainment is measured against, by class
	// (default DefaultSLOs()).
	SLO [admit.NumClasses]SLO
	// Metrics are Prometheus endpoints (pods' or the gateway's /metrics)
	// scraped before and after the run for the prefix cache hit rate.
	Metrics []string
	// Progress, if set, is called about once a second from another
	// goroutine while the run lasts.
	Progress func(Progress)
}

// Progress is a run's state while it lasts.
type Progress struct {
	Elapsed                          time.Duration
	Sent, OK, Errors, Lost, InFlight int64
}

var errConfig = errors.New("load: invalid config")

// withDefaults fills c's zero fields.
func (c Config) withDefaults() Config {
	if c.Target == "" {
		c.Target = DefaultTarget
	}
	c.Target = strings.TrimSuffix(c.Target, "/")
	c.Targets = slices.Clone(c.Targets)
	for i, t := range c.Targets {
		c.Targets[i] = strings.TrimSuffix(t, "/")
	}
	if c.Body.Model == "" {
		c.Body.Model = DefaultModel
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.SLO == ([admit.NumClasses]SLO{}) {
		c.SLO = DefaultSLOs()
	}
	return c
}

// Validate rejects a config that cannot run, naming the field.
func (c Config) Validate() error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: %s = %q %s", errConfig, field, fmt.Sprint(v), why)
	}
	for _, t := range c.all() {
		u, err := url.Parse(t)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" {
			return bad("target", t, "must be a base URL such as http://127.0.0.1:8080")
		}
		if !c.AllowRemote && !isLoopback(u.Hostname()) {
			return bad("target", t, "is not a loopback address (allow remote targets explicitly)")
		}
	}
	switch c.Arrival {
	case Poisson, Constant:
		if !(c.Rate > 0) {
			return bad("rate", c.Rate, "must be positive")
		}
	case Closed:
		if c.Concurrency < 1 {
			return bad("concurrency", c.Concurrency, "must be at least 1")
		}
	case Replay:
	default:
		return bad("arrival", c.Arrival, "is unknown")
	}
	switch {
	case c.Body.API != "" && c.Body.API != APIChat && c.Body.API != APIResponses && c.Body.API != APIMessages:
		return bad("api", c.Body.API, "must be "+APIChat+", "+APIResponses+" or "+APIMessages)
	case c.Duration < 0:
		return bad("duration", c.Duration, "must not be negative")
	case c.Requests < 0:
		return bad("requests", c.Requests, "must not be negative")
	case c.Duration == 0 && c.Requests == 0 && c.Arrival != Replay:
		return fmt.Errorf("%w: give a duration or a request count: a run is always bounded", errConfig)
	case c.Timeout <= 0:
		return bad("timeout", c.Timeout, "must be positive")
	case c.MaxConns < 1:
		return bad("max_conns", c.MaxConns, "must be at least 1")
	}
	for i, s := range c.SLO {
		if !(s.TTFT > 0) || !(s.TPOT >= 0) {
			return bad("slo."+admit.Class(i).String(), s, "needs a positive TTFT and a non-negative TPOT")
		}
	}
	for _, m := range c.Metrics {
		if u, err := url.Parse(m); err != nil || u.Host == "" {
			return bad("metrics", m, "must be a URL such as http://127.0.0.1:9090/metrics")
		}
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// run is the state of one Run.
type run struct {
	cfg     Config
	targets []string // Target and Targets
	client  *http.Client
	start   time.Time
	wg      sync.WaitGroup

	mu      sync.Mutex
	results []Result

	sent, ok, errs, lost atomic.Int64
}

// Run sends w's requests as cfg says and reports what they measured. It
// returns once every request sent has ended (each is bounded by the
// timeout). Cancelling ctx stops sending and cuts what is in flight, which
// then counts as lost.
func Run(ctx context.Context, cfg Config, w Workload) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	transport := &http.Transport{
		Proxy:               nil, // a load test measures the target, not a proxy from the environment
		DialContext:         (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxConnsPerHost:     cfg.MaxConns,
		MaxIdleConnsPerHost: cfg.MaxConns,
		MaxIdleConns:        cfg.MaxConns,
		DisableCompression:  true, // SSE must arrive as sent, chunk by chunk
	}
	defer transport.CloseIdleConnections()
	r := &run{cfg: cfg, targets: cfg.all(), client: &http.Client{Transport: transport}}

	var before cacheCounters
	if len(cfg.Metrics) > 0 {
		var err error
		if before, err = scrapeCache(ctx, r.client, cfg.Metrics); err != nil {
			return nil, err
		}
	}

	r.start = time.Now()
	stopProgress := r.progress()
	if cfg.Arrival == Closed {
		r.closedLoop(ctx, w)
	} else {
		r.openLoop(ctx, w)
	}
	r.wg.Wait()
	elapsed := time.Since(r.start)
	stopProgress()

	rep := newReport(cfg, r.results, elapsed)
	if len(cfg.Metrics) > 0 {
		after, err := scrapeCache(context.WithoutCancel(ctx), r.client, cfg.Metrics)
		if err != nil {
			rep.MetricsError = err.Error()
		} else if rate, ok := after.hitRateSince(before); ok {
			rep.HitRate = &rate
		} else {
			rep.MetricsError = "no prefix cache queries counted during the run"
		}
	}
	return rep, nil
}

// due reports whether a request due at offset t (since the start) may
// still be sent: the count and time bounds allow it.
func (r *run) due(n int, t time.Duration) bool {
	return (r.cfg.Requests == 0 || n < r.cfg.Requests) && (r.cfg.Duration == 0 || t < r.cfg.Duration)
}

// openLoop sends each request at its due time whether or not earlier ones
// have been answered, as independent users do.
func (r *run) openLoop(ctx context.Context, w Workload) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0xa221))
	var (
		req Request
		t   time.Duration
	)
	for n := 0; ; n++ {
		if !w.Next(&req) {
			return
		}
		switch r.cfg.Arrival {
		case Poisson:
			t += time.Duration(rng.ExpFloat64() / r.cfg.Rate * float64(time.Second))
		case Constant:
			t = time.Duration(float64(n) / r.cfg.Rate * float64(time.Second))
		case Replay:
			t = time.Duration(req.At * float64(time.Second))
		}
		if !r.due(n, t) {
			return
		}
		// The body is built before the wait, so the send is on time.
		body := req.AppendBody(nil, r.cfg.Body)
		due := r.start.Add(t)
		if wait := time.Until(due); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		r.wg.Add(1)
		go func(req Request) {
			defer r.wg.Done()
			r.send(ctx, &req, body, due)
		}(req)
	}
}

// closedLoop keeps Concurrency requests in flight: each worker sends the
// next request as soon as its previous one ended. One goroutine draws
// from the workload, so the sequence is the seed's whatever the timing.
func (r *run) closedLoop(ctx context.Context, w Workload) {
	type job struct {
		req  Request
		body []byte
	}
	jobs := make(chan job)
	for range r.cfg.Concurrency {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for j := range jobs {
				r.send(ctx, &j.req, j.body, time.Now())
			}
		}()
	}
	defer close(jobs)
	var req Request
	for n := 0; r.due(n, time.Since(r.start)) && w.Next(&req); n++ {
		j := job{req: req, body: req.AppendBody(nil, r.cfg.Body)}
		select {
		case <-ctx.Done():
			return
		case jobs <- j:
		}
	}
}

// send runs one request and records its result.
func (r *run) send(ctx context.Context, req *Request, body []byte, due time.Time) {
	n := r.sent.Add(1)
	ctx, cancel := context.WithDeadline(ctx, due.Add(r.cfg.Timeout))
	defer cancel()
	res := Result{Start: due.Sub(r.start).Seconds(), Target: int((n - 1) % int64(len(r.targets)))}
	send(ctx, r.client, r.targets[res.Target], req, body, r.cfg.Body, due, &res)
	switch res.Outcome {
	case OK:
		r.ok.Add(1)
	case Lost:
		r.lost.Add(1)
	default:
		r.errs.Add(1)
	}
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

// progress calls cfg.Progress once a second until the returned stop is
// called.
func (r *run) progress() (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				ok, errs, lost := r.ok.Load(), r.errs.Load(), r.lost.Load()
				sent := r.sent.Load()
				r.cfg.Progress(Progress{Elapsed: time.Since(r.start), Sent: sent, OK: ok, Errors: errs, Lost: lost,
					InFlight: sent - ok - errs - lost})
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

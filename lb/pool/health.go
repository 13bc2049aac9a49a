package pool

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// Checker runs the active health checks and metric scrapes of a snapshot's
// pods: one goroutine per pod, each with its own small client so checks never
// wait behind request traffic for a connection.
type Checker struct {
	cfg       config.Health
	keepalive time.Duration // upstream.keepalive_timeout
	log       *slog.Logger
	stop      chan struct{}
	wg        sync.WaitGroup
}

// StartChecker starts checking every pod of s. cfg.UnhealthyAfter failed
// checks in a row mark a pod unhealthy, a refused connection at once (a
// strong signal: traffic must leave a dead pod within one interval); a
// check that timed out while the pod answered requests is not counted;
// one passing check marks it healthy again. Passive ejection (Pod.Eject) is
// separate and expires on its own, so a pod that answers /health but fails
// requests stays out for its ejection time. keepalive is how long a
// checker's connection to a pod may idle.
func StartChecker(s *Snapshot, cfg config.Health, keepalive time.Duration, log *slog.Logger) *Checker {
	c := &Checker{cfg: cfg, keepalive: keepalive, log: log, stop: make(chan struct{})}
	for _, p := range s.Pods {
		c.wg.Add(1)
		go c.run(p)
	}
	return c
}

// Close stops every check and waits for them to end.
func (c *Checker) Close() {
	close(c.stop)
	c.wg.Wait()
}

func (c *Checker) run(p *Pod) {
	defer c.wg.Done()
	// Idle connections go before the pod closes them, as the pod's
	// request clients' do (config.Upstream.KeepaliveTimeout): checks less
	// frequent than the pod's keep-alive would each fail on a closed one.
	// Dual-stack, as the pods' request clients dial (fasthttp's default
	// dialer is IPv4 only, and an IPv6 pod would never pass).
	client := &fasthttp.HostClient{Addr: p.Config.Address, Name: "pdlb-health", MaxConns: 2, MaxIdemponentCallAttempts: 1,
		MaxIdleConnDuration: c.keepalive, DialDualStack: true}
	if p.Config.TLS {
		client.Dial = p.Dial
	}
	defer client.CloseIdleConnections()
	// Start at a random point of the interval so checks of many pods do not
	// fire in lockstep.
	check := time.NewTimer(time.Duration(rand.Int64N(int64(c.cfg.Interval))))
	defer check.Stop()
	var scrape <-chan time.Time
	if c.cfg.MetricsInterval > 0 {
		t := time.NewTicker(c.cfg.MetricsInterval)
		defer t.Stop()
		scrape = t.C
		c.scrape(client, p)
	}
	for {
		select {
		case <-c.stop:
			return
		case <-check.C:
			c.check(client, p)
			check.Reset(c.cfg.Interval)
		case <-scrape:
			c.scrape(client, p)
		}
	}
}

func (c *Checker) check(client *fasthttp.HostClient, p *Pod) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + p.Config.Address + "/health")
	p.Authorize(req)
	err := client.DoTimeout(req, resp, c.cfg.Timeout)
	if limits.NoFDs(err) {
		// The gateway's limit (limits.FDs): no word on the pod, which
		// counting would mark unhealthy with every other.
		return
	}
	ok := err == nil && resp.StatusCode() == fasthttp.StatusOK
	// A check that timed out on a pod that answered a request since the
	// previous check says it is busy, not dead: a saturated engine's
	// /health waits behind its work (vLLM's API server, uvicorn's one
	// event loop, misses a 1 s timeout under load), and counting it
	// would take every pod of a loaded fleet out at once.
	answered := p.answered.Swap(false)
	if !ok && answered && late(err) {
		return
	}
	if ok {
		p.checkFails.Store(0)
	} else {
		// The pod may come back as another process, with other PD info.
		p.PrefillInfo.Forget()
		if int(p.checkFails.Add(1)) < c.cfg.UnhealthyAfter && !errors.Is(err, syscall.ECONNREFUSED) {
			return
		}
	}
	if was := p.set(flagHealthy, ok); was != ok {
		if ok {
			c.log.Info("pod healthy", "pod", p.Config.Name)
		} else {
			if err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
				// No answer at all: hung. A draining engine refuses new
				// connections or answers 503 while it finishes its
				// requests, which keep their connections.
				p.markDown()
			}
			c.log.Warn("pod unhealthy", "pod", p.Config.Name, "err", errText(err, resp))
		}
	}
}

func (c *Checker) scrape(client *fasthttp.HostClient, p *Pod) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + p.Config.Address + "/metrics")
	p.Authorize(req)
	if err := client.DoTimeout(req, resp, c.cfg.Timeout); err != nil || resp.StatusCode() != fasthttp.StatusOK {
		return
	}
	now := time.Now()
	p.updateDrain(now)
	load, ok := engines.ParseMetrics(p.Engine, resp.Body())
	c.scrapeLoRA(client, p, resp.Body())
	if !ok {
		return
	}
	s := &Scraped{Load: load, At: now, TokensPerSec: load.Throughput}
	if prev := p.scraped.Load(); s.TokensPerSec < 0 && prev != nil && load.GeneratedTokens >= prev.GeneratedTokens && prev.GeneratedTokens >= 0 {
		if dt := now.Sub(prev.At).Seconds(); dt > 0 {
			s.TokensPerSec = (load.GeneratedTokens - prev.GeneratedTokens) / dt
		}
	}
	p.setScraped(s)
}

// late reports whether a check failed for want of time: its timeout ran
// out, or earlier checks still hold both of the checker's connections
// waiting for their answers.
func late(err error) bool { return IsTimeout(err) || errors.Is(err, fasthttp.ErrNoFreeConns) }

// IsTimeout reports whether an exchange with a pod failed because a
// timeout ran out: fasthttp's own, the dial's, or a socket deadline's.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

func errText(err error, resp *fasthttp.Response) string {
	if err != nil {
		return err.Error()
	}
	return "status " + fasthttp.StatusMessage(resp.StatusCode())
}

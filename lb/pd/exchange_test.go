package pd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
	"pdlb/lb/fail"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/lb/route"
	"pdlb/lb/upstream"
	"pdlb/ledger"
)

// leg is how one send of a leg ends: err, else an answer with status and
// body, after delay. wait makes it wait for its cut instead (a decode pod
// waiting for KV that never comes).
type leg struct {
	status int
	body   string
	err    error
	delay  time.Duration
	wait   bool
}

// scriptedLegs is a Fleet whose legs end as a script says, without a
// socket, and a Host that records what the exchange asked of the request.
type scriptedLegs struct {
	mu     sync.Mutex
	script map[*pool.Pod][]leg
	sent   []string

	c         *Call
	retries   int         // MoveDecode allows this many
	spare     []*pool.Pod // MoveDecode takes these in order
	tried     []string
	responded *pool.Pod
}

func (s *scriptedLegs) Send(cut, drop <-chan struct{}, pod *pool.Pod, up *fasthttp.Request, resp *fasthttp.Response, _ time.Time, _ []byte) (int, error) {
	s.mu.Lock()
	s.sent = append(s.sent, pod.Config.Name)
	l := leg{err: errors.New("no script")}
	if q := s.script[pod]; len(q) > 0 {
		l, s.script[pod] = q[0], q[1:]
	}
	s.mu.Unlock()
	if l.wait {
		select {
		case <-cut:
		case <-drop:
		}
		return 0, upstream.ErrCut
	}
	time.Sleep(l.delay)
	if l.err != nil {
		return 0, l.err
	}
	resp.SetStatusCode(l.status)
	resp.SetBodyString(l.body)
	return 0, nil
}

func (s *scriptedLegs) CallFailed(*pool.Pod, error) {}
func (s *scriptedLegs) PodFailed(*pool.Pod)         {}

func (s *scriptedLegs) PodFailure(pod *pool.Pod, err error, within time.Duration) *fail.Failure {
	e := openai.UpstreamError(err.Error())
	if pool.IsTimeout(err) {
		e = openai.UpstreamTimeout(within)
	}
	return &fail.Failure{E: e, Pod: pod, Reason: fail.ReasonOf(err)}
}
func (s *scriptedLegs) ReleasePrefill(ledger.Ticket)       {}
func (s *scriptedLegs) ResponseTimeout(bool) time.Duration { return time.Minute }

func (s *scriptedLegs) Upstream(pod *pool.Pod) *fasthttp.Request {
	up := fasthttp.AcquireRequest()
	up.SetHost(pod.Config.Address)
	return up
}
func (s *scriptedLegs) RequestID() string                            { return "" }
func (s *scriptedLegs) PrefillRank(*pool.Pod) (int, int)             { return 0, 0 }
func (s *scriptedLegs) PlacePair(pre, _ *pool.Pod) bool              { pre.Acquire(1); return true }
func (s *scriptedLegs) Unplace(pre *pool.Pod)                        { pre.Release(1) }
func (s *scriptedLegs) PrefillDone(*pool.Pod, time.Time, bool, bool) {}
func (s *scriptedLegs) HandOver() (int64, ledger.Ticket)             { return 0, ledger.Ticket{} }
func (s *scriptedLegs) Respond(pod *pool.Pod, resp *fasthttp.Response, _ []byte) {
	s.responded = pod
	fasthttp.ReleaseResponse(resp)
	pod.Release(1)
}
func (s *scriptedLegs) AnswerFromPrefill(pre *pool.Pod, resp *fasthttp.Response, _ []byte) {
	s.responded = pre
	fasthttp.ReleaseResponse(resp)
	pre.Release(1)
}
func (s *scriptedLegs) TakeDecode()         { s.c.Dec.Acquire(1) }
func (s *scriptedLegs) Tried(pod *pool.Pod) { s.tried = append(s.tried, pod.Config.Name) }
func (s *scriptedLegs) MoveDecode(f *fail.Failure) bool {
	if len(s.spare) == 0 || !f.MayRetry() || s.retries == 0 {
		return false
	}
	s.retries--
	s.c.Dec, s.spare = s.spare[0], s.spare[1:]
	return true
}

// pdPods are four pods of one model: p0..p2 vLLM, p3 SGLang; the test
// pairs them as it likes.
func pdPods(t *testing.T) []*pool.Pod {
	t.Helper()
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	for i, engine := range []string{"vllm", "vllm", "vllm", "sglang"} {
		cfg.Pods = append(cfg.Pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Engine: engine, Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	snap, err := pool.Build(&cfg, upstream.Dialer(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Models[0].Pods
}

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}

// TestRunPair runs a pair's exchange over scripted legs: each case is how
// the legs end, and what the request path gets (status 0: the decode or
// prefill pod's answer was relayed). Every case gives back every pod it
// took.
func TestRunPair(t *testing.T) {
	pods := pdPods(t)
	m := NewMetrics(metrics.NewSet(), "m", []float64{1})
	const kv = `{"kv_transfer_params":{"remote_engine_id":"e"}}`
	type tc struct {
		name      string
		pre, dec  int
		legs      map[int][]leg
		retries   int
		spare     []int
		opts      route.PDOptions
		stream    bool
		status    int
		pdHeader  string
		mayRetry  bool
		sent      string
		tried     string
		responded string
		watchdogs uint64
	}
	f := func(c tc) {
		t.Helper()
		s := &scriptedLegs{script: map[*pool.Pod][]leg{}, retries: c.retries}
		for i, l := range c.legs {
			s.script[pods[i]] = l
		}
		for _, i := range c.spare {
			s.spare = append(s.spare, pods[i])
		}
		var req fasthttp.Request
		req.SetBodyString(fmt.Sprintf(`{"model":"m","prompt":"hi","stream":%v}`, c.stream))
		ctx := new(fasthttp.RequestCtx)
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
		opts := c.opts
		opts.PrefillRequestTimeout = time.Second
		call := AcquireCall(s, s, ctx, opts, m, c.stream, false, 1, 1)
		defer call.Release()
		s.c, call.Pre, call.Dec = call, pods[c.pre], pods[c.dec]
		before := m.Watchdog.Get()
		got := call.RunPair()
		status, header, retry := 0, "", false
		if got != nil {
			status, header, retry = got.E.Status, got.PDHeader, got.MayRetry()
		}
		// Every leg gives its pod back; a concurrent one's goroutine when it
		// ends.
		for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
			busy := ""
			for _, p := range pods {
				if p.InFlight() != 0 {
					busy += fmt.Sprintf(" %s:%d", p.Config.Name, p.InFlight())
				}
			}
			if busy == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: pods still held:%s", c.name, busy)
			}
		}
		responded := ""
		if s.responded != nil {
			responded = s.responded.Config.Name
		}
		s.mu.Lock()
		// Concurrent legs go out in either order.
		slices.Sort(s.sent)
		sent := fmt.Sprint(s.sent)
		s.mu.Unlock()
		if status != c.status || header != c.pdHeader || retry != c.mayRetry || responded != c.responded ||
			sent != c.sent || fmt.Sprint(s.tried) != c.tried || m.Watchdog.Get()-before != c.watchdogs {
			t.Errorf("%s: status %d, header %q, mayRetry %v, responded %q, sent %s, tried %v, watchdogs %d\nwant %d, %q, %v, %q, %s, %s, %d",
				c.name, status, header, retry, responded, sent, s.tried, m.Watchdog.Get()-before,
				c.status, c.pdHeader, c.mayRetry, c.responded, c.sent, c.tried, c.watchdogs)
		}
	}
	ok := []leg{{status: 200, body: "{}"}}
	// Sequential (vLLM).
	f(tc{name: "both legs answer", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: ok},
		sent: "[p0 p1]", tried: "[]", responded: "p1"})
	f(tc{name: "prefill pod refused", pre: 0, dec: 1, legs: map[int][]leg{0: {{err: errRefused}}},
		status: 502, pdHeader: HeaderPrefillError, mayRetry: true, sent: "[p0]", tried: "[p0]"})
	f(tc{name: "prefill answered 500", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 500, body: "boom"}}},
		status: 500, pdHeader: HeaderPrefillError, sent: "[p0]", tried: "[]"})
	f(tc{name: "prefill timed out", pre: 0, dec: 1, legs: map[int][]leg{0: {{err: fasthttp.ErrTimeout}}},
		status: 504, pdHeader: HeaderPrefillError, mayRetry: true, sent: "[p0]", tried: "[p0]"})
	f(tc{name: "prefill answered 503", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 503, body: "full"}}},
		status: 503, pdHeader: HeaderPrefillError, mayRetry: true, sent: "[p0]", tried: "[p0]"})
	f(tc{name: "prefill answer without KV parameters", pre: 0, dec: 1, legs: map[int][]leg{0: ok},
		status: 502, pdHeader: HeaderPrefillError, sent: "[p0]", tried: "[]"})
	f(tc{name: "client left during the prefill", pre: 0, dec: 1, legs: map[int][]leg{0: {{err: upstream.ErrCut}}},
		status: fail.StatusClientClosed, sent: "[p0]", tried: "[]"})
	f(tc{name: "decode pod refused, moved", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: {{err: errRefused}}, 2: ok},
		retries: 1, spare: []int{2}, sent: "[p0 p1 p2]", tried: "[p1]", responded: "p2"})
	f(tc{name: "decode pod refused, none left", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: {{err: errRefused}}},
		retries: 1, status: 502, pdHeader: HeaderDecodeError, mayRetry: true, sent: "[p0 p1]", tried: "[p1]"})
	f(tc{name: "decode pod refused, no retries left", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: {{err: errRefused}}},
		spare: []int{2}, status: 502, pdHeader: HeaderDecodeError, mayRetry: true, sent: "[p0 p1]", tried: "[p1]"})
	f(tc{name: "decode watchdog", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: {{err: fasthttp.ErrTimeout}}},
		opts: route.PDOptions{DecodeFirstResponseTimeout: time.Second}, stream: true,
		status: 504, pdHeader: HeaderDecodeError, sent: "[p0 p1]", tried: "[p1]", watchdogs: 1})
	f(tc{name: "decode timeout, no watchdog", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: {{err: fasthttp.ErrTimeout}}},
		stream: true, status: 504, pdHeader: HeaderDecodeError, mayRetry: true, sent: "[p0 p1]", tried: "[p1]"})
	f(tc{name: "decode pod reset before its head, the pair retried", pre: 0, dec: 1, legs: map[int][]leg{0: {{status: 200, body: kv}}, 1: {{err: fasthttp.ErrConnectionClosed}}},
		retries: 1, spare: []int{2}, status: 502, pdHeader: HeaderDecodeError, mayRetry: true, sent: "[p0 p1]", tried: "[p1]"})
	// Concurrent (SGLang).
	f(tc{name: "concurrent: both legs answer", pre: 3, dec: 1, legs: map[int][]leg{3: ok, 1: ok},
		tried: "[]", responded: "p1", sent: "[p1 p3]"})
	f(tc{name: "concurrent: prefill answered 500, decode waiting", pre: 3, dec: 1, legs: map[int][]leg{3: {{status: 500}}, 1: {{wait: true}}},
		status: 500, pdHeader: HeaderPrefillError, tried: "[]", sent: "[p1 p3]"})
	f(tc{name: "concurrent: prefill pod refused, decode waiting", pre: 3, dec: 1, legs: map[int][]leg{3: {{err: errRefused}}, 1: {{wait: true}}},
		status: 502, pdHeader: HeaderPrefillError, mayRetry: true, tried: "[p3]", sent: "[p1 p3]"})
	f(tc{name: "concurrent: decode pod refused, moved", pre: 3, dec: 1, legs: map[int][]leg{3: ok, 1: {{err: errRefused}}, 2: ok},
		retries: 1, spare: []int{2}, tried: "[p1]", responded: "p2", sent: "[p1 p2 p3]"})
	f(tc{name: "concurrent: decode watchdog", pre: 3, dec: 1, legs: map[int][]leg{3: ok, 1: {{wait: true}}},
		opts: route.PDOptions{DecodeFirstResponseTimeout: 20 * time.Millisecond}, stream: true,
		status: 504, pdHeader: HeaderDecodeError, tried: "[]", sent: "[p1 p3]", watchdogs: 1})
	f(tc{name: "concurrent: decode answered 500, the prefill fails within the grace", pre: 3, dec: 1,
		legs:   map[int][]leg{3: {{status: 500, delay: 5 * time.Millisecond}}, 1: {{status: 500}}},
		status: 500, pdHeader: HeaderPrefillError, tried: "[]", sent: "[p1 p3]"})
	f(tc{name: "concurrent: decode answered 503, the prefill succeeds", pre: 3, dec: 1,
		legs:  map[int][]leg{3: {{status: 200, body: "{}", delay: 20 * time.Millisecond}}, 1: {{status: 503}}},
		tried: "[]", responded: "p1", sent: "[p1 p3]"})
}

// TestConcurrentPrefillCutTimesNothing: a concurrent prefill leg the
// client cut short is not a prefill's time, as a sequential one is not:
// pdlb_pd_prefill_seconds counts neither.
func TestConcurrentPrefillCutTimesNothing(t *testing.T) {
	pods := pdPods(t)
	set := metrics.NewSet()
	m := NewMetrics(set, "m", []float64{1})
	for _, c := range []struct {
		name     string
		pre, dec int
		legs     map[int][]leg
	}{
		{"sequential", 0, 1, map[int][]leg{0: {{err: upstream.ErrCut}}}},
		{"concurrent", 3, 1, map[int][]leg{3: {{err: upstream.ErrCut}}, 1: {{wait: true}}}},
	} {
		s := &scriptedLegs{script: map[*pool.Pod][]leg{}}
		for i, l := range c.legs {
			s.script[pods[i]] = l
		}
		var req fasthttp.Request
		req.SetBodyString(`{"model":"m","prompt":"hi"}`)
		ctx := new(fasthttp.RequestCtx)
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5555}, nil)
		call := AcquireCall(s, s, ctx, route.PDOptions{PrefillRequestTimeout: time.Second}, m, false, false, 1, 1)
		s.c, call.Pre, call.Dec = call, pods[c.pre], pods[c.dec]
		if f := call.RunPair(); f != fail.ClientLeft {
			t.Fatalf("%s: %v, want the client left", c.name, f)
		}
		call.Release()
		var b bytes.Buffer
		set.WritePrometheus(&b)
		for _, line := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(line, "pdlb_pd_prefill_seconds_count") && !strings.HasSuffix(line, " 0") {
				t.Fatalf("%s: a prefill leg cut short was timed: %s", c.name, line)
			}
		}
	}
}

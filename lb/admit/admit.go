package admit

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// Class is a request's priority class. Each class has its own SLOs and its
// own rule for a request that would miss them: interactive requests are
// rejected at once (a fast 429 the client can retry elsewhere beats a slow
// timeout), batch requests wait in the deferral queue.
type Class uint8

// The priority classes.
const (
	Interactive Class = iota
	Batch
	NumClasses
)

var classNames = [NumClasses]string{"interactive", "batch"}

func (c Class) String() string {
	if c < NumClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ErrUnknownClass is returned by ParseClass for a name that is no class.
var ErrUnknownClass = errors.New("admit: unknown priority class")

// ParseClass maps a request's priority name to its class; an empty name is
// Interactive, the class of a request that says nothing.
func ParseClass(name string) (Class, error) {
	if name == "" {
		return Interactive, nil
	}
	for i, n := range classNames {
		if n == name {
			return Class(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (known: interactive, batch)", ErrUnknownClass, name)
}

// Defaults of the admission knobs. The interactive TTFT target is the
// global-scheduling study's 2 s; its TPOT target of 100 ms is ten tokens a
// second, reading speed.
const (
	DefaultInteractiveTTFTSLO = 2.0
	DefaultInteractiveTPOTSLO = 0.1
	DefaultBatchTTFTSLO       = 60.0
	DefaultBatchMaxWait       = 30.0
	DefaultDeferQueue         = 1024
)

// ClassConfig is one class's targets. Times are in seconds.
type ClassConfig struct {
	// TTFTSLO is the time to first token the class is promised, counted
	// from arrival (defaults: interactive 2, batch 60).
	TTFTSLO float64 `yaml:"ttft_slo"`
	// TPOTSLO is the time per output token the class is promised; 0 means
	// none (defaults: interactive 0.1, batch 0).
	TPOTSLO float64 `yaml:"tpot_slo"`
	// MaxWait is how long a request of the class may wait in the deferral
	// queue for a prediction that clears; 0 rejects at once instead
	// (defaults: interactive 0, batch 30).
	MaxWait float64 `yaml:"max_wait"`
}

// Config is the admission controller's configuration.
type Config struct {
	// Classes holds each class's targets, indexed by Class.
	Classes [NumClasses]ClassConfig `yaml:"classes"`
	// DeferQueue is the most requests the deferral queue holds (default
	// 1,024); a request deferred when it is full is rejected.
	DeferQueue int `yaml:"defer_queue"`
}

// DefaultConfig returns the configuration with every default.
func DefaultConfig() Config {
	return Config{
		Classes: [NumClasses]ClassConfig{
			Interactive: {TTFTSLO: DefaultInteractiveTTFTSLO, TPOTSLO: DefaultInteractiveTPOTSLO},
			Batch:       {TTFTSLO: DefaultBatchTTFTSLO, MaxWait: DefaultBatchMaxWait},
		},
		DeferQueue: DefaultDeferQueue,
	}
}

var errConfig = errors.New("admit: invalid config")

// Validate rejects values the controller cannot run with, naming the field
// and quoting the value.
func (c Config) Validate() error {
	for i, cc := range c.Classes {
		name := Class(i).String()
		switch {
		case !(cc.TTFTSLO > 0):
			return fmt.Errorf("%w: classes.%s.ttft_slo = %v must be positive", errConfig, name, cc.TTFTSLO)
		case !(cc.TPOTSLO >= 0):
			return fmt.Errorf("%w: classes.%s.tpot_slo = %v must not be negative", errConfig, name, cc.TPOTSLO)
		case !(cc.MaxWait >= 0):
			return fmt.Errorf("%w: classes.%s.max_wait = %v must not be negative", errConfig, name, cc.MaxWait)
		}
	}
	if c.DeferQueue < 0 {
		return fmt.Errorf("%w: defer_queue = %d must not be negative", errConfig, c.DeferQueue)
	}
	return nil
}

// Action is what the gateway does with a request.
type Action uint8

// The actions.
const (
	// Admit: send the request to the chosen pod now.
	Admit Action = iota
	// Reject: answer 429 with Retry-After now, before any pod spends work.
	Reject
	// Defer: the request waits in the deferral queue; see Controller.Head.
	Defer
)

func (a Action) String() string {
	switch a {
	case Admit:
		return "admit"
	case Reject:
		return "reject"
	case Defer:
		return "defer"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Verdict is an admission decision. RetryAfter is the whole seconds a
// rejected client should wait (the Retry-After header): how far the
// prediction overshoots the target, which is how long the pod's queue needs
// to drain enough, at least 1. It is 0 unless Action is Reject.
type Verdict struct {
	Action     Action
	RetryAfter int
}

// Deferred is a request waiting in the deferral queue.
type Deferred struct {
	ID    uint64  // the caller's request id
	Class Class   // its priority class
	Lane  string  // the lane it waits in (see Controller)
	Since float64 // when it arrived, on the caller's clock (seconds)
}

// ClassStats are one class's counters, plain numbers for the gateway's
// metrics. Every request ends in exactly one of Admitted or Rejected, by
// its last decision where the caller moves rejected ones on (Judge);
// Deferred counts those that waited on the way (and Waiting those waiting
// now); Met and Missed count admitted requests whose outcome the caller
// reported through Observe.
type ClassStats struct {
	Admitted, Rejected, Deferred, Waiting, Met, Missed uint64
}

// Attainment is the fraction of decided requests that met the class's SLOs:
// rejected requests count as misses, admitted ones still running are not
// counted yet. It is 1 before any request.
func (s ClassStats) Attainment() float64 {
	total := s.Met + s.Missed + s.Rejected
	if total == 0 {
		return 1
	}
	return float64(s.Met) / float64(total)
}

// Controller makes admission decisions. All methods are safe for concurrent
// use and allocate nothing. Decide needs no lock (counters are atomic); the
// deferral queue is a fixed ring behind a mutex held for a few instructions.
//
// The queue is first come, first served within a lane (the gateway's lanes
// are its models): a deferred request is retried (Retry) only once it is
// the oldest of its lane (First), so a lane whose pods are overloaded does
// not hold up another's requests, whose predictions come from other pods.
// The deferral queue's bound and the max waits are the queue's as a whole.
//
// Times are seconds on the caller's clock: wall time in the gateway,
// virtual time in bench/cluster.
type Controller struct {
	cfg   Config
	stats [NumClasses]classCounters

	mu    sync.Mutex
	ring  []Deferred
	head  int
	count int
	// lanes holds each lane with a request in the ring: its oldest entry
	// and how many it has. At most one a ring slot, so it never grows
	// past its first capacity.
	lanes []lane
}

// lane is one lane's place in the deferral queue.
type lane struct {
	first Deferred // its oldest entry
	n     int      // its entries in the ring
}

type classCounters struct {
	admitted, rejected, deferred, met, missed atomic.Uint64
}

// New returns a controller for a configuration that Validate accepts.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, ring: make([]Deferred, cfg.DeferQueue), lanes: make([]lane, 0, cfg.DeferQueue)}, nil
}

// Config returns the controller's configuration.
func (c *Controller) Config() Config { return c.cfg }

// fits reports whether a request that has waited waited seconds meets its
// class's targets if its predictions ttft and tpot (seconds) come true.
func (c *Controller) fits(class Class, waited, ttft, tpot float64) bool {
	cc := &c.cfg.Classes[class]
	return waited+ttft <= cc.TTFTSLO && (cc.TPOTSLO == 0 || tpot <= cc.TPOTSLO)
}

// Decide admits, defers or rejects a newly arrived request of class, whose
// id the caller chose, given the predicted TTFT and TPOT (seconds) on the
// pod the router picked. A Defer verdict means the request is now in the
// deferral queue, in lane; a request the full queue cannot take is
// rejected.
func (c *Controller) Decide(class Class, lane string, id uint64, now, ttft, tpot float64) Verdict {
	v := c.Judge(class, lane, id, now, ttft, tpot)
	if v.Action == Reject {
		c.Rejected(class)
	}
	return v
}

// Judge is Decide for a caller that may move a rejected request on, to be
// decided anew elsewhere (the gateway's fallback model): it leaves the
// rejection uncounted, for Rejected to count once it stands, so that a
// request counts once, by its last decision.
func (c *Controller) Judge(class Class, lane string, id uint64, now, ttft, tpot float64) Verdict {
	st := &c.stats[class]
	if c.fits(class, 0, ttft, tpot) {
		st.admitted.Add(1)
		return Verdict{Action: Admit}
	}
	if c.cfg.Classes[class].MaxWait > 0 && c.push(Deferred{ID: id, Class: class, Lane: lane, Since: now}) {
		st.deferred.Add(1)
		return Verdict{Action: Defer}
	}
	return Verdict{Action: Reject, RetryAfter: c.retryAfter(class, ttft)}
}

// Rejected counts a rejection of class that stands: one Judge left to the
// caller, or that of a deferred request whose wait ran out and which the
// caller took out of the queue (Withdraw).
func (c *Controller) Rejected(class Class) { c.stats[class].rejected.Add(1) }

// retryAfter is how many whole seconds (at least 1) the prediction ttft
// overshoots class's TTFT target by.
func (c *Controller) retryAfter(class Class, ttft float64) int {
	over := ttft - c.cfg.Classes[class].TTFTSLO
	if !(over < 3600) { // also +Inf and NaN
		return 3600
	}
	return max(1, int(math.Ceil(over)))
}

func (c *Controller) push(d Deferred) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count == len(c.ring) {
		return false
	}
	c.ring[(c.head+c.count)%len(c.ring)] = d
	c.count++
	if l := c.laneOf(d.Lane); l != nil {
		l.n++
	} else {
		c.lanes = append(c.lanes, lane{first: d, n: 1})
	}
	return true
}

// laneOf is the lane named name, nil when none of its requests waits;
// the caller holds mu. There are few lanes (models) and each waiter asks
// once a poll, so a scan beats a map, which would allocate.
func (c *Controller) laneOf(name string) *lane {
	for i := range c.lanes {
		if c.lanes[i].first.Lane == name {
			return &c.lanes[i]
		}
	}
	return nil
}

// Expired removes and returns the oldest deferred request whose wait has
// run past its class's MaxWait at now, counting it rejected; ok is false
// when none has. The caller answers it with 429 and calls Expired again
// until ok is false. Retry-After for it is 1: the queue it waited in is
// still full of work, but a slot may free up at any moment.
func (c *Controller) Expired(now float64) (d Deferred, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The ring is in arrival order but classes wait differently long, so
	// look at every entry; the queue is short and this runs per completion,
	// not per request.
	for i := 0; i < c.count; i++ {
		e := c.ring[(c.head+i)%len(c.ring)]
		if now-e.Since <= c.cfg.Classes[e.Class].MaxWait {
			continue
		}
		c.removeAt(i)
		c.stats[e.Class].rejected.Add(1)
		return e, true
	}
	return Deferred{}, false
}

// removeAt drops the i-th oldest entry, keeping the others in order; the
// caller holds mu.
func (c *Controller) removeAt(i int) {
	e := c.ring[(c.head+i)%len(c.ring)]
	for j := i; j > 0; j-- {
		c.ring[(c.head+j)%len(c.ring)] = c.ring[(c.head+j-1)%len(c.ring)]
	}
	c.head = (c.head + 1) % len(c.ring)
	c.count--
	l := c.laneOf(e.Lane)
	if l.n--; l.n == 0 {
		*l = c.lanes[len(c.lanes)-1]
		c.lanes = c.lanes[:len(c.lanes)-1]
		return
	}
	if l.first.ID != e.ID {
		return
	}
	// e was its lane's oldest, so the next is among the entries after
	// it, which now begin at i.
	for j := i; j < c.count; j++ {
		if d := c.ring[(c.head+j)%len(c.ring)]; d.Lane == e.Lane {
			l.first = d
			return
		}
	}
	panic("BUG: admit: a lane counts more entries than the ring holds")
}

// Withdraw takes deferred request id out of the queue, counted neither
// admitted nor rejected: its client left, or its wait ran out (its
// rejection is the caller's to count, with Rejected, once it stands);
// false when it is not queued. A waiter that gives up takes its own
// entry: were it to take the oldest expired one (Expired), an older
// waiter that then left would find its entry gone and leave this one in
// the queue for good, at its head.
func (c *Controller) Withdraw(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.takeLocked(id)
	return ok
}

// takeLocked removes and returns id's entry; the caller holds mu.
func (c *Controller) takeLocked(id uint64) (Deferred, bool) {
	for i := 0; i < c.count; i++ {
		if e := c.ring[(c.head+i)%len(c.ring)]; e.ID == id {
			c.removeAt(i)
			return e, true
		}
	}
	return Deferred{}, false
}

// Head returns the oldest deferred request without removing it; ok is false
// when the queue is empty. It is the oldest of its lane: the caller may
// route it again and pass the fresh predictions to Retry.
func (c *Controller) Head() (d Deferred, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count == 0 {
		return Deferred{}, false
	}
	return c.ring[c.head], true
}

// First reports whether deferred request id is the oldest of its lane,
// the one whose turn it is to be routed again and passed to Retry.
func (c *Controller) First(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.firstLocked(id) != nil
}

// firstLocked is the lane whose oldest entry is id, or nil; the caller
// holds mu.
func (c *Controller) firstLocked(id uint64) *lane {
	for i := range c.lanes {
		if c.lanes[i].first.ID == id {
			return &c.lanes[i]
		}
	}
	return nil
}

// Retry re-decides deferred request id, which must be the oldest of its
// lane (else it returns false and changes nothing: another goroutine got
// there first). When the predictions now meet its class's targets,
// counting the time it has already waited, it leaves the queue as
// admitted and Retry returns true; otherwise it keeps waiting, and later
// requests of its lane wait behind it, so each lane stays first come,
// first served.
func (c *Controller) Retry(id uint64, now, ttft, tpot float64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.firstLocked(id)
	if l == nil || !c.fits(l.first.Class, now-l.first.Since, ttft, tpot) {
		return false
	}
	e, _ := c.takeLocked(id)
	c.stats[e.Class].admitted.Add(1)
	return true
}

// Observe records the outcome of an admitted request of class: its measured
// TTFT and TPOT (seconds; TPOT 0 when it produced at most one token).
func (c *Controller) Observe(class Class, ttft, tpot float64) {
	if c.fits(class, 0, ttft, tpot) {
		c.stats[class].met.Add(1)
	} else {
		c.stats[class].missed.Add(1)
	}
}

// Stats returns class's counters.
func (c *Controller) Stats(class Class) ClassStats {
	st := &c.stats[class]
	s := ClassStats{
		Admitted: st.admitted.Load(),
		Rejected: st.rejected.Load(),
		Deferred: st.deferred.Load(),
		Met:      st.met.Load(),
		Missed:   st.missed.Load(),
	}
	c.mu.Lock()
	for i := 0; i < c.count; i++ {
		if c.ring[(c.head+i)%len(c.ring)].Class == class {
			s.Waiting++
		}
	}
	c.mu.Unlock()
	return s
}

package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/engines/sim"
	"pdlb/internal/redistest"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

// TestPlanReplicasActOnce: two replicas plan one fleet through one Redis,
// each with the webhook. Both decide the same switch, but only one posts
// it: the controller behind the webhook hears one split per decision, not
// one per replica. The other says it only advises, and takes over once
// the acting replica is gone.
func TestPlanReplicasActOnce(t *testing.T) {
	srv := redistest.Start(t, 0)
	var mu sync.Mutex
	var posted []string // the replica of every webhook call
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posted = append(posted, strings.TrimPrefix(r.URL.Path, "/"))
		mu.Unlock()
	}))
	defer hook.Close()
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(posted)
	}

	replicas, closeReplica := planReplicas(t, srv.Addr(), 300, hook.URL, nil, "a", "b")

	// window closes a planning window on each replica of ids after each
	// routed a minute of long prompts; then it waits for the switch it
	// started, if any, to end.
	start, windows := time.Now(), 0
	window := func(ids ...string) {
		t.Helper()
		windows++
		for _, id := range ids {
			routeLongPrompts(replicas[id])
		}
		for _, id := range ids {
			replicas[id].plan.tick(context.Background(), start.Add(time.Duration(windows)*time.Minute))
		}
		for _, id := range ids {
			testwait.For(t, "replica "+id+"'s switch to end", func() bool { return !planOf(t, replicas[id]).Models[0].Switching })
		}
	}
	testwait.For(t, "a replica to post a switch", func() bool {
		window("a", "b")
		return len(calls()) > 0
	})
	for range 3 {
		window("a", "b")
	}
	got := calls()
	acting := got[0]
	other := map[string]string{"a": "b", "b": "a"}[acting]
	if slices.Contains(got, other) {
		t.Fatalf("the webhook heard both replicas: %v", got)
	}
	st := planOf(t, replicas[other])
	if st.Acting || st.LeaseHolder != acting || !strings.Contains(st.Models[0].Reason, "advice only") {
		t.Errorf("replica %s, not acting: %+v", other, st)
	}

	// The acting replica ends; the other takes the lease when it expires.
	closeReplica(acting)
	n := len(got)
	testwait.For(t, "replica "+other+" to post a switch", func() bool {
		window(other)
		return len(calls()) > n
	})
	if got := calls()[n:]; slices.ContainsFunc(got, func(id string) bool { return id != other }) {
		t.Fatalf("after %s ended the webhook heard %v", acting, got)
	}
}

// TestPlanLeaseLostMidSwitch: the acting replica loses the plan lease
// while its switch waits on the webhook (it was cut off from Redis for the
// lease's term, and another replica took over). The rest of its switch
// would run beside the new holder's: whether the webhook then fails or
// takes the split, the replica must neither post it again nor tell a pod
// to switch.
func TestPlanLeaseLostMidSwitch(t *testing.T) {
	f := func(status int) {
		t.Helper()
		srv := redistest.Start(t, 0)
		var switched atomic.Int32 // POST /admin/role the pods received
		var addrs []string
		for range 3 {
			pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && r.URL.Path == "/admin/role" {
					switched.Add(1)
				}
				http.NotFound(w, r)
			}))
			defer pod.Close()
			addrs = append(addrs, strings.TrimPrefix(pod.URL, "http://"))
		}
		// The first post waits for the test to take the lease; every post
		// is then answered status (a 503 would be retried).
		var posts atomic.Int32
		answer := make(chan struct{})
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			posts.Add(1)
			<-answer
			w.WriteHeader(status)
		}))
		defer hook.Close()
		replicas, closeReplica := planReplicas(t, srv.Addr(), 60_000, hook.URL, func(c *config.Config) {
			c.Plan.SwitchRoles = true
			for i := range c.Pods {
				c.Pods[i].Address = addrs[i]
			}
		}, "a")
		defer closeReplica("a")
		answered := sync.OnceFunc(func() { close(answer) })
		defer answered()
		g := replicas["a"]
		testwait.For(t, "a to hold the lease", func() bool { return planOf(t, g).LeaseHolder == "a" })

		start, windows := time.Now(), 0
		testwait.For(t, "a to start a switch", func() bool {
			windows++
			routeLongPrompts(g)
			g.plan.tick(context.Background(), start.Add(time.Duration(windows)*time.Minute))
			return planOf(t, g).Models[0].Switching
		})
		testwait.For(t, "the switch to post to the webhook", func() bool { return posts.Load() > 0 })

		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		if err := rdb.Set(context.Background(), g.plan.share.keys[0], "b", 0).Err(); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "a to see b hold the lease", func() bool { return planOf(t, g).LeaseHolder == "b" })
		answered()
		testwait.For(t, "a's switch to end", func() bool { return !planOf(t, g).Models[0].Switching })
		if n, m := posts.Load(), switched.Load(); n != 1 || m != 0 {
			t.Errorf("webhook answering %d: after a lost the lease, its switch went on: %d more webhook posts, %d pods told to switch",
				status, n-1, m)
		}
	}
	f(http.StatusServiceUnavailable)
	f(http.StatusOK)
}

// TestPlanSwitchRolesWithReplicas: two replicas plan one fleet of sim
// pods with switch_roles. The acting one could re-role pods in its own
// pool only, while the other would go on routing to them in their old
// roles (a decode leg to a pod now serving prefill fails): with several
// replicas the decision stays advice, and every replica routes each pod
// in the role it serves.
func TestPlanSwitchRolesWithReplicas(t *testing.T) {
	srv := redistest.Start(t, 0)
	pods := map[string]*sim.Pod{}
	for _, name := range []string{"p1", "d1", "d2"} {
		role := sim.RoleDecode
		if name == "p1" {
			role = sim.RolePrefill
		}
		p, err := sim.Start(sim.Config{Name: name, Model: "m", Role: role, Speedup: 100})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pods[name] = p
	}
	replicas, _ := planReplicas(t, srv.Addr(), 60_000, "", func(c *config.Config) {
		c.Plan.SwitchRoles = true
		for i := range c.Pods {
			c.Pods[i].Address = pods[c.Pods[i].Name].Addr()
		}
	}, "a", "b")
	var holder string
	testwait.For(t, "both replicas to see one lease holder", func() bool {
		a, b := planOf(t, replicas["a"]), planOf(t, replicas["b"])
		holder = a.LeaseHolder
		return holder != "" && b.LeaseHolder == holder && a.Replicas == 2 && b.Replicas == 2
	})

	start, windows := time.Now(), 0
	testwait.For(t, "the acting replica to decide a switch", func() bool {
		windows++
		for _, g := range replicas {
			routeLongPrompts(g)
		}
		for _, g := range replicas {
			g.plan.tick(context.Background(), start.Add(time.Duration(windows)*time.Minute))
		}
		return strings.HasPrefix(planOf(t, replicas[holder]).Models[0].Reason, "switch ")
	})
	for id, g := range replicas {
		testwait.For(t, "replica "+id+"'s switch to end", func() bool { return !planOf(t, g).Models[0].Switching })
		for _, p := range g.pool.Load().Pods {
			if serves := pods[p.Config.Name].Role(); p.Config.Role != serves {
				t.Errorf("replica %s routes %s as %s, the pod serves %s", id, p.Config.Name, p.Config.Role, serves)
			}
		}
	}
	if st := planOf(t, replicas[holder]).Models[0]; !strings.Contains(st.Reason, "advice only: switch_roles") {
		t.Errorf("the acting replica's reason: %q", st.Reason)
	}
}

// TestPlanLeaseReleasedOnClose: the acting replica gives up the plan lease
// when it closes, so the other acts at its next exchange rather than once
// the lease expires, here long after the test's wait. A replica that
// closes without holding the lease leaves it to its holder.
func TestPlanLeaseReleasedOnClose(t *testing.T) {
	srv := redistest.Start(t, 0)
	replicas, closeReplica := planReplicas(t, srv.Addr(), 60_000, "", nil, "a", "b")
	var holder string
	testwait.For(t, "both replicas to see one lease holder", func() bool {
		a, b := planOf(t, replicas["a"]), planOf(t, replicas["b"])
		holder = a.LeaseHolder
		return holder != "" && b.LeaseHolder == holder && a.Replicas == 2 && b.Replicas == 2
	})
	other := map[string]string{"a": "b", "b": "a"}[holder]

	closeReplica(holder)
	testwait.For(t, "replica "+other+" to act after "+holder+" closed", func() bool {
		st := planOf(t, replicas[other])
		return st.Acting && st.Replicas == 1
	})

	// Another replica, say one that just took over, holds the lease.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	lease := replicas[other].plan.share.keys[0]
	if err := rdb.Set(context.Background(), lease, "c", 0).Err(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "replica "+other+" to see c hold the lease", func() bool {
		return planOf(t, replicas[other]).LeaseHolder == "c"
	})
	closeReplica(other)
	if got, err := rdb.Get(context.Background(), lease).Result(); got != "c" {
		t.Fatalf("after %s, not holding the lease, closed, it is %q (%v), want c", other, got, err)
	}
}

// TestPlanLostReplyCountsOnce: Redis runs an exchange that carries a
// replica's new requests, and the reply is lost (the connection is cut, as
// a reset or a read timeout leaves it). The replica cannot tell whether its
// counts went in; its next exchange must not add them again, or every
// replica's planner reads the window with them twice.
func TestPlanLostReplyCountsOnce(t *testing.T) {
	const requests = 4242
	srv := redistest.Start(t, 0)
	proxy := startReplyDropper(t, srv.Addr(), []byte(fmt.Sprintf("$4\r\n%d\r\n", requests)))
	replicas, _ := planReplicas(t, proxy.addr, 60_000, "", nil, "a")
	g := replicas["a"]
	testwait.For(t, "a's first exchange", func() bool { return planOf(t, g).LeaseHolder == "a" })

	g.metrics.model(g.pool.Load().Models[0]).pd.Kinds[0].Add(requests)
	testwait.For(t, "the reply to the exchange of the requests to be lost", proxy.dropped.Load)
	lost := time.Now()
	testwait.For(t, "an exchange after the lost reply", func() bool {
		s := g.plan.share
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.at.After(lost)
	})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	got, err := rdb.HGet(context.Background(), g.plan.share.keyPre+"m", "requests").Int()
	if err != nil || got != requests {
		t.Fatalf("after a lost reply the fleet's counters hold %d requests (%v), want %d", got, err, requests)
	}
}

// TestPlanFirstWindowWithRedis: a replica that shares a Redis observes
// its first window one window after it starts, as a replica alone does,
// not two.
func TestPlanFirstWindowWithRedis(t *testing.T) {
	srv := redistest.Start(t, 0)
	replicas, _ := planReplicas(t, srv.Addr(), 60_000, "", nil, "a")
	g := replicas["a"]
	testwait.For(t, "a's first exchange", func() bool { return planOf(t, g).LeaseHolder == "a" })
	g.plan.tick(context.Background(), time.Now().Add(time.Minute))
	if st := planOf(t, g).Models[0]; st.ObservedAt.IsZero() {
		t.Fatalf("a window after the start, no window observed: %q", st.Reason)
	}
}

// replyDropper passes a gateway's Redis connections through, but swallows
// the reply to the first plan exchange whose command holds match, once
// Redis has run it, and cuts that connection.
type replyDropper struct {
	addr, redis string
	match       []byte
	dropped     atomic.Bool
}

func startReplyDropper(t *testing.T, redisAddr string, match []byte) *replyDropper {
	d := &replyDropper{redis: redisAddr, match: match}
	d.addr = testnet.Serve(t, testnet.Listen(t), d.serve)
	return d
}

func (d *replyDropper) serve(c net.Conn) {
	up, err := net.Dial("tcp", d.redis)
	if err != nil {
		return
	}
	defer up.Close()
	// The client sends one command and waits for its reply: the bytes
	// that follow a matching command are its reply.
	var drop atomic.Bool
	go func() {
		defer up.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 && !d.dropped.Load() && bytes.Contains(buf[:n], []byte(":plan:lease")) && bytes.Contains(buf[:n], d.match) {
				drop.Store(true)
			}
			if n > 0 {
				if _, err := up.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		// An error reply (NOSCRIPT: the script did not run) goes through.
		if n > 0 && drop.Load() && buf[0] != '-' && d.dropped.CompareAndSwap(false, true) {
			return
		}
		drop.Store(false)
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// routeLongPrompts counts on g a minute of long prompts, as if g had
// routed them: about 3.3 prefill pods of work for the 1P2D pool of
// planReplicas at the default 20,000 tokens/s.
func routeLongPrompts(g *Gateway) {
	stats := g.metrics.model(g.pool.Load().Models[0])
	stats.pd.Kinds[0].Add(100)
	stats.requests[statusIndex(200)].Add(100)
	stats.generated.Add(100)
	stats.promptTokens.Add(100 * 20000)
}

// planReplicas starts a gateway for each of ids planning one 1P2D fleet
// through the Redis at addr: exchanging every 10 ms, its lease lasting
// expiryMs, posting to hook+"/"+id unless hook is "", its configuration
// then changed by edit unless nil. close ends one before the test does.
func planReplicas(t *testing.T, addr string, expiryMs int, hook string, edit func(*config.Config), ids ...string) (replicas map[string]*Gateway, close func(id string)) {
	t.Helper()
	replicas = map[string]*Gateway{}
	closed := map[string]bool{}
	t.Cleanup(func() {
		for id, g := range replicas {
			if !closed[id] {
				g.Close()
			}
		}
	})
	for _, id := range ids {
		cfg := config.Default()
		cfg.Redis.Address, cfg.Redis.ReplicaID = addr, id
		cfg.TokenLoad.SharedSyncIntervalMs, cfg.TokenLoad.SharedExpiryMs = 10, expiryMs
		// A switch costs next to nothing and may follow the last at once:
		// every window whose load wants more prefill pods switches.
		cfg.Plan.Enabled, cfg.Plan.MinDwellSec = true, 0
		cfg.Plan.DrainSec, cfg.Plan.WarmupSec = 0.1, 0.1
		if hook != "" {
			cfg.Plan.Webhook.URL = hook + "/" + id
		}
		cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
		cfg.Pods = []config.Pod{
			{Name: "p1", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
			{Name: "d1", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
			{Name: "d2", Model: "m", Address: "127.0.0.1:10003", Role: config.RoleDecode, Roleset: "a"},
		}
		if edit != nil {
			edit(&cfg)
		}
		g, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		replicas[id] = g
	}
	return replicas, func(id string) {
		replicas[id].Close()
		closed[id] = true
	}
}

// planStatus is the part of GET /admin/plan the plan's tests read.
type planStatus struct {
	Acting      bool   `json:"acting"`
	LeaseHolder string `json:"lease_holder"`
	Replicas    int64  `json:"replicas"`
	Models      []struct {
		ObservedAt time.Time `json:"observed_at"`
		Reason     string    `json:"reason"`
		Switching  bool      `json:"switching"`
	} `json:"models"`
}

// planOf is g's GET /admin/plan.
func planOf(t *testing.T, g *Gateway) planStatus {
	t.Helper()
	rec := httptest.NewRecorder()
	g.servePlan(rec, httptest.NewRequest(http.MethodGet, "/admin/plan", nil))
	var st planStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || len(st.Models) != 1 {
		t.Fatalf("/admin/plan: %s (%v)", rec.Body, err)
	}
	return st
}

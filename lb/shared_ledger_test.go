package lb_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"pdlb/engines/sim"
	"pdlb/internal/redistest"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/ledger"
)

// decodeLoad reads, from a gateway's /admin/pods, the decode tokens its
// ledger charges to pod: its own and, shared, the other replicas'.
func decodeLoad(t *testing.T, s *lb.Server, pod string) float64 {
	t.Helper()
	var out struct {
		Pods []struct {
			Name string
			Load struct{ Decode float64 } `json:"token_load"`
		}
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/pods")), &out); err != nil {
		t.Fatal(err)
	}
	for _, p := range out.Pods {
		if p.Name == pod {
			return p.Load.Decode
		}
	}
	t.Fatalf("no pod %s", pod)
	return 0
}

func TestReplicasShareTheDecodeLedger(t *testing.T) {
	redis := redistest.Start(t, 0)
	e := pdEngines[0]
	slow := func(c *sim.Config) { c.Speedup = 1 } // a 200-token answer takes about 2 s
	pre := startSim(t, e, "pre", sim.RolePrefill, slow)
	dec := startSim(t, e, "dec", sim.RoleDecode, slow)
	pods := []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
	shared := func(id string) func(*config.Config) {
		return func(c *config.Config) {
			c.Redis.Address, c.Redis.ReplicaID = redis.Addr(), id
			c.TokenLoad.SharedSyncIntervalMs = 20
		}
	}
	a := pdGateway(t, e, pods, shared("a"))
	b := pdGateway(t, e, pods, shared("b"))

	// A stream through a holds the decode pod; b sees it.
	stream := func(s *lb.Server) (*http.Response, error) {
		return client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(pdBody("/v1/chat/completions", true, 200)))
	}
	resp, err := stream(a)
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n')
	testwait.For(t, "replica b to see a's decode charge", func() bool { return decodeLoad(t, b, "dec") > 0 })
	if own := decodeLoad(t, a, "dec"); own <= 0 {
		t.Fatalf("replica a does not see its own charge: %v", own)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	testwait.For(t, "replica b to see the charge released", func() bool { return decodeLoad(t, b, "dec") == 0 })

	// Redis goes away while streams run through both replicas: every one
	// of them completes, each replica keeps its own ledger.
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(s *lb.Server) {
			defer wg.Done()
			r, err := stream(s)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer r.Body.Close()
			b, _ := io.ReadAll(r.Body)
			if r.StatusCode != 200 || !streamWhole(string(b)) {
				errs <- r.Status + " " + string(b[max(0, len(b)-120):])
			}
		}([]*lb.Server{a, b}[i%2])
	}
	redis.Stop()
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a request did not complete with Redis gone: %s", e)
	}
	ledgerSettles(t, a)
	ledgerSettles(t, b)
}

// TestSharedLedgerKeyPrefix: redis.key_prefix namespaces a gateway's keys,
// so two deployments sharing one Redis server keep their loads apart.
func TestSharedLedgerKeyPrefix(t *testing.T) {
	srv := redistest.Start(t, 0)
	sims := testFleet(t, "m", 1, 100)
	testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.Redis.Address, c.Redis.ReplicaID, c.Redis.KeyPrefix = srv.Addr(), "a", "staging"
		c.TokenLoad.SharedSyncIntervalMs = 20
	})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	replicas := func(prefix string) []string {
		ids, err := rdb.ZRange(context.Background(), "{"+prefix+"}:decode:replicas", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	testwait.For(t, "replica a in the staging replica set", func() bool { return slices.Equal(replicas("staging"), []string{"a"}) })
	if ids := replicas(ledger.DefaultKeyPrefix); len(ids) != 0 {
		t.Fatalf("replicas %v under the default prefix", ids)
	}
}

package lb_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/config"
)

// churnSecondsEnv sets how long TestChurn churns (default
// defaultChurnSeconds); make bench's churn scenario runs it for a minute.
const (
	churnSecondsEnv     = "PDLB_CHURN_SECONDS"
	defaultChurnSeconds = 6
	// churnEvery is how often the fleet changes.
	churnEvery = 200 * time.Millisecond
	// churnClients send requests back to back.
	churnClients = 8
)

// TestChurn changes the fleet every 200 ms through reloads (SIGHUP's
// path and discovery's, in turn) under load: pods leave, come back under
// their name at another address, and come under another name at a
// leaver's address. The pods that leave keep running, and at least two
// pods are always in the fleet, so every request must be answered 200.
// Each pod's ledger charges must be the requests it answered (a charge on
// a pod the request did not go to shows as a pod with more), every ledger
// must be back at zero at the end, and after each reload the prefix index
// must hold blocks only for the pods of the fleet.
func TestChurn(t *testing.T) {
	secs := defaultChurnSeconds
	if v := os.Getenv(churnSecondsEnv); v != "" {
		var err error
		if secs, err = strconv.Atoi(v); err != nil || secs <= 0 {
			t.Fatalf("%s = %q: want a number of seconds", churnSecondsEnv, v)
		}
	}
	const names, sims = 8, 10
	var addrs []string
	for i := range sims {
		p, err := sim.Start(sim.Config{Name: fmt.Sprint("sim-", i), Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		addrs = append(addrs, p.Addr())
	}
	f := &churnFleet{rng: rand.New(rand.NewPCG(26, 2)), names: names, addrs: addrs}
	for range 4 {
		f.add()
	}
	s := testGateway(t, f.pods(), func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", Policy: "hybrid_cache_load"}}
	})
	load := startChurnLoad(s)
	var stale int
	reloads := 0
	for end := time.Now().Add(time.Duration(secs) * time.Second); time.Now().Before(end); time.Sleep(churnEvery) {
		f.change()
		if reloads++; reloads%2 == 0 {
			cfg := s.Gateway.Config()
			cfg.Pods = f.pods()
			if err := s.Reload(cfg); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Gateway.SetPods(f.pods()); err != nil {
			t.Fatal(err)
		}
		stale = max(stale, staleBlocks(t, s))
	}
	load.stop()
	ledgerSettles(t, s)
	after := metricValue(t, s, "pd_token_load_")
	stale = max(stale, staleBlocks(t, s))
	// Each name's charges against the requests it answered.
	var mischarged []string
	for _, name := range f.allNames() {
		charged := metricValue(t, s, `pdlb_ledger_charges_total{pod="`+name+`"}`)
		if served := load.served[name]; charged != float64(served) {
			mischarged = append(mischarged, fmt.Sprintf("%s charged %v, answered %d", name, charged, served))
		}
	}
	t.Logf("churn: %d s, %d reloads (%d pods added, %d removed), %d requests: %d ok, %d errors, %d lost; "+
		"pods whose charges differ from their answers: %d; ledger after: %v tokens; index blocks of pods not in the fleet: %d",
		secs, reloads, f.added, f.removed, load.sent.Load(), load.ok.Load(), load.errors.Load(), load.lost.Load(),
		len(mischarged), after, stale)
	if load.ok.Load() == 0 || load.errors.Load() != 0 || load.lost.Load() != 0 {
		t.Errorf("%d answered, %d errors, %d lost; samples: %q", load.ok.Load(), load.errors.Load(), load.lost.Load(), load.samples)
	}
	if len(mischarged) > 0 {
		t.Errorf("ledger charges against answers: %q", mischarged)
	}
	if after != 0 || stale != 0 {
		t.Errorf("%v tokens still charged, %d index blocks for pods not in the fleet", after, stale)
	}
}

// churnFleet is the fleet TestChurn reloads: pods named p0..p<names-1>,
// each at one of addrs, no two sharing a name or an address.
type churnFleet struct {
	rng            *rand.Rand
	names          int
	addrs          []string
	live           []config.Pod
	added, removed int
}

func (f *churnFleet) pods() []config.Pod { return slices.Clone(f.live) }

func (f *churnFleet) allNames() []string {
	var out []string
	for i := range f.names {
		out = append(out, fmt.Sprint("p", i))
	}
	return out
}

// add adds a pod under a name and at an address that no pod has.
func (f *churnFleet) add() {
	free := func(n int, used func(i int) bool) int {
		for {
			if i := f.rng.IntN(n); !used(i) {
				return i
			}
		}
	}
	name := fmt.Sprint("p", free(f.names, func(i int) bool {
		return slices.ContainsFunc(f.live, func(p config.Pod) bool { return p.Name == fmt.Sprint("p", i) })
	}))
	addr := f.addrs[free(len(f.addrs), func(i int) bool {
		return slices.ContainsFunc(f.live, func(p config.Pod) bool { return p.Address == f.addrs[i] })
	})]
	f.live = append(f.live, config.Pod{Name: name, Model: "m", Address: addr})
	f.added++
}

// change removes a pod, adds one, or both, keeping two to six.
func (f *churnFleet) change() {
	switch n := len(f.live); {
	case n <= 2:
		f.add()
	case n >= 6 || f.rng.IntN(3) == 0:
		i := f.rng.IntN(n)
		f.live = slices.Delete(f.live, i, i+1)
		f.removed++
		if f.rng.IntN(2) == 0 {
			f.add()
		}
	default:
		f.add()
	}
}

// staleBlocks is how many blocks the gateway's prefix index holds beyond
// those of the pods in its fleet.
func staleBlocks(t *testing.T, s *lb.Server) int {
	t.Helper()
	var out struct {
		Models []struct {
			HeldBlocks int `json:"held_blocks"`
			Pods       []struct{ Blocks int }
		}
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+s.AdminAddr()+"/admin/index")), &out); err != nil {
		t.Fatal(err)
	}
	stale := 0
	for _, m := range out.Models {
		stale += m.HeldBlocks
		for _, p := range m.Pods {
			stale -= p.Blocks
		}
	}
	return stale
}

// churnLoad is TestChurn's clients: each sends a request, streamed or
// not, of one of a few conversations, back to back until stopped.
type churnLoad struct {
	done                   chan struct{}
	wg                     sync.WaitGroup
	sent, ok, errors, lost atomic.Int64
	mu                     sync.Mutex
	served                 map[string]int // 200s by the pod that answered (x-pdlb-pod)
	samples                []string
}

func startChurnLoad(s *lb.Server) *churnLoad {
	l := &churnLoad{done: make(chan struct{}), served: map[string]int{}}
	for c := range churnClients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			hc := &http.Client{Timeout: 20 * time.Second}
			defer hc.CloseIdleConnections()
			for i := 0; ; i++ {
				select {
				case <-l.done:
					return
				default:
				}
				l.one(hc, s, (c*7+i)%16, i%2 == 0)
			}
		}()
	}
	return l
}

func (l *churnLoad) stop() {
	close(l.done)
	l.wg.Wait()
}

// one sends conversation conv's request and records how it ended: 200
// with a whole answer, an error in OpenAI's shape, or lost.
func (l *churnLoad) one(hc *http.Client, s *lb.Server, conv int, stream bool) {
	l.sent.Add(1)
	body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
		stream, strings.Repeat(fmt.Sprintf("Conversation %d sets the scene. ", conv), 12), conv)
	resp, err := hc.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		l.record(&l.lost, err.Error())
		return
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		l.record(&l.lost, err.Error())
	case resp.StatusCode != http.StatusOK:
		if strings.Contains(string(b), `"error"`) {
			l.record(&l.errors, fmt.Sprintf("%d %s", resp.StatusCode, b))
		} else {
			l.record(&l.lost, fmt.Sprintf("%d %s", resp.StatusCode, b))
		}
	case stream && !streamWhole(string(b)), !stream && !strings.Contains(string(b), `"choices"`):
		l.record(&l.lost, "incomplete answer: "+string(b))
	default:
		l.ok.Add(1)
		l.mu.Lock()
		l.served[resp.Header.Get("x-pdlb-pod")]++
		l.mu.Unlock()
	}
}

func (l *churnLoad) record(n *atomic.Int64, sample string) {
	n.Add(1)
	l.mu.Lock()
	if len(l.samples) < 5 {
		l.samples = append(l.samples, sample)
	}
	l.mu.Unlock()
}

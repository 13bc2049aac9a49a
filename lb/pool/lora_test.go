package pool

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/config"
	"pdlb/lb/route"
)

// TestScrapeLearnsAdapters: a scrape of a pod that reports LoRA in
// vllm:lora_requests_info learns its adapters from /v1/models (those
// whose parent is its model) and from the gauge, and the snapshot
// resolves them to the pod's model; the gauge's max_lora sets its slots.
func TestScrapeLearnsAdapters(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_running 1\n"+
				`vllm:lora_requests_info{max_lora="1",running_lora_adapters="hot",waiting_lora_adapters=""} 1.7e9`+"\n")
		case "/v1/models":
			io.WriteString(w, `{"data":[{"id":"m","root":"m"},{"id":"sql","root":"/l/sql","parent":"m"},{"id":"other","parent":"x"}]}`)
		}
	}))
	defer srv.Close()
	cfg := config.Default()
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: strings.TrimPrefix(srv.URL, "http://")}}
	snap := buildDialing(t, cfg)
	p := snap.Pods[0]
	c := &Checker{cfg: config.Health{Timeout: time.Second}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	client := &fasthttp.HostClient{Addr: p.Config.Address}
	defer client.CloseIdleConnections()
	c.scrape(client, p)
	f := func(name, wantModel string) {
		t.Helper()
		m, a := snap.Resolve([]byte(name))
		switch {
		case wantModel == "" && m != nil:
			t.Errorf("%s resolves to %s", name, m.Name)
		case wantModel != "" && (m == nil || a == nil || m.Name != wantModel || a.Base != wantModel):
			t.Errorf("%s: model %v adapter %v, want an adapter of %s", name, m, a, wantModel)
		}
	}
	f("sql", "m")
	f("hot", "m")
	f("other", "")
	_, sql := snap.Resolve([]byte("sql"))
	l := snap.Models[0].LoRA
	if got := p.AdapterSec(sql, &l); got != 2*l.AdapterLoadSec {
		t.Errorf("AdapterSec with the one slot taken by hot = %v, want two loads", got)
	}
	p.UseAdapter(sql, &l)
	if got := p.AdapterSec(sql, &l); got != 0 {
		t.Errorf("AdapterSec after the gateway sent sql = %v, want 0", got)
	}
	if other := (&Pod{Config: config.Pod{Name: "q", Model: "m"}, podState: &podState{}}); other.Has(sql) {
		t.Error("a pod that did not list a learned adapter serves it")
	}
}

// TestScrapeKeepsALoadItRaced: a load the gateway makes while a scrape's
// /v1/models is under way (the pod answered before the load, the scrape
// is taken in after it) leaves the adapter served: the next pick for it
// loads it nowhere again. The scrape after that has the pod's own word.
func TestScrapeKeepsALoadItRaced(t *testing.T) {
	var loaded atomic.Bool
	// The first /v1/models waits, its answer made, until the load is done.
	var first sync.Once
	listing, answer := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			io.WriteString(w, `vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9`+"\n")
		case "/v1/load_lora_adapter":
			loaded.Store(true)
			io.WriteString(w, "Success: LoRA adapter 'fin' added successfully.")
		case "/v1/models":
			body := `{"data":[{"id":"m","root":"m"}]}`
			if loaded.Load() {
				body = `{"data":[{"id":"m","root":"m"},{"id":"fin","root":"/l/fin","parent":"m"}]}`
			}
			first.Do(func() {
				close(listing)
				<-answer
			})
			io.WriteString(w, body)
		}
	}))
	defer srv.Close()
	m, p, fin := finPod(t, srv)
	c := &Checker{cfg: config.Health{Timeout: 5 * time.Second}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	client := &fasthttp.HostClient{Addr: p.Config.Address}
	defer client.CloseIdleConnections()
	scraped := make(chan struct{})
	go func() { c.scrape(client, p); close(scraped) }()
	<-listing // the pod's list, without fin, is made
	loads, _, ok := m.LoadAdapter(fin, [2]*Pod{p, p}, m.LoadsBegun(), 5*time.Second)
	if !ok || loads[0] == nil || loads[0].Err() != nil {
		t.Fatalf("load: %v %v", ok, loads[0])
	}
	close(answer)
	<-scraped
	if loads, started, _ := m.LoadAdapter(fin, [2]*Pod{p, p}, m.LoadsBegun(), 5*time.Second); started[0] {
		loads[0].Err()
		t.Error("the scrape that raced the load forgot it: fin is loaded on p again")
	}
	loaded.Store(false) // the pod restarted, say
	c.scrape(client, p)
	if p.Has(fin) {
		t.Error("a scrape after the load, whose /v1/models lacks fin, leaves it served")
	}
}

// TestFitSeesALoadEnd: while a load of fin runs on p, p fits a request
// for fin as serving it at every moment, the one its load ends in
// included; else a pick then would begin a second load elsewhere. The
// moment is a few instructions wide: the test watches many loads end.
func TestFitSeesALoadEnd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "Success: LoRA adapter 'fin' added successfully.")
	}))
	defer srv.Close()
	m, p, fin := finPod(t, srv)
	for i := range 300 {
		p.lora.view.Store(nil) // p serves fin no more: the next pick loads it
		loads, started, ok := m.LoadAdapter(fin, [2]*Pod{p, p}, m.LoadsBegun(), 5*time.Second)
		if !ok || !started[0] {
			t.Fatalf("load %d: ok %v started %v", i, ok, started)
		}
		for done := false; !done; {
			select {
			case <-loads[0].Done():
				done = true
			default:
			}
			if tier, _ := p.adapterFit(fin, &m.LoRA); tier != fitServes {
				t.Fatalf("load %d: p fits fin as tier %d while loading it, want %d (serves)", i, tier, fitServes)
			}
		}
		if err := loads[0].Err(); err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
}

// finPod builds, dialing, a snapshot of model m, which may load adapter
// fin, with its one pod p at srv.
func finPod(t *testing.T, srv *httptest.Server) (*Model, *Pod, *Adapter) {
	t.Helper()
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", LoRA: config.LoRA{MaxLoras: 2, LoadAdapters: true, Adapters: []config.Adapter{{Name: "fin", Path: "/l/fin"}}}}}
	cfg.Pods = []config.Pod{{Name: "p", Model: "m", Address: strings.TrimPrefix(srv.URL, "http://")}}
	snap := buildDialing(t, cfg)
	_, fin := snap.Resolve([]byte("fin"))
	return snap.Models[0], snap.Pods[0], fin
}

// loraSnapshot builds, without dialing, a snapshot of model m with one
// slot a pod and adapters fin and sql the gateway loads, over pods with the given
// roles (named by their initial and index), and resolves the adapters.
func loraSnapshot(t *testing.T, roles ...string) (snap *Snapshot, fin, sql *Adapter) {
	t.Helper()
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", LoRA: config.LoRA{MaxLoras: 1, LoadAdapters: true,
		Adapters: []config.Adapter{{Name: "fin", Path: "/l/fin"}, {Name: "sql", Path: "/l/sql"}}}}}
	for i, role := range roles {
		p := config.Pod{Name: fmt.Sprint(role[:1], i), Model: "m", Role: role, Address: fmt.Sprintf("127.0.0.1:%d", 10000+i)}
		if role != "combined" {
			p.Roleset = "rs"
		}
		cfg.Pods = append(cfg.Pods, p)
	}
	snap = offlineSnapshot(t, cfg)
	_, fin = snap.Resolve([]byte("fin"))
	_, sql = snap.Resolve([]byte("sql"))
	return snap, fin, sql
}

// offlineSnapshot builds cfg's snapshot with a dialer that fails.
func offlineSnapshot(t *testing.T, cfg config.Config) *Snapshot {
	t.Helper()
	cfg.Provision()
	snap, err := Build(&cfg, func(string, time.Duration, *tls.Config) (net.Conn, error) { return nil, net.ErrClosed }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestFillAdapter: pods serving the adapter are the candidates; when none
// does, those with a free slot are, so the gateway's load evicts nothing
// while a slot is free; when every slot is taken, all are; none when the
// gateway may not load it.
func TestFillAdapter(t *testing.T) {
	snap, fin, sql := loraSnapshot(t, "combined", "combined", "combined")
	m := snap.Models[0]
	f := func(want string) {
		t.Helper()
		var cands []route.Candidate
		for _, p := range m.Combined {
			cands = append(cands, route.Candidate{Pod: p.ID})
		}
		var got []string
		for _, c := range m.FillAdapter(cands, fin) {
			got = append(got, fmt.Sprintf("%s:%g", snap.Pods[c.Pod].Config.Name, c.AdapterSec))
		}
		if fmt.Sprint(got) != want {
			t.Errorf("candidates %v, want %s", got, want)
		}
	}
	f("[c0:0.2 c1:0.2 c2:0.2]")
	m.Pods[0].UseAdapter(sql, &m.LoRA)
	m.Pods[2].UseAdapter(sql, &m.LoRA)
	f("[c1:0.2]")
	m.Pods[1].UseAdapter(sql, &m.LoRA)
	f("[c0:0.4 c1:0.4 c2:0.4]")
	m.LoRA.LoadAdapters = false
	f("[]")
	m.LoRA.LoadAdapters = true
	m.Pods[2].markListed(fin)
	f("[c2:0.4]")
}

// TestFillAdapterPD: a PD decision's pods are tiered as FillAdapter tiers
// combined ones, role by role: the best prefill pods and the best decode
// pods for the adapter stay up, each with its AdapterSec.
func TestFillAdapterPD(t *testing.T) {
	snap, fin, sql := loraSnapshot(t, "prefill", "prefill", "decode", "decode")
	m := snap.Models[0]
	var tiers []uint8
	f := func(want string) {
		t.Helper()
		cands := make([]route.PDCandidate, len(m.Pods))
		for i, p := range m.Pods {
			cands[i].Pod, cands[i].Role = p.ID, p.Role
		}
		tiers = m.FillAdapterPD(cands, m.Pods, fin, tiers)
		var got []string
		for i, c := range cands {
			if !c.Down {
				got = append(got, fmt.Sprintf("%s:%g", m.Pods[i].Config.Name, c.AdapterSec))
			}
		}
		if fmt.Sprint(got) != want {
			t.Errorf("up %v, want %s", got, want)
		}
	}
	f("[p0:0.2 p1:0.2 d2:0.2 d3:0.2]")
	// One prefill and one decode pod fill their slot with sql.
	for _, p := range []*Pod{m.Pods[0], m.Pods[3]} {
		p.UseAdapter(sql, &m.LoRA)
	}
	f("[p1:0.2 d2:0.2]")
	m.Pods[3].markListed(fin)
	f("[p1:0.2 d3:0.4]")
}

// TestDeclaredAdapters: adapters a pod's config declares (Kubernetes'
// pdlb/lora-adapters) resolve to its model and are served by that pod
// alone, and by those listing them.
func TestDeclaredAdapters(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Adapters: []config.Adapter{{Name: "fin", Path: "/l/fin"}}}}}
	cfg.Pods = []config.Pod{
		{Name: "p0", Model: "m", Address: "127.0.0.1:10000", Adapters: "ops, fin=/l/fin"},
		{Name: "p1", Model: "m", Address: "127.0.0.1:10001"},
	}
	snap := offlineSnapshot(t, cfg)
	p0, p1 := snap.Models[0].Pods[0], snap.Models[0].Pods[1]
	for _, name := range []string{"ops", "fin"} {
		m, a := snap.Resolve([]byte(name))
		if m == nil || a == nil || m.Name != "m" || !p0.Has(a) || p1.Has(a) {
			t.Errorf("%s: model %v adapter %+v; want an adapter of m that p0 alone serves", name, m, a)
		}
	}
	var names []string
	for _, a := range snap.Adapters() {
		names = append(names, a.Name)
	}
	if fmt.Sprint(names) != "[fin ops]" {
		t.Errorf("Adapters() = %v", names)
	}
}

// buildDialing provisions cfg and builds its snapshot, dialing pods over
// TCP.
func buildDialing(t *testing.T, cfg config.Config) *Snapshot {
	t.Helper()
	cfg.Provision()
	snap, err := Build(&cfg, func(addr string, timeout time.Duration, _ *tls.Config) (net.Conn, error) {
		return net.DialTimeout("tcp", addr, timeout)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

// dnsServer is an authoritative DNS server on loopback UDP that answers A,
// AAAA and SRV questions from maps the test changes as it goes.
type dnsServer struct {
	conn net.PacketConn

	mu       sync.Mutex
	ips      map[string][]net.IP // by FQDN; IPv4 answer A, IPv6 AAAA
	srvs     map[string][]net.SRV
	servfail []dnsmessage.Type // question types answered SERVFAIL
	// failAfter delays each SERVFAIL, as a forwarder's comes once its
	// upstream timed out while it answers from its cache at once.
	failAfter time.Duration
	failed    chan struct{} // one value per SERVFAIL answered
	answered  int           // questions answered NOERROR
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{conn: conn, ips: map[string][]net.IP{}, srvs: map[string][]net.SRV{}, failed: make(chan struct{}, 1024)}
	var done sync.WaitGroup
	done.Go(s.serve)
	t.Cleanup(func() {
		conn.Close()
		done.Wait()
	})
	return s
}

// dial sends every query to s, whatever the system's resolv.conf says.
func (s *dnsServer) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
}

func (s *dnsServer) set(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		if resp, delay, ok := s.answer(buf[:n]); ok {
			time.AfterFunc(delay, func() { s.conn.WriteTo(resp, from) })
		}
	}
}

func (s *dnsServer) answer(req []byte) (resp []byte, delay time.Duration, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, 0, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	name := q.Name.String()
	ips, hasIPs := s.ips[name]
	srvs, hasSRVs := s.srvs[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}
	switch {
	case slices.Contains(s.servfail, q.Type):
		rh.RCode = dnsmessage.RCodeServerFailure
		delay = s.failAfter
		select {
		case s.failed <- struct{}{}:
		default:
		}
	case !hasIPs && !hasSRVs:
		rh.RCode = dnsmessage.RCodeNameError
	default:
		s.answered++
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	must := func(err error) {
		if err != nil {
			panic("BUG: building a DNS answer: " + err.Error())
		}
	}
	must(b.StartQuestions())
	must(b.Question(q))
	must(b.StartAnswers())
	rrh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
	if rh.RCode == dnsmessage.RCodeSuccess {
		for _, ip := range ips {
			if v4 := ip.To4(); v4 != nil && q.Type == dnsmessage.TypeA {
				must(b.AResource(rrh, dnsmessage.AResource{A: [4]byte(v4)}))
			} else if v4 == nil && q.Type == dnsmessage.TypeAAAA {
				must(b.AAAAResource(rrh, dnsmessage.AAAAResource{AAAA: [16]byte(ip.To16())}))
			}
		}
		for _, r := range srvs {
			if q.Type == dnsmessage.TypeSRV {
				must(b.SRVResource(rrh, dnsmessage.SRVResource{
					Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: dnsmessage.MustNewName(r.Target),
				}))
			}
		}
	}
	resp, err = b.Finish()
	must(err)
	return resp, delay, true
}

func dnsSource(t *testing.T, srv *dnsServer, s spec.DNS, log *slog.Logger) *DNS {
	t.Helper()
	d := spec.Discovery{DNS: []spec.DNS{s}}
	d.Provision()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	return NewDNS(d.DNS[0], srv.dial, log)
}

func TestDNSARecords(t *testing.T) {
	srv := startDNS(t)
	const name = "llama.inference.test."
	srv.set(func() {
		srv.ips[name] = []net.IP{net.ParseIP("127.0.0.11"), net.ParseIP("fd00::1"), net.ParseIP("127.0.0.11")}
	})
	var logged testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	// Family all: every address of both families is a pod.
	w := follow(t, dnsSource(t, srv, spec.DNS{Name: name, Family: spec.DNSFamilyAll, Port: 8000, Model: "llama", KVEventsPort: 5557, KVReplayPort: 5600,
		DataParallelSize: 2, Interval: 50 * time.Millisecond}, log))
	pods := w.expect(
		"127.0.0.11:8000 llama vllm combined  127.0.0.11:8000",
		"[fd00::1]:8000 llama vllm combined  [fd00::1]:8000",
	)
	if pods[0].KVEvents != "tcp://127.0.0.11:5557" || pods[1].KVEvents != "tcp://[fd00::1]:5557" || pods[0].Weight != 1 ||
		pods[0].KVReplay != "tcp://127.0.0.11:5600" || pods[1].DataParallelSize != 2 {
		t.Fatalf("pods: %+v", pods)
	}
	// Re-resolution picks up a pod that joined and one that left.
	srv.set(func() { srv.ips[name] = []net.IP{net.ParseIP("127.0.0.11"), net.ParseIP("127.0.0.12")} })
	w.expect(
		"127.0.0.11:8000 llama vllm combined  127.0.0.11:8000",
		"127.0.0.12:8000 llama vllm combined  127.0.0.12:8000",
	)
	// A failing server keeps the last pods: the next report after it
	// recovers is the new list, never an empty one.
	srv.set(func() { srv.servfail = []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} })
	failureLogged := func() bool {
		return strings.Contains(logged.String(), "DNS lookup failed")
	}
	for !failureLogged() {
		<-srv.failed
	}
	srv.set(func() {
		srv.servfail = nil
		srv.ips[name] = []net.IP{net.ParseIP("127.0.0.13")}
	})
	if got := describe(w.next()); got != "127.0.0.13:8000 llama vllm combined  127.0.0.13:8000" {
		t.Fatalf("after SERVFAIL: %q", got)
	}
	if n := strings.Count(logged.String(), "DNS lookup failed"); n != 1 {
		t.Errorf("the failure must be logged once, not %d times:\n%s", n, logged.String())
	}
	if !strings.Contains(logged.String(), "keeping the last pods") {
		t.Errorf("a failure after pods were found must say they are kept:\n%s", logged.String())
	}
	// The name is gone: no pods.
	srv.set(func() { delete(srv.ips, name) })
	w.expect()
}

// TestDNSOneQueryFails: a resolver that answers AAAA "no such records"
// from its cache while its A query fails (the upstream behind it is down)
// has not said the name is gone.
func TestDNSOneQueryFails(t *testing.T) {
	srv := startDNS(t)
	const name = "llama.inference.test."
	srv.set(func() { srv.ips[name] = []net.IP{net.ParseIP("127.0.0.11")} })
	var logged testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	w := follow(t, dnsSource(t, srv, spec.DNS{Name: name, Port: 8000, Model: "llama", Interval: 50 * time.Millisecond}, log))
	w.expect("127.0.0.11:8000 llama vllm combined  127.0.0.11:8000")
	srv.set(func() { srv.servfail, srv.failAfter = []dnsmessage.Type{dnsmessage.TypeA}, 5*time.Millisecond })
	failureLogged := func() bool {
		return strings.Contains(logged.String(), "DNS lookup failed")
	}
	for !failureLogged() {
		select {
		case <-srv.failed:
		case pods := <-w.reports:
			t.Fatalf("A query failing, AAAA answered with no records: reported %q", describe(pods))
		}
	}
	srv.set(func() {
		srv.servfail = nil
		srv.ips[name] = []net.IP{net.ParseIP("127.0.0.12")}
	})
	if got := describe(w.next()); got != "127.0.0.12:8000 llama vllm combined  127.0.0.12:8000" {
		t.Fatalf("after the failure: %q", got)
	}
}

// TestDNSFailureLoggedEachOutage: each outage of the name server is
// logged, not only the first, though the pods did not change in between.
func TestDNSFailureLoggedEachOutage(t *testing.T) {
	srv := startDNS(t)
	const name = "llama.inference.test."
	srv.set(func() { srv.ips[name] = []net.IP{net.ParseIP("127.0.0.11")} })
	var logged testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	w := follow(t, dnsSource(t, srv, spec.DNS{Name: name, Port: 8000, Model: "llama", Interval: 50 * time.Millisecond}, log))
	w.expect("127.0.0.11:8000 llama vllm combined  127.0.0.11:8000")
	failures := func() int {
		return strings.Count(logged.String(), "DNS lookup failed")
	}
	outage := func(n int) {
		t.Helper()
		srv.set(func() { srv.servfail = []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} })
		testwait.For(t, fmt.Sprintf("outage %d logged", n), func() bool { return failures() == n })
		// Recovered: four questions answered make at least one whole
		// lookup that succeeds, and the same pods.
		var answered int
		srv.set(func() { srv.servfail, answered = nil, srv.answered })
		testwait.For(t, "a lookup that succeeds", func() bool {
			var now int
			srv.set(func() { now = srv.answered })
			return now >= answered+4
		})
	}
	outage(1)
	outage(2)
}

// TestDNSFirstLookupFails: a lookup that fails before any succeeded has
// no last pods to keep, and its log line must not say it keeps them.
func TestDNSFirstLookupFails(t *testing.T) {
	srv := startDNS(t)
	const name = "llama.inference.test."
	srv.set(func() {
		srv.ips[name] = []net.IP{net.ParseIP("127.0.0.11")}
		srv.servfail = []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA}
	})
	var logged testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	w := follow(t, dnsSource(t, srv, spec.DNS{Name: name, Port: 8000, Model: "llama", Interval: 50 * time.Millisecond}, log))
	logLine := func() string {
		return logged.String()
	}
	for !strings.Contains(logLine(), "DNS lookup failed") {
		<-srv.failed
	}
	if line := logLine(); strings.Contains(line, "keeping the last pods") || !strings.Contains(line, "no pods") {
		t.Errorf("the first lookup failed, with no pods found yet; logged:\n%s", line)
	}
	srv.set(func() { srv.servfail = nil })
	w.expect("127.0.0.11:8000 llama vllm combined  127.0.0.11:8000")
}

func TestDNSSRVRecords(t *testing.T) {
	srv := startDNS(t)
	const name = "_http._tcp.sgl.test."
	srv.set(func() {
		srv.srvs[name] = []net.SRV{
			{Target: "pod-b.sgl.test.", Port: 30001, Priority: 1, Weight: 1},
			{Target: "pod-a.sgl.test.", Port: 30000, Priority: 1, Weight: 1},
		}
	})
	w := follow(t, dnsSource(t, srv, spec.DNS{Name: name, Type: "srv", Model: "qwen", Engine: "sglang", Role: "prefill", Roleset: "g0", Interval: 50 * time.Millisecond}, quiet))
	pods := w.expect(
		"pod-a.sgl.test:30000 qwen sglang prefill g0 pod-a.sgl.test:30000",
		"pod-b.sgl.test:30001 qwen sglang prefill g0 pod-b.sgl.test:30001",
	)
	if pods[0].BootstrapPort != spec.DefaultBootstrapPort || pods[0].KVEvents != "" {
		t.Fatalf("pods: %+v", pods)
	}
	srv.set(func() {
		srv.srvs[name] = []net.SRV{{Target: "pod-c.sgl.test.", Port: 30002}}
	})
	w.expect("pod-c.sgl.test:30002 qwen sglang prefill g0 pod-c.sgl.test:30002")
	// Target "." says the service is not available there (RFC 2782).
	srv.set(func() { srv.srvs[name] = []net.SRV{{Target: ".", Port: 0}} })
	if got := describe(w.next()); got != "" {
		t.Fatalf("a record with target \".\" reported %q, want no pods", got)
	}
}

// TestDNSOneFamilyPerName: a dual-stack name (a headless Service of a
// dual-stack cluster) lists each pod under an A and an AAAA record; they
// are one engine, so one pod, not two that split its load and its KV
// events between them. An SRV target is one pod whatever its records.
func TestDNSOneFamilyPerName(t *testing.T) {
	srv := startDNS(t)
	const name = "llama.inference.test."
	resolve := func(s spec.DNS) []string {
		t.Helper()
		s.Model, s.Interval = "llama", time.Second
		pods, err := dnsSource(t, srv, s, quiet).resolve(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		return names
	}
	f := func(family string, ips []string, want ...string) {
		t.Helper()
		srv.set(func() {
			srv.ips[name] = nil
			for _, ip := range ips {
				srv.ips[name] = append(srv.ips[name], net.ParseIP(ip))
			}
		})
		if got := resolve(spec.DNS{Name: name, Family: family, Port: 8000}); !slices.Equal(got, want) {
			t.Errorf("family %q, %v: pods %q, want %q", family, ips, got, want)
		}
	}
	dual := []string{"127.0.0.11", "fd00::11", "127.0.0.12", "fd00::12"}
	v4 := []string{"127.0.0.11", "127.0.0.12"}
	v6 := []string{"fd00::11", "fd00::12"}
	f("", dual, "127.0.0.11:8000", "127.0.0.12:8000")
	f("", v6, "[fd00::11]:8000", "[fd00::12]:8000")
	f(spec.DNSFamilyV4Preferred, v4, "127.0.0.11:8000", "127.0.0.12:8000")
	f(spec.DNSFamilyV6Preferred, dual, "[fd00::11]:8000", "[fd00::12]:8000")
	f(spec.DNSFamilyV6Preferred, v4, "127.0.0.11:8000", "127.0.0.12:8000")
	f(spec.DNSFamilyV4Only, dual, "127.0.0.11:8000", "127.0.0.12:8000")
	f(spec.DNSFamilyV4Only, v6)
	f(spec.DNSFamilyV6Only, dual, "[fd00::11]:8000", "[fd00::12]:8000")
	f(spec.DNSFamilyV6Only, v4)
	f(spec.DNSFamilyAll, dual, "127.0.0.11:8000", "127.0.0.12:8000", "[fd00::11]:8000", "[fd00::12]:8000")
	// A literal is its own family's only address.
	if got := resolve(spec.DNS{Name: "fd00::13", Port: 8000}); !slices.Equal(got, []string{"[fd00::13]:8000"}) {
		t.Errorf("the literal fd00::13: pods %q", got)
	}
	if got := resolve(spec.DNS{Name: "fd00::13", Family: spec.DNSFamilyV4Only, Port: 8000}); got != nil {
		t.Errorf("the literal fd00::13 with v4_only: pods %q, want none", got)
	}
	srv.set(func() {
		srv.ips["pod-a.sgl.test."] = []net.IP{net.ParseIP("127.0.0.11"), net.ParseIP("fd00::11")}
		srv.srvs["_http._tcp.sgl.test."] = []net.SRV{{Target: "pod-a.sgl.test.", Port: 30000}}
	})
	if got := resolve(spec.DNS{Name: "_http._tcp.sgl.test.", Type: spec.DNSTypeSRV}); !slices.Equal(got, []string{"pod-a.sgl.test:30000"}) {
		t.Errorf("SRV target with A and AAAA records: pods %q", got)
	}
}

// TestDiscoveredBootstrapPortReachesTheGateway: the gateway takes a
// discovered pod's config.Pod (lb.Server hands it found[i].Pod), so an
// SGLang pod's bootstrap port, from its annotation or the DNS spec, must
// be there, not defaulted to 8998 by Provision.
func TestDiscoveredBootstrapPortReachesTheGateway(t *testing.T) {
	sgl := pdLabels("prefill", "g0")
	sgl[spec.LabelEngine] = "sglang"
	k, err := NewKubernetes(nil, spec.Kubernetes{Selector: spec.DefaultSelector}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var r rebuilder
	pods := r.rebuild([]any{kpod("s0", "10.0.0.4", sgl, map[string]string{spec.AnnotationBootstrapPort: "9001"})}, k.selector, quiet)
	srv := startDNS(t)
	srv.set(func() { srv.srvs["_http._tcp.sgl.test."] = []net.SRV{{Target: "pod-a.sgl.test.", Port: 30000}} })
	dns, err := dnsSource(t, srv, spec.DNS{Name: "_http._tcp.sgl.test.", Type: "srv", Model: "qwen", Engine: "sglang", Role: "prefill",
		Roleset: "g0", BootstrapPort: 9002, Interval: time.Second}, quiet).resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f := func(p Pod, want int) {
		t.Helper()
		c := p.Pod
		c.Provision()
		if c.BootstrapPort != want {
			t.Errorf("pod %s: the gateway gets bootstrap port %d, want %d", c.Name, c.BootstrapPort, want)
		}
	}
	f(pods[0], 9001)
	f(dns[0], 9002)
}

// TestDiscoveredDataParallelRouting: a discovered pod set may leave its
// data-parallel ranks to the engine, as a configured pod may
// (data_parallel_routing: engine): by the Kubernetes annotation or the
// DNS entry's setting; without either the gateway names ranks. An
// annotation of no known value leaves the pod out, saying so.
func TestDiscoveredDataParallelRouting(t *testing.T) {
	k, err := NewKubernetes(nil, spec.Kubernetes{Selector: spec.DefaultSelector}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var logged testlog.Buffer
	dp := map[string]string{spec.AnnotationKVEventsPort: "5557", spec.AnnotationKVReplayPort: "5600", spec.AnnotationDataParallelSize: "2"}
	annotated := func(routing string) map[string]string {
		a := maps.Clone(dp)
		a[spec.AnnotationDataParallelRouting] = routing
		return a
	}
	model := map[string]string{spec.LabelModel: "m"}
	var r rebuilder
	pods := r.rebuild([]any{
		kpod("k-engine", "10.0.0.1", model, annotated("engine")),
		kpod("k-prefix", "10.0.0.2", model, annotated("prefix")),
		kpod("k-unset", "10.0.0.3", model, dp),
		kpod("k-bad", "10.0.0.4", model, annotated("Engine")),
	}, k.selector, slog.New(slog.NewTextHandler(&logged, nil)))
	srv := startDNS(t)
	srv.set(func() {
		srv.ips["engine.test."] = []net.IP{net.ParseIP("127.0.0.21")}
		srv.ips["unset.test."] = []net.IP{net.ParseIP("127.0.0.22")}
	})
	for _, d := range []spec.DNS{
		{Name: "engine.test.", Port: 8000, Model: "m", KVEventsPort: 5557, KVReplayPort: 5600, DataParallelSize: 2,
			DataParallelRouting: config.DataParallelByEngine, Interval: time.Second},
		{Name: "unset.test.", Port: 8000, Model: "m", KVEventsPort: 5557, KVReplayPort: 5600, DataParallelSize: 2, Interval: time.Second},
	} {
		found, err := dnsSource(t, srv, d, quiet).resolve(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, found...)
	}
	got := map[string]string{}
	for _, p := range pods {
		c := p.Pod // as lb.Server takes it
		c.Provision()
		if err := c.Validate("pod"); err != nil {
			t.Fatalf("pod %s: %v", c.Name, err)
		}
		got[c.Name] = c.DataParallelRouting
	}
	want := map[string]string{
		"inference/k-engine": "engine", "inference/k-prefix": "prefix", "inference/k-unset": "prefix",
		"127.0.0.21:8000": "engine", "127.0.0.22:8000": "prefix",
	}
	if !maps.Equal(got, want) {
		t.Errorf("data_parallel_routing by pod: %v, want %v", got, want)
	}
	const bad = `pod=inference/k-bad err="annotation pdlb/data-parallel-routing = \"Engine\" must be \"prefix\" (default) or \"engine\""`
	if !strings.Contains(logged.String(), bad) {
		t.Errorf("log lacks %s:\n%s", bad, logged.String())
	}
}

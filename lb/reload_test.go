package lb_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/internal/lbtest"
	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

func TestReloadSwapsPodsWithoutDroppingStreams(t *testing.T) {
	sims := testFleet(t, "m", 3, 1)
	s := testGateway(t, podsOf("m", sims[0], sims[1]), func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
	})
	// A stream in flight on one of the pods that stay or go.
	resp, err := client.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"stream"}],"max_tokens":60,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	br.ReadString('\n')

	// m-0 leaves, m-2 joins; m-1 stays with its state.
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
	cfg.Pods = podsOf("m", sims[1], sims[2])
	if err := s.Reload(cfg); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("a reload that changes the listeners: %v", err)
	}
	// The refusal names the setting, and both values.
	cfg = s.Gateway.Config()
	retries := cfg.Upstream.Retries
	cfg.Upstream.Retries = retries + 2
	want := fmt.Sprintf("upstream.retries: %d → %d needs a restart", retries, retries+2)
	if err := s.Reload(cfg); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a reload that changes upstream.retries: %v; want %q", err, want)
	}
	cfg = s.Gateway.Config()
	cfg.Pods = podsOf("m", sims[1], sims[2])
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil || !streamWhole(string(rest)) {
		t.Fatalf("the stream in flight did not finish whole: %v %q", err, rest)
	}
	served := map[string]int{}
	for i := 0; i < 8; i++ {
		r, b := post(t, s, "/v1/chat/completions", chatBody)
		if r.StatusCode != 200 {
			t.Fatalf("%d %s", r.StatusCode, b)
		}
		served[r.Header.Get("x-pdlb-pod")]++
	}
	if served["m-0"] != 0 || served["m-1"] == 0 || served["m-2"] == 0 {
		t.Fatalf("after the reload traffic went to %v", served)
	}
	// The gateway's per-pod series follow the fleet at once; the token
	// ledger's stay until its janitor finds the pod idle for a minute, as
	// AIBrix's ledger does.
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	if strings.Contains(metrics, `pdlb_pod_in_flight{pod="m-0"}`) || !strings.Contains(metrics, `pdlb_pod_in_flight{pod="m-2"}`) {
		t.Fatalf("per-pod series do not follow the fleet:\n%s", metrics)
	}
}

// TestReloadAndDiscoveryDoNotUndoEachOther: a discovery update of the
// pods that races a reload keeps the reload's models, whichever lands
// last.
func TestReloadAndDiscoveryDoNotUndoEachOther(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	s := testGateway(t, podsOf("m", sims[0]), nil)
	for i := range 50 {
		cfg := s.Gateway.Config()
		name := fmt.Sprintf("added-%d", i)
		cfg.Models = append(slices.Clone(cfg.Models), config.Model{Name: name, Policy: "round_robin"})
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := s.Reload(cfg); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if err := s.Gateway.SetPods(podsOf("m", sims[0])); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if !slices.ContainsFunc(s.Gateway.Config().Models, func(m config.Model) bool { return m.Name == name }) {
			t.Fatalf("round %d: the reload's model %s is gone after a discovery update raced it", i, name)
		}
	}
}

// TestReloadKeepsDiscoveredPods: a reload of the config file (SIGHUP, or
// the file changed) brings the file's own pods; the pods discovery found
// stay beside them, for discovery reports only when its list changes.
func TestReloadKeepsDiscoveredPods(t *testing.T) {
	sims := testFleet(t, "m", 2, 100)
	_, port, _ := net.SplitHostPort(sims[1].Addr())
	p, _ := strconv.Atoi(port)
	static := podsOf("other", sims[0])
	s := testGateway(t, static, func(c *config.Config) {
		c.Discovery.DNS = []spec.DNS{{Name: "localhost", Port: p, Model: "m", Interval: 50 * time.Millisecond}}
	})
	testwait.For(t, "discovery to find the pod", func() bool {
		r, _ := post(t, s, "/v1/chat/completions", chatBody)
		return r.StatusCode == 200
	})
	// The file again, as config.Load reads it: its own pods.
	cfg := s.Gateway.Config()
	cfg.Pods = static
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if r, b := post(t, s, "/v1/chat/completions", chatBody); r.StatusCode != 200 {
		t.Fatalf("after a reload of the file the discovered pod is gone: %d %s", r.StatusCode, b)
	}
}

// TestModelLeavesAndComesBack: a model whose last pod leaves (a reload,
// discovery scaling it to zero) and that comes back later is served
// again, with the series it had.
func TestModelLeavesAndComesBack(t *testing.T) {
	sims := testFleet(t, "m", 2, 100)
	other := podsOf("other", sims[1])
	// other is numbered before m: a model that leaves is not the last.
	s := testGateway(t, append(other, podsOf("m", sims[0])...), nil)
	cfg := s.Gateway.Config()
	cfg.Pods = podsOf("m", sims[0])
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Pods = append(podsOf("m", sims[0]), other...)
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if r, b := post(t, s, "/v1/chat/completions", chatBody); r.StatusCode != 200 {
		t.Fatalf("%d %s", r.StatusCode, b)
	}
}

// TestReloadProvisionsAsStartDoes: pdlb serve reloads the file's pods with
// its --pod pods appended as parsed, as it started with them: a reload
// must fill and spell them as Start does (an http:// address is host:port).
func TestReloadProvisionsAsStartDoes(t *testing.T) {
	sims := testFleet(t, "m", 1, 1)
	pods := func() []config.Pod { return []config.Pod{{Model: "m", Address: "http://" + sims[0].Addr()}} }
	s := testGateway(t, pods(), nil)
	cfg := s.Gateway.Config()
	cfg.Pods = pods()
	if err := s.Reload(cfg); err != nil {
		t.Fatalf("reloading the configuration it started with: %v", err)
	}
}

// TestDiscoveredPodAtConfiguredAddressLeftOut: a pod discovery finds at
// the address of a configured pod of another name (a DNS name over the
// engines the file lists) is that pod's engine: it is left out, with a
// log line naming both, rather than counted twice.
func TestDiscoveredPodAtConfiguredAddressLeftOut(t *testing.T) {
	sims := testFleet(t, "m", 1, 100)
	_, port, _ := net.SplitHostPort(sims[0].Addr())
	p, _ := strconv.Atoi(port)
	var logs testlog.Buffer
	s := lbtest.StartGatewayLog(t, podsOf("m", sims[0]), func(c *config.Config) {
		c.Discovery.DNS = []spec.DNS{{Name: "127.0.0.1", Port: p, Model: "m", Interval: 50 * time.Millisecond}}
	}, slog.New(slog.NewTextHandler(&logs, nil)))
	found := fmt.Sprintf(`"name": %q`, sims[0].Addr())
	var pods string
	testwait.For(t, "discovery's first report", func() bool {
		pods = get(t, "http://"+s.AdminAddr()+"/admin/pods")
		return strings.Contains(logs.String(), "left out") || strings.Contains(pods, found)
	})
	if strings.Contains(pods, found) {
		t.Fatalf("the engine of pod %s joined again as discovered pod %s:\n%s", sims[0].Config().Name, sims[0].Addr(), pods)
	}
	if l := logs.String(); !strings.Contains(l, "at another pod's address left out") || !strings.Contains(l, sims[0].Config().Name) {
		t.Fatalf("no log line names the pod left out and the configured one:\n%s", l)
	}
}

// TestDiscoveredPodTakingANameLeftOut: a discovered pod whose model is
// the name of an alias is left out with a log line naming it; it must
// not get the fleet it joins refused whole, discovery's updates and the
// config file's reloads alike, for as long as it runs.
func TestDiscoveredPodTakingANameLeftOut(t *testing.T) {
	sims := testFleet(t, "m", 2, 100)
	_, port, _ := net.SplitHostPort(sims[1].Addr())
	p, _ := strconv.Atoi(port)
	var logs testlog.Buffer
	s := lbtest.StartGatewayLog(t, podsOf("m", sims[0]), func(c *config.Config) {
		c.Aliases = []config.Alias{{Name: "chat", Targets: []config.AliasTarget{{Model: "m"}}}}
		c.Discovery.DNS = []spec.DNS{{Name: "127.0.0.1", Port: p, Model: "chat", Interval: 50 * time.Millisecond}}
	}, slog.New(slog.NewTextHandler(&logs, nil)))
	testwait.For(t, "discovery's first report", func() bool {
		return strings.Contains(logs.String(), "left out") || strings.Contains(logs.String(), "not applied")
	})
	if l := logs.String(); !strings.Contains(l, "discovered pod left out") || !strings.Contains(l, sims[1].Addr()) {
		t.Errorf("no log line names the pod left out:\n%s", l)
	}
	// The file again, as SIGHUP reads it.
	cfg := s.Gateway.Config()
	cfg.Pods = podsOf("m", sims[0])
	if err := s.Reload(cfg); err != nil {
		t.Fatalf("the file's reload: %v", err)
	}
}

// TestReloadValidatesAsStart: a reload is checked on the configuration's
// own pods, as Start is: a fallback to a model that only discovered pods
// serve is refused, as Start refuses it, rather than taken until those
// pods leave, when every fleet, discovered or reloaded, would be refused
// whole.
func TestReloadValidatesAsStart(t *testing.T) {
	sims := testFleet(t, "m", 2, 100)
	_, port, _ := net.SplitHostPort(sims[1].Addr())
	p, _ := strconv.Atoi(port)
	static := podsOf("other", sims[0])
	s := testGateway(t, static, func(c *config.Config) {
		c.Discovery.DNS = []spec.DNS{{Name: "127.0.0.1", Port: p, Model: "m", Interval: 50 * time.Millisecond}}
	})
	testwait.For(t, "discovery to find the pod", func() bool {
		r, _ := post(t, s, "/v1/chat/completions", chatBody)
		return r.StatusCode == 200
	})
	cfg := s.Gateway.Config()
	cfg.Pods = static
	cfg.Models = []config.Model{{Name: "other", LoRA: config.LoRA{Fallback: []string{"m"}}}}
	const want = `models[0].fallback[0] = "m" is not another model`
	if err := s.Reload(cfg); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the reload: %v; want %s, as Start says", err, want)
	}
	if _, err := lb.Start(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start: %v; want %s", err, want)
	}
}

// Package tests holds cross-language and whole-system checks: real tools
// (promtool, the official OpenAI and Anthropic Node clients) against a
// live gateway over simulated pods on loopback.
package tests

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/lb"
	"pdlb/lb/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, lbtest.LeakOptions()...) }

// startPod starts one simulated pod of model playing engine.
func startPod(t *testing.T, name, model string, engine engines.Kind, speedup float64) *sim.Pod {
	t.Helper()
	p, err := sim.Start(sim.Config{Name: name, Model: model, Engine: engine, Listen: "127.0.0.1:0", Speedup: speedup, DefaultMaxTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// podConfig is the gateway's view of a simulated pod.
func podConfig(p *sim.Pod) config.Pod {
	c := p.Config()
	return config.Pod{Name: c.Name, Model: c.Model, Address: p.Addr(), Engine: string(c.Engine)}
}

// pdPair starts a prefill and a decode pod of model (vLLM) and returns
// them as one roleset, so a gateway has a model its planner plans.
func pdPair(t *testing.T, model string) []config.Pod {
	t.Helper()
	var out []config.Pod
	for _, role := range []string{sim.RolePrefill, sim.RoleDecode} {
		p, err := sim.Start(sim.Config{Name: model + "-" + role, Model: model, Role: role, Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pc := podConfig(p)
		pc.Role, pc.Roleset = role, "rs0"
		out = append(out, pc)
	}
	return out
}

// startGateway starts a gateway on loopback over pods; edit adjusts the
// config first.
func startGateway(t *testing.T, pods []config.Pod, edit func(*config.Config)) *lb.Server {
	t.Helper()
	return lbtest.StartGateway(t, pods, edit)
}

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// fetch GETs url and returns the body of a 200 answer.
func fetch(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return b
}

// post sends a JSON body and fails the test unless the answer is 200.
func post(t *testing.T, url, body string) {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
}

// sendTraffic makes the gateway's request, latency and pod series non-empty:
// streaming and not, chat and completions, one request per model.
func sendTraffic(t *testing.T, s *lb.Server, models ...string) {
	t.Helper()
	base := "http://" + s.Addr() + "/v1"
	for _, m := range models {
		post(t, base+"/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`, m))
		post(t, base+"/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}`, m))
		post(t, base+"/completions", fmt.Sprintf(`{"model":%q,"prompt":"Once upon a time","max_tokens":8,"stream":true}`, m))
	}
}

// lookTool finds a command-line tool, or skips the test saying why.
func lookTool(t *testing.T, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("SKIP: %s not found (%v); %s", name, err, why)
	}
	return p
}

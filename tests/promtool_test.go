package tests

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/internal/redistest"
	"pdlb/lb"
	"pdlb/lb/config"
)

// promtool runs `promtool check metrics` on an exposition and returns its
// complaints, one a line; none means the exposition passes. promtool comes
// with Debian's prometheus package, which make test-deps installs.
func promtool(t *testing.T, exposition []byte) []string {
	t.Helper()
	bin := lookTool(t, "promtool", "install Debian's prometheus package (make test-deps does) to lint /metrics")
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	var problems []string
	for _, line := range strings.Split(string(out), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			problems = append(problems, line)
		}
	}
	// Exit status 3 is lint problems, which problems lists; anything else
	// means promtool could not read the exposition at all.
	if err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("promtool check metrics: %v: %s", err, out)
		}
	}
	return problems
}

// The gateway's admin /metrics, with every kind of series non-empty, passes
// promtool's lint: help texts, types, unit and _total suffixes.
func TestGatewayMetricsPassPromtool(t *testing.T) {
	s, _, _ := everySeriesGateway(t)
	exposition := fetch(t, "http://"+s.AdminAddr()+"/metrics")
	// The series docs/tuning.md's open-files alert divides, and one of
	// the Redis exchanges'.
	for _, family := range []string{"\nprocess_open_fds ", "\nprocess_max_fds ", "\npdlb_redis_exchange_up{loop=\"plan\"} "} {
		if !bytes.Contains(exposition, []byte(family)) {
			t.Errorf("no %s series on /metrics", strings.TrimSpace(family))
		}
	}
	if problems := promtool(t, exposition); len(problems) > 0 {
		t.Fatalf("promtool check metrics on the gateway's /metrics:\n%s", strings.Join(problems, "\n"))
	}
}

// everySeriesGateway is a gateway that has served traffic with every kind
// of series on: admission, a KV-event feed (no publisher needs to be there
// for its series to exist), the planner over a prefill/decode pair, and
// Redis; and its vLLM and SGLang pods.
func everySeriesGateway(t *testing.T) (s *lb.Server, vllm, sglang *sim.Pod) {
	t.Helper()
	vllm = startPod(t, "vllm-0", "mv", engines.VLLM, 100)
	sglang = startPod(t, "sglang-0", "ms", engines.SGLang, 100)
	pods := []config.Pod{podConfig(vllm), podConfig(sglang)}
	pods[0].KVEvents = "tcp://" + closedAddr(t)
	pods = append(pods, pdPair(t, "mpd")...)
	redis := redistest.Start(t, 0)
	s = startGateway(t, pods, func(c *config.Config) {
		c.Admission.Enabled, c.Plan.Enabled, c.Redis.Address = true, true, redis.Addr()
	})
	sendTraffic(t, s, "mv", "ms")
	return s, vllm, sglang
}

// The simulated engines' /metrics carry help texts and types as the real
// engines do. Their names keep the engines' colon prefixes (vllm:,
// sglang:), which promtool's lint reports and nothing else may.
func TestEngineMetricsPassPromtool(t *testing.T) {
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang} {
		p := startPod(t, string(engine)+"-0", "m", engine, 100)
		s := startGateway(t, []config.Pod{podConfig(p)}, nil)
		sendTraffic(t, s, "m")
		colons := 0
		for _, problem := range promtool(t, fetch(t, "http://"+p.Addr()+"/metrics")) {
			if !strings.HasSuffix(problem, "metric names should not contain ':'") {
				t.Errorf("%s: promtool: %s", engine, problem)
				continue
			}
			colons++
		}
		t.Logf("%s: promtool reports %d names with a colon, as for the real engine", engine, colons)
	}
}

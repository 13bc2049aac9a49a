package gateway

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"

	"pdlb/lb/config"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// TestMetricsLabelEscaping: names from the configuration (a model's, a
// pod's, an adapter's) reach label values escaped as the text format
// wants: backslash, double quote and line feed, nothing else. Go's %q
// writes \t, \u00a0 or \x7f, escapes that Prometheus' parsers reject
// ("invalid escape sequence"), failing the whole scrape.
func TestMetricsLabelEscaping(t *testing.T) {
	model, podName, adapter := "llama\u00a03", "pod\t0", "sql\x7f"
	cfg := config.Default()
	cfg.Pods = []config.Pod{{Name: podName, Model: model, Address: "127.0.0.1:1"}}
	cfg.Provision()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	snap, err := pool.Build(&cfg, upstream.Dialer(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	var inFlight atomic.Int64
	m := newMetrics(&inFlight)
	m.addModels(snap)
	m.model(snap.Models[0]).adapters.counter(adapter).Inc()
	var b bytes.Buffer
	if err := m.writePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	writePods(&b, snap, 0)
	for _, want := range []string{`model="` + model + `"`, `pod="` + podName + `"`, `adapter="` + adapter + `"`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no series with %q", want)
		}
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		for i := 0; i < len(line); i++ {
			if line[i] != '\\' {
				continue
			}
			if i+1 >= len(line) || !strings.ContainsRune(`\"n`, rune(line[i+1])) {
				t.Errorf("invalid escape in %q", line)
				break
			}
			i++
		}
	}
}
